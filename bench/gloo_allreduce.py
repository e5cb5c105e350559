"""The PyTorch side of bench/allreduce.sh: median time per in-place torch.distributed.all_reduce
(gloo, CPU, float32 — or GLOO_DTYPE=float16 — sum) for each size in bytes given on the command
line. Started by the script with two processes; rendezvous through
MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
dtype = {"float32": torch.float32, "float16": torch.float16}[os.environ.get("GLOO_DTYPE", "float32")]
for arg in sys.argv[1:]:
    nbytes = int(arg)
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    buf = torch.arange(n, dtype=torch.float32).remainder_(13).add_(rank).to(dtype)
    iters = min(2000, max(5, (512 << 20) // (nbytes + 4096)))
    iters = min(iters, 300)  # gloo is slow; keep the run short
    for _ in range(3):
        dist.all_reduce(buf)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t0)
    med = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"gloo,{nbytes},{med.item() * 1e6:.2f}", flush=True)
dist.destroy_process_group()
