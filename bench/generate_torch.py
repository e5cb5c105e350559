"""The torch side of bench/generate.sh: greedy generation from a ddptrain GPT checkpoint, loaded
into the torch twin (tests/python/gpt_twin.py) by name, two ways: nanoGPT's sample.py (every token
a forward of the whole context, logits of the last position) and with a key/value cache (each
block's keys and values kept, a new token one position's work: what transformers' generate does).
Prints one line per way: "<way> <tokens/s> <sha1 of the ids>" (the median of --reps runs).
usage: generate_torch.py RUN_DIR PROMPT NEW [--threads N] [--reps R]"""
import argparse
import hashlib
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
sys.path.insert(0, os.path.dirname(__file__))
from gpt_twin import GPT, Config  # noqa: E402
from gpt_twin_train import latest_checkpoint, load_st  # noqa: E402


@torch.no_grad()
def recompute(m, idx, new):
    T = m.config.block_size
    for _ in range(new):
        logits, _ = m(idx[:, -T:])
        idx = torch.cat((idx, logits[:, -1, :].argmax(-1, keepdim=True)), dim=1)
    return idx


@torch.no_grad()
def cached(m, idx, new):
    c = m.config
    nh, C = c.n_head, c.n_embd
    hs = C // nh
    assert idx.size(1) + new <= c.block_size, "the cached way needs prompt + NEW <= block_size"
    kv = [None] * c.n_layer
    x_ids, pos0, out = idx, 0, idx
    for _ in range(new):
        T = x_ids.size(1)
        x = m.transformer.wte(x_ids) + m.transformer.wpe(torch.arange(pos0, pos0 + T))
        for i, b in enumerate(m.transformer.h):
            q, k, v = b.attn.c_attn(b.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(1, T, nh, hs).transpose(1, 2) for t in (q, k, v))
            if kv[i] is not None:
                k, v = torch.cat((kv[i][0], k), dim=2), torch.cat((kv[i][1], v), dim=2)
            kv[i] = (k, v)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            if T > 1:  # the prompt: causal among its own positions
                att = att.masked_fill(torch.ones(T, T).tril() == 0, float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(1, T, C)
            x = x + b.attn.c_proj(y)
            x = x + b.mlp(b.ln_2(x))
        nxt = m.lm_head(m.transformer.ln_f(x[:, -1, :])).argmax(-1, keepdim=True)
        out = torch.cat((out, nxt), dim=1)
        x_ids, pos0 = nxt, pos0 + T
    return out


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("prompt")
    ap.add_argument("new", type=int)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sd, meta = load_st(latest_checkpoint(a.run))
    cfg = yaml.safe_load(meta["config"])  # ddptrain's stored configuration, "model.n_layer: 4"
    get = lambda k: cfg["model." + k]  # noqa: E731
    c = Config(n_layer=get("n_layer"), n_head=get("n_head"), n_embd=get("n_embd"),
               block_size=get("block_size"), vocab_size=get("vocab_size"), bias=get("bias"))
    m = GPT(c)
    missing, _ = m.load_state_dict({k: v for k, v in sd.items() if not k.startswith("optim.")},
                                   strict=False)
    assert all(k in ("lm_head.weight",) for k in missing), missing
    m.eval()
    # The physical limit of a batch of one: every new token reads every weight once (the position
    # embedding's one row aside), so tokens/s ≤ bandwidth / weight bytes. Bandwidth: torch.mv over
    # a matrix of the weights' size (threads as given), the best of 5.
    nbytes = 4 * sum(v.numel() for k, v in sd.items()
                     if not k.startswith("optim.") and k != "transformer.wpe.weight")
    W = torch.empty(nbytes // 4 // 1024, 1024).uniform_()
    xv = torch.ones(1024)
    best = min(timed(lambda: torch.mv(W, xv)) for _ in range(5))
    print("limit", f"{nbytes / best / nbytes:.1f}", f"{nbytes / best / 1e9:.1f}GB/s", flush=True)
    del W
    idx = torch.tensor([list(a.prompt.encode())], dtype=torch.long)
    for name, fn in (("recompute", recompute), ("cached", cached)):
        rates, ids = [], None
        for _ in range(a.reps):
            t0 = time.perf_counter()
            ids = fn(m, idx, a.new)
            rates.append(a.new / (time.perf_counter() - t0))
        rates.sort()
        h = hashlib.sha1(bytes(ids[0, idx.size(1):].tolist())).hexdigest()[:12]
        print(name, f"{rates[len(rates) // 2]:.1f}", h, flush=True)


if __name__ == "__main__":
    main()
