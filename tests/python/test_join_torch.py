"""Uneven inputs against torch's own: ranks with different numbers of batches, ddpc's
ddp_reducer_set_join/ddp_reducer_join (tests/integration/joincheck.c --dump) and torch's
DistributedDataParallel under `with model.join():` (gloo), 3 ranks, two epochs (rank q has
1 + 2q batches, then 2 + (2 - q)), SGD: the final parameters must agree, dividing by the world
size (torch's default) and by the ranks still training (divide_by_initial_world_size=False).
torch's joined ranks do not step and get the last joiner's parameters at the end; ddpc's step
with the mean they receive: the same values either way.
Usage: test_join_torch.py BINDIR  (needs Debian's python3-torch)"""
import datetime
import faulthandler
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

NP, COUNT, LR, W = 4, 600, np.float32(1e-3), 3


def gval(q, e, s, i):
    """joincheck.c's gval(q, e, s, 0, i, k) for every k, in the same uint32 and float32 steps."""
    k = np.arange(COUNT, dtype=np.uint64)
    h = np.uint64(q * 7919 + e * 3571 + s * 104729 + i * 15485863) ^ ((k * 2654435761) & 0xFFFFFFFF)
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(13)
    v = (h % np.uint64(2000001)).astype(np.float32) / np.float32(1000.0)
    return v - np.float32(1000.0) + np.float32(1.0) / np.float32(3.0)


def batches(e, q):
    return 1 + 2 * q if e == 0 else 2 + (W - 1 - q)


class Params(torch.nn.Module):
    def __init__(self):
        super().__init__()
        init = [np.array([((i * 31 + k) % 17) * 0.125 - 1.0 for k in range(COUNT)], np.float32)
                for i in range(NP)]
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.from_numpy(a)) for a in init])

    def forward(self, gs):  # d(loss)/d(p_i) = gs[i]: the gradient joincheck writes
        return sum((p * g).sum() for p, g in zip(self.ps, gs))


def worker(rank, store_dir, by_world, out):
    faulthandler.dump_traceback_later(60, exit=True)  # a deadline: never a hang
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank,
                            world_size=W, timeout=datetime.timedelta(seconds=30))
    model = DDP(Params())
    opt = torch.optim.SGD(model.parameters(), lr=float(LR))
    for e in range(2):
        with model.join(divide_by_initial_world_size=by_world):
            for s in range(batches(e, rank)):
                opt.zero_grad()
                model([torch.from_numpy(gval(rank, e, s, i)) for i in range(NP)]).backward()
                opt.step()
    if rank == 0:
        np.save(out, np.concatenate([p.detach().numpy() for p in model.module.ps]))
    dist.destroy_process_group()
    # torch 1.13's gloo worker sometimes hangs in the interpreter's exit, after everything is
    # done (seen 1 run in 4 here): leave at once.
    sys.stdout.flush()
    os._exit(0)


def main():
    bindir = sys.argv[1]
    bad = 0
    with tempfile.TemporaryDirectory(prefix="ddp-join-torch-") as tmp:
        for by_world in (True, False):
            ours = os.path.join(tmp, "ours.bin")
            cmd = [os.path.join(bindir, "ddprun"), "--standalone", f"--nproc_per_node={W}",
                   os.path.join(bindir, "joincheck"), "--dump", ours]
            print(f"ddpc: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd + ([] if by_world else ["--by-ranks"]), check=True,
                           stdout=subprocess.DEVNULL, timeout=60)
            a = np.fromfile(ours, np.float32)
            theirs = os.path.join(tmp, "theirs.npy")
            store = tempfile.mkdtemp(dir=tmp)
            print("torch: 3 processes, gloo", flush=True)
            mp.spawn(worker, args=(store, by_world, theirs), nprocs=W, join=True)
            b = np.load(theirs)
            d = float(np.max(np.abs(a - b) / (1.0 + np.abs(b))))
            init = np.concatenate([p.detach().numpy() for p in Params().ps])
            moved = float(np.max(np.abs(b - init)))
            name = "world size" if by_world else "ranks training"
            print(f"divided by the {name}: max relative difference {d:.3g} "
                  f"(parameters moved up to {moved:.3g})")
            if a.shape != b.shape or d > 1e-6:
                print(f"FAIL: divided by the {name}: ddpc and torch differ by {d:.3g} (limit 1e-6)")
                bad += 1
    print("join parity: " + ("FAILED" if bad else "ddpc's parameters equal torch's"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
