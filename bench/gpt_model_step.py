"""One training step of the library's GPT (ddp_model, model.type gpt) against PyTorch, side by side
on one thread each: forward, backward,
global-norm clipping to 1.0 and AdamW (betas 0.9/0.95, weight decay 0.1 on 2-D tensors) of the
same GPT-2-shaped model (ddpc: model.type gpt through tests/python/gpt_dump; torch: the twin
tests/python/gpt_twin.py), random byte tokens (V 256), dropout 0. The two run alternately,
ROUNDS times, so that load from other processes falls on both alike; the median ms/step of each,
the ratio of the medians and the median of the per-round ratios (torch / ddpc: > 1 means ddpc
is faster) are printed per shape, for wall clock and for CPU time, with ddpc's memory line (peak
RSS against parameters + gradients + AdamW state + activations from the shapes).
Usage: bench/gpt_model_step.py BINDIR [ROUNDS]   (OpenBLAS and torch on one thread)
"""
import os
import re
import statistics
import subprocess
import sys
import time

BIN, ROUNDS = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [  # L, NH, C, T, B, steps per round (ddpc and torch alike)
    (2, 4, 128, 64, 4, 40),
    (6, 6, 384, 256, 8, 3),
]
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

TORCH = r"""
import statistics, sys, time, torch
sys.path.insert(0, sys.argv[1])
from gpt_twin import GPT, Config
L, NH, C, T, B, steps = (int(a) for a in sys.argv[2:8])
torch.set_num_threads(1)
torch.manual_seed(0)
model = GPT(Config(L, NH, C, T, 256, 0.0, True))
opt = model.optimizer(3e-4, 0.1, (0.9, 0.95), 1e-8)
g = torch.Generator().manual_seed(1)
ms, cpu = [], []
for k in range(steps + 3):
    x = torch.randint(0, 256, (B, T), generator=g)
    y = torch.randint(0, 256, (B, T), generator=g)
    t0, c0 = time.perf_counter(), time.process_time()
    opt.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    t1, c1 = time.perf_counter(), time.process_time()
    if k >= 3:
        ms.append((t1 - t0) * 1e3)
        cpu.append((c1 - c0) * 1e3)
print(statistics.median(ms), statistics.median(cpu))
"""


def ddpc(L, NH, C, T, B, steps):
    out = subprocess.run([os.path.join(BIN, "gpt_dump"), "-", "bench", str(L), str(NH), str(C),
                          str(T), "256", str(B), str(steps)], env=ENV, check=True,
                         capture_output=True, text=True).stdout
    return (float(re.search(r"([0-9.]+) ms/step median", out).group(1)),
            float(re.search(r"CPU ([0-9.]+) ms/step", out).group(1)), out.strip().splitlines())


def torch_ms(L, NH, C, T, B, steps):
    out = subprocess.run(["/usr/bin/python3", "-c", TORCH,
                          os.path.join(HERE, "..", "tests", "python"),
                          str(L), str(NH), str(C), str(T), str(B), str(steps)],
                         env=ENV, check=True, capture_output=True, text=True).stdout
    wall, cpu = out.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


print(f"gpt training step, 1 thread, median of {ROUNDS} rounds (each the median of its steps); "
      f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}. Wall clock, "
      f"and CPU time (the process's), which a machine busy with other work inflates less")
for L, NH, C, T, B, steps in SHAPES:
    cw, cc, tw, tc, lines = [], [], [], [], None
    for _ in range(ROUNDS):
        w, c, lines = ddpc(L, NH, C, T, B, steps)
        cw.append(w)
        cc.append(c)
        w, c = torch_ms(L, NH, C, T, B, steps)
        tw.append(w)
        tc.append(c)
    m = statistics.median
    rw = m([t / c for t, c in zip(tw, cw)])
    rc = m([t / c for t, c in zip(tc, cc)])
    print(f"L{L}/C{C}/NH{NH}/T{T}/B{B}: wall ddpc {m(cw):.2f} ms/step, torch {m(tw):.2f}, "
          f"torch/ddpc {m(tw) / m(cw):.2f}x (per round {rw:.2f}x); CPU ddpc {m(cc):.2f} ms/step, "
          f"torch {m(tc):.2f}, torch/ddpc {m(tc) / m(cc):.2f}x (per round {rc:.2f}x)")
    print(f"  rounds (CPU ms): ddpc {', '.join(f'{v:.1f}' for v in cc)}; "
          f"torch {', '.join(f'{v:.1f}' for v in tc)}")
    for line in lines:
        print("  " + line)
