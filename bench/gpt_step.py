"""A whole GPT training step on the CPU, ddpc's layers against PyTorch 1.13, one thread each.

ddpc: tests/python/transformer_dump's bench_gpt (tiny_gpt.c: nanoGPT's GPT composed from the
ddp/nn.h layers; zero the gradients, forward with the loss, backward, AdamW over every
parameter). PyTorch: the same model written the way nanoGPT's model.py writes it (modules,
manual attention since 1.13 has no scaled_dot_product_attention, tanh GELU, tied lm_head,
cross-entropy with ignore_index=-1), zero_grad(set_to_none=True), forward, backward, AdamW
(foreach off, as on a CPU by default). The two runs alternate, REPEATS times, and the ratio is
taken per pair: the host's speed drifts by tens of percent over minutes.
Usage: bench/gpt_step.py BINDIR [STEPS] [REPEATS]   (e.g. bench/gpt_step.py build/bin 30 3)
Shapes: the CPU anchor of FACTS.md (L2/C128/NH4/T64/B4, byte vocabulary, biases) and nanoGPT's
shakespeare-char (L6/C384/NH6/T256, V 65, no biases) at batch 8, both without dropout."""
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
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
BIN = os.path.join(sys.argv[1], "transformer_dump")
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
REPEATS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
SHAPES = [dict(L=2, C=128, nh=4, T=64, B=4, V=256, bias=True),
          dict(L=6, C=384, nh=6, T=256, B=8, V=65, bias=False)]


class LayerNorm(nn.Module):
    def __init__(self, C, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = nn.Parameter(torch.zeros(C)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, C, nh, T, bias):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)
        self.c_proj = nn.Linear(C, C, bias=bias)
        self.nh = nh
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.nh, hs).transpose(1, 2)
        k = k.view(B, T, self.nh, hs).transpose(1, 2)
        v = v.view(B, T, self.nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, C, nh, T, bias):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(C, bias), Attention(C, nh, T, bias)
        self.ln_2 = LayerNorm(C, bias)
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C, bias=bias), nn.Linear(4 * C, C, bias=bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, nh, T, V, bias):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, nh, T, bias) for _ in range(L)])
        self.ln_f = LayerNorm(C, bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)


def torch_step_ms(s):
    model = GPT(s["L"], s["C"], s["nh"], s["T"], s["V"], s["bias"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for r in range(STEPS + 2):
        idx = torch.randint(0, s["V"], (s["B"], s["T"]))
        tg = torch.randint(0, s["V"], (s["B"], s["T"]))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tg)
        loss.backward()
        opt.step()
        if r >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
for s in SHAPES:
    ratios, tt, td = [], [], []
    for rep in range(REPEATS):
        t_torch = torch_step_ms(s)
        out = subprocess.run([BIN, "/nonexistent", "bench_gpt", str(s["L"]), str(s["C"]),
                              str(s["nh"]), str(s["T"]), str(s["V"]), str(int(s["bias"])),
                              str(s["B"]), "0", str(STEPS)], check=True, env=env,
                             capture_output=True, text=True).stdout.strip()
        t_ddpc = float(out.split("step ")[1].split(" ms")[0])
        ratios.append(t_torch / t_ddpc), tt.append(t_torch), td.append(t_ddpc)
        print(f"  torch {t_torch:.2f} ms/step | {out}")
    name = "L{L}/C{C}/NH{nh}/T{T}/B{B}/V{V}".format(**s)
    print(f"{name}: torch {statistics.median(tt):.2f} ms/step, ddpc {statistics.median(td):.2f} "
          f"ms/step, ddpc is {statistics.median(ratios):.2f}x torch (median of {REPEATS} pairs)")
