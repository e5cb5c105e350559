"""A PyTorch program as torchrun users write one, run under ddprun by
tests/integration/test_torch_programs.sh: init_process_group from the environment (rank 0 hosts
torch's TCPStore on MASTER_PORT), gloo collectives, one DistributedDataParallel step, and the
store torch made. Prints one line per rank on success; any mismatch raises.

  torch_ddprun_worker.py [fail-first|nccl]   fail-first: rank 1 of attempt 0 exits 3 after
                                             init; nccl: backend nccl on GPU LOCAL_RANK
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    env = os.environ
    assert env["MASTER_PORT"] != env["DDP_STORE_PORT"], "MASTER_PORT is ddprun's store port"
    dev = torch.device("cpu")
    if mode == "nccl":
        dev = torch.device("cuda", int(env["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if mode == "nccl" else "gloo",
                            timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(env["RANK"]) and world == int(env["WORLD_SIZE"]), (rank, world)
    attempt = int(env["TORCHELASTIC_RESTART_COUNT"])
    if mode == "fail-first" and attempt == 0 and rank == 1:
        print(f"rank 1 of attempt 0 leaves (MASTER_PORT {env['MASTER_PORT']})", flush=True)
        sys.exit(3)

    t = torch.tensor([float(rank + 1)], device=dev)
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t
    b = torch.tensor([42.0 if rank == 0 else -1.0], device=dev)
    dist.broadcast(b, 0)
    assert b.item() == 42.0, b
    got = [torch.zeros(1, device=dev) for _ in range(world)]
    dist.all_gather(got, torch.tensor([float(rank)], device=dev))
    assert [g.item() for g in got] == [float(r) for r in range(world)], got

    # One DDP step: the averaged gradient is the mean of every rank's.
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1, bias=False).to(dev))
    x = torch.full((1, 3), float(rank + 1), device=dev)
    model(x).sum().backward()
    want = sum(r + 1 for r in range(world)) / world
    assert torch.allclose(model.module.weight.grad, torch.full((1, 3), want, device=dev)), model.module.weight.grad

    # torch's own store, the one init_process_group made on MASTER_PORT.
    store = dist.distributed_c10d._get_default_store()
    store.set(f"from{rank}", str(rank))
    dist.barrier()
    assert all(store.get(f"from{r}") == str(r).encode() for r in range(world))
    dist.barrier()
    print(f"torch rank {rank} of {world} ok (attempt {attempt}, MASTER_PORT {env['MASTER_PORT']})",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
