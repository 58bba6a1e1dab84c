#!/usr/bin/python3
"""conveyor-kv's types in the server's life: BLPOP/BRPOP wake-ups, order,
timeouts and disconnects (also woken by an RDMA RPC); the encoding thresholds
and one-sided reads of each encoding; AOF replay and rewrite of every type;
large sets and hashes (scans while the table resizes, SPOP/SRANDMEMBER
fairness); expiry and eviction of every type; redis-benchmark's default tests.
The replies compared with redis-server's are kv_types.py.

Usage: kv_types_state.py CONVEYOR_BINARY [unittest args...]
Starts its own `conveyor kv serve` servers.
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_server import KvServer  # noqa: E402
from kv_types_gen import gen, norm  # noqa: E402
from resp_conn import Conn  # noqa: E402

BIN = None


class Kv(KvServer):
    def __init__(self, *args):
        super().__init__(BIN, *args)


class Blocking(unittest.TestCase):
    def setUp(self):
        self.rdma = "@kv-types-%d" % os.getpid()
        self.kv = Kv("--provider", "shm", "--rdma-listen", self.rdma)
        deadline = time.monotonic() + 10
        while not any("RDMA on" in line for line in self.kv.stderr_lines):
            self.assertLess(time.monotonic(), deadline, self.kv.stderr_lines)
            time.sleep(0.05)

    def tearDown(self):
        self.kv.stop()

    def test_blpop_is_woken_by_a_push_and_gets_it(self):
        waiter, pusher = Conn(self.kv.port), Conn(self.kv.port)
        waiter.send("BLPOP", "q", "other", "5")
        time.sleep(0.2)
        t0 = time.monotonic()
        self.assertEqual(pusher.call("RPUSH", "q", "job1", "job2"), ("int", 2))
        self.assertEqual(waiter.read(), ("arr", [("bulk", b"q"), ("bulk", b"job1")]))
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(pusher.call("LRANGE", "q", "0", "-1"), ("arr", [("bulk", b"job2")]))
        # The waiter's pipeline after BLPOP waited for it, then ran.
        waiter.send("BRPOP", "q2", "5")
        waiter.send("PING")
        time.sleep(0.1)
        pusher.call("LPUSH", "q2", "x")
        self.assertEqual(waiter.read(), ("arr", [("bulk", b"q2"), ("bulk", b"x")]))
        self.assertEqual(waiter.read(), ("simple", b"PONG"))
        self.assertEqual(pusher.call("EXISTS", "q2"), ("int", 0))  # the pop emptied it

    def test_waiters_are_served_in_arrival_order(self):
        w = [Conn(self.kv.port) for _ in range(3)]
        for c in w:
            c.send("BLPOP", "fifo", "5")
            time.sleep(0.05)
        p = Conn(self.kv.port)
        p.call("RPUSH", "fifo", "1", "2", "3")
        self.assertEqual([c.read()[1][1] for c in w], [("bulk", b"1"), ("bulk", b"2"), ("bulk", b"3")])

    def test_blpop_times_out_with_a_null_array(self):
        c = Conn(self.kv.port)
        t0 = time.monotonic()
        self.assertEqual(c.call("BLPOP", "never", "0.3"), ("nullarr",))
        took = time.monotonic() - t0
        self.assertGreaterEqual(took, 0.29)
        self.assertLess(took, 1.0)
        c.call("HELLO", "3")
        self.assertEqual(c.call("BRPOP", "never", "0.05"), ("null",))

    def test_a_client_that_disconnects_while_blocked_is_forgotten(self):
        c = Conn(self.kv.port)
        c.send("BLPOP", "gone", "0")
        time.sleep(0.1)
        c.close()
        time.sleep(0.1)
        p = Conn(self.kv.port)
        self.assertEqual(p.call("RPUSH", "gone", "kept"), ("int", 1))
        time.sleep(0.05)
        # Nobody took it: the closed client's wait went with it.
        self.assertEqual(p.call("LRANGE", "gone", "0", "-1"), ("arr", [("bulk", b"kept")]))

    def test_a_push_over_rdma_wakes_a_resp_client(self):
        waiter = Conn(self.kv.port)
        waiter.send("BLPOP", "rq", "5")
        time.sleep(0.1)
        out = subprocess.run([BIN, "kv", "call", "RPUSH", "rq", "from-rdma", "-h", self.rdma],
                             capture_output=True, timeout=20)
        self.assertEqual(out.stdout, b":1\r\n", out.stderr)
        self.assertEqual(waiter.read(), ("arr", [("bulk", b"rq"), ("bulk", b"from-rdma")]))
        # Over an RPC, BLPOP cannot wait: it answers as a timeout at once.
        out = subprocess.run([BIN, "kv", "call", "BLPOP", "empty", "0", "-h", self.rdma],
                             capture_output=True, timeout=20)
        self.assertEqual(out.stdout, b"*-1\r\n", out.stderr)


def dump(c):
    """Every key's type, contents and expiry, comparable across restarts."""
    out = {}
    keys = sorted(e[1] for e in c.call("KEYS", "*")[1])
    for k in keys:
        t = c.call("TYPE", k)[1]
        if t == b"string":
            v = c.call("GET", k)
        elif t == b"hash":
            v = norm(["HGETALL"], c.call("HGETALL", k))
        elif t == b"list":
            v = c.call("LRANGE", k, "0", "-1")
        elif t == b"set":
            v = norm(["SMEMBERS"], c.call("SMEMBERS", k))
        else:
            v = c.call("ZRANGE", k, "0", "-1", "WITHSCORES")
        pttl = c.call("PEXPIRETIME", k)[1]
        out[k] = (t, v, pttl)
    return out


class Thresholds(unittest.TestCase):
    def test_encoding_options_reach_config_get_and_object_encoding(self):
        kv = Kv("--hash-max-listpack-entries", "4", "--set-max-intset-entries", "2",
                "--provider", "shm", "--rdma-listen", "@kv-types-thr-%d" % os.getpid())
        try:
            c = Conn(kv.port)
            self.assertEqual(c.call("CONFIG", "GET", "hash-max-listpack-entries"),
                             ("arr", [("bulk", b"hash-max-listpack-entries"), ("bulk", b"4")]))
            c.call("HSET", "h", "a", "1", "b", "2", "c", "3", "d", "4")
            self.assertEqual(c.call("OBJECT", "ENCODING", "h"), ("bulk", b"listpack"))
            deadline = time.monotonic() + 10
            while not any("RDMA on" in line for line in kv.stderr_lines):
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.05)
            where = ["-h", "@kv-types-thr-%d" % os.getpid()]
            # Small: one-sided, from the item.
            out = subprocess.run([BIN, "kv", "hgetall", "h", *where], capture_output=True, timeout=20)
            lines = out.stdout.split(b"\n")[:-1]
            self.assertEqual(sorted(zip(lines[::2], lines[1::2])),
                             [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")], out.stderr)
            out = subprocess.run([BIN, "kv", "hgetall", "nokey", *where], capture_output=True, timeout=20)
            self.assertEqual(out.stdout, b"(empty array)\n", out.stderr)
            out = subprocess.run([BIN, "kv", "get", "h", *where], capture_output=True, timeout=20)
            self.assertIn(b"WRONGTYPE", out.stderr)
            self.assertEqual(out.returncode, 1)
            c.call("HSET", "h", "e", "5")
            self.assertEqual(c.call("OBJECT", "ENCODING", "h"), ("bulk", b"hashtable"))
            c.call("SADD", "s", "1", "2", "3")
            self.assertEqual(c.call("OBJECT", "ENCODING", "s"), ("bulk", b"hashtable"))
            # Past the threshold the hash is read through the server, all of it.
            out = subprocess.run([BIN, "kv", "hgetall", "h", "-h", "@kv-types-thr-%d" % os.getpid()],
                                 capture_output=True, timeout=20)
            lines = out.stdout.split(b"\n")[:-1]
            self.assertEqual(sorted(zip(lines[::2], lines[1::2])),
                             [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4"), (b"e", b"5")],
                             out.stderr)
            out = subprocess.run([BIN, "kv", "hget", "h", "e", "-h", "@kv-types-thr-%d" % os.getpid()],
                                 capture_output=True, timeout=20)
            self.assertEqual(out.stdout, b"5\n", out.stderr)
        finally:
            kv.stop()


class Persistence(unittest.TestCase):
    def test_aof_replays_and_rewrites_every_type(self):
        d = tempfile.mkdtemp(prefix="kv-types-aof-")
        try:
            kv = Kv("--appendonly", "yes", "--dir", d, "--appendfsync", "always")
            c = Conn(kv.port)
            rng = random.Random(7)
            for _ in range(3000):
                cmd = gen(rng)
                if cmd[0] in ("BLPOP", "BRPOP"):
                    continue
                c.call(*cmd)
            c.call("HSET", "user", "name", "ann", "age", "41")
            c.call("RPUSH", "big", *["e%d" % j for j in range(300)])
            c.call("ZADD", "scores", "1.1", "a", "inf", "b", "-2.5e-7", "c")
            c.call("SADD", "tags", "x", "y", "3")
            c.call("PEXPIRE", "tags", "100000")
            c.call("SPOP", "tags")
            c.call("HINCRBYFLOAT", "user", "age", "0.5")
            c.call("ZPOPMIN", "scores")
            before = dump(c)
            self.assertGreater(len(before), 4)
            c.close()
            kv.stop()
            kv = Kv("--appendonly", "yes", "--dir", d)
            c = Conn(kv.port)
            self.assertEqual(dump(c), before)
            self.assertEqual(c.call("BGREWRITEAOF")[0], "simple")
            c.close()
            kv.stop()
            size = os.path.getsize(os.path.join(d, "appendonly.aof"))
            kv = Kv("--appendonly", "yes", "--dir", d)
            c = Conn(kv.port)
            self.assertEqual(dump(c), before)
            with open(os.path.join(d, "appendonly.aof"), "rb") as f:
                log = f.read()
            for word in (b"HSET", b"RPUSH", b"SADD", b"ZADD", b"PEXPIREAT"):
                self.assertIn(word, log)
            self.assertGreater(size, 0)
            c.close()
            kv.stop()
        finally:
            shutil.rmtree(d, ignore_errors=True)


class LargeSetsAndHashes(unittest.TestCase):
    """Sets and hashes past the compact encodings are hash tables that resize
    as they grow and shrink (element_table.hpp): SSCAN/HSCAN keep Redis's
    guarantee across resizes, SPOP/SRANDMEMBER pick every member, and big
    collections survive the AOF rewrite."""

    def setUp(self):
        self.kv = Kv()
        self.c = Conn(self.kv.port)

    def tearDown(self):
        self.c.close()
        self.kv.stop()

    def scan_while(self, cmd, key, between):
        seen, cursor, steps = set(), b"0", 0
        while True:
            r = self.c.call(cmd, key, cursor, "COUNT", "20")
            self.assertEqual(r[0], "arr", r)
            cursor = r[1][0][1]
            items = [e[1] for e in r[1][1][1]]
            seen.update(items if cmd == "SSCAN" else items[::2])
            between(steps)
            steps += 1
            self.assertLess(steps, 200000)
            if cursor == b"0":
                return seen

    def test_scans_return_every_element_present_throughout_while_the_table_resizes(self):
        for cmd, add, rem in (("SSCAN", "SADD", "SREM"), ("HSCAN", "HSET", "HDEL")):
            key = cmd.lower()
            stable = ["stable:%d" % j for j in range(2000)]
            pair = (lambda xs: xs) if add == "SADD" else (lambda xs: [x for e in xs for x in (e, "v")])
            self.c.call(add, key, *pair(stable))
            extras = ["extra:%d" % j for j in range(40000)]
            at = {"grown": 0}

            def between(step):
                # 40 000 more elements over the first 80 steps (the table
                # doubles four times), then all of them gone again (it halves
                # back), with the cursor well into the scan.
                if step < 80:
                    chunk = extras[step * 500:(step + 1) * 500]
                    self.c.call(add, key, *pair(chunk))
                    at["grown"] = (step + 1) * 500
                elif step >= 150 and at["grown"] > 0:
                    chunk = extras[at["grown"] - 2000:at["grown"]]
                    self.assertEqual(self.c.call(rem, key, *chunk), ("int", len(chunk)))
                    at["grown"] -= 2000

            seen = self.scan_while(cmd, key, between)
            missing = [m for m in stable if m.encode() not in seen]
            self.assertEqual(missing, [], cmd)
            self.assertEqual(self.c.call("OBJECT", "ENCODING", key), ("bulk", b"hashtable"))

    def test_spop_and_srandmember_pick_every_member(self):
        members = ["m%d" % j for j in range(600)]  # past set-max-intset-entries: a table
        self.c.call("SADD", "s", *members)
        r = self.c.call("SRANDMEMBER", "s", "-60000")  # repeats allowed: 60 000 draws
        counts = {}
        for e in r[1]:
            counts[e[1]] = counts.get(e[1], 0) + 1
        self.assertEqual(len(counts), 600)
        # 100 expected each; a fair pick leaves [40, 180] with probability < 1e-8 over all.
        self.assertGreater(min(counts.values()), 40, sorted(counts.values())[:5])
        self.assertLess(max(counts.values()), 180, sorted(counts.values())[-5:])
        r = self.c.call("SRANDMEMBER", "s", "599")
        self.assertEqual(len({e[1] for e in r[1]}), 599)
        popped = []
        while True:
            r = self.c.call("SPOP", "s")
            if r[0] != "bulk" or r[1] is None:
                break
            popped.append(r[1])
            if len(popped) == 300:
                self.assertEqual(self.c.call("SCARD", "s"), ("int", 300))
                popped += [e[1] for e in self.c.call("SPOP", "s", "250")[1]]
        self.assertEqual(sorted(popped), sorted(m.encode() for m in members))
        self.assertEqual(self.c.call("EXISTS", "s"), ("int", 0))

    def test_big_sets_and_hashes_survive_the_aof_rewrite(self):
        d = tempfile.mkdtemp(prefix="kv-types-big-")
        try:
            kv = Kv("--appendonly", "yes", "--dir", d)
            c = Conn(kv.port)
            for j in range(0, 100000, 1000):
                c.call("SADD", "bigset", *["member:%d" % i for i in range(j, j + 1000)])
                c.call("HSET", "bighash", *[x for i in range(j // 2, j // 2 + 500)
                                            for x in ("field:%d" % i, "value:%d" % i)])
            c.call("SPOP", "bigset", "1000")
            c.call("SREM", "bigset", *["member:%d" % i for i in range(0, 100000, 3)])
            c.call("HDEL", "bighash", *["field:%d" % i for i in range(0, 50000, 7)])
            before = dump(c)
            self.assertEqual(c.call("BGREWRITEAOF")[0], "simple")
            c.close()
            kv.stop()
            kv = Kv("--appendonly", "yes", "--dir", d)
            c = Conn(kv.port)
            self.assertEqual(dump(c), before)
            self.assertEqual(c.call("SCARD", "bigset")[1], len(before[b"bigset"][1][1]))
            c.close()
            kv.stop()
        finally:
            shutil.rmtree(d, ignore_errors=True)


class ExpiryAndEviction(unittest.TestCase):
    def test_every_type_expires_lazily_and_actively(self):
        kv = Kv()
        try:
            c = Conn(kv.port)
            for lazy in (True, False):
                c.call("HSET", "h", "f", "v")
                c.call("RPUSH", "l", "a")
                c.call("SADD", "s", "a")
                c.call("ZADD", "z", "1", "a")
                for k in ("h", "l", "s", "z"):
                    self.assertEqual(c.call("PEXPIRE", k, "100"), ("int", 1))
                    self.assertGreater(c.call("PTTL", k)[1], 0)
                time.sleep(0.35)
                if lazy:
                    self.assertEqual(c.call("HGET", "h", "f"), ("null",))
                    self.assertEqual(c.call("LLEN", "l"), ("int", 0))
                    self.assertEqual(c.call("SCARD", "s"), ("int", 0))
                    self.assertEqual(c.call("ZCARD", "z"), ("int", 0))
                else:  # nobody touched them: the active pass removed them
                    self.assertEqual(c.call("DBSIZE"), ("int", 0))
                # The collection went with its key: a new one starts empty.
                self.assertEqual(c.call("RPUSH", "l", "fresh"), ("int", 1))
                c.call("FLUSHALL")
        finally:
            kv.stop()

    def test_every_type_is_evicted_under_maxmemory(self):
        kv = Kv("--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
        try:
            c = Conn(kv.port)
            blob = "v" * 200
            for j in range(400):
                c.call("HSET", "h%d" % j, *[x for i in range(10) for x in ("f%d" % i, blob)])
                c.call("RPUSH", "l%d" % j, *[blob] * 10)
                c.call("SADD", "s%d" % j, *["%s%d" % (blob, i) for i in range(10)])
                r = c.call("ZADD", "z%d" % j, *[x for i in range(10) for x in (str(i), "%s%d" % (blob, i))])
                self.assertEqual(r, ("int", 10))
            info = c.call("INFO", "stats")[1].decode()
            evicted = int(info.split("evicted_keys:")[1].split()[0])
            self.assertGreater(evicted, 100)
            types = {c.call("TYPE", k[1])[1] for k in c.call("KEYS", "*")[1]}
            self.assertEqual(types, {b"hash", b"list", b"set", b"zset"})
            used = int(c.call("INFO", "memory")[1].decode().split("used_memory:")[1].split()[0])
            self.assertLessEqual(used, 2 << 20)
        finally:
            kv.stop()
        kv = Kv("--maxmemory", "1mb")
        try:
            c = Conn(kv.port)
            blob = "v" * 1000
            r = None
            for j in range(2000):
                r = c.call("RPUSH", "l", blob)
                if r[0] == "err":
                    break
            self.assertEqual(r, ("err", b"OOM command not allowed when used memory > 'maxmemory'."))
            self.assertEqual(c.call("LPOP", "l")[0], "bulk")  # reads and frees still work
        finally:
            kv.stop()


class Benchmark(unittest.TestCase):
    def test_redis_benchmark_default_tests_complete(self):
        kv = Kv()
        try:
            out = subprocess.run(["redis-benchmark", "-p", str(kv.port), "-n", "2000", "-q"],
                                 capture_output=True, text=True, timeout=240)
            rows = [line.split("\r")[-1] for line in out.stdout.splitlines() if "requests per second" in line]
            names = [r.split(":")[0] for r in rows]
            for want in ("PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "LPUSH", "RPUSH", "LPOP",
                         "RPOP", "SADD", "HSET", "SPOP", "ZADD", "ZPOPMIN", "LPUSH (needed to benchmark LRANGE)",
                         "LRANGE_100 (first 100 elements)", "LRANGE_300 (first 300 elements)",
                         "LRANGE_500 (first 500 elements)", "LRANGE_600 (first 600 elements)",
                         "MSET (10 keys)"):
                self.assertIn(want, names, out.stdout + out.stderr)
            self.assertNotIn("ERR", out.stdout + out.stderr)
            self.assertEqual(out.returncode, 0)
            c = Conn(kv.port)
            self.assertEqual(c.call("TYPE", "mylist"), ("simple", b"list"))
        finally:
            kv.stop()


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main()
