"""The PyTorch side of bench/train_vs_torch.sh: DistributedDataParallel (gloo, CPU) training the
same MLP or CNN as ddptrain on Fashion-MNIST, same per-rank batch, one thread per process,
SGD with momentum. Prints the median samples/s over windows of 50 steps (after a warm-up
window), like ddptrain's progress lines. Started by the script with RANK/WORLD_SIZE/MASTER_*."""
import gzip
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

kind, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo")
d = "/usr/share/datasets/fashion-mnist"
with gzip.open(f"{d}/train-images-idx3-ubyte.gz") as f:
    x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28).astype(np.float32) / 255
with gzip.open(f"{d}/train-labels-idx1-ubyte.gz") as f:
    y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
ds = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
if kind == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                          nn.ReLU(), nn.Linear(128, 10))
else:
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 7 * 7, 128),
                          nn.ReLU(), nn.Linear(128, 10))
model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sampler = DistributedSampler(ds, seed=42)
loader = DataLoader(ds, batch_size=batch, sampler=sampler, drop_last=True)
lossf = nn.CrossEntropyLoss()
rates, step, t_last = [], 0, time.perf_counter()
epoch = 0
while step < steps:
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        lossf(model(xb), yb).backward()
        opt.step()
        step += 1
        if step % 50 == 0:
            now = time.perf_counter()
            rates.append(50 * batch * dist.get_world_size() / (now - t_last))
            t_last = now
        if step >= steps:
            break
    epoch += 1
if dist.get_rank() == 0:
    print(f"samples_per_s {statistics.median(rates[1:]):.1f}", flush=True)
dist.destroy_process_group()
