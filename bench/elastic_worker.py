# A worker for bench/elastic_reform.sh, the same under ddprun and torchrun: joins the gloo group
# of its round (env://), prints "world W at T" (T: time.time()), then allreduces a small tensor
# every 20 ms until its launcher stops it; a lost peer ends it with exit 1, as a training job
# would, so that its launcher restarts the group.
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=30))
print(f"world {dist.get_world_size()} rank {dist.get_rank()} at {time.time():.3f}", flush=True)
t = torch.ones(16)
try:
    while True:
        dist.all_reduce(t)
        t.fill_(1)
        time.sleep(0.02)
except Exception as e:  # a peer is gone
    print(f"lost a peer: {e}", file=sys.stderr, flush=True)
    sys.exit(1)
