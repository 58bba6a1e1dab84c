"""torch all_reduce over conveyor-gloo between two "hosts": two ranks in two
network namespaces joined by a veth pair, as users run it on two machines.

    torch_netns.py ifname    GLOO_SOCKET_IFNAME=<the rank's veth end>, per rank
    torch_netns.py default   no interface named: the host's name resolves to
                             loopback here, which must never be advertised
    torch_netns.py lo        GLOO_SOCKET_IFNAME=lo: a loopback address cannot
                             reach the other host; both ranks must fail at
                             once, saying so, instead of timing out

Namespace A holds 10.213.7.1/24, namespace B 10.213.7.2/24, assigned to the
veth ends inside the namespaces this test creates (names include the pid);
they are deleted at the end, also on failure. Rank 0 runs in A (and hosts
torch's TCPStore there), rank 1 in B; the ranks differ in network namespace,
so conveyor-gloo picks soft (TCP) between them. Every result is compared with
what the inputs imply. Needs root and `ip`: otherwise it says why and exits 77
(ctest: skipped).
"""
import datetime
import os
import shutil
import subprocess
import sys

SKIP = 77
ADDR = {"a": "10.213.7.1", "b": "10.213.7.2"}
PORT = 29517  # inside namespace A only


def worker(rank):
    import conveyor_gloo  # noqa: F401  (before init_process_group)
    import torch
    import torch.distributed as dist

    assert os.environ["GLOO_DEVICE_TRANSPORT"] == "CONVEYOR"
    dist.init_process_group("gloo", init_method=f"tcp://{ADDR['a']}:{PORT}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=20))

    def inp(r, n):
        return (torch.arange(n, dtype=torch.float32) % 7 + 1).mul(r + 1)

    for n in (1, 1000, 1 << 20):  # 1 Mi floats: RDMA WRITE, not the staging copy
        t = inp(rank, n)
        dist.all_reduce(t)
        if not torch.equal(t, inp(0, n) + inp(1, n)):
            raise AssertionError(f"rank {rank}: all_reduce of {n} floats gave wrong sums")
    t = torch.full((64,), float(rank + 5))
    dist.broadcast(t, src=1)
    if not torch.equal(t, torch.full((64,), 6.0)):
        raise AssertionError(f"rank {rank}: broadcast from rank 1 gave {t[0].item()}")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: all_reduce and broadcast across the veth pair correct", flush=True)


def sh(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=20)


def main(mode):
    if os.geteuid() != 0:
        print("SKIPPED: two network namespaces need root", flush=True)
        return SKIP
    ip = shutil.which("ip") or "/usr/sbin/ip"
    if not os.path.exists(ip):
        print("SKIPPED: no `ip` (iproute2) here", flush=True)
        return SKIP
    tag = str(os.getpid())
    ns = {s: f"cvgloo-{tag}-{s}" for s in "ab"}
    veth = {s: f"cvg{tag[-7:]}{s}" for s in "ab"}
    made = []
    try:
        for s in "ab":
            r = sh(ip, "netns", "add", ns[s])
            if r.returncode != 0:
                print(f"SKIPPED: cannot create a network namespace here: {r.stderr.strip()}",
                      flush=True)
                return SKIP
            made.append(ns[s])
        r = sh(ip, "link", "add", veth["a"], "type", "veth", "peer", "name", veth["b"])
        if r.returncode != 0:
            print(f"SKIPPED: cannot create a veth pair here: {r.stderr.strip()}", flush=True)
            return SKIP
        for s in "ab":
            for cmd in (["link", "set", veth[s], "netns", ns[s]],
                        ["-n", ns[s], "addr", "add", ADDR[s] + "/24", "dev", veth[s]],
                        ["-n", ns[s], "link", "set", veth[s], "up"],
                        ["-n", ns[s], "link", "set", "lo", "up"]):
                r = sh(ip, *cmd)
                if r.returncode != 0:
                    print(f"FAILED: ip {' '.join(cmd)}: {r.stderr.strip()}", flush=True)
                    return 1
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.pop("CONVEYOR_GLOO_DEVICE", None)  # the default choice: soft between hosts
        env.pop("GLOO_SOCKET_IFNAME", None)
        procs = []
        for rank, s in enumerate("ab"):
            e = dict(env)
            if mode != "default":
                e["GLOO_SOCKET_IFNAME"] = veth[s] if mode == "ifname" else "lo"
            procs.append(subprocess.Popen(
                [ip, "netns", "exec", ns[s], "/usr/bin/python3", os.path.abspath(__file__),
                 "--worker", str(rank)], env=e, stderr=subprocess.PIPE, text=True))
        failed = 0
        for rank, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=90)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                rc = "hung (killed after 90 s)"
            sys.stderr.write(err[-3000:])
            if mode == "lo":
                # The 20 s context timeout would say "timed out": the check must come first.
                if rc == 0 or "listens on a loopback address" not in err:
                    print(f"FAILED: rank {rank} ({rc}) did not refuse the loopback address",
                          flush=True)
                    failed += 1
            elif rc != 0:
                print(f"FAILED: rank {rank}: {rc}", flush=True)
                failed += 1
        print(f"{'FAILED' if failed else 'passed'}: torch over conveyor-gloo across two network "
              f"namespaces ({mode})", flush=True)
        return 1 if failed else 0
    finally:
        for n in made:
            sh(ip, "netns", "del", n)  # takes the veth end inside it, and so the pair
        sh(ip, "link", "del", veth["a"])  # still here only if it never moved


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]))
        sys.exit(0)
    if len(sys.argv) != 2 or sys.argv[1] not in ("ifname", "default", "lo"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
