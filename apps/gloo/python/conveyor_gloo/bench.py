"""Is conveyor-gloo faster than plain Gloo on this machine?

    python3 -m conveyor_gloo.bench -b 8 -e 64M -n 2

Starts -n ranks on this host for each transport: Gloo's TCP transport
(torch's default) and conveyor-gloo (CONVEYOR_GLOO_DEVICE as --device says;
default: unset, so shm between ranks on one host). At each size from -b to -e
(times -f) it runs torch all_reduce (sum, float32) over one, then the other,
alternating in --rounds rounds (the order swapped every round), so both see
the same machine at the same time and the ratio is fair. It prints one row per
size: the median time and bus bandwidth of each transport and the ratio
(gloo-tcp time / conveyor time: above 1, conveyor-gloo is faster).

Timing, as nccl-tests and bench/allreduce's MPI program: each iteration every
rank leaves a barrier and times one all_reduce; the iteration's time is the
slowest rank's; the median over the iterations is reported.
bus bandwidth = 2 (n-1)/n * bytes / time. Before timing, each size is checked
once (every rank gets the sum of 1..n); a wrong result stops the run.

    -b/--minbytes, -e/--maxbytes   8 .. 64M (K, M, G suffixes: powers of 1024)
    -f/--stepfactor                2
    --sizes 4096,65536,...         explicit sizes instead
    -n/--nproc                     ranks per transport (2)
    --iters                        timed iterations per size and transport (20)
    -w/--warmup                    untimed all_reduce calls first (3)
    --rounds                       alternations of the transports per size (4)
    --device soft,shm              one conveyor column per provider (default:
                                   auto, the per-pair choice)
    --format lines                 "label ranks bytes median_us busbw_GBps"
                                   (bench/allreduce/plot reads these)
    --hosts NS:IF,NS:IF            ranks on "hosts": rank r runs in network
                                   namespace NS of entry r % count (ip netns
                                   exec; root), with GLOO_SOCKET_IFNAME=IF, as
                                   users select the network on real hosts
                                   (bench/allreduce/two-hosts makes them)
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def size_name(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


# ---------------------------------------------------------------- a rank
def worker(label, rank, nproc, store, timeout_s):
    import datetime
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=nproc,
                            timeout=datetime.timedelta(seconds=timeout_s))
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    tensors = {}
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        nbytes, iters, warmup = int(cmd[1]), int(cmd[2]), int(cmd[3])
        t = tensors.get(nbytes)
        if t is None:
            tensors.clear()
            t = tensors[nbytes] = torch.empty(nbytes // 4)
            t.fill_(rank + 1)
            dist.all_reduce(t)
            want = nproc * (nproc + 1) / 2
            wrong = int((t != want).sum())
            if wrong:
                out.write(f"wrong {wrong}\n")
                out.flush()
                continue
        for _ in range(warmup):
            dist.all_reduce(t)
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        out.write("times " + " ".join(f"{x:.9f}" for x in times) + "\n")
        out.flush()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the driver
class Group:
    """The ranks of one transport, driven through their stdin/stdout."""

    def __init__(self, label, env, nproc, tmp, timeout_s, hosts=()):
        self.label = label
        store = os.path.join(tmp, label + ".store")
        self.procs = []
        for r in range(nproc):
            cmd = [sys.executable, "-m", "conveyor_gloo.bench", "--worker", label, str(r),
                   str(nproc), store, str(timeout_s)]
            renv = env
            if hosts:  # (namespace, interface): this rank's "host"
                ns, iface = hosts[r % len(hosts)]
                cmd = [shutil.which("ip") or "/usr/sbin/ip", "netns", "exec", ns] + cmd
                renv = {**env, "GLOO_SOCKET_IFNAME": iface}
            self.procs.append(subprocess.Popen(cmd, env=renv, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, text=True, bufsize=1))

    def wait_ready(self):
        for r in range(len(self.procs)):
            self.expect(r, "ready")

    def line(self, r):
        s = self.procs[r].stdout.readline()
        if not s:
            code = self.procs[r].wait()
            raise SystemExit(f"conveyor_gloo.bench: rank {r} over {self.label} exited "
                             f"(status {code}); its messages are above")
        return s.split()

    def expect(self, r, word):
        got = self.line(r)
        if got[:1] != [word]:
            raise SystemExit(f"conveyor_gloo.bench: rank {r} over {self.label} said {' '.join(got)}")
        return got

    def run(self, nbytes, iters, warmup):
        """Per-iteration times, each the slowest rank's."""
        for p in self.procs:
            p.stdin.write(f"run {nbytes} {iters} {warmup}\n")
            p.stdin.flush()
        per_rank = []
        for r in range(len(self.procs)):
            got = self.line(r)
            if got[0] == "wrong":
                raise SystemExit(f"conveyor_gloo.bench: {self.label}, {nbytes} bytes: rank {r} "
                                 f"got {got[1]} wrong elements")
            per_rank.append([float(x) for x in got[1:]])
        return [max(ts) for ts in zip(*per_rank)]

    def close(self):
        for p in self.procs:
            try:
                p.stdin.write("quit\n")
                p.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m conveyor_gloo.bench",
                                 description="torch all_reduce over Gloo TCP and conveyor-gloo, "
                                             "alternated in one run, one row per size")
    ap.add_argument("-b", "--minbytes", default="8")
    ap.add_argument("-e", "--maxbytes", default="64M")
    ap.add_argument("-f", "--stepfactor", type=int, default=2)
    ap.add_argument("--sizes", help="comma-separated sizes instead of -b/-e/-f")
    ap.add_argument("-n", "--nproc", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="auto",
                    help="conveyor provider(s): auto, soft, shm, verbs[:name]; comma-separated")
    ap.add_argument("--format", choices=["table", "lines"], default="table")
    ap.add_argument("--timeout", type=int, default=120, help="seconds (torch's gloo timeout)")
    ap.add_argument("--hosts", help="NS:IFACE,...: rank r runs in network namespace NS of entry "
                                    "r %% count with GLOO_SOCKET_IFNAME=IFACE (root)")
    a = ap.parse_args(argv)
    hosts = []
    for h in (a.hosts.split(",") if a.hosts else []):
        ns, sep, iface = h.partition(":")
        if not ns or not sep or not iface:
            ap.error(f"--hosts: {h!r} is not NAMESPACE:INTERFACE")
        hosts.append((ns, iface))
    if a.nproc < 2 or a.stepfactor < 2 or a.iters < 1 or a.rounds < 1:
        ap.error("needs -n >= 2, -f >= 2, --iters >= 1, --rounds >= 1")
    if a.sizes:
        sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    else:
        sizes, s = [], max(4, parse_size(a.minbytes))
        while s <= parse_size(a.maxbytes):
            sizes.append(s)
            s *= a.stepfactor
    sizes = [max(4, s // 4 * 4) for s in sizes]  # float32 elements

    base = dict(os.environ)
    base["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(_HERE)] + [p for p in [base.get("PYTHONPATH")] if p])
    base.setdefault("OMP_NUM_THREADS", "1")
    transports = [("gloo-tcp", {"GLOO_DEVICE_TRANSPORT": "TCP"})]
    for d in a.device.split(","):
        env = {"GLOO_DEVICE_TRANSPORT": "CONVEYOR"}
        if d != "auto":
            env["CONVEYOR_GLOO_DEVICE"] = d
        transports.append(("conveyor" if d == "auto" else "conveyor-" + d, env))
    if a.device == "auto":
        base.pop("CONVEYOR_GLOO_DEVICE", None)

    # iterations per round: --iters in all, spread over the rounds
    rounds = min(a.rounds, a.iters)
    per_round = [a.iters // rounds + (1 if i < a.iters % rounds else 0) for i in range(rounds)]
    n = a.nproc
    tmp = tempfile.mkdtemp(prefix="conveyor-gloo-bench-")
    groups = []
    try:
        for label, extra in transports:
            groups.append(Group(label, {**base, **extra}, n, tmp, a.timeout, hosts))
        for g in groups:  # all started at once: their imports and rendezvous overlap
            g.wait_ready()
        labels = [g.label for g in groups]
        if a.format == "table":
            auto = " (CONVEYOR_GLOO_DEVICE unset: shm between ranks on one host)" \
                if a.device == "auto" else ""
            where = f"on {len(hosts)} hosts (network namespaces {', '.join(h[0] for h in hosts)})" \
                if hosts else "on this host"
            print(f"# conveyor_gloo.bench: torch all_reduce (sum, float32), {n} ranks {where}, "
                  f"{' vs '.join(labels)}{auto}")
            print(f"# median of {a.iters} iterations per size and transport, alternated in {rounds} "
                  f"rounds; time in us, busbw in GB/s; ratio = gloo-tcp time / conveyor time")
            # nccl-tests' layout: one time/busbw column pair per transport
            top = " " * 21 + "".join(f" {l:^17}" for l in labels)
            head = f"{'size':>10} {'count':>10}" + f" {'time(us)':>9} {'busbw':>7}" * len(labels)
            for l in labels[1:]:
                head += f" {'ratio' if len(labels) == 2 else 'ratio ' + l[9:]:>10}"
            print("#" + top[1:].rstrip())
            print("#" + head[1:], flush=True)
        for nbytes in sizes:
            times = {l: [] for l in labels}
            for i, k in enumerate(per_round):
                order = groups if i % 2 == 0 else groups[::-1]
                for g in order:
                    times[g.label] += g.run(nbytes, k, a.warmup if i == 0 else 0)
            med = {l: statistics.median(ts) for l, ts in times.items()}
            bw = {l: 2 * (n - 1) / n * nbytes / med[l] / 1e9 for l in labels}
            if a.format == "lines":
                for l in labels:
                    print(f"{l} {n} {nbytes} {med[l] * 1e6:.1f} {bw[l]:.3f}", flush=True)
                continue
            row = f"{size_name(nbytes):>10} {nbytes // 4:>10}"
            for l in labels:
                row += f" {med[l] * 1e6:>9.1f} {bw[l]:>7.3f}"
            for l in labels[1:]:
                row += f" {med['gloo-tcp'] / med[l]:>10.2f}"
            print(row, flush=True)
    finally:
        for g in groups:
            g.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, label, rank, nproc, store, timeout_s = sys.argv
        worker(label, int(rank), int(nproc), store, int(timeout_s))
    else:
        main()
