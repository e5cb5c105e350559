"""Causal self-attention, forward + backward, ddpc against PyTorch 1.13 on the CPU, one thread each.

ddpc: tests/python/transformer_dump's bench_attention (ddp_nn_attention_forward + _backward on
qkv (B, T, 3C), the saved log-sum-exp, blockwise recompute). PyTorch: nanoGPT's
CausalSelfAttention between c_attn and c_proj as torch 1.13 runs it (the manual path: q·kᵀ,
masked_fill, softmax, dropout, att·v; 1.13 has no scaled_dot_product_attention), forward then
backward from qkv. Both report the median over REPS runs after two warm-up runs.
The two alternate REPEATS times and the ratio is taken per pair (the host's speed drifts).
Usage: bench/attention.py BINDIR [REPS] [REPEATS]   (e.g. bench/attention.py build/bin 21 3)
Shapes: the GPT anchor L2/C128/NH4/T64/B4 and nanoGPT's shakespeare-char L6/C384/NH6/T256/B8
(batch as in the brief), each with attention dropout 0 and 0.2."""
import math
import os
import statistics
import subprocess
import sys
import time

# One thread for torch's OpenBLAS too (it reads this when torch loads it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn.functional as F

torch.set_num_threads(1)
BIN = os.path.join(sys.argv[1], "transformer_dump")
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 21
REPEATS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
SHAPES = [(4, 64, 128, 4), (8, 256, 384, 6)]


def torch_attention(qkv, B, T, C, nh, p, bias):
    hs = C // nh
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, nh, hs).transpose(1, 2)
    k = k.view(B, T, nh, hs).transpose(1, 2)
    v = v.view(B, T, nh, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    att = att.masked_fill(bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    att = F.dropout(att, p, training=True)
    y = att @ v
    return y.transpose(1, 2).contiguous().view(B, T, C)


def bench_torch(B, T, C, nh, p):
    bias = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    qkv = torch.randn(B, T, 3 * C, requires_grad=True)
    dout = torch.randn(B, T, C)
    tf, tb, tt = [], [], []
    for r in range(REPS + 2):
        t0 = time.perf_counter()
        y = torch_attention(qkv, B, T, C, nh, p, bias)
        t1 = time.perf_counter()
        y.backward(dout)
        t2 = time.perf_counter()
        qkv.grad = None
        if r >= 2:
            tf.append(t1 - t0), tb.append(t2 - t1), tt.append(t2 - t0)
    med = [statistics.median(v) * 1e3 for v in (tf, tb, tt)]
    return (f"torch attention B={B} T={T} C={C} nh={nh} p={p:g}: forward {med[0]:.3f} ms, "
            f"backward {med[1]:.3f} ms, both {med[2]:.3f} ms (median of {REPS})"), med[2]


env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
for B, T, C, nh in SHAPES:
    for p in (0.0, 0.2):
        ratios, tt, td = [], [], []
        for rep in range(REPEATS):
            line, t_torch = bench_torch(B, T, C, nh, p)
            out = subprocess.run([BIN, "/nonexistent", "bench_attention", str(B), str(T), str(C),
                                  str(nh), repr(p), str(REPS)], check=True, env=env,
                                 capture_output=True, text=True).stdout.strip()
            t_ddpc = float(out.split("both ")[1].split(" ms")[0])
            ratios.append(t_torch / t_ddpc), tt.append(t_torch), td.append(t_ddpc)
            print("  " + line)
            print("  " + out)
        print(f"B={B} T={T} C={C} nh={nh} p={p:g}: forward+backward torch "
              f"{statistics.median(tt):.3f} ms, ddpc {statistics.median(td):.3f} ms, ddpc is "
              f"{statistics.median(ratios):.2f}x torch (median of {REPEATS} pairs)")
