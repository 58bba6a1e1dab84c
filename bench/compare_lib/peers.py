"""One measurement per peer for bench/compare: raw TCP (conveyor-baseline), libfabric (conveyor-fi-
bench), UCX (ucx_perftest), Conveyor (conveyor perf) and the machine's limits.
"""
import json
import os
import shutil
import subprocess
import time

from compare_lib.common import BASELINE, CONVEYOR, FIBENCH, MIB, NA
from compare_lib.procs import SERVERS, Server, run_client


def pinned(cpu, cmd):
    return ["taskset", "-c", str(cpu)] + cmd if cpu is not None and shutil.which("taskset") else cmd


def cpu_per_gb(r):
    c = r.get("cpu") or {}
    tot = sum(c.get(k, 0.0) for k in ("user_s", "sys_s", "peer_user_s", "peer_sys_s"))
    b = r.get("mb_per_s", 0) * 1e6 * r.get("seconds", 0)
    return tot / (b / 1e9) if b > 0 else None


def lat_rtt(r):
    return (r.get("lat_us") or {}).get("p50")


class Ctx:
    def __init__(self, args, env, pin, port_base):
        self.args, self.env, self.pin = args, env, pin
        self.cpu_cli, self.cpu_srv = pin
        self.port_base = port_base
        self.ucx_port = port_base + 50
        self.servers = {}
        self.cache = {}
        self.sizes = []
        self.lat_sweep = False

    def server(self, key, cmd, env=None, settle=0.15):
        if key not in self.servers:
            s = Server(cmd, env, settle)
            SERVERS.append(s)
            self.servers[key] = s
        return self.servers[key].ensure()

    def close(self):
        for s in self.servers.values():
            s.stop()


def m_tcp(ctx, test, size, poll="busy", conns=1):
    a = ctx.args
    port = ctx.port_base + 1
    ctx.server("tcp", ctx.env.srv(pinned(ctx.cpu_srv, [BASELINE, "tcp-server", "--bind", f"{ctx.env.srv_ip}:{port}"])))
    cmd = [BASELINE, "tcp", f"{ctx.env.srv_ip}:{port}", "--test", test, "--size", str(size),
           "--duration", str(a.duration)]
    cmd += ["--poll", poll]
    if test == "pingpong":
        cmd += ["--iters", str(a.lat_iters)]
    if conns > 1:
        cmd += ["--conns", str(conns)]
    out, _, _ = run_client(ctx.env.cli(pinned(ctx.cpu_cli, cmd)), timeout=a.timeout)
    return json.loads(out.strip().splitlines()[-1])


def m_fi(ctx, prov, test, mode, size):
    """One conveyor-fi-bench process per (provider, test, mode) and run, for all the sizes (its start-up is slow)."""
    key = (ctx.args._run, prov, test, mode)
    if key not in ctx.cache:
        sizes = [s for s in ctx.sizes
                 if mode == "bw" or s == 8 or (mode == "lat" and test == "write" and prov == "tcp" and ctx.lat_sweep)]
        ctx.cache[key] = fi_sizes(ctx, prov, test, mode, sizes)
    got = ctx.cache[key]
    if size not in got:
        raise NA(got.get("error", "not measured"))
    return got[size]


def fi_sizes(ctx, prov, test, mode, sizes):
    a = ctx.args
    if not os.path.exists(FIBENCH):
        return {"error": "conveyor-fi-bench not built (apt install libfabric-dev)"}
    port = ctx.port_base + 2
    try:
        ctx.server("fi", ctx.env.srv(pinned(ctx.cpu_srv, [FIBENCH, "--server", "--bind", f"{ctx.env.srv_ip}:{port}"])))
    except NA as x:
        return {"error": str(x)}
    cmd = [FIBENCH, f"{ctx.env.srv_ip}:{port}", "--provider", prov, "--test", test, "--mode", mode,
           "--size", ",".join(map(str, sizes)), "--duration", str(a.duration),
           "--iters", str(a.lat_iters if mode == "lat" else 10**9)]
    if prov != "shm":
        cmd += ["--src", ctx.env.cli_ip]
    got = {}
    try:
        out, _, _ = run_client(ctx.env.cli(pinned(ctx.cpu_cli, cmd)), timeout=a.timeout * len(sizes))
    except NA as x:
        return {"error": str(x)}
    for line in out.strip().splitlines():
        r = json.loads(line)
        got[r["size"]] = r
    return got


UCX_TESTS = {("write", "bw"): "ucp_put_bw", ("read", "bw"): "ucp_get", ("write", "lat"): "ucp_put_lat",
             ("read", "lat"): "ucp_get", ("write", "rate"): "ucp_put_bw"}


def m_ucx(ctx, tls, test, mode, size):
    """ucx_perftest, one test per server process. Latency: its ping-pong (put_lat) reports half the
    round trip, doubled here; its get latency is the time per get (a round trip)."""
    a = ctx.args
    if not shutil.which("ucx_perftest"):
        raise NA("no ucx_perftest (apt install ucx-utils)")
    env = dict(os.environ, UCX_TLS=tls, UCX_WARN_UNUSED_ENV_VARS="n")
    srv_env, cli_env = dict(env), dict(env)
    if tls == "tcp":
        srv_env["UCX_NET_DEVICES"], cli_env["UCX_NET_DEVICES"] = ctx.env.dev_srv, ctx.env.dev_cli
    ctx.ucx_port = ctx.ucx_port + 1 if ctx.ucx_port < ctx.port_base + 99 else ctx.port_base + 50
    port = ctx.ucx_port
    if mode == "bw":
        n = max(3, min(a.ucx_rate_iters, a.ucx_bytes // size))
        if test == "read" and tls == "tcp":
            n = min(n, 500)  # UCX 1.13 emulates get over TCP: about a millisecond each
        w = max(1, n // 10)
    elif mode == "rate":
        n, w = a.ucx_rate_iters, 1000
    else:
        n = max(5, min(a.lat_iters, a.ucx_bytes // (8 * size)))
        if test == "read":
            n = min(n, 200)  # UCX 1.13 emulates get over TCP: about a millisecond each
        if ctx.cpu_cli == ctx.cpu_srv:
            n = min(n, 200)  # sharing a core, ucx_perftest's spinning costs a scheduler tick per round trip
        w = max(2, n // 10)
    cmd = ["ucx_perftest", ctx.env.srv_ip, "-p", str(port), "-t", UCX_TESTS[(test, mode)], "-s", str(size),
           "-n", str(n), "-w", str(w), "-f", "-v"]
    if mode == "lat" and test == "read":
        cmd += ["-O", "1"]  # one get at a time: each is a round trip
    for attempt in (1, 2):
        srv = Server(ctx.env.srv(pinned(ctx.cpu_srv, ["ucx_perftest", "-p", str(port)])), srv_env, settle=0.1)
        SERVERS.append(srv)
        try:
            srv.ensure()
            out, err, ru = run_client(ctx.env.cli(pinned(ctx.cpu_cli, cmd)), env=cli_env, timeout=a.timeout)
            sru = srv.wait_exit(5)
            break
        except NA as x:
            if attempt == 2 or "timed out" in str(x):
                raise
            time.sleep(0.3)  # the server was not listening yet
        finally:
            srv.stop()
            SERVERS.remove(srv)
    lines = [l for l in out.strip().splitlines() if l.strip()[:1].isdigit()]
    if not lines:
        raise NA("no result from ucx_perftest: " + (err.strip().splitlines() or ["?"])[-1][:120])
    f = [x.strip() for x in lines[-1].split(",")]
    iters, p50, avg_lat, _, avg_bw, _, avg_mr, _ = (float(x) for x in f[:8])
    r = {"test": test, "mode": mode, "size": size, "iterations": int(iters)}
    mbps = avg_bw * MIB / 1e6  # ucx_perftest's MB is 2^20 bytes
    r["mb_per_s"] = mbps
    r["mops"] = avg_mr / 1e6
    r["seconds"] = iters * avg_lat / 1e6 if avg_lat > 0 else 0
    if mode == "lat":
        factor = 2.0 if test == "write" else 1.0
        r["lat_us"] = {"p50": p50 * factor}
    if sru is not None:
        # Whole-process CPU of both ucx_perftest processes (set-up included).
        r["cpu"] = {"user_s": ru.ru_utime, "sys_s": ru.ru_stime, "peer_user_s": sru.ru_utime,
                    "peer_sys_s": sru.ru_stime, "whole_process": True}
        r["seconds"] = size * iters / (mbps * 1e6) if mode == "bw" and mbps > 0 else r["seconds"]
    return r


def conveyor_devices():
    if not os.path.exists(CONVEYOR):
        return None
    try:
        r = subprocess.run([CONVEYOR, "devices", "--json"], capture_output=True, text=True, timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return None


def has_shm_device(devs):
    if devs is None:
        return False
    items = devs.get("devices", devs) if isinstance(devs, dict) else devs
    return any(isinstance(d, dict) and d.get("provider") == "shm" for d in items)


# Slots of an shm ring (src/providers/shm/wire/segment.hpp, ring_slots).
SHM_RING_SLOTS = 256


def m_conveyor(ctx, provider, test, mode, size, qps=1, depth=None):
    """One `conveyor perf` client run against the provider's server; qps > 1 connects that many data QPs
    (bandwidth spread round-robin, READ latency taking the next QP for each round trip); depth fixes
    --tx-depth and --batch."""
    a = ctx.args
    if os.path.exists(CONVEYOR):
        label = provider
        # "shm-engine": shm with direct mapping off on both sides, so every one-sided
        # operation is validated and executed by the target's engine.
        pre = ["env", "CONVEYOR_SHM_DIRECT=off"] if provider == "shm-engine" else []
        provider = "shm" if provider == "shm-engine" else provider
        port = ctx.port_base + {"soft": 3, "shm": 4, "shm-engine": 5}[label]
        # Name check: shm listens on an abstract Unix socket name (nothing in any filesystem),
        # not ip:port (conveyor perf --server takes an address in the provider's syntax).
        bind = f"@conveyor-compare-{os.getpid()}-{port}" if provider == "shm" else f"{ctx.env.srv_ip}:{port}"
        srv_cmd = pre + [CONVEYOR, "perf", "--server", bind, "--persistent", "--quiet", "--provider", provider]
        if ctx.cpu_srv is not None:
            srv_cmd += ["--cpu", str(ctx.cpu_srv)]
        ctx.server("conveyor-" + label, ctx.env.srv(srv_cmd), settle=0.3)
        cmd = pre + [CONVEYOR, "perf", bind, "--provider", provider, "--test", test, "--mode", mode, "--size", str(size),
               "--json", "--quiet"]
        if qps > 1:
            # Every QP before the clock starts: the rows measure the steady state, not the
            # connections' first touches. On shm a QP's first access maps the peer's region; and
            # through the target's engine (bench/ab's shm-engine rows) each ring's first lap maps
            # its pages, on this VM about 5 us a page and process even when populated ahead,
            # which held 64 QPs of 4 KiB WRITEs to ~0.2 GB/s for their first 0.3 s
            # (docs/performance/2026-12-04-compare-third-pair.md, "The shm rings' first lap"): a lap
            # of every QP's ring there, for the READ round trip too (its N+100 warm-up round trips left each one on fresh
            # slots: 27-31 us at 64-1000 QPs against 3.4-4.7 lapped). At 1000 QPs the lap maps
            # 2 GB (bandwidth) or 4 GB (READ) of rings and takes seconds.
            lap = label == "shm-engine"
            per_qp = max(depth or 1, SHM_RING_SLOTS if lap else 1)
            cmd += ["--qps", str(qps), "--warmup", str(qps * per_qp + (100 if mode == "lat" else 0))]
        one_buffer = False
        if mode == "lat":
            cmd += ["--iters", str(max(10, min(a.lat_iters, 64 * MIB // size)))]
        else:
            cmd += ["--duration", str(a.duration)]
            if depth is not None:
                cmd += ["--tx-depth", str(depth), "--batch", str(depth)]
                # The many-connection rows: one buffer a QP, so that the data touched does not
                # grow with the QPs (16 buffers a QP touched 64 MiB a side at 1000 QPs, and the
                # rows measured the cache instead of per-QP costs).
                one_buffer = mode == "bw"
            elif mode == "bw" and provider == "shm":  # name check: the shared-memory peers' settings
                # Eight in flight, four per post, as the shared-memory peers (UCX, libfabric
                # and the process_vm limit) run.
                cmd += ["--tx-depth", "8", "--batch", "4"]
            elif mode == "bw" and size >= MIB:
                # At most 32 MiB in flight, like conveyor-fi-bench, so that the final drain
                # does not dominate a short measurement.
                inflight = max(4, 32 * MIB // size)
                cmd += ["--tx-depth", str(inflight), "--batch", str(min(16, inflight))]
            if mode == "bw" and qps == 1:
                # Sixteen requests completed before the clock starts, as conveyor-fi-bench posts
                # and the TCP stream sends: a buffer's first pass is not the transport's speed
                # (on this VM the first kernel and user access to each page cost ~40 us, so an
                # 8 MiB buffer's first WRITE ran at ~95 MB/s).
                cmd += ["--warmup", "16"]
            if mode == "bw" and qps == 1:
                # Every request from and into one buffer, as every peer does (conveyor-fi-bench,
                # the TCP baseline, ucx_perftest; on one host UCX, libfabric and the process_vm
                # limit): the same working set. A buffer per request moves depth x size through
                # memory: 32 MiB at 1 MiB, which this VM can make 10-30 times slower
                # (docs/performance/2026-12-03-compare-first-pair.md, "soft at 1 and 8 MiB"), and
                # two 8 MiB buffers on shm ran at half the speed of one.
                one_buffer = True
        if one_buffer:
            cmd += ["--slots", "1"]
        if ctx.cpu_cli is not None:
            cmd += ["--cpu", str(ctx.cpu_cli)]
        out, _, _ = run_client(ctx.env.cli(cmd), timeout=a.timeout)
        doc = json.loads(out)
        res = [r for r in doc.get("results", []) if r.get("size") == size] or doc.get("results", [])
        if not res:
            raise NA("conveyor perf printed no result")
        return res[0]
    raise NA("conveyor perf is not built (cmake --build --preset release --target conveyor_tool)")


def m_limit(ctx, what, size):
    a = ctx.args
    if what == "memcpy":
        cmd = pinned(ctx.cpu_cli, [BASELINE, "memcpy", "--size", str(size), "--duration", str(a.duration)])
    elif what == "shm-pingpong":
        cmd = [BASELINE, "shm-pingpong", "--duration", str(a.duration), "--iters", str(a.lat_iters * 10)]
        cmd += ["--cpu", str(ctx.cpu_cli), "--peer-cpu", str(ctx.cpu_srv)]
    else:
        cmd = [BASELINE, "cma", "--test", what.split("-")[1], "--size", str(size), "--duration", str(a.duration),
               "--cpu", str(ctx.cpu_cli), "--peer-cpu", str(ctx.cpu_srv)]
    out, _, _ = run_client(cmd, timeout=a.timeout)
    return json.loads(out.strip().splitlines()[-1])
