#!/usr/bin/python3
"""`conveyor kv serve --rdma-listen` with `conveyor kv get|set|del`,
conveyor-kv-bench and redis-cli on the same data, on soft and shm, with and
without requirepass; the client commands take redis-cli's letters (-h host, -p
port, -a password) and infer the provider from the address; a client pointed
at a RESP port, or at a peer that never answers, fails within its bound and
says what to check.

Usage: kv_cli.py CONVEYOR_BINARY CONVEYOR_KV_BENCH_BINARY
"""
import os
import re
import socket
import subprocess
import sys
import time

conveyor = sys.argv[1]
kv_bench = sys.argv[2]


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
    rport = free_port()
    # The server is another process: its address, in the provider's syntax,
    # and the client's redis-cli letters for it (the provider comes from the
    # address form: "@name" is shm), one case per provider.
    addr, where = {
        "soft": (f"127.0.0.1:{rport}", ["-h", "127.0.0.1", "-p", str(rport)]),
        "shm": (f"@kv-cli-{os.getpid()}-{provider}", ["-h", f"@kv-cli-{os.getpid()}-{provider}"]),
    }[provider]
    cmd = [conveyor, "kv", "serve", "--quiet", "--port", str(port), "--provider", provider,
           "--rdma-listen", addr]
    if password:
        cmd += ["--requirepass", password]
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        wait_up(srv, port)
        auth = ["-a", password] if password else []
        common = [*where, *auth]
        assert kv("set", "greeting", "hello world", *common).stdout == "OK\n"
        assert kv("get", "greeting", *common).stdout == "hello world\n"
        assert kv("get", "absent", *common).stdout == "(nil)\n"
        # the long forms: --address, --provider, --pass and --password
        longs = ["--address", addr, "--provider", provider] + (["--pass", password] if password else [])
        assert kv("get", "greeting", *longs).stdout == "hello world\n"
        if password:
            assert kv("get", "greeting", "--address", addr, "--password", password).stdout == "hello world\n"
        rc = ["redis-cli", "-p", str(port)] + (["-a", password, "--no-auth-warning"] if password else [])
        # both paths, one store
        assert subprocess.run(rc + ["get", "greeting"], capture_output=True, text=True).stdout == "hello world\n"
        subprocess.run(rc + ["set", "from-resp", "42"], check=True, capture_output=True)
        assert kv("get", "from-resp", *common).stdout == "42\n"
        assert kv("del", "greeting", *common).stdout == "(integer) 1\n"
        assert kv("del", "greeting", *common).stdout == "(integer) 0\n"
        assert kv("get", "greeting", *common).stdout == "(nil)\n"
        b = subprocess.run([kv_bench, *common, "--keys", "200", "--seconds", "0.5", "--get-ratio", "0.9",
                            "--depth", "4", "--json"], capture_output=True, text=True, timeout=60)
        assert b.returncode == 0 and '"schema":"conveyor-kv-bench/1"' in b.stdout and '"misses":0' in b.stdout, \
            (b.stdout, b.stderr)
        assert f'"provider":"{provider}"' in b.stdout, b.stdout
        # The client device without an engine thread: the waiting thread drives it.
        assert kv("set", "manual", "m1", *common, "--progress", "manual").stdout == "OK\n"
        assert kv("get", "manual", *common, "--progress", "manual").stdout == "m1\n"
        r = kv("get", "manual", *common, "--progress", "bogus", check=False)
        assert r.returncode != 0 and "--progress" in r.stderr, r.stderr
        if password:
            r = kv("get", "from-resp", *where, check=False)
            assert r.returncode == 1 and "NOAUTH" in r.stderr, r.stderr
            r = kv("get", "from-resp", *where, "-a", "wrong", check=False)
            assert r.returncode == 1 and "WRONGPASS" in r.stderr, r.stderr
        # The RESP port is not the RDMA one: said at once, not after a silent wait.
        t0 = time.monotonic()
        r = kv("get", "from-resp", "-p", str(port), *auth, check=False)
        took = time.monotonic() - t0
        assert r.returncode == 1 and "RESP port" in r.stderr and "redis-cli" in r.stderr, r.stderr
        assert took < 3, f"pointed at the RESP port, kv get took {took:.1f} s"
    finally:
        srv.terminate()
        srv.wait(timeout=20)
    print(f"ok {provider}{' requirepass' if password else ''}")


def help_and_silent_peer():
    # -h is the host now; --help is the help, and names the letters.
    r = kv("get", "--help")
    for flag in ("-h,--host", "-p,--port", "-a,--pass,--password", "--address", "--provider", "-t,--timeout"):
        assert flag in r.stdout, (flag, r.stdout)
    # A peer that accepts and never answers: the handshake is bounded by -t and
    # the error says what it waited for and what to check.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        t0 = time.monotonic()
        r = kv("get", "k", "-p", str(silent.getsockname()[1]), "-t", "0.5", check=False)
        took = time.monotonic() - t0
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "did not answer the RDMA handshake" in r.stderr and "redis-cli" in r.stderr, r.stderr
    assert took < 3, f"-t 0.5 against a silent peer took {took:.1f} s"
    # An @name address is shm's without --provider (before: "missing port").
    r = kv("get", "k", "-h", f"@kv-cli-nobody-{os.getpid()}", check=False)
    assert r.returncode == 1 and "missing port" not in r.stderr and re.search("shm|@kv-cli-nobody", r.stderr), \
        r.stderr
    print("ok help, silent peer, @name without --provider")


help_and_silent_peer()
for prov in ("soft", "shm"):
    case(prov, "")
    case(prov, "pw-123")
