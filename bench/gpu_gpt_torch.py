"""PyTorch's side of the GPU GPT benchmark (scripts/gpu-check.sh runs it beside build/bin/gpu_bench
on the same GPU): the torch twin of ddpc's GPT (tests/python/gpt_twin.py, manual causal
attention as ddpc's first CUDA attention) at GPT-2 124M's shape (L12, C768, nh12, T1024,
V50304), batch B, one training step = zero_grad, forward with the loss, backward, AdamW (fused
where torch has it). Precisions: fp32 (TF32 off), tf32 (matmul TF32 on), bf16 (autocast), and
bf16 under torch.compile unless --no-compile. Prints tokens/s (best of the timed steps after
warm-up) and MFU against the dense peak given (TFLOP/s; the same table ddpc uses).
Usage: python3 bench/gpu_gpt_torch.py [--quick] [--peak-tf32 T] [--peak-bf16 T] [--peak-fp32 T]
NOT YET RUN (no GPU in the session that wrote it)."""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from gpt_twin import GPT, Config  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true")
ap.add_argument("--no-compile", action="store_true")
ap.add_argument("--peak-fp32", type=float, default=0.0)
ap.add_argument("--peak-tf32", type=float, default=0.0)
ap.add_argument("--peak-bf16", type=float, default=0.0)
a = ap.parse_args()
L, B = (4, 2) if a.quick else (12, 8)
T, V, C = 1024, 50304, 768
dev = "cuda"


def run(prec, compile_it):
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    torch.manual_seed(0)
    model = GPT(Config(n_layer=L, n_head=12, n_embd=C, block_size=T, vocab_size=V)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_model = torch.compile(model) if compile_it else model
    x = torch.randint(0, 50257, (B, T), device=dev)
    y = torch.randint(0, 50257, (B, T), device=dev)
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    flops = B * T * (6 * n + 12 * L * C * T)
    best = 1e30
    for it in range(8):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
            _, loss = step_model(x, y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if it >= 3:
            best = min(best, time.perf_counter() - t0)
    peak = {"fp32": a.peak_fp32, "tf32": a.peak_tf32, "bf16": a.peak_bf16}[prec] * 1e12
    mfu = 100.0 * flops / best / peak if peak > 0 else 0.0
    what = f"torch gpt L{L} B{B} T{T} {prec}{' compile' if compile_it else ' eager'} tokens/s"
    print(f"{what:<44} {B * T / best:12.0f} {mfu:9.1f}% mfu", flush=True)
    del model, opt, step_model
    torch.cuda.empty_cache()


print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
for prec in ("fp32", "tf32", "bf16"):
    run(prec, False)
if not a.no_compile:
    run("bf16", True)
