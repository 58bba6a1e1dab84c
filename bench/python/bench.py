#!/usr/bin/python3
"""Python per-operation overhead next to the C++ figures, in one run.

    bench/python/bench.py [--build build/release] [--runs 5] [--providers soft,shm] [--json]

Forks two processes per provider and run: a target (this script with
--serve) that allocates 16 MiB with every right and then only waits, and the
initiator (this process) that measures through the Python package. The same
run starts `conveyor perf --server` and its client for the C++ figures, with
the same settings. Runs are interleaved (Python, C++, Python, C++, ...) and
the table shows medians over the runs, min-max in brackets.

Measured, as `conveyor perf` does:
- 8 B READ round trip: post one READ, poll for its completion (spinning 5 us,
  then yielding the core on each idle turn, as perf does); 2000 timed after
  200 untimed; the run's median (perf: --test read --mode lat, its p50).
- 1 MiB READ / WRITE bandwidth: 16 requests outstanding, one posted per
  completion, yielding the core on idle polls, for --duration seconds (perf:
  --mode bw --tx-depth 16 --batch 1).
  A WRITE stream ends with an 8-byte READ, so every byte is placed when the
  clock stops.
- per-call cost of the binding: the cheapest bound call (RemoteRegion.slice,
  no library work), an empty cq.poll() (on soft it also runs the engine once);
  16 8-byte inline WRITEs
  (the last signaled) posted as one post_send([16 SendWr]) call against 16
  post_send(SendWr) calls, the batch's completion waited for each time.
Both sides use pd.allocate_memory, as perf does (on shm: direct mapping).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
REGION = 16 << 20
MIB = 1 << 20


def serve(provider, address):
    import conveyor

    dev = conveyor.Device.open(provider)
    pd = dev.alloc_pd()
    cq = dev.create_cq(64)
    mr = pd.allocate_memory(REGION, conveyor.ALL_ACCESS)
    msg = pd.allocate_memory(64, conveyor.Access.local_write)
    lis = conveyor.Listener.bind(dev, address or None)  # "": an ephemeral address
    print(lis.address, flush=True)
    qp = pd.create_qp(cq)
    qp.post_recv(msg, 1)
    lis.accept(30.0).accept(qp, mr.remote().encode())
    cq.wait(300.0, 1)  # the initiator's "done": until then the engine alone serves
    return 0


def spin_one(cq, spin_ns=5000):
    """The next completion: poll, spinning spin_ns, then yielding the core on
    every idle turn (conveyor perf's waiting, so both share the cores alike)."""
    now = time.perf_counter_ns
    poll = cq.poll
    t_spin = now() + spin_ns
    while True:
        wcs = poll(1)
        if wcs:
            wc = wcs[0]
            if not wc.ok:
                raise RuntimeError("completion failed: %r" % wc)
            return wc
        if now() > t_spin:
            os.sched_yield()


def read_lat(qp, cq, local, peer, iters=2000, warmup=200):
    sink = local.sge(0, 8)
    src = peer.slice(0, 8)
    post = qp.post_read
    now = time.perf_counter_ns
    samples = []
    for i in range(warmup + iters):
        t0 = now()
        post(sink, src, i)
        spin_one(cq)
        if i >= warmup:
            samples.append(now() - t0)
    return statistics.median(samples) / 1000.0


def bandwidth(conveyor, qp, cq, local, peer, opcode, size=MIB, depth=16, seconds=1.0):
    post = qp.post_read if opcode == "read" else qp.post_write
    n_slots = REGION // size
    outstanding = 0
    done = 0
    t_end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    k = 0
    while outstanding < depth:
        post(local.sge((k % n_slots) * size, size), peer.slice((k % n_slots) * size, size), k)
        k += 1
        outstanding += 1
    while True:
        wcs = cq.poll(depth)
        if not wcs:
            os.sched_yield()  # as perf's bandwidth loops: yield at once when idle
        for wc in wcs:
            if not wc.ok:
                raise RuntimeError("completion failed: %r" % wc)
            outstanding -= 1
            done += 1
        if time.perf_counter() < t_end:
            while outstanding < depth:
                post(local.sge((k % n_slots) * size, size), peer.slice((k % n_slots) * size, size), k)
                k += 1
                outstanding += 1
        elif outstanding == 0:
            break
    if opcode == "write":  # every byte placed when the clock stops
        qp.post_read(local.sge(0, 8), peer.slice(0, 8), 1 << 40)
        spin_one(cq)
    took = time.perf_counter() - t0
    return done * size / took / 1e6


def call_costs(conveyor, qp, cq, local, peer, reps=2000):
    from conveyor import SendFlags, SendWr, WrOpcode

    now = time.perf_counter_ns
    t0 = now()
    for _ in range(reps * 10):
        cq.poll()
    empty_poll = (now() - t0) / (reps * 10)
    t0 = now()
    for _ in range(reps * 10):
        peer.slice(0, 8)
    floor = (now() - t0) / (reps * 10)

    def wrs():
        out = []
        for k in range(16):
            out.append(SendWr(WrOpcode.rdma_write, local=local.sge(k * 8, 8), remote=peer.slice(k * 8, 8), wr_id=k,
                              flags=(SendFlags.signaled if k == 15 else SendFlags.none) | SendFlags.inline_data))
        return out

    batch = wrs()
    times_batch, times_single = [], []
    for r in range(reps):
        t0 = now()
        qp.post_send(batch)
        t1 = now()
        spin_one(cq)
        times_batch.append(t1 - t0)
        t0 = now()
        for w in batch:
            qp.post_send(w)
        t1 = now()
        spin_one(cq)
        times_single.append(t1 - t0)
    return {"empty_poll_ns": empty_poll, "call_floor_ns": floor,
            "post_16_one_call_us": statistics.median(times_batch) / 1000.0,
            "post_16_calls_us": statistics.median(times_single) / 1000.0}


def python_run(provider, duration):
    import conveyor

    # The target listens at an ephemeral address in its provider's syntax and prints it.
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", provider, ""],
                             stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        addr = child.stdout.readline().strip()
        dev = conveyor.Device.open(provider)
        pd = dev.alloc_pd()
        cq = dev.create_cq(256)
        qp = pd.create_qp(cq)
        peer = conveyor.RemoteRegion.decode(conveyor.connect(qp, addr, timeout=10.0).private_data)
        local = pd.allocate_memory(REGION, conveyor.Access.local_write)
        out = {"read_lat_us": read_lat(qp, cq, local, peer)}
        out["read_mb_s"] = bandwidth(conveyor, qp, cq, local, peer, "read", seconds=duration)
        out["write_mb_s"] = bandwidth(conveyor, qp, cq, local, peer, "write", seconds=duration)
        out.update(call_costs(conveyor, qp, cq, local, peer))
        done = pd.allocate_memory(8, conveyor.Access.local_write)
        qp.post_send_msg(done, 2)
        spin_one(cq)
        if child.wait(timeout=30) != 0:
            raise RuntimeError("the target failed")
        return out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def cxx_run(tool, provider, duration):
    # conveyor perf --server needs an address the client knows beforehand, in
    # the provider's syntax: one per provider this script runs.
    address = {"soft": "127.0.0.1:18600", "shm": "@cvy-cxxbench-%d" % os.getpid()}[provider]
    server = subprocess.Popen([tool, "perf", "--server", address, "--persistent", "-p", provider, "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)

        def client(*args):
            cmd = [tool, "perf", address, "-p", provider, "--json", "--quiet", *args]
            for attempt in range(20):
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                if r.returncode == 0:
                    return json.loads(r.stdout)["results"][0]
                time.sleep(0.2)  # the server may not listen yet
            raise RuntimeError("conveyor perf failed: %s\n%s" % (" ".join(cmd), r.stderr))

        lat = client("--test", "read", "--mode", "lat", "--size", "8", "--iters", "2000", "--warmup", "200")
        bw = {}
        for t in ("read", "write"):
            bw[t] = client("--test", t, "--mode", "bw", "--size", "1M", "--duration", str(duration),
                           "--tx-depth", "16", "--batch", "1")["mb_per_s"]
        return {"read_lat_us": lat["lat_us"]["p50"], "read_mb_s": bw["read"], "write_mb_s": bw["write"]}
    finally:
        server.kill()
        server.wait()


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", nargs=2, metavar=("PROVIDER", "ADDRESS"), help=argparse.SUPPRESS)
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per bandwidth measurement")
    ap.add_argument("--providers", default="soft,shm")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.serve:
        return serve(*a.serve)  # PYTHONPATH comes from the parent
    if os.environ.get("PYTHONPATH") is None:
        os.environ["PYTHONPATH"] = os.path.join(a.build, "python")
        sys.path.insert(0, os.environ["PYTHONPATH"])
    tool = os.path.join(a.build, "tools", "conveyor", "conveyor")
    providers = a.providers.split(",")
    res = {p: {"python": [], "cxx": []} for p in providers}
    for r in range(a.runs):
        for p in providers:
            res[p]["python"].append(python_run(p, a.duration))
            res[p]["cxx"].append(cxx_run(tool, p, a.duration))
        print("run %d/%d done" % (r + 1, a.runs), file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    load = os.getloadavg()
    print("runs %d, %.1f s per bandwidth measurement, load average %.2f %.2f %.2f"
          % (a.runs, a.duration, *load))
    print("%-6s %-28s %22s %22s %12s" % ("", "measurement", "Python", "C++ (conveyor perf)", "Python/C++"))
    for p in providers:
        for key, label, unit in (("read_lat_us", "8 B READ round trip", "us"),
                                 ("read_mb_s", "1 MiB READ bandwidth", "MB/s"),
                                 ("write_mb_s", "1 MiB WRITE bandwidth", "MB/s")):
            py = med([x[key] for x in res[p]["python"]])
            cx = med([x[key] for x in res[p]["cxx"]])
            print("%-6s %-28s %9.1f [%5.1f-%5.1f] %9.1f [%5.1f-%5.1f] %12.3f %s"
                  % (p, label, *py, *cx, py[0] / cx[0], unit))
        for key, label in (("call_floor_ns", "RemoteRegion.slice() (ns)"),
                           ("empty_poll_ns", "empty cq.poll() (ns)"),
                           ("post_16_one_call_us", "16 WRs, one post_send (us)"),
                           ("post_16_calls_us", "16 WRs, 16 post_send (us)")):
            v = med([x[key] for x in res[p]["python"]])
            print("%-6s %-28s %9.2f [%5.2f-%5.2f]" % (p, label, *v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
