"""The PyTorch side of bench/gpu_allreduce.sh: median time per in-place torch.distributed.all_reduce
on CUDA tensors (float32, sum) for each size in bytes on the command line, through the backend
named by TORCH_BACKEND (nccl: one process per GPU; gloo: several processes may share a GPU, staged
through host memory). Each process uses GPU LOCAL_RANK modulo the GPUs visible. Prints
NAME,bytes,µs on rank 0, NAME = torch_<backend>."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

backend = os.environ.get("TORCH_BACKEND", "nccl")
local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
torch.cuda.set_device(local % torch.cuda.device_count())
dist.init_process_group(backend)
rank = dist.get_rank()
for arg in sys.argv[1:]:
    nbytes = int(arg)
    buf = torch.arange(nbytes // 4, dtype=torch.float32, device="cuda").remainder_(13).add_(rank)
    iters = min(200, max(5, (4 << 30) // (nbytes + 4096)))
    for _ in range(3):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = torch.tensor([statistics.median(times)], dtype=torch.float64, device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"torch_{backend},{nbytes},{med.item() * 1e6:.2f}", flush=True)
dist.destroy_process_group()
