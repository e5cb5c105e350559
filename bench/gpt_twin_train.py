"""The torch side of bench/gpt_vs_torch_loss.sh: trains the torch twin of ddptrain's GPT
(tests/python/gpt_twin.py) the way ddptrain trained RUN_DIR — the same configuration (read from
the checkpoint's stored config), the same token files (train.log's "data:" line), the same
number of steps, learning-rate schedule, AdamW (weight decay on 2-D weights), clipping and
effective batch (batch_size x world_size x grad_accum windows in one process) — and evaluates on
the same validation windows at the same steps. Its random training windows are ddptrain's own
(ddp_lm_window_starts transcribed below), so the two runs see the same tokens in the same order;
only the initial weights (torch's generator) and float rounding differ.

First loads ddptrain's last checkpoint into the twin by name (strict=False, as nanoGPT would)
and checks that it evaluates to ddptrain's own validation loss. Prints both validation curves
and exits 1 when the final losses differ by more than --tol (relative, 0.02) or the checkpoint
did not load.
With --init CKPT the twin starts from that checkpoint's weights instead of its own draw (ddptrain
saves its initial weights, to float precision, as `--total_steps 1 --lr 1e-30`:
bench/gpt_vs_torch_loss.sh --same-init does it): then the two runs differ only by float rounding.
usage: gpt_twin_train.py RUN_DIR [--threads N] [--tol 0.02] [--init CKPT]"""
import argparse
import json
import math
import os
import re
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from gpt_twin import GPT, Config  # noqa: E402

M64 = (1 << 64) - 1


def mix(z):
    """splitmix64's finaliser (src/data/windows.c)."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def window_starts(seed, step, first, n, ntokens, T):
    """ddp_lm_window_starts: window k of the step starts where (seed, step, first + k) says."""
    rng = ntokens - T if ntokens > T else 1
    key = mix((mix(seed ^ 0x6C6D77696E646F77) + step) & M64)
    return [mix((key + first + k) & M64) % rng for k in range(n)]


def lr_at(c, step, total, world):
    """ddp_lr_at (src/nn/schedule.c)."""
    lr = float(c["lr"])
    if c["lr_scaling"] == "linear":
        lr *= world
    elif c["lr_scaling"] == "sqrt":
        lr *= math.sqrt(world)
    warm = int(c["warmup_steps"])
    if step < warm:
        return lr * (step + 1) / warm
    frac = (step - warm) / (total - warm) if total > warm else 0.0
    if c["schedule"] == "cosine":
        return lr * 0.5 * (1 + math.cos(math.pi * frac))
    if c["schedule"] == "linear":
        return lr * (1 - frac)
    return lr


def tokens(path):
    """A token file: llm.c's shard (256 x int32 header) or nanoGPT's raw uint16."""
    raw = np.fromfile(path, dtype=np.uint8)
    if len(raw) >= 1024 and struct.unpack("<i", raw[:4].tobytes())[0] == 20240520:
        raw = raw[1024:]
    return torch.from_numpy(raw.view(np.uint16).astype(np.int64))


def truth(v):
    """A config bool, whether YAML made it a bool or left it text."""
    return str(v).lower() in ("true", "yes", "on", "1")


def latest_checkpoint(run):
    d = os.path.join(run, "checkpoints")
    steps = [int(m.group(1)) for f in os.listdir(d) if (m := re.fullmatch(r"step(\d+)\.safetensors", f))]
    return os.path.join(d, f"step{max(steps)}.safetensors")


def load_st(path):
    """A safetensors file's F32 tensors and metadata (Debian has no safetensors package)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32).reshape(v["shape"])
    return out, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--init", help="start from this checkpoint's weights")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ckpt = latest_checkpoint(a.run)
    weights, meta = load_st(ckpt)
    c = yaml.safe_load(meta["config"])
    world = int(meta["world_size"])
    log = open(os.path.join(a.run, "train.log")).read()
    m = re.findall(r"^data: \d+ training tokens in (\S+), \d+ validation tokens in (\S+)$", log, re.M)
    train, val = tokens(m[-1][0]), tokens(m[-1][1])
    ours = {}  # step -> ddptrain's validation loss (the last run's, metrics.jsonl is appended to)
    for line in open(os.path.join(a.run, "metrics.jsonl")):
        r = json.loads(line)
        if "val_loss" in r:
            ours[r["step"]] = r["val_loss"]

    T, B, A = int(c["model.block_size"]), int(c["batch_size"]), int(c["grad_accum"])
    total, seed = int(c["total_steps"]), int(c["seed"])
    betas = tuple(float(x) for x in str(c["betas"]).split(","))
    torch.manual_seed(seed)
    model = GPT(Config(int(c["model.n_layer"]), int(c["model.n_head"]), int(c["model.n_embd"]), T,
                       int(c["model.vocab_size"]), float(c["model.dropout"]), truth(c["model.bias"])))
    opt = model.optimizer(float(c["lr"]), float(c["weight_decay"]), betas, float(c["eps"]))
    clip, every = float(c["grad_clip"]), int(c["eval_every"])

    # The evaluation windows of trainer_evaluate_lm: all N, or K spread as floor(j N / K).
    N = (len(val) - 1) // T
    K = min(int(c["eval_windows"]), N) if int(c["eval_windows"]) > 0 else N
    vs = torch.tensor([(j * N // K) * T for j in range(K)])
    vx = torch.stack([val[s:s + T] for s in vs])
    vy = torch.stack([val[s + 1:s + 1 + T] for s in vs])

    def evaluate():
        model.eval()
        with torch.no_grad():
            tot = 0.0
            for i in range(0, K, 64):
                logits, _ = model(vx[i:i + 64])
                tot += F.cross_entropy(logits.view(-1, logits.size(-1)), vy[i:i + 64].reshape(-1),
                                       reduction="sum").item()
        model.train()
        return tot / (K * T)

    # ddptrain's checkpoint loads into the twin by name, as into nanoGPT: strict=False, missing
    # only lm_head.weight (tied to transformer.wte.weight), and evaluates to ddptrain's loss.
    missing, unexpected = model.load_state_dict(
        {k: v for k, v in weights.items() if not k.startswith("optim.")}, strict=False)
    step_saved = int(meta["step"])
    loaded = evaluate()
    rel_ck = abs(loaded - ours[step_saved]) / ours[step_saved]
    print(f"checkpoint {ckpt} in torch: missing {missing}, unexpected {unexpected}; val loss "
          f"{loaded:.6f} vs ddptrain's {ours[step_saved]:.6f} (relative {rel_ck:.1e})")
    ck_ok = missing == ["lm_head.weight"] and not unexpected and rel_ck <= 1e-4
    torch.manual_seed(seed)  # and back to a fresh model
    model = GPT(model.config)
    if a.init:
        w0, _ = load_st(a.init)
        model.load_state_dict({k: v for k, v in w0.items() if not k.startswith("optim.")},
                              strict=False)
        print(f"initial weights from {a.init}")
    opt = model.optimizer(float(c["lr"]), float(c["weight_decay"]), betas, float(c["eps"]))

    theirs = {0: evaluate()}
    n = B * world * A  # windows per optimizer step, all in one batch
    t0 = time.perf_counter()
    for step in range(total):
        starts = window_starts(seed, step, step * n, n, len(train), T)
        x = torch.stack([train[s:s + T] for s in starts])
        y = torch.stack([train[s + 1:s + 1 + T] for s in starts])
        for g in opt.param_groups:
            g["lr"] = lr_at(c, step, total, world)
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if (every > 0 and (step + 1) % every == 0) or step + 1 == total:
            theirs[step + 1] = evaluate()
            print(f"step {step + 1}: torch val loss {theirs[step + 1]:.4f}"
                  f" | ddptrain {ours.get(step + 1, float('nan')):.4f}", flush=True)
    secs = time.perf_counter() - t0
    print(f"torch: {total} steps in {secs:.1f} s ({total * n * T / secs:.0f} tokens/s, "
          f"{a.threads} threads)")
    print("step | ddptrain val loss | torch val loss")
    for s in sorted(theirs):
        print(f"{s} | {ours.get(s, float('nan')):.4f} | {theirs[s]:.4f}")
    mine, ref = ours.get(total), theirs[total]
    if mine is None:
        print(f"train.log has no evaluation at step {total}")
        return 1
    rel = abs(mine - ref) / ref
    print(f"final val loss: ddptrain {mine:.4f}, torch {ref:.4f}, relative difference {rel:.4f} "
          f"({'within' if rel <= a.tol else 'OVER'} {a.tol})")
    return 0 if rel <= a.tol and ck_ok else 1


if __name__ == "__main__":
    sys.exit(main())
