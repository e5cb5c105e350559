"""DistributedSampler parity: ddpc's sampler must give exactly torch's indices over a grid of
dataset sizes, world sizes, ranks, seeds, epochs, shuffle and drop_last; and the exact
evaluation mode must cover every sample exactly once across ranks.
Usage: test_sampler.py BINDIR  (runs BINDIR/sampler_dump; needs Debian's python3-torch)"""
import itertools
import subprocess
import sys

from torch.utils.data import DistributedSampler


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


configs = []
for n, w, shuffle, seed, epoch, drop in itertools.product(
        [0, 1, 2, 5, 7, 10, 64, 1000, 60000], [1, 2, 3, 4, 8], [False, True], [0, 42, 2**33 + 5],
        [0, 1, 7], [False, True]):
    if not shuffle and (seed or epoch):
        continue
    for r in range(w):
        configs.append((n, w, r, shuffle, seed, epoch, drop))

lines = "".join(f"{n} {w} {r} {int(sh)} {seed} {ep} {int(dl)} 0\n" for n, w, r, sh, seed, ep, dl in configs)
out = subprocess.run([sys.argv[1] + "/sampler_dump"], input=lines, capture_output=True, text=True,
                     check=True).stdout.split("\n")
bad = 0
for cfg, line in zip(configs, out):
    n, w, r, sh, seed, ep, dl = cfg
    s = DistributedSampler(Sized(n), num_replicas=w, rank=r, shuffle=sh, seed=seed, drop_last=dl)
    s.set_epoch(ep)
    want = list(s)
    got = [int(x) for x in line.split()]
    if got != want:
        bad += 1
        if bad <= 5:
            print(f"MISMATCH N={n} W={w} rank={r} shuffle={sh} seed={seed} epoch={ep} "
                  f"drop_last={dl}:\n  torch {want[:20]}\n  ddpc  {got[:20]}")
print(f"sampler parity: {len(configs) - bad} of {len(configs)} configurations identical to torch")

# Exact mode: a partition of the epoch's order, every sample once.
exact = []
for n, w, seed, ep in itertools.product([0, 1, 7, 10, 1001], [1, 2, 3, 8], [0, 3], [0, 2]):
    exact.append((n, w, seed, ep))
lines = "".join(f"{n} {w} {r} 1 {seed} {ep} 0 1\n" for n, w, seed, ep in exact for r in range(w))
out = iter(subprocess.run([sys.argv[1] + "/sampler_dump"], input=lines, capture_output=True,
                          text=True, check=True).stdout.split("\n"))
for n, w, seed, ep in exact:
    seen = []
    for r in range(w):
        seen += [int(x) for x in next(out).split()]
    if sorted(seen) != list(range(n)):
        bad += 1
        print(f"EXACT MODE BROKEN N={n} W={w}: {len(seen)} indices, {len(set(seen))} distinct")
print(f"exact mode: {len(exact)} configurations checked")
print(f"{len(configs) + len(exact) - bad} passed, {bad} failed")
sys.exit(1 if bad else 0)
