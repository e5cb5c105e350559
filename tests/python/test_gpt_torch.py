"""Whole-model parity of ddpc's GPT (model.type gpt, run through gpt_dump) with its torch twin
(gpt_twin.py, nanoGPT's GPT with the same parameter names), torch 1.13 on one thread.

For each configuration (with and without biases, vocabularies of 256, 97 and 50257):
  - the C model's own initial weights load into the twin by name with strict=False, missing
    exactly lm_head.weight (the tied head) and nothing unexpected; their spread is GPT-2's;
  - given the twin's initial weights: the evaluation loss and logits;
  - training STEPS steps (forward, backward, global-norm clipping to 1.0, AdamW betas (0.9,
    0.95), eps 1e-8, weight decay 0.1 on 2-D tensors only, constant LR) on the same token
    batches, some targets ignored (-1): every step's loss and gradient norm, step 1's gradients,
    the weights after step 1 and after all steps.
Errors: losses relative, |ddpc - torch| / |torch|; tensors scaled, max|ddpc - torch| / max|torch|
per tensor (elementwise relative error is meaningless where a value passes through zero); the
whole model's weights as one vector, ||ddpc - torch||_2 / ||torch||_2.
  TOL_LOSS  1e-5   losses
  TOL_VALUE 1e-5   logits, step 1's gradients (each tensor), gradient norms
  TOL_W     1e-5   the weights after one and after STEPS AdamW steps, the whole model (L2)
  TOL_UPD   1e-4   the update (weights after - before) of each tensor against torch in float64,
                   relative L2, over the elements where AdamW is well conditioned (below)
Why the update and not the weights per tensor: AdamW moves an element by lr * m_hat /
(sqrt(v_hat) + eps), so where sqrt(v_hat) is near eps = 1e-8 the update follows float noise in
the gradient. The k part of c_attn.bias has a gradient of exactly 0 in exact arithmetic (a
constant added to every score of a row leaves the softmax unchanged): float32 gives it noise of
~1e-11, which the first step turns into ~lr * 1e-3 of either sign, and torch float32 itself is
then ~1e-3 (scaled) from float64 on that tensor. Elements with sqrt(v_hat) < COND x eps (in
float64) are left out of TOL_UPD and counted. The rest is limited by float32 weights: a
layernorm weight of 1 stores its update of 1e-3 to 6e-5 relative, in torch as here; torch
float32's own figure is printed beside ours, and a tensor passes also when its error is within
twice torch float32's own (the position embedding on an AVX2-only CPU: 1.0e-4 against torch's
7.2e-5, the order of float32 sums differing with the vector width).
Usage: test_gpt_torch.py BINDIR  (exit 77, skipped, without torch)
With DDP_GPT_DUMP_DEVICE=cuda the C model runs on the GPU and the tolerances are issue 12's
(printed at the start); scripts/gpu-check.sh runs it so."""
import atexit
import json
import math
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
    print("SKIP: torch is not installed (Debian: apt-get install python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_twin import GPT, Config  # noqa: E402


def dump_env():
    """gpt_dump's environment: one OpenBLAS thread (ThreadSanitizer cannot see OpenBLAS's own
    synchronisation), and on a GPU machine (scripts/gpu-check.sh) the carried libraries' path,
    which torch itself, in this process, must not see."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if os.environ.get("DDP_CARRY_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["DDP_CARRY_LD_LIBRARY_PATH"]
    return env

TOL_LOSS, TOL_VALUE, TOL_W, TOL_UPD, COND = 1e-5, 1e-5, 1e-5, 1e-4, 100
if os.environ.get("DDP_GPT_DUMP_DEVICE") == "cuda":
    # ddpc's GPT on the GPU (scripts/gpu-check.sh): fp32 statistics, cuBLAS's summation order and
    # atomic adds; issue 12 asks for logits within 1e-3 and losses within 1e-4.
    TOL_LOSS, TOL_VALUE, TOL_W, TOL_UPD = 1e-4, 1e-3, 1e-4, 1e-2
    print("gpt_dump runs the model on the GPU: tolerances loss 1e-4, values 1e-3, weights 1e-4")
STEPS, LR = 4, 1e-3
BIN = os.path.join(sys.argv[1], "gpt_dump")
torch.set_num_threads(1)
passed = failed = 0
worst = {}


def check(ok, what):
    global passed, failed
    passed += ok
    failed += not ok
    print(("ok: " if ok else "FAIL: ") + what, flush=True)


def load_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(v["shape"])
    return out


def save_st(path, tensors):
    hdr, blobs, off = {}, [], 0
    for k, t in tensors.items():
        b = t.detach().contiguous().numpy().astype("<f4").tobytes()
        hdr[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def scaled(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()


def l2(ts):
    return math.sqrt(sum((t.double() ** 2).sum().item() for t in ts))


def weights_check(name, what, got, w0, net32, net64, opt64, t):
    """got: name -> tensor (ddpc), w0 the weights before training; the twin in float32 and in
    float64 (with its optimizer) after the same t steps."""
    p32, p64 = dict(net32.named_parameters()), dict(net64.named_parameters())
    e_l2 = l2([got[n].double() - p.detach().double() for n, p in p32.items()]) / \
        l2([p.detach() for p in p32.values()])
    note(f"weights after {what} (L2)", e_l2)
    check(e_l2 <= TOL_W, f"{name}: weights after {what}, whole model, relative L2 {e_l2:.1e}")
    bad, worst_c, worst_t, skipped, total = [], 0.0, 0.0, 0, 0
    for n, p in p64.items():
        # AdamW's denominator sqrt(v_hat) + eps, in float64: well conditioned where sqrt(v_hat)
        # is at least COND x eps.
        v_hat = opt64.state[p]["exp_avg_sq"] / (1 - 0.95 ** t)
        mask = v_hat.sqrt() >= COND * 1e-8
        skipped += int((~mask).sum())
        total += mask.numel()
        upd = l2([(p.detach() - w0[n].double())[mask]])
        if upd == 0:
            continue
        e_c = l2([(got[n].double() - p.detach())[mask]]) / upd
        e_t = l2([(p32[n].detach().double() - p.detach())[mask]]) / upd
        worst_c, worst_t = max(worst_c, e_c), max(worst_t, e_t)
        if e_c > TOL_UPD and e_c > 2 * e_t:
            bad.append(f"{n} {e_c:.1e} (torch float32 {e_t:.1e})")
    note(f"update over {what} vs float64 (tensor, L2)", worst_c)
    check(not bad, f"{name}: the update over {what} against float64, each tensor, relative L2 "
          f"{worst_c:.1e} (torch float32 {worst_t:.1e}; {skipped} of {total} elements with "
          f"sqrt(v_hat) < {COND:g} eps left out){': ' + ', '.join(bad) if bad else ''}")


def note(kind, err):
    worst[kind] = max(worst.get(kind, 0.0), err)


def case(L, NH, C, T, V, bias, B):
    name = f"L{L} NH{NH} C{C} T{T} V{V} bias={bias} B{B}"
    d = tempfile.mkdtemp(prefix="ddp-gpt-parity-")
    atexit.register(shutil.rmtree, d, True)  # removed at exit, whatever happens
    torch.manual_seed(1000 + L * 7 + V)
    net = GPT(Config(L, NH, C, T, V, 0.0, bias))
    # the tied head appears once, as transformer.wte; copies, as training changes the parameters
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    save_st(os.path.join(d, "weights.safetensors"), params)
    x = torch.randint(0, V, (STEPS, B, T), dtype=torch.int32)
    y = torch.randint(0, V, (STEPS, B, T), dtype=torch.int32)
    y[:, 0, :3] = -1  # ignored targets
    x.numpy().tofile(os.path.join(d, "tokens.bin"))
    y.numpy().tofile(os.path.join(d, "targets.bin"))
    subprocess.run([BIN, d, "train", str(L), str(NH), str(C), str(T), str(V), str(int(bias)),
                    str(B), str(STEPS), repr(LR), "0"], check=True, env=dump_env())

    # The C model's own init loads by name; the tied head is the one missing key.
    init = load_st(os.path.join(d, "out_init.safetensors"))
    twin = GPT(Config(L, NH, C, T, V, 0.0, bias))
    res = twin.load_state_dict(init, strict=False)
    check(res.missing_keys == ["lm_head.weight"] and not res.unexpected_keys
          and list(init.keys()) == list(params.keys())
          and torch.equal(twin.lm_head.weight, init["transformer.wte.weight"]),
          f"{name}: the C init loads into torch by name (missing {res.missing_keys}, "
          f"unexpected {res.unexpected_keys}), in named_parameters() order")
    ok = True
    for k, t in init.items():
        if t.dim() == 2:
            want = 0.02 / math.sqrt(2 * L) if k.endswith("c_proj.weight") else 0.02
            ok &= abs(t.std().item() - want) < 0.15 * want
        else:
            ok &= bool((t == (1.0 if k.endswith("weight") else 0.0)).all())
    check(ok, f"{name}: GPT-2 init (std 0.02, c_proj 0.02/sqrt(2L), layernorm 1, biases 0)")

    # Evaluation of batch 0.
    net.eval()
    with torch.no_grad():
        logits, loss = net(x[0].long(), y[0].long())
    c_eval = np.fromfile(os.path.join(d, "out_eval.bin"), dtype=np.float64)[0]
    c_logits = torch.from_numpy(np.fromfile(os.path.join(d, "out_logits.bin"), dtype=np.float32))
    e_loss = abs(c_eval - loss.item()) / abs(loss.item())
    e_logits = scaled(c_logits, logits.reshape(-1))
    note("eval loss", e_loss)
    note("logits", e_logits)
    check(e_loss <= TOL_LOSS and e_logits <= TOL_VALUE,
          f"{name}: evaluation loss {c_eval:.6f} vs {loss.item():.6f} (rel {e_loss:.1e}), "
          f"logits {e_logits:.1e}")

    # Training, in float32 and (the exact reference for the weights) in float64.
    net.train()
    net64 = GPT(Config(L, NH, C, T, V, 0.0, bias)).double()
    net64.load_state_dict({k: v.double() for k, v in params.items()}, strict=False)
    net64.train()
    opt = net.optimizer(LR, 0.1, (0.9, 0.95), 1e-8)
    opt64 = net64.optimizer(LR, 0.1, (0.9, 0.95), 1e-8)
    c_loss = np.fromfile(os.path.join(d, "out_loss.bin"), dtype=np.float64)
    c_norm = np.fromfile(os.path.join(d, "out_norm.bin"), dtype=np.float64)
    for k in range(STEPS):
        opt.zero_grad(set_to_none=True)
        opt64.zero_grad(set_to_none=True)
        _, loss = net(x[k].long(), y[k].long())
        loss.backward()
        _, loss64 = net64(x[k].long(), y[k].long())
        loss64.backward()
        if k == 0:
            grads = load_st(os.path.join(d, "out_grads.safetensors"))
            e = max(scaled(grads[n], p.grad) for n, p in net.named_parameters())
            note("step-1 gradients", e)
            check(e <= TOL_VALUE, f"{name}: step 1 gradients, worst tensor {e:.1e}")
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0).item()
        torch.nn.utils.clip_grad_norm_(net64.parameters(), 1.0)
        opt.step()
        opt64.step()
        e_l = abs(c_loss[k] - loss.item()) / abs(loss.item())
        e_n = abs(c_norm[k] - norm) / norm
        note("training loss", e_l)
        note("gradient norm", e_n)
        check(e_l <= TOL_LOSS and e_n <= TOL_VALUE,
              f"{name}: step {k + 1} loss {c_loss[k]:.6f} vs {loss.item():.6f} (rel {e_l:.1e}), "
              f"gradient norm {c_norm[k]:.4f} vs {norm:.4f} (rel {e_n:.1e})")
        if k == 0:
            weights_check(name, "1 step", load_st(os.path.join(d, "out_step1.safetensors")),
                          params, net, net64, opt64, 1)
    weights_check(name, f"{STEPS} steps", load_st(os.path.join(d, "out_final.safetensors")),
                  params, net, net64, opt64, STEPS)

case(2, 4, 64, 32, 256, True, 4)
case(3, 2, 48, 16, 97, False, 3)
case(1, 2, 32, 8, 50257, True, 2)
print("worst scaled errors: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
