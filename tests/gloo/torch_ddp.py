"""A small DDP training run (CPU, backend="gloo"): its final parameters must be
identical on every rank; rank 0 writes them to argv[1] for comparison with the
same run over another transport. Nothing here names Conveyor: the test launches
it as `torchrun -m conveyor_gloo torch_ddp.py OUT` and as plain `torchrun`.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # same initial model everywhere (DDP broadcasts it anyway)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 4))
    ddp = DDP(model, bucket_cap_mb=1)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)  # different data per rank
    for _ in range(8):
        x = torch.randn(64, 32, generator=gen)
        y = torch.randn(64, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(every, flat)
    if not all(torch.equal(every[0], e) for e in every):
        raise AssertionError(f"rank {rank}: parameters differ between ranks")
    if rank == 0:
        torch.save(flat, sys.argv[1])
        print(f"DDP over {os.environ.get('GLOO_DEVICE_TRANSPORT', 'TCP')}: {flat.numel()} parameters, "
              f"identical on {n} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
