"""The PyTorch side of bench/gpt_vs_torch.sh: DistributedDataParallel (gloo, CPU) training the same
GPT-2-shaped model as ddptrain (tests/python/gpt_twin.py) with the same B, T, AdamW and random
token windows from the same file, one thread per process. Prints the median tokens/s over
windows of `window` steps after the first. Started with RANK/WORLD_SIZE/MASTER_* set.
precision bf16 runs the forward under torch.autocast("cpu", torch.bfloat16) (oneDNN's bf16
matmuls, fp32 master weights), PyTorch's CPU mixed precision.
usage: torch_gpt_train.py TOKENS.bin n_layer n_head n_embd block_size batch steps window [fp32|bf16]"""
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from gpt_twin import GPT, Config  # noqa: E402

path = sys.argv[1]
L, H, C, T, B, steps, window = (int(a) for a in sys.argv[2:9])
bf16 = len(sys.argv) > 9 and sys.argv[9] == "bf16"
torch.set_num_threads(1)
dist.init_process_group("gloo")
data = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
torch.manual_seed(1337)
model = GPT(Config(L, H, C, T, 256, 0.0, True))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = model.optimizer(3e-4, 0.1, (0.9, 0.95), 1e-8)
g = torch.Generator().manual_seed(1000 + dist.get_rank())
rates, t_last = [], time.perf_counter()
for step in range(1, steps + 1):
    ix = torch.randint(len(data) - T, (B,), generator=g)
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        _, loss = ddp(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step % window == 0:
        now = time.perf_counter()
        rates.append(window * B * T * dist.get_world_size() / (now - t_last))
        t_last = now
if dist.get_rank() == 0:
    print(f"tokens_per_s {statistics.median(rates[1:]):.1f} params {model.num_params()}", flush=True)
dist.destroy_process_group()
