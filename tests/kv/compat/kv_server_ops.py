"""conveyor-kv's transactions, pub/sub and operations commands side by side
with a redis-server 7.0 started here: MULTI/EXEC/WATCH (reply by reply, WATCH
broken by another client, by expiry and by an RDMA write RPC, redis-py's
pipeline and a WATCH retry loop), the AOF of a transaction cut short,
SUBSCRIBE/PSUBSCRIBE/PUBLISH through redis-py and raw RESP2/RESP3, a
subscriber that never reads, MONITOR, CLIENT KILL, CONFIG SET, SLOWLOG,
SHUTDOWN from redis-cli, INFO through redis-py and redis-cli --stat, the ports
bound before the AOF is read, protected mode and the idle footprint.

Usage: kv_server_ops.py CONVEYOR_BINARY [unittest args...]
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import redis

from kv_server import KvServer, RedisServer, encode

BIN = None


class Kv(KvServer):
    def __init__(self, *args):
        super().__init__(BIN, *args)


Redis = RedisServer  # its client() is kv_server.py's


class Resp:
    """A raw RESP connection: sends commands, reads whole replies as bytes."""

    def __init__(self, port, timeout=5.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, *args):
        self.s.sendall(encode(*args))

    def _line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                raise ConnectionError("closed")
            self.buf += d
        i = self.buf.index(b"\r\n")
        line, self.buf = self.buf[:i + 2], self.buf[i + 2:]
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            d = self.s.recv(65536)
            if not d:
                raise ConnectionError("closed")
            self.buf += d
        b, self.buf = self.buf[:n], self.buf[n:]
        return b

    def reply(self):
        line = self._line()
        t = line[:1]
        if t in (b"+", b"-", b":", b"_", b",", b"#"):
            return line
        if t in (b"$", b"=", b"!"):
            n = int(line[1:-2])
            return line if n < 0 else line + self._exact(n + 2)
        if t in (b"*", b">", b"~", b"%"):
            n = int(line[1:-2])
            if n < 0:
                return line
            if t == b"%":
                n *= 2
            return line + b"".join(self.reply() for _ in range(n))
        raise AssertionError("not RESP: %r" % line)

    def call(self, *args):
        self.send(*args)
        return self.reply()

    def close(self):
        self.s.close()


class SideBySide(unittest.TestCase):
    """Each case gets a conveyor-kv and a redis-server."""

    kv_args = ()

    def setUp(self):
        self.kv = Kv(*self.kv_args)
        self.redis = Redis()

    def tearDown(self):
        self.assertEqual(self.kv.stop(), 0)
        self.redis.stop()

    def both(self, script, proto=2):
        """Runs the same commands on fresh raw connections to both servers and
        asserts the replies are the same bytes, one by one."""
        a, b = Resp(self.kv.port), Resp(self.redis.port)
        try:
            if proto == 3:
                a.call("HELLO", "3")
                b.call("HELLO", "3")
            for cmd in script:
                got, want = a.call(*cmd), b.call(*cmd)
                self.assertEqual(got, want, "after %r" % (cmd,))
        finally:
            a.close()
            b.close()


class Transactions(SideBySide):
    def test_each_rule_replies_as_redis(self):
        self.both([
            ("MULTI",), ("MULTI",),                      # nested MULTI: an error, MULTI stays
            ("WATCH", "a"),                              # WATCH inside MULTI
            ("SET", "a", "1"), ("GETX", "x"), ("GET",),  # queued, unknown, wrong arity
            ("EXEC",),                                   # EXECABORT
            ("EXEC",), ("DISCARD",),                     # without MULTI
            ("SET", "s", "text"),
            ("MULTI",), ("SET", "a", "1"), ("INCR", "a"), ("INCR", "s"), ("GET", "a"),
            ("EXEC",),                                   # runtime error inside: no rollback
            ("GET", "a"),
            ("MULTI",), ("SET", "d", "1"), ("DISCARD",), ("EXISTS", "d"),
            ("WATCH", "w"), ("SET", "w", "1"), ("MULTI",), ("GET", "w"),
            ("EXEC",),                                   # own write breaks the WATCH: null
            ("WATCH", "w"), ("UNWATCH",), ("SET", "w", "2"), ("MULTI",), ("GET", "w"),
            ("EXEC",),                                   # unwatched: runs
            ("WATCH", "gone"), ("MULTI",), ("SET", "gone", "1"), ("EXEC",),  # absent key, unchanged
            ("WATCH", "nothing"), ("SET", "nothing", "1"), ("DEL", "nothing"),
            ("MULTI",), ("SET", "x", "1"), ("EXEC",),     # absent, created, deleted: null
            ("WATCH",), ("UNWATCH",),
            ("MULTI",), ("PING",), ("ECHO", "x"), ("EXEC",),
            ("MULTI",), ("EXEC",),                       # empty
        ])

    def test_wait_without_replicas_replies_as_redis(self):
        # A server with no replica: 0 at once (Redis waits out a timeout
        # first when asked for more; the bytes are the same), errors in
        # Redis's order (the replica count is checked first), inside MULTI too.
        self.both([
            ("SET", "k", "1"), ("WAIT", "0", "0"), ("WAIT", "1", "50"),
            ("WAIT", "x", "0"), ("WAIT", "1", "-1"), ("WAIT", "1", "y"), ("WAIT", "x", "y"),
            ("WAIT",), ("WAIT", "1"),
            ("MULTI",), ("SET", "k", "2"), ("WAIT", "0", "0"), ("EXEC",),
        ])

    def test_resp3_null_exec_and_queued(self):
        self.both([("WATCH", "k"), ("SET", "k", "1"), ("MULTI",), ("GET", "k"), ("EXEC",),
                   ("MULTI",), ("GET", "k"), ("EXEC",)], proto=3)

    def test_watch_broken_by_another_client_and_by_expiry(self):
        for srv in (self.kv, self.redis):
            c1, c2 = srv.client(), srv.client()
            c1.set("k", "v")
            with c1.pipeline() as p:
                p.watch("k")
                c2.set("k", "other")
                p.multi()
                p.set("k", "mine")
                with self.assertRaises(redis.WatchError):
                    p.execute()
            self.assertEqual(c1.get("k"), b"other")
            # A key that expires between WATCH and EXEC counts as changed.
            c1.set("e", "v", px=100)
            with c1.pipeline() as p:
                p.watch("e")
                time.sleep(0.3)
                p.multi()
                p.set("e", "again")
                with self.assertRaises(redis.WatchError):
                    p.execute()
            self.assertIsNone(c1.get("e"))

    def test_redis_py_pipeline_and_a_watch_retry_loop(self):
        r = self.kv.client()
        with r.pipeline() as p:  # transaction=True: MULTI ... EXEC
            p.set("x", "1").incr("x").incrby("x", 10).get("x")
            self.assertEqual(p.execute(), [True, 2, 12, b"12"])
        r.set("counter", 0)
        retries = [0]

        def bump(times):
            c = self.kv.client()
            for _ in range(times):
                while True:
                    with c.pipeline() as p:
                        try:
                            p.watch("counter")
                            v = int(p.get("counter"))
                            p.multi()
                            p.set("counter", v + 1)
                            p.execute()
                            break
                        except redis.WatchError:
                            retries[0] += 1

        threads = [threading.Thread(target=bump, args=(100,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(int(r.get("counter")), 400)  # no lost update, whatever the retries

    def test_queued_commands_are_bounded(self):
        s = Resp(self.kv.port, timeout=30)
        s.call("MULTI")
        n = 100000  # server_config::multi_max_commands
        chunk = b"".join(b"*3\r\n$3\r\nSET\r\n$1\r\nq\r\n$1\r\n1\r\n" for _ in range(1000))
        for _ in range(n // 1000):
            s.s.sendall(chunk)
        for _ in range(n):
            self.assertEqual(s.reply(), b"+QUEUED\r\n")
        self.assertTrue(s.call("SET", "q", "1").startswith(b"-ERR MULTI queue limit reached"))
        self.assertEqual(s.call("EXEC"),
                         b"-EXECABORT Transaction discarded because of previous errors.\r\n")
        self.assertEqual(s.call("EXISTS", "q"), b":0\r\n")
        s.close()


class WatchAndRdma(unittest.TestCase):
    def test_watch_is_broken_by_an_rdma_write_rpc(self):
        kv = Kv("--rdma-listen", "127.0.0.1:0")
        try:
            addr = None
            deadline = time.monotonic() + 10
            while addr is None and time.monotonic() < deadline:
                for line in kv.stderr_lines:
                    m = re.search(r"RDMA on (\S+)", line)
                    if m:
                        addr = m.group(1)
                time.sleep(0.05)
            self.assertIsNotNone(addr, kv.stderr_lines)
            r = kv.client()
            r.set("k", "v")
            with r.pipeline() as p:
                p.watch("k")
                out = subprocess.run([BIN, "kv", "set", "k", "from-rdma", "--address", addr],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(out.returncode, 0, out.stderr)
                p.multi()
                p.set("k", "from-resp")
                with self.assertRaises(redis.WatchError):
                    p.execute()
            self.assertEqual(r.get("k"), b"from-rdma")
            # INFO conveyor: the READs the device served to a one-sided GET
            # (soft's engine counts each; the server's threads see none of them).
            before = r.info("conveyor")
            self.assertEqual(before["provider"], "soft")
            hits = r.info("stats")["keyspace_hits"]
            out = subprocess.run([BIN, "kv", "get", "k", "--address", addr],
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(out.stdout.strip(), "from-rdma", out.stderr)
            after = r.info("conveyor")
            self.assertGreaterEqual(after["rdma_reads_served"] - before["rdma_reads_served"], 2)
            self.assertGreaterEqual(after["rdma_read_bytes_served"] - before["rdma_read_bytes_served"],
                                    256 + len("from-rdma"))
            self.assertEqual(r.info("stats")["keyspace_hits"], hits)  # not counted as a hit
            # Without the RPC in between, the same transaction runs.
            with r.pipeline() as p:
                p.watch("k")
                p.multi()
                p.set("k", "from-resp")
                self.assertEqual(p.execute(), [True])
        finally:
            self.assertEqual(kv.stop(), 0)


class TransactionLog(unittest.TestCase):
    def test_a_cut_transaction_replays_none_of_it(self):
        d = tempfile.mkdtemp(prefix="conveyor-kv-tx.")
        try:
            kv = Kv("--appendonly", "yes", "--appendfsync", "always", "--dir", d)
            r = kv.client()
            r.set("before", "1")
            with r.pipeline() as p:
                p.set("t1", "a").set("t2", "b").incr("before")
                p.execute()
            self.assertEqual(kv.stop(), 0)
            path = os.path.join(d, "appendonly.aof")
            data = open(path, "rb").read()
            multi = data.index(b"*1\r\n$5\r\nMULTI\r\n")
            self.assertTrue(data.endswith(b"*1\r\n$4\r\nEXEC\r\n"), data)
            # Whole: all of it replays.
            kv = Kv("--appendonly", "yes", "--dir", d)
            self.assertEqual(kv.client().mget("before", "t1", "t2"), [b"2", b"a", b"b"])
            self.assertEqual(kv.stop(), 0)
            # Cut anywhere inside it (EXEC's record incomplete or missing): none of it.
            for cut in (len(data) - 1, len(data) - 14, multi + 20, multi + 15):
                with open(path, "wb") as f:
                    f.write(data[:cut])
                for side in [x for x in os.listdir(d) if ".torn-" in x]:
                    os.unlink(os.path.join(d, side))
                kv = Kv("--appendonly", "yes", "--dir", d)
                self.assertEqual(kv.client().mget("before", "t1", "t2"), [b"1", None, None], cut)
                self.assertEqual(kv.stop(), 0)
                self.assertEqual(os.path.getsize(path), multi)  # cut at the MULTI
                side = [x for x in os.listdir(d) if ".torn-" in x]
                self.assertEqual(side, ["appendonly.aof.torn-%d" % multi])
                self.assertEqual(open(os.path.join(d, side[0]), "rb").read(), data[multi:cut])
                self.assertTrue(any("MULTI without EXEC" in l for l in kv.stderr_lines))
        finally:
            shutil.rmtree(d, ignore_errors=True)


class PubSub(SideBySide):
    def test_redis_py_messages_match_redis(self):
        got = {}
        for name, srv in (("kv", self.kv), ("redis", self.redis)):
            r = srv.client()
            p = r.pubsub()
            p.subscribe("news", "sport")
            p.psubscribe("n*", "x?z")
            msgs = []
            deadline = time.monotonic() + 5
            while len(msgs) < 4 and time.monotonic() < deadline:
                m = p.get_message(timeout=0.5)
                if m:
                    msgs.append(m)
            counts = [r.publish("news", "hello"), r.publish("xyz", "p"), r.publish("none", "z"),
                      r.publish("sport", b"\x00bin\r\n")]
            while len(msgs) < 9 and time.monotonic() < deadline:
                m = p.get_message(timeout=0.5)
                if m:
                    msgs.append(m)
            info = (r.pubsub_channels(), r.pubsub_numsub("news", "nope"), r.pubsub_numpat())
            p.unsubscribe("news")
            p.punsubscribe()
            while len(msgs) < 12 and time.monotonic() < deadline:
                m = p.get_message(timeout=0.5)
                if m:
                    msgs.append(m)
            got[name] = (msgs, counts, sorted(info[0]), info[1], info[2])
            p.close()
        self.assertEqual(got["kv"], got["redis"])
        self.assertEqual(got["kv"][1], [2, 1, 1, 1])

    def test_subscriptions_are_bounded(self):
        s = Resp(self.kv.port)
        self.assertEqual(s.call("SUBSCRIBE", b"c" * ((64 << 10) + 1)),
                         b"-ERR channel or pattern longer than 65536 bytes\r\n")
        self.assertEqual(s.call("PSUBSCRIBE", b"p" * 65536)[:14], b"*3\r\n$10\r\npsubs")
        names = [b"ch%d" % i for i in range(99999)]  # with the pattern: 100000, the bound
        s.send("SUBSCRIBE", *names)
        for i in range(99999):
            s.reply()
        self.assertTrue(s.call("SUBSCRIBE", "one-more").startswith(b"-ERR too many subscriptions"))
        self.assertEqual(self.kv.client().pubsub_numsub("ch5"), [(b"ch5", 1)])
        s.close()

    def test_subscribed_mode_and_resp3_pushes_raw(self):
        # Each reply is read as one frame, so a command that answers with several
        # is compared frame by frame; UNSUBSCRIBE with no argument only where one
        # channel is left (Redis walks its own hash order).
        script = [("SUBSCRIBE", "c", "d"), ("GET", "a"), ("PING",), ("PING", "x"),
                  ("PSUBSCRIBE", "p*"), ("UNSUBSCRIBE", "d"), ("UNSUBSCRIBE",),
                  ("PUNSUBSCRIBE", "p*", "q*"), ("UNSUBSCRIBE",), ("GET", "a"), ("PING",)]
        self.both(script)
        self.both(script, proto=3)  # RESP3: pushes, and every command allowed
        # A message pushed to a RESP3 subscriber, byte for byte.
        frames = []
        for srv in (self.kv, self.redis):
            sub, pub = Resp(srv.port), Resp(srv.port)
            sub.call("HELLO", "3")
            sub.call("SUBSCRIBE", "ch")
            sub.call("PSUBSCRIBE", "c*")
            self.assertEqual(pub.call("PUBLISH", "ch", "msg"), b":2\r\n")
            frames.append((sub.reply(), sub.reply(), sub.call("PING")))
            sub.close()
            pub.close()
        self.assertEqual(frames[0], frames[1])
        self.assertEqual(frames[0][0], b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nmsg\r\n")

    def test_a_subscriber_that_never_reads_is_closed_and_memory_stays_bounded(self):
        r = self.kv.client()
        self.assertTrue(r.config_set("client-output-buffer-limit", "pubsub 4mb 1mb 1"))
        self.assertEqual(r.config_get("client-output-buffer-limit")["client-output-buffer-limit"],
                         "normal 0 0 0 slave 268435456 67108864 60 pubsub 4194304 1048576 1")
        lazy = socket.socket()
        lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lazy.connect(("127.0.0.1", self.kv.port))
        lazy.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nfeed\r\n")
        time.sleep(0.2)
        rss0 = self.rss_kib()
        payload = b"x" * 65536
        sent = 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            n = r.publish("feed", payload)
            sent += 1
            if n == 0:
                break
        self.assertEqual(r.publish("feed", payload), 0)  # the subscriber is gone
        self.assertLess(sent * 65536, 64 << 20)  # well before 64 MiB were published
        info = r.info("stats")
        self.assertGreaterEqual(info["output_limit_closes"], 1)
        self.assertEqual(r.pubsub_numsub("feed"), [(b"feed", 0)])
        self.assertLess(self.rss_kib() - rss0, 32 << 10)
        lazy.close()
        # The soft limit: above 1 MB for more than 2 seconds (the hard one out of reach).
        r.config_set("client-output-buffer-limit", "pubsub 256mb 1mb 2")
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", self.kv.port))
        slow.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nslow\r\n")
        time.sleep(0.2)
        start = time.monotonic()
        for _ in range(256):  # 16 MiB: past what the sockets' buffers take, over the soft limit
            r.publish("slow", payload)
        # Still subscribed while over the soft limit for less than its 2 seconds
        # (judged only when publishing took well under that: not under a sanitizer).
        if time.monotonic() - start < 1.5:
            self.assertEqual(r.pubsub_numsub("slow"), [(b"slow", 1)])
        time.sleep(3.0)
        self.assertEqual(r.pubsub_numsub("slow"), [(b"slow", 0)])
        slow.close()

    def rss_kib(self):
        with open(f"/proc/{self.kv.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


class Operations(SideBySide):
    def test_monitor_lines_have_redis_format(self):
        lines = []
        for srv in (self.kv, self.redis):
            m = Resp(srv.port)
            self.assertEqual(m.call("MONITOR"), b"+OK\r\n")
            c = srv.client()
            c.set("a b", "x\ny\"\x01")
            lines.append(m._line())
            m.close()
        pat = re.compile(rb'^\+\d+\.\d{6} \[0 127\.0\.0\.1:\d+\] "SET" "a b" "x\\ny\\"\\x01"\r\n$')
        for line in lines:
            self.assertRegex(line, pat)

    def test_client_kill_list_and_errors(self):
        self.both([("CLIENT", "KILL", "1.2.3.4:5"), ("CLIENT", "KILL", "ID", "999"),
                   ("CLIENT", "KILL", "ID", "x"), ("CLIENT", "KILL", "FOO", "bar"),
                   ("CLIENT", "KILL", "ADDR", "1.2.3.4:5", "SKIPME", "maybe"),
                   ("CLIENT", "PAUSE", "x"), ("CLIENT", "PAUSE", "10", "X"),
                   ("CLIENT", "UNPAUSE",), ("CLIENT", "KILL")])
        r = self.kv.client()
        victim = self.kv.client()
        victim.client_setname("victim")
        vid = victim.client_id()
        listing = r.client_list()
        me = [c for c in listing if c["name"] == "victim"]
        self.assertEqual(len(me), 1)
        self.assertEqual(int(me[0]["id"]), vid)
        self.assertEqual(r.execute_command("CLIENT", "KILL", "ID", vid), 1)
        self.assertFalse(any(c["name"] == "victim" for c in r.client_list()))
        # The old form, by address.
        other = Resp(self.kv.port)
        other.call("CLIENT", "SETNAME", "old")
        addr = [c["addr"] for c in r.client_list() if c["name"] == "old"][0]
        self.assertEqual(r.execute_command("CLIENT", "KILL", addr), b"OK")
        time.sleep(0.1)
        with self.assertRaises((ConnectionError, OSError)):
            other.call("PING")
        # SKIPME yes (the default) spares the caller.
        self.assertEqual(r.execute_command("CLIENT", "KILL", "ID", r.client_id()), 0)
        self.assertTrue(r.ping())

    def test_client_pause_holds_commands_until_it_ends_or_unpause(self):
        r, w = self.kv.client(), self.kv.client()
        self.assertTrue(r.execute_command("CLIENT", "PAUSE", "400", "WRITE"))
        t0 = time.monotonic()
        self.assertIsNone(w.get("x"))  # reads go on
        self.assertLess(time.monotonic() - t0, 0.2)
        t0 = time.monotonic()
        self.assertTrue(w.set("x", "1"))  # the write waits for the pause to end
        self.assertGreater(time.monotonic() - t0, 0.3)
        self.assertTrue(r.execute_command("CLIENT", "PAUSE", "10000"))  # ALL
        threading.Timer(0.3, lambda: r.execute_command("CLIENT", "UNPAUSE")).start()
        t0 = time.monotonic()
        self.assertEqual(w.get("x"), b"1")
        self.assertTrue(0.25 < time.monotonic() - t0 < 2.0)
        # WRITE: an EXEC whose queue holds a write waits; a read-only one runs.
        tx_write, tx_read = Resp(self.kv.port), Resp(self.kv.port)
        for c in (tx_write, tx_read):
            self.assertEqual(c.call("MULTI"), b"+OK\r\n")
        self.assertEqual(tx_write.call("SET", "y", "1"), b"+QUEUED\r\n")
        self.assertEqual(tx_read.call("GET", "x"), b"+QUEUED\r\n")
        self.assertTrue(r.execute_command("CLIENT", "PAUSE", "400", "WRITE"))
        t0 = time.monotonic()
        self.assertEqual(tx_read.call("EXEC"), b"*1\r\n$1\r\n1\r\n")
        self.assertLess(time.monotonic() - t0, 0.2)
        self.assertEqual(tx_write.call("EXEC"), b"*1\r\n+OK\r\n")
        self.assertGreater(time.monotonic() - t0, 0.3)
        tx_write.close()
        tx_read.close()

    def test_config_set_takes_effect_and_errors_match(self):
        self.both([("CONFIG", "SET", "foo", "bar"), ("CONFIG", "SET", "timeout", "x"),
                   ("CONFIG", "SET", "timeout", "-1"), ("CONFIG", "SET", "appendfsync", "maybe"),
                   ("CONFIG", "SET", "timeout"), ("CONFIG", "SET", "timeout", "5", "timeout", "6"),
                   ("CONFIG", "SET", "protected-mode", "maybe"),
                   ("CONFIG", "SET", "maxmemory", "10x"),
                   ("CONFIG", "SET", "client-output-buffer-limit", "pubsub 1"),
                   ("CONFIG", "SET", "slowlog-max-len", "64"), ("CONFIG", "GET", "slowlog-max-len"),
                   ("CONFIG", "SET", "maxmemory", "100mb"), ("CONFIG", "GET", "maxmemory"),
                   ("CONFIG", "SET", "maxmemory", "0")])
        r = self.kv.client()
        r.config_set("maxmemory", "1mb")
        with self.assertRaises(redis.ResponseError) as e:
            for i in range(20):
                r.set("big%d" % i, "x" * 100000)
        self.assertTrue(str(e.exception).startswith("OOM"), e.exception)
        self.assertLess(r.dbsize(), 11)
        r.config_set("maxmemory", "0")
        self.assertTrue(r.set("big", "x" * 2000000))
        r.config_set("timeout", "1")
        idle = Resp(self.kv.port)
        self.assertEqual(idle.call("PING"), b"+PONG\r\n")
        time.sleep(2.5)
        with self.assertRaises((ConnectionError, OSError)):
            idle.call("PING")
        self.assertEqual(r.config_get("timeout"), {"timeout": "1"})
        r.config_set("timeout", "0")

    def test_slowlog_records_slow_commands(self):
        r = self.kv.client()
        r.config_set("slowlog-log-slower-than", "0")
        r.slowlog_reset()
        r.set("slow-key", "v" * 200)
        r.get("slow-key")
        log = r.slowlog_get(10)
        self.assertGreaterEqual(len(log), 2)
        self.assertEqual(log[0]["command"], b"GET slow-key")
        self.assertTrue(log[1]["command"].startswith(b"SET slow-key " + b"v" * 128 + b"... (72 more bytes)"))
        self.assertGreater(log[0]["id"], log[1]["id"])
        self.assertGreaterEqual(r.slowlog_len(), 2)
        r.config_set("slowlog-log-slower-than", "-1")
        self.assertTrue(r.slowlog_reset())
        r.get("slow-key")
        self.assertEqual(r.slowlog_len(), 0)
        self.both([("SLOWLOG", "GET", "x"), ("SLOWLOG", "FOO"), ("SLOWLOG", "GET", "-1")])

    def test_a_single_server_says_it_is_not_a_cluster_as_redis_does(self):
        # What cluster clients probe: the CLUSTER family's error and INFO's field.
        self.both([("CLUSTER", "KEYSLOT", "foo"), ("CLUSTER", "INFO"), ("READONLY",),
                   ("READWRITE",), ("CLUSTER",), ("INFO", "cluster")])

    def test_info_fields_for_redis_py_and_redis_cli_stat(self):
        r = self.kv.client()
        r.set("one", "1")
        r.get("one")
        r.get("missing")
        info = r.info("everything")
        for k in ("redis_version", "conveyor_kv_version", "run_id", "process_id", "tcp_port",
                  "uptime_in_seconds", "connected_clients", "blocked_clients", "used_memory",
                  "used_memory_rss", "maxmemory", "aof_enabled", "total_commands_processed",
                  "instantaneous_ops_per_sec", "keyspace_hits", "keyspace_misses", "role",
                  "connected_slaves", "used_cpu_sys", "used_cpu_user", "cmdstat_get", "db0"):
            self.assertIn(k, info)
        self.assertEqual(info["process_id"], self.kv.proc.pid)
        self.assertEqual(info["tcp_port"], self.kv.port)
        self.assertEqual(info["role"], "master")
        self.assertEqual(info["cmdstat_get"]["calls"], 2)
        self.assertEqual(info["db0"]["keys"], 1)
        self.assertEqual((info["keyspace_hits"], info["keyspace_misses"]), (1, 1))
        self.assertEqual(len(info["run_id"]), 40)
        with open(f"/proc/{self.kv.proc.pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        self.assertLess(abs(info["used_memory_rss"] - rss), 8 << 20)
        out = subprocess.run(["timeout", "2.5", "stdbuf", "-oL", "redis-cli", "-p", str(self.kv.port), "--stat",
                              "-i", "0.5"], capture_output=True, text=True)
        rows = [l.split() for l in out.stdout.splitlines() if re.match(r"^\d", l)]
        self.assertGreaterEqual(len(rows), 2, out.stdout)
        self.assertEqual(rows[0][0], "1")  # keys
        self.assertTrue(rows[0][2] == "1" or rows[0][2] == "2")  # clients: r (and redis-cli)
        self.assertRegex(rows[0][1], r"^[\d.]+[BKMG]$")  # used_memory with a unit
        self.assertTrue(rows[0][4].isdigit())  # requests: total_commands_processed


if __name__ == "__main__":
    BIN = sys.argv[1]
    del sys.argv[1]
    unittest.main(verbosity=2, warnings="ignore")
