"""The cost of torch's uneven-input support (DDP's model.join()) per step, for
bench/join_overhead.sh: LAYERS parameters of COUNT float32 each under DistributedDataParallel
(gloo, buckets of CAP bytes), a backward whose gradients are x, STEPS timed steps after 5 warm-up
ones, with or without `with model.join():`. Prints, on rank 0, the slower rank's median ms per
step. Run under a launcher that sets torchrun's variables (ddprun or torchrun).
    python3 join_torch.py LAYERS COUNT STEPS CAP_BYTES join|nojoin"""
import faulthandler
import os
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Layers(torch.nn.Module):
    def __init__(self, layers, count):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(count)) for _ in range(layers)])

    def forward(self, x):
        return sum((p * x).sum() for p in self.ps)


def main():
    faulthandler.dump_traceback_later(300, exit=True)  # a deadline: a hang ends the run
    layers, count, steps, cap = (int(a) for a in sys.argv[1:5])
    join = sys.argv[5] == "join"
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = DDP(Layers(layers, count), bucket_cap_mb=cap / 2**20)
    x = torch.arange(count, dtype=torch.float32) % 17 * 0.01
    ms = []
    with model.join() if join else nullcontext():
        for s in range(5 + steps):
            dist.barrier()
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=False)
            model(x).backward()
            if s >= 5:
                ms.append((time.perf_counter() - t0) * 1e3)
    med = torch.tensor([statistics.median(ms)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"{med.item():.3f}")
    dist.destroy_process_group()
    # torch 1.13's gloo worker sometimes hangs in the interpreter's exit after everything is done
    # (tests/python/test_join_torch.py saw it 1 run in 4): leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
