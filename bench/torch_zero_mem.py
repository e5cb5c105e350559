"""The PyTorch side of bench/zero_memory.sh: DistributedDataParallel (gloo, CPU) training the GPT
twin (tests/python/gpt_twin.py) with AdamW, either plain (every rank keeps the whole optimizer
state) or through torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1: each rank keeps the
state of its partition of the parameters), for a few steps, then rank 0 saves one checkpoint
(model and optimizer state_dict: with ZeRO after consolidate_state_dict(to=0), as torch's docs
ask); each rank prints its peak RSS.
Started with RANK/WORLD_SIZE/MASTER_* set.
usage: torch_zero_mem.py TOKENS.bin n_layer n_head n_embd block_size batch steps zero(0|1) CKPT"""
import os
import resource
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from gpt_twin import GPT, Config  # noqa: E402

path = sys.argv[1]
L, H, C, T, B, steps, zero = (int(a) for a in sys.argv[2:9])
ckpt = sys.argv[9]
torch.set_num_threads(1)
dist.init_process_group("gloo")
data = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
torch.manual_seed(1337)
model = GPT(Config(L, H, C, T, 256, 0.0, True))
ddp = torch.nn.parallel.DistributedDataParallel(model)
if zero:
    # one parameter list (ZeroRedundancyOptimizer partitions it; weight decay as AdamW's default
    # group would have it: the memory is what is measured here)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                  lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
else:
    opt = model.optimizer(3e-4, 0.1, (0.9, 0.95), 1e-8)
g = torch.Generator().manual_seed(1000 + dist.get_rank())
for step in range(steps):
    ix = torch.randint(len(data) - T, (B,), generator=g)
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
    opt.zero_grad(set_to_none=True)
    _, loss = ddp(x, y)
    loss.backward()
    opt.step()
# one checkpoint, as a torch user writes it: with ZeRO the state is first consolidated on rank 0
if zero:
    opt.consolidate_state_dict(to=0)
if dist.get_rank() == 0:
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, ckpt)
    os.unlink(ckpt)
print(f"rank {dist.get_rank()} maxrss_kb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} "
      f"params {model.num_params()}", flush=True)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # torch 1.13's gloo worker can hang in the interpreter's exit (tests/python)
