"""The torchrun side of bench/launch.sh: 4 ranks meet and leave, the same job as hello_world.

mode 'store': through torchrun's TCPStore only (an add, then wait for the last arriver), the
              like-for-like comparison with ddprun + hello_world;
mode 'pg':    init_process_group("gloo") + barrier, what PyTorch scripts usually do.
"""
import os
import sys
from datetime import timedelta

import torch.distributed as dist

mode = sys.argv[1] if len(sys.argv) > 1 else "store"
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if mode == "store":
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          False, timedelta(seconds=60))
    if store.add("arrived", 1) == world:
        store.set("done", "1")
    store.wait(["done"])
else:
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
if rank == 0:
    print(f"met {world}")
