"""torch.distributed all_reduce bus bandwidth over backend="gloo" (launched by
bench/allreduce/run under torchrun). Per size: warm-up, then REPS timed
all_reduce calls, each started together (barrier) and timed on every rank; an
iteration's time is the slowest rank's, the reported time the median.
bus bandwidth = 2(n-1)/n * bytes / time (the nccl-tests definition).
Prints one line per size: label ranks bytes median_us busbw_GBps
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--label", required=True)
p.add_argument("--sizes", default="4096,65536,1048576,4194304,16777216,67108864")
p.add_argument("--reps", type=int, default=10)
a = p.parse_args()
if os.environ.get("GLOO_DEVICE_TRANSPORT") == "CONVEYOR":
    import conveyor_gloo  # noqa: F401
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
for nbytes in (int(s) for s in a.sizes.split(",")):
    t = torch.ones(nbytes // 4)
    reps = a.reps if nbytes >= (16 << 20) else a.reps * 3
    for _ in range(3):
        dist.all_reduce(t)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(float(dt))
    med = statistics.median(times)
    if rank == 0:
        print(f"{a.label} {n} {nbytes} {med * 1e6:.1f} {2 * (n - 1) / n * nbytes / med / 1e9:.3f}", flush=True)
dist.destroy_process_group()
