#!/usr/bin/python3
"""conveyor-kv-bench (bench/kv) against live servers on every protocol: RDMA (soft, shm),
RESP (conveyor kv serve's port) and memcached's text protocol (when
/usr/bin/memcached exists), 2 clients for about a second each; then the checks
that make a wrong server fail the bench: misses of keys that were never loaded,
and values of the wrong length.

Usage: kv_bench.py CONVEYOR_BINARY CONVEYOR_KV_BENCH_BINARY
"""
import json
import os
import socket
import subprocess
import sys
import time

conveyor = sys.argv[1]
kv_bench = sys.argv[2]
procs = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(proc, port):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"server did not listen on {port}")


def start(cmd, port):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    procs.append(p)
    wait_up(p, port)
    return p


def kv_serve(provider):
    port = free_port()
    # The server is another process: an address in its provider's syntax.
    addr = {"soft": f"127.0.0.1:{free_port()}", "shm": f"@kv-bench-{os.getpid()}-{provider}"}[provider]
    p = start([conveyor, "kv", "serve", "--quiet", "--port", str(port), "--provider", provider,
               "--rdma-listen", addr], port)
    return p, port, addr


def bench(*args):
    r = subprocess.run([kv_bench, "--json", *args], capture_output=True, text=True, timeout=60)
    lines = r.stdout.strip().splitlines()
    return r.returncode, (json.loads(lines[-1]) if lines else {}), r.stderr


def expect_clean(what, *args):
    rc, j, err = bench("--keys", "2000", "--clients", "2", "--seconds", "1", *args)
    assert rc == 0, f"{what}: exit {rc}: {err}"
    assert j["errors"] == 0 and j["misses"] == 0, f"{what}: {j}"
    assert j["gets"] > 0 and j["ops_per_s"] > 0 and j["clients"] == 2, f"{what}: {j}"
    assert j["get_us"]["p50"] > 0 and j["get_us"]["p999"] >= j["get_us"]["p50"], f"{what}: {j}"
    if "--server-pid" in args:
        assert j["server_cpu"]["total_s"] > 0 and j["server_cpu_s_per_mget"] > 0, f"{what}: {j}"
    print(f"ok {what}: {j['ops_per_s']:.0f} ops/s, GET p50 {j['get_us']['p50']:.1f} us")
    return j


def expect_fail(what, needle, *args):
    rc, j, err = bench("--seconds", "0.3", *args)
    assert rc == 1, f"{what}: exit {rc} (expected 1): {j} {err}"
    assert j.get("errors", 0) > 0 and needle in err, f"{what}: {j} {err}"
    print(f"ok {what}: fails with {j['errors']} errors")


try:
    for prov in ("soft", "shm"):
        srv, port, addr = kv_serve(prov)
        rdma = ["--protocol", "rdma", "--address", addr]  # the provider from the address form
        expect_clean(f"rdma {prov}", *rdma, "--load-port", str(port), "--get-ratio", "0.9",
                     "--server-pid", str(srv.pid))
        expect_clean(f"rdma {prov} depth 8", *rdma, "--load", "false", "--depth", "8")
        # After the warm-up every key is remembered: GETs are one READ (issue 34),
        # and without the location cache none is.
        j = expect_clean(f"rdma {prov} warm", *rdma, "--load", "false", "--get-ratio", "1",
                         "--warmup", "0.5")
        rounds = j["get_rounds"]
        assert j["one_read_gets"] > 0.9 * j["gets"], j
        assert rounds["one"] + rounds["two"] + rounds["three"] + rounds["more"] == j["gets"], j
        j = expect_clean(f"rdma {prov} buckets first", *rdma, "--load", "false", "--get-ratio", "1",
                         "--location-cache", "0")
        # (two rounds each; three when a tag collision or a retry adds one)
        assert j["one_read_gets"] == 0 and j["get_rounds"]["one"] == 0, j
        if prov == "soft":
            j = expect_clean("resp", "--protocol", "resp", "--port", str(port), "--load", "false",
                             "--depth", "4", "--get-ratio", "0.5", "--server-pid", str(srv.pid))
            assert j["sets"] > 0, j
            # values of 100 B where the bench expects 64 B: every GET is wrong
            expect_fail("resp wrong value length", "not the loaded value", "--protocol", "resp", "--port",
                        str(port), "--keys", "2000", "--value-size", "100", "--load", "false")
        srv.terminate()
        srv.wait(20)
    # empty servers: every GET of a key that was never loaded is a miss, and an error
    srv, port, addr = kv_serve("soft")
    expect_fail("rdma soft empty store", "no such key", "--protocol", "rdma", "--address", addr,
                "--keys", "1000", "--get-ratio", "1", "--load", "false")
    expect_fail("resp empty store", "no such key", "--protocol", "resp", "--port", str(port), "--keys",
                "1000", "--get-ratio", "1", "--load", "false")
    if os.path.exists("/usr/bin/memcached"):
        mport = free_port()
        cmd = ["/usr/bin/memcached", "-l", "127.0.0.1", "-p", str(mport), "-U", "0", "-m", "64"]
        if os.geteuid() == 0:
            cmd += ["-u", "root"]
        mc = start(cmd, mport)
        mc_args = ["--protocol", "memcached", "--port", str(mport)]
        expect_fail("memcached empty", "no such key", *mc_args, "--keys", "1000", "--load", "false")
        expect_clean("memcached", *mc_args, "--depth", "4", "--server-pid", str(mc.pid))
        expect_fail("memcached wrong value length", "not the loaded value", *mc_args, "--keys", "2000",
                    "--value-size", "10", "--load", "false")
    else:
        print("skip memcached: /usr/bin/memcached is not installed")
finally:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(20)
