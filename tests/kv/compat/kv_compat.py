#!/usr/bin/python3
"""conveyor-kv against the clients people use: redis-py, redis-cli (--pipe),
redis-benchmark, a hiredis program; malformed and slow clients; kill -9
durability with appendfsync always and everysec.

Usage: kv_compat.py CONVEYOR_BINARY [HIREDIS_CLIENT] [unittest args...]
Each case starts its own `conveyor kv serve --port 0` and reads the port from
its start-up line. Loopback only.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import redis

from kv_server import KvServer

BIN = None
HIREDIS = None


class Server(KvServer):
    def __init__(self, *args, dir=None):
        self.dir = dir
        super().__init__(BIN, *args, *(["--dir", dir] if dir else []))

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def raw(port, data, read_until_close=True, timeout=5.0):
    """Sends bytes on a fresh connection; returns what came back before the server closed."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return got, False
            if not chunk:
                return got, True
            got += chunk
            if not read_until_close:
                return got, False
    finally:
        s.close()


class Compat(unittest.TestCase):
    def setUp(self):
        self.srv = Server()
        self.r = self.srv.client()

    def tearDown(self):
        self.assertTrue(self.srv.alive(), "the server died")
        self.assertEqual(self.srv.stop(), 0)

    def test_redis_py_strings_expiry_keyspace(self):
        r = self.r
        self.assertTrue(r.ping())
        self.assertTrue(r.set("k", "v"))
        self.assertEqual(r.get("k"), b"v")
        self.assertIsNone(r.set("k", "w", nx=True))
        self.assertTrue(r.set("k", "w", xx=True, ex=100))
        self.assertIn(r.ttl("k"), (99, 100))
        self.assertEqual(r.getset("k", "z"), b"w")
        self.assertEqual(r.ttl("k"), -1)
        self.assertEqual(r.getdel("k"), b"z")
        self.assertTrue(r.mset({"a": "1", "b": "2"}))
        self.assertEqual(r.mget("a", "nope", "b"), [b"1", None, b"2"])
        self.assertEqual(r.incr("a"), 2)
        self.assertEqual(r.incrby("a", 10), 12)
        self.assertEqual(r.decr("a"), 11)
        self.assertEqual(r.decrby("a", 5), 6)
        self.assertEqual(r.append("b", "xy"), 3)
        self.assertEqual(r.strlen("b"), 3)
        self.assertTrue(r.expire("b", 50))
        self.assertGreater(r.pttl("b"), 49000)
        self.assertTrue(r.persist("b"))
        self.assertTrue(r.pexpire("b", 50))
        time.sleep(0.1)
        self.assertIsNone(r.get("b"))
        self.assertEqual(r.exists("a", "b"), 1)
        self.assertEqual(r.type("a"), b"string")
        with self.assertRaises(redis.ResponseError) as e:
            r.execute_command("XADD", "s", "*", "f", "x")  # streams are not supported
        self.assertIn("unknown command", str(e.exception))
        with self.assertRaises(redis.ResponseError):
            r.execute_command("GET")
        r.set("nonnum", "x")
        with self.assertRaises(redis.ResponseError):
            r.incr("nonnum")
        for i in range(300):
            r.set(f"scan:{i}", i)
        self.assertEqual(set(r.scan_iter(match="scan:*", count=50)), {f"scan:{i}".encode() for i in range(300)})
        self.assertEqual(len(r.keys("scan:1?")), 10)
        self.assertEqual(r.dbsize(), 302)  # a, nonnum and scan:* ("b" expired)
        info = r.info()
        self.assertIn("keyspace_hits", info)
        # One-sided GETs never reach the server's threads: INFO does not claim a
        # count of them (the conveyor section counts the READs the device served).
        self.assertNotIn("one_sided_gets", info)
        self.assertTrue(r.flushall())
        self.assertEqual(r.dbsize(), 0)
        self.assertEqual(r.client_id(), r.client_id())
        self.assertTrue(r.client_setname("py"))
        self.assertIn(r.client_getname(), (b"py", "py"))
        self.assertEqual(r.config_get("appendonly"), {"appendonly": "no"})
        self.assertEqual(r.echo("hi"), b"hi")

    def test_binary_and_large_values(self):
        v = bytes(range(256)) * 4096  # 1 MiB with CR, LF and NUL everywhere
        self.assertTrue(self.r.set(b"\x00bin\r\n", v))
        self.assertEqual(self.r.get(b"\x00bin\r\n"), v)

    def test_redis_py_pipeline_of_a_thousand(self):
        p = self.r.pipeline(transaction=False)
        for i in range(1000):
            p.set(f"p{i}", i)
            p.get(f"p{i}")
        out = p.execute()
        self.assertEqual(out[0::2], [True] * 1000)
        self.assertEqual(out[1::2], [str(i).encode() for i in range(1000)])

    def test_redis_cli_set_get_and_pipe(self):
        port = str(self.srv.port)
        self.assertEqual(subprocess.run(["redis-cli", "-p", port, "set", "cli", "hello"], capture_output=True,
                                        text=True, timeout=30).stdout.strip(), "OK")
        self.assertEqual(subprocess.run(["redis-cli", "-p", port, "get", "cli"], capture_output=True, text=True,
                                        timeout=30).stdout.strip(), "hello")
        cmds = "".join(f"SET pipe:{i} {i}\r\n" for i in range(10000))
        out = subprocess.run(["redis-cli", "-p", port, "--pipe"], input=cmds, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("errors: 0, replies: 10000", out.stdout)
        self.assertEqual(self.r.get("pipe:9999"), b"9999")

    def test_redis_benchmark_set_get_short_run(self):
        out = subprocess.run(["redis-benchmark", "-p", str(self.srv.port), "-t", "set,get", "-n", "5000", "-c", "10",
                              "-q"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        text = out.stdout.replace("\r", "\n")
        for t in ("SET", "GET"):
            m = re.search(t + r": ([0-9.]+) requests per second", text)
            self.assertIsNotNone(m, text)
            self.assertGreater(float(m.group(1)), 0)
        out = subprocess.run(["redis-benchmark", "-p", str(self.srv.port), "-t", "get", "-n", "20000", "-P", "16",
                              "-q"], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("GET:", out.stdout)

    def test_hiredis_client(self):
        self.assertTrue(HIREDIS and os.access(HIREDIS, os.X_OK), "the hiredis client was not built")
        out = subprocess.run([HIREDIS, str(self.srv.port)], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("hiredis: ok", out.stdout)

    def test_malformed_requests_get_an_error_and_a_close(self):
        port = self.srv.port
        for bad in (b"*1\r\n$99999999999\r\n",        # bulk length beyond any limit
                    b"*99999999\r\n",                  # too many arguments
                    b"*2\r\n$3\r\nGET\r\n:1\r\n",       # not a bulk
                    b"*x\r\n",                          # not a count
                    b"set k \"unterminated\r\n",        # inline with unbalanced quotes
                    b"*1\r\n$4\r\nPINGxx",              # bulk not ended by CRLF
                    b"\x00\xff\xfe*$" + os.urandom(64) + b"\n"):
            got, closed = raw(port, bad)
            self.assertTrue(got.startswith(b"-ERR Protocol error"), (bad, got))
            self.assertTrue(closed, bad)
        # A line that never ends is bounded too (64 KiB).
        got, closed = raw(port, b"x" * (70 << 10))
        self.assertTrue(got.startswith(b"-ERR Protocol error"), got[:80])
        self.assertTrue(closed)
        self.assertTrue(self.r.ping())
        self.assertGreaterEqual(self.r.info("stats")["protocol_errors"], 8)

    def test_replies_before_a_protocol_error_are_sent(self):
        got, closed = raw(self.srv.port, b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$-5\r\n")
        self.assertTrue(got.startswith(b"+PONG\r\n+PONG\r\n-ERR Protocol error"), got)
        self.assertTrue(closed)

    def test_quit_closes_after_its_reply(self):
        got, closed = raw(self.srv.port, b"*1\r\n$4\r\nQUIT\r\nPING\r\n")
        self.assertEqual(got, b"+OK\r\n")
        self.assertTrue(closed)


class Bounds(unittest.TestCase):
    def test_half_commands_and_slow_loris_are_closed(self):
        srv = Server("--partial-timeout", "1")
        try:
            t0 = time.monotonic()
            got, closed = raw(srv.port, b"*2\r\n$3\r\nGET\r\n$10\r\nab", timeout=10)
            self.assertTrue(closed)
            self.assertLess(time.monotonic() - t0, 5)
            # One byte every 0.2 s: each byte is activity, but the command never completes.
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            t0 = time.monotonic()
            closed = False
            for b in b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\n" + b"v" * 100:
                try:
                    s.send(bytes([b]))
                    s.settimeout(0.2)
                    if s.recv(1) == b"":
                        closed = True
                        break
                except socket.timeout:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
            s.close()
            self.assertTrue(closed)
            self.assertLess(time.monotonic() - t0, 5)
            r = srv.client()
            self.assertTrue(r.ping())
            self.assertGreaterEqual(r.info("stats")["timed_out_clients"], 2)
            # An idle connection with no partial command is left alone.
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            time.sleep(1.6)
            s.sendall(b"PING\r\n")
            self.assertEqual(s.recv(100), b"+PONG\r\n")
            s.close()
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_a_client_that_does_not_read_its_replies_is_bounded(self):
        srv = Server()
        try:
            r = srv.client()
            r.set("big", b"x" * (1 << 20))
            base = srv.rss_kib()
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            req = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n" * 4000  # 4 GiB of replies, never read
            s.settimeout(3)
            try:
                s.sendall(req)
            except socket.timeout:
                pass  # the server stopped reading: the point
            time.sleep(1)
            grown = srv.rss_kib() - base
            self.assertLess(grown, 128 << 10, f"server grew {grown} KiB for one client")
            self.assertTrue(r.ping())
            s.close()
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_requirepass(self):
        srv = Server("--requirepass", "s3cret")
        try:
            with self.assertRaises(redis.AuthenticationError):
                srv.client().get("k")
            with self.assertRaises((redis.AuthenticationError, redis.ResponseError)) as e:
                srv.client(password="wrong").ping()
            self.assertIn("WRONGPASS", str(e.exception))
            r = srv.client(password="s3cret")
            self.assertTrue(r.set("k", "v"))
            self.assertEqual(r.get("k"), b"v")
            out = subprocess.run(["redis-cli", "-p", str(srv.port), "get", "k"], capture_output=True, text=True,
                                 timeout=30)
            self.assertIn("NOAUTH", out.stdout + out.stderr)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_resp3_hello(self):
        srv = Server()
        try:
            got, _ = raw(srv.port, b"HELLO 3\r\nSET k v\r\nGET nope\r\nQUIT\r\n")
            self.assertTrue(got.startswith(b"%7\r\n$6\r\nserver\r\n"), got)
            self.assertIn(b"+OK\r\n_\r\n+OK\r\n", got)
        finally:
            self.assertEqual(srv.stop(), 0)


class Durability(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="conveyor-kv-durable.")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write_until_killed(self, fsync, seconds=1.5, writers=4):
        srv = Server("--appendonly", "yes", "--appendfsync", fsync, dir=self.dir)
        acked = [[] for _ in range(writers)]  # (key, time acknowledged)
        stop = threading.Event()

        def writer(w):
            r = srv.client()
            i = 0
            try:
                while not stop.is_set():
                    k = f"w{w}:{i}"
                    r.set(k, str(i))
                    acked[w].append((k, time.monotonic()))
                    i += 1
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                pass

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        killed_at = time.monotonic()
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)
        stop.set()
        for t in threads:
            t.join(20)
        srv.stop()
        all_acked = [a for per in acked for a in per]
        self.assertGreater(len(all_acked), 50, "the writers made no progress")
        srv2 = Server("--appendonly", "yes", "--appendfsync", fsync, dir=self.dir)
        try:
            r = srv2.client()
            keys = [k for k, _ in all_acked]
            vals = []
            for i in range(0, len(keys), 500):
                vals += r.mget(keys[i:i + 500])
            lost = [(k, t) for (k, t), v in zip(all_acked, vals) if v is None]
            # Nothing acknowledged may come back wrong.
            for (k, _), v in zip(all_acked, vals):
                if v is not None:
                    self.assertEqual(v, k.split(":")[1].encode())
            return lost, killed_at, len(all_acked)
        finally:
            self.assertEqual(srv2.stop(), 0)

    def test_kill9_with_appendfsync_always_loses_no_acknowledged_write(self):
        lost, _, n = self.write_until_killed("always")
        self.assertEqual(lost, [], f"{len(lost)} of {n} acknowledged writes lost")

    def test_kill9_with_appendfsync_everysec_loses_at_most_about_a_second(self):
        lost, killed_at, n = self.write_until_killed("everysec")
        # A killed process loses nothing the kernel has; only a machine crash
        # loses the unsynced second. Either way nothing older than ~1 s is gone.
        for k, t in lost:
            self.assertGreater(t, killed_at - 1.5, f"{k} acknowledged {killed_at - t:.2f} s before the kill was lost")

    def test_restart_replays_and_cuts_a_torn_tail(self):
        srv = Server("--appendonly", "yes", "--appendfsync", "always", dir=self.dir)
        r = srv.client()
        r.set("a", "1")
        r.set("t", "v", ex=1000)
        self.assertEqual(srv.stop(), 0)
        with open(os.path.join(self.dir, "appendonly.aof"), "ab") as f:
            f.write(b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$100\r\nxx")
        srv = Server("--appendonly", "yes", dir=self.dir)
        try:
            r = srv.client()
            self.assertEqual(r.get("a"), b"1")
            self.assertIsNone(r.get("b"))
            self.assertGreater(r.ttl("t"), 990)
            self.assertTrue(any("incomplete command" in l for l in srv.stderr_lines), srv.stderr_lines)
        finally:
            self.assertEqual(srv.stop(), 0)
        # The cut bytes were kept aside first.
        side = [n for n in os.listdir(self.dir) if n.startswith("appendonly.aof.torn-")]
        self.assertEqual(len(side), 1, os.listdir(self.dir))
        with open(os.path.join(self.dir, side[0]), "rb") as f:
            self.assertEqual(f.read(), b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$100\r\nxx")
        with self.assertRaises(RuntimeError):  # a log it cannot open: refuses to start
            Server("--appendonly", "yes", dir="/nonexistent-dir-for-kv")

    def test_an_overflowing_psetex_is_refused_and_the_log_restarts(self):
        srv = Server("--appendonly", "yes", dir=self.dir)
        r = srv.client()
        with self.assertRaisesRegex(redis.ResponseError, "invalid expire time in 'psetex' command"):
            r.psetex("k", 2**63 - 1, "v")
        r.set("a", "1")
        self.assertEqual(srv.stop(), 0)
        srv = Server("--appendonly", "yes", dir=self.dir)
        try:
            self.assertEqual(srv.client().mget("a", "k"), [b"1", None])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_damage_mid_file_refuses_to_start_and_leaves_the_file(self):
        recs = []
        for i in range(1000):
            v = b"v" * 20000 if i == 10 else b"value%d" % i
            k = b"key%d" % i
            recs.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
        recs[10] = recs[10].replace(b"$20000", b"$90000")  # one digit: past the end of the file
        data = b"".join(recs)
        path = os.path.join(self.dir, "appendonly.aof")
        with open(path, "wb") as f:
            f.write(data)
        with self.assertRaises(RuntimeError) as e:
            Server("--appendonly", "yes", dir=self.dir)
        at = len(b"".join(recs[:10]))
        self.assertIn(f"offset {at}", str(e.exception))
        self.assertIn(f"truncate -s {at}", str(e.exception))
        with open(path, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(os.listdir(self.dir), ["appendonly.aof"])

    def test_a_refused_record_names_the_fix_and_can_be_skipped(self):
        with open(os.path.join(self.dir, "appendonly.aof"), "wb") as f:
            f.write(b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n"
                    b"*5\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n2\r\n$2\r\nPX\r\n$1\r\n0\r\n"
                    b"*3\r\n$3\r\nSET\r\n$1\r\nc\r\n$1\r\n3\r\n")
        with self.assertRaises(RuntimeError) as e:
            Server("--appendonly", "yes", dir=self.dir)
        self.assertIn("offset 27", str(e.exception))
        self.assertIn("--aof-skip-bad-records", str(e.exception))
        srv = Server("--appendonly", "yes", "--aof-skip-bad-records", dir=self.dir)
        try:
            self.assertEqual(srv.client().mget("a", "b", "c"), [b"1", None, b"3"])
            self.assertTrue(any("skipping the record at offset 27" in l for l in srv.stderr_lines),
                            srv.stderr_lines)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_a_corrupt_log_refuses_to_start(self):
        with open(os.path.join(self.dir, "appendonly.aof"), "wb") as f:
            f.write(b"*1\r\n$8\r\nFLUSHALL\r\nGARBAGE GARBAGE\r\n*1\r\n$8\r\nFLUSHALL\r\n")
        with self.assertRaises(RuntimeError):
            Server("--appendonly", "yes", dir=self.dir)


if __name__ == "__main__":
    BIN = sys.argv[1]
    if len(sys.argv) > 2 and not sys.argv[2].startswith("-"):
        HIREDIS = sys.argv[2]
        del sys.argv[2]
    del sys.argv[1]
    unittest.main(verbosity=2, warnings="ignore")
