#!/usr/bin/python3
"""`conveyor kv serve --rdma-listen` with `conveyor kv get|set|del|bench` and
redis-cli on the same data, on soft and shm, with and without requirepass.

Usage: kv_cli.py CONVEYOR_BINARY
"""
import os
import socket
import subprocess
import sys
import time

conveyor = sys.argv[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kv(*args, check=True):
    r = subprocess.run([conveyor, "kv", *args], capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        sys.exit(f"conveyor kv {' '.join(args)}: exit {r.returncode}: {r.stderr}")
    return r


def wait_up(proc, port):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"kv serve exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit("kv serve did not start")


def case(provider, password):
    port = free_port()
    # name check: address syntax (shm listens on "@name")
    addr = f"@kv-cli-{os.getpid()}-{provider}" if provider == "shm" else f"127.0.0.1:{free_port()}"
    cmd = [conveyor, "kv", "serve", "--quiet", "--port", str(port), "--provider", provider,
           "--rdma-listen", addr]
    if password:
        cmd += ["--requirepass", password]
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        wait_up(srv, port)
        auth = ["--password", password] if password else []
        common = ["-p", provider, "-a", addr, *auth]
        assert kv("set", "greeting", "hello world", *common).stdout == "OK\n"
        assert kv("get", "greeting", *common).stdout == "hello world\n"
        assert kv("get", "absent", *common).stdout == "(nil)\n"
        rc = ["redis-cli", "-p", str(port)] + (["-a", password, "--no-auth-warning"] if password else [])
        # both paths, one store
        assert subprocess.run(rc + ["get", "greeting"], capture_output=True, text=True).stdout == "hello world\n"
        subprocess.run(rc + ["set", "from-resp", "42"], check=True, capture_output=True)
        assert kv("get", "from-resp", *common).stdout == "42\n"
        assert kv("del", "greeting", *common).stdout == "(integer) 1\n"
        assert kv("del", "greeting", *common).stdout == "(integer) 0\n"
        assert kv("get", "greeting", *common).stdout == "(nil)\n"
        b = kv("bench", *common, "--keys", "200", "--seconds", "0.5", "--get-ratio", "0.9", "--depth", "4",
               "--json").stdout
        assert '"schema":"conveyor-kv-bench/1"' in b and '"misses":0' in b, b
        # The client device without an engine thread: the waiting thread drives it.
        assert kv("set", "manual", "m1", *common, "--progress", "manual").stdout == "OK\n"
        assert kv("get", "manual", *common, "--progress", "manual").stdout == "m1\n"
        r = kv("get", "manual", *common, "--progress", "bogus", check=False)
        assert r.returncode != 0 and "--progress" in r.stderr, r.stderr
        if password:
            r = kv("get", "from-resp", "-p", provider, "-a", addr, check=False)
            assert r.returncode == 1 and "NOAUTH" in r.stderr, r.stderr
            r = kv("get", "from-resp", "-p", provider, "-a", addr, "--password", "wrong", check=False)
            assert r.returncode == 1 and "WRONGPASS" in r.stderr, r.stderr
    finally:
        srv.terminate()
        srv.wait(timeout=20)
    print(f"ok {provider}{' requirepass' if password else ''}")


for prov in ("soft", "shm"):
    case(prov, "")
    case(prov, "pw-123")
