"""torch.distributed's CPU collectives with backend="gloo" over conveyor-gloo.

Launched by torchrun (tests/gloo/CMakeLists.txt). `import conveyor_gloo` loads
the transport and sets GLOO_DEVICE_TRANSPORT=CONVEYOR; CONVEYOR_GLOO_DEVICE
picks soft or shm. Every result is compared with what the ranks' inputs imply.
"""
import datetime
import os
import sys

import conveyor_gloo  # noqa: F401  (must come before init_process_group)
import torch
import torch.distributed as dist


def main():
    assert os.environ["GLOO_DEVICE_TRANSPORT"] == "CONVEYOR"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    checks = 0

    def check(ok, what):
        nonlocal checks
        checks += 1
        if not ok:
            raise AssertionError(f"rank {rank}: {what}")

    def inp(r, size, dtype=torch.float32):
        return (torch.arange(size, dtype=torch.float32) % 7 + 1).mul(r + 1).to(dtype)

    sizes = [0, 1, 1000, 70000, 1 << 20]
    for size in sizes:
        for dtype in (torch.float32, torch.float16, torch.float64, torch.int32):
            if dtype == torch.float16 and size > 70000:
                continue
            t = inp(rank, size, dtype)
            dist.all_reduce(t)
            want = sum(inp(r, size, torch.float64) for r in range(n)).to(dtype)
            check(torch.equal(t, want), f"all_reduce sum {dtype} {size}")
        for op, fn in ((dist.ReduceOp.MAX, torch.maximum), (dist.ReduceOp.MIN, torch.minimum),
                       (dist.ReduceOp.PRODUCT, torch.mul)):
            t = inp(rank, size)
            dist.all_reduce(t, op=op)
            want = inp(0, size)
            for r in range(1, n):
                want = fn(want, inp(r, size))
            check(torch.equal(t, want), f"all_reduce {op} {size}")
        for root in range(n):
            t = inp(rank, size) if rank == root else torch.full((size,), -1.0)
            dist.broadcast(t, src=root)
            check(torch.equal(t, inp(root, size)), f"broadcast {root} {size}")
        if size == 0:
            continue  # torch 1.13's gather-type collectives die of SIGFPE on empty tensors over Gloo's TCP too
        out = [torch.empty(size) for _ in range(n)]
        dist.all_gather(out, inp(rank, size))
        check(all(torch.equal(out[r], inp(r, size)) for r in range(n)), f"all_gather {size}")
        t = inp(rank, size)
        dist.reduce(t, dst=n - 1)
        if rank == n - 1:
            check(torch.equal(t, sum(inp(r, size) for r in range(n))), f"reduce {size}")
        g = [torch.empty(size) for _ in range(n)] if rank == 0 else None
        dist.gather(inp(rank, size), gather_list=g, dst=0)
        if rank == 0:
            check(all(torch.equal(g[r], inp(r, size)) for r in range(n)), f"gather {size}")
        s = torch.empty(size)
        dist.scatter(s, scatter_list=[inp(r, size) for r in range(n)] if rank == 0 else None, src=0)
        check(torch.equal(s, inp(rank, size)), f"scatter {size}")
        # all_to_all_single: block j of rank i goes to rank j.
        per = max(size // n, 1)
        src = torch.cat([torch.full((per,), float(rank * 100 + j)) for j in range(n)])
        dst = torch.empty(per * n)
        dist.all_to_all_single(dst, src)
        want = torch.cat([torch.full((per,), float(j * 100 + rank)) for j in range(n)])
        check(torch.equal(dst, want), f"all_to_all_single {size}")

    # Async work: several collectives in flight at once, then waited for.
    works, tensors = [], []
    for k in range(4):
        t = inp(rank, 5000 + k)
        tensors.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    bt = inp(rank, 3000) if rank == 0 else torch.zeros(3000)
    works.append(dist.broadcast(bt, src=0, async_op=True))
    for w in works:
        w.wait()
        check(w.is_completed(), "work completed")
    for k, t in enumerate(tensors):
        check(torch.equal(t, sum(inp(r, 5000 + k) for r in range(n))), f"async all_reduce {k}")
    check(torch.equal(bt, inp(0, 3000)), "async broadcast")
    fut = dist.all_reduce(inp(rank, 10), async_op=True).get_future()
    fut.wait()

    # Point to point: send/recv, isend/irecv, and recv from any source.
    if rank == 0:
        seen = set()
        for _ in range(n - 1):
            t = torch.empty(2000)
            src = dist.recv(t)  # any source
            check(src not in seen and torch.equal(t, inp(src, 2000)), f"recv from any ({src})")
            seen.add(src)
        reqs = [dist.isend(inp(0, 100000), dst=r) for r in range(1, n)]
        for q in reqs:
            q.wait()
    else:
        dist.send(inp(rank, 2000), dst=0)
        t = torch.empty(100000)
        dist.irecv(t, src=0).wait()
        check(torch.equal(t, inp(0, 100000)), "irecv")

    # Objects (pickled, through broadcast and all_gather of bytes).
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "x": [rank] * 3})
    check(objs == [{"rank": r, "x": [r] * 3} for r in range(n)], "all_gather_object")
    lst = [{"from": 0}] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    check(lst == [{"from": 0}], "broadcast_object_list")

    dist.barrier()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)

    # Collectives in a new group of a subset of ranks.
    if n > 2:
        sub = dist.new_group([0, n - 1])
        if rank in (0, n - 1):
            t = inp(rank, 100)
            dist.all_reduce(t, group=sub)
            check(torch.equal(t, inp(0, 100) + inp(n - 1, 100)), "subgroup all_reduce")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {checks} checks passed on {os.environ.get('CONVEYOR_GLOO_DEVICE', 'default')}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a clear failure instead of a hang of the others
        print(f"FAILED: {e!r}", file=sys.stderr)
        raise
