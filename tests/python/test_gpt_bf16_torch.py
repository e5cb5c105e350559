"""ddpc's GPT in precision bf16 (or fp16) on the GPU (gpt_dump with DDP_GPT_DUMP_DEVICE=cuda and
DDP_GPT_DUMP_PRECISION=bf16 or fp16) against its torch twin (gpt_twin.py) under
torch.autocast("cuda", torch.bfloat16) (or torch.float16 with torch.amp.GradScaler) on the same
GPU, from the same initial weights on the same batches: issue 12's check, every one of STEPS
training losses within TOL = 0.05.

fp16: both sides run GradScaler's loop (scale the loss from 2^16, unscale, skip the step and halve
the scale on inf/NaN, double it after 2000 clean steps: never within 10 steps), clip, step; the
loss scale each step used is printed for both (they may differ where torch's fp16 scores QKᵀ
overflow and ddpc's fp32 ones do not: a skipped step, printed, not a failure by itself).

Each step: forward (training), backward, global-norm clipping to 1.0, AdamW (betas 0.9, 0.95, eps
1e-8, weight decay 0.1 on 2-D tensors, constant LR): gpt_dump's loop and the twin's, as in
test_gpt_torch.py. The twin also runs in float32 (TF32 off), and both 16-bit runs are printed
against it, so that a failure shows which side moved.

Where the two 16-bit runs round differently (docs/gpu.md, "Mixed precision"): autocast rounds the
logits and the scores QKᵀ to the 16-bit type and keeps the softmax's fp32 output for its backward;
ddpc keeps the logits and scores in fp32 and keeps the rounded probabilities. Each is a relative
2^-9 (bf16) or 2^-12 (fp16) per element; TOL is issue 12's.

Usage: test_gpt_bf16_torch.py BINDIR [bf16|fp16]   (scripts/gpu-check.sh's run half; bf16 when
left out)
DDP_CARRY_LD_LIBRARY_PATH, when set, is gpt_dump's LD_LIBRARY_PATH (the carried libraries), so
that torch itself runs with the machine's own. Exit 77 (a failure under gpu-check, which counts
any non-zero exit) without torch or without a CUDA device for torch. NOT YET RUN: no GPU in the
session that wrote it."""
import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
except ImportError:
    print("SKIP: torch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: torch sees no CUDA device")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_twin import GPT, Config  # noqa: E402

TOL, STEPS, LR = 0.05, 10, 1e-3
BIN = os.path.join(sys.argv[1], "gpt_dump")
PREC = sys.argv[2] if len(sys.argv) > 2 else "bf16"
if PREC not in ("bf16", "fp16"):
    sys.exit(f"precision {PREC!r}: bf16 or fp16")
ADT = torch.bfloat16 if PREC == "bf16" else torch.float16
DEV = "cuda"
failed = 0


def save_st(path, tensors):
    """tensors: name -> float32 tensor, written as a safetensors file (weights.safetensors)."""
    hdr, blobs, off = {}, [], 0
    for k, t in tensors.items():
        b = t.detach().cpu().contiguous().numpy().astype("<f4").tobytes()
        hdr[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def twin_losses(cfg, params, x, y, autocast, scales=None):
    """The twin's STEPS losses; with autocast in fp16, GradScaler's loop, the scale each step used
    appended to scales."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    net = GPT(cfg).to(DEV)
    res = net.load_state_dict({k: v.to(DEV) for k, v in params.items()}, strict=False)
    assert res.missing_keys == ["lm_head.weight"] and not res.unexpected_keys, res
    net.train()
    opt = net.optimizer(LR, 0.1, (0.9, 0.95), 1e-8)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast and ADT == torch.float16)
    out = []
    for k in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=ADT, enabled=autocast):
            _, loss = net(x[k].long().to(DEV), y[k].long().to(DEV))
        if scales is not None:
            scales.append(scaler.get_scale() if scaler.is_enabled() else 1.0)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        out.append(loss.item())
    return out


def case(L, NH, C, T, V, bias, B):
    global failed
    name = f"L{L} NH{NH} C{C} T{T} V{V} bias={bias} B{B}"
    d = tempfile.mkdtemp(prefix=f"ddp-gpt-{PREC}-")
    atexit.register(shutil.rmtree, d, True)  # removed at exit, whatever happens
    torch.manual_seed(2000 + L * 7 + V)
    cfg = Config(L, NH, C, T, V, 0.0, bias)
    params = {n: p.detach().clone() for n, p in GPT(cfg).named_parameters()}
    save_st(os.path.join(d, "weights.safetensors"), params)
    x = torch.randint(0, V, (STEPS, B, T), dtype=torch.int32)
    y = torch.randint(0, V, (STEPS, B, T), dtype=torch.int32)
    y[:, 0, :3] = -1  # ignored targets
    x.numpy().tofile(os.path.join(d, "tokens.bin"))
    y.numpy().tofile(os.path.join(d, "targets.bin"))
    env = {**os.environ, "DDP_GPT_DUMP_DEVICE": "cuda", "DDP_GPT_DUMP_PRECISION": PREC,
           "OPENBLAS_NUM_THREADS": "1"}
    if os.environ.get("DDP_CARRY_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["DDP_CARRY_LD_LIBRARY_PATH"]
    subprocess.run([BIN, d, "train", str(L), str(NH), str(C), str(T), str(V), str(int(bias)),
                    str(B), str(STEPS), repr(LR), "0"], check=True, env=env)
    ours = np.fromfile(os.path.join(d, "out_loss.bin"), dtype=np.float64)
    tscales = []
    bf = twin_losses(cfg, params, x, y, True, tscales)
    fp = twin_losses(cfg, params, x, y, False)
    print(f"{name}:")
    if PREC == "fp16":
        oscales = np.fromfile(os.path.join(d, "out_scale.bin"), dtype=np.float64)
        print("  loss scale each step: ddpc", [float(v) for v in oscales], "torch", tscales)
    print(f"  step   ddpc {PREC}  torch autocast  torch fp32   |ddpc-autocast|")
    worst = 0.0
    for k in range(STEPS):
        dk = abs(ours[k] - bf[k])
        if not dk <= worst:  # a NaN counts (max() would skip it)
            worst = dk
        print(f"  {k + 1:4d}  {ours[k]:10.6f}  {bf[k]:14.6f}  {fp[k]:10.6f}   {dk:.2e}")
    e_fp = max(abs(ours[k] - fp[k]) for k in range(STEPS))
    e_tf = max(abs(bf[k] - fp[k]) for k in range(STEPS))
    ok = worst <= TOL
    failed += not ok
    print(("ok: " if ok else "FAIL: ") + f"{name}: largest |ddpc {PREC} - torch autocast| "
          f"{worst:.2e} (tolerance {TOL}); against torch fp32: ddpc {e_fp:.2e}, autocast "
          f"{e_tf:.2e}", flush=True)


print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
case(2, 4, 64, 32, 256, True, 4)
case(2, 2, 64, 64, 50257, False, 2)  # GPT-2's vocabulary: the 16-bit gradient's 2V rows
sys.exit(1 if failed else 0)
