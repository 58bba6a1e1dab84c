#!/usr/bin/python3
"""conveyor-kv's hashes, lists, sets and sorted sets against redis-server 7 as
the oracle: seeded random command sequences over every type (and expiry, and
the keyspace commands) sent to both, every reply compared (order-insensitive
only where Redis leaves the order unspecified); bad input for every command;
BLPOP/BRPOP wake-ups, timeouts and disconnects; expiry and eviction of every
type; AOF replay and rewrite of every type; redis-benchmark's default tests.

Usage: kv_types.py CONVEYOR_BINARY [unittest args...]
Starts its own `conveyor kv serve --port 0` and a redis-server on a free port.
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
from kv_server import KvServer, RedisServer  # noqa: E402
from resp_conn import Conn  # noqa: E402

BIN = None
REDIS = "/usr/bin/redis-server"


class Redis(RedisServer):
    def __init__(self):
        super().__init__("--protected-mode", "no")


class Kv(KvServer):
    def __init__(self, *args):
        super().__init__(BIN, *args)


# ---- the random command sequences ---------------------------------------------

KEYS = ["k0", "k1", "k2", "k3", "k4"]
FIELDS = ["f0", "f1", "f2", "f3", "1", "2"]
VALUES = ["a", "b", "1", "2", "-3", "10", "1.5", "x" * 70, "", "9223372036854775807", "abc"]
SCORES = ["1", "2", "-1", "1.5", "0", "inf", "-inf", "+inf", "3e2", "nan", "x", "(1"]
UNORDERED = {"SMEMBERS", "SINTER", "SUNION", "SDIFF", "HKEYS", "HVALS", "HGETALL", "KEYS"}


def gen(rng):
    """One random command (a list of strings)."""
    k = rng.choice(KEYS)
    k2 = rng.choice(KEYS)
    f = rng.choice(FIELDS)
    v = rng.choice(VALUES)
    i = str(rng.randint(-6, 6))
    s = rng.choice(SCORES)
    m = rng.choice(FIELDS)
    big = rng.random() < 0.02
    choices = [
        # strings, WRONGTYPE on collections
        lambda: ["SET", k, v], lambda: ["GET", k], lambda: ["APPEND", k, v], lambda: ["INCR", k],
        lambda: ["STRLEN", k], lambda: ["GETRANGE", k, "0", i], lambda: ["GETSET", k, v],
        lambda: ["GETDEL", k], lambda: ["MGET", k, k2],
        # hashes
        lambda: ["HSET", k, f, v] + ([m, v] if rng.random() < 0.3 else []),
        lambda: ["HMSET", k, f, v], lambda: ["HSETNX", k, f, v], lambda: ["HGET", k, f],
        lambda: ["HMGET", k, f, m], lambda: ["HGETALL", k], lambda: ["HDEL", k, f, m],
        lambda: ["HINCRBY", k, f, i], lambda: ["HINCRBYFLOAT", k, f, rng.choice(["1.5", "-0.25", "x", "3"])],
        lambda: ["HLEN", k], lambda: ["HEXISTS", k, f], lambda: ["HKEYS", k], lambda: ["HVALS", k],
        lambda: ["HSTRLEN", k, f], lambda: ["HSCAN", k, "0"],
        # lists
        lambda: [rng.choice(["LPUSH", "RPUSH"]), k, v] + ([m] if rng.random() < 0.4 else []),
        lambda: [rng.choice(["LPUSHX", "RPUSHX"]), k, v],
        lambda: [rng.choice(["LPOP", "RPOP"]), k] + ([str(rng.randint(-1, 3))] if rng.random() < 0.5 else []),
        lambda: ["LRANGE", k, i, str(rng.randint(-6, 6))], lambda: ["LLEN", k],
        lambda: ["LINDEX", k, i], lambda: ["LSET", k, i, v], lambda: ["LREM", k, i, v],
        lambda: ["LTRIM", k, i, str(rng.randint(-6, 6))],
        lambda: [rng.choice(["BLPOP", "BRPOP"]), k, k2, "0.01"],
        # sets
        lambda: ["SADD", k, m] + ([v] if rng.random() < 0.4 else []), lambda: ["SREM", k, m],
        lambda: ["SMEMBERS", k], lambda: ["SISMEMBER", k, m], lambda: ["SCARD", k],
        lambda: [rng.choice(["SINTER", "SUNION", "SDIFF"]), k, k2], lambda: ["SSCAN", k, "0"],
        lambda: ["SPOP", k] + ([str(rng.randint(-1, 4))] if rng.random() < 0.5 else []),
        lambda: ["SRANDMEMBER", k] + ([str(rng.randint(-4, 4))] if rng.random() < 0.7 else []),
        # sorted sets
        lambda: ["ZADD", k] + rng.sample(["NX", "XX", "GT", "LT", "CH", "INCR"], rng.randint(0, 2))
        + [s, m] + ([rng.choice(SCORES), v] if rng.random() < 0.3 else []),
        lambda: ["ZINCRBY", k, s, m], lambda: ["ZREM", k, m], lambda: ["ZSCORE", k, m],
        lambda: ["ZCARD", k], lambda: ["ZRANK", k, m], lambda: ["ZREVRANK", k, m],
        lambda: ["ZCOUNT", k, rng.choice(SCORES), rng.choice(SCORES)],
        lambda: [rng.choice(["ZPOPMIN", "ZPOPMAX"]), k] + ([str(rng.randint(-1, 3))] if rng.random() < 0.5 else []),
        lambda: zrange(rng, k), lambda: ["ZSCAN", k, "0"],
        # keyspace and expiry
        lambda: ["DEL", k], lambda: ["EXISTS", k, k2], lambda: ["TYPE", k],
        lambda: ["EXPIRE", k, rng.choice(["100", "-1"])], lambda: ["TTL", k], lambda: ["PERSIST", k],
        lambda: ["RENAME", k, k2], lambda: ["RENAMENX", k, k2], lambda: ["OBJECT", "ENCODING", k],
        lambda: ["DBSIZE"], lambda: ["KEYS", "*"],
    ]
    if big:  # past the compact encodings' thresholds
        n = rng.choice([130, 140, 600])
        return rng.choice([
            ["RPUSH", k] + ["e%d" % j for j in range(n)],
            ["HSET", k] + [x for j in range(n) for x in ("h%d" % j, str(j))],
            ["SADD", k] + [str(j) for j in range(n)],
            ["ZADD", k] + [x for j in range(n) for x in (str(j % 7), "z%d" % j)],
        ])
    return rng.choice(choices)()


def zrange(rng, k):
    kind = rng.choice(["rank", "score", "lex", "rangebyscore", "revrange"])
    if kind == "rank":
        a = ["ZRANGE", k, str(rng.randint(-4, 4)), str(rng.randint(-4, 4))]
    elif kind == "score":
        a = ["ZRANGE", k, rng.choice(SCORES), rng.choice(SCORES), "BYSCORE"]
    elif kind == "lex":
        a = ["ZRANGE", k, rng.choice(["-", "[f1", "(f2", "[1", "x"]),
             rng.choice(["+", "[f3", "(f2", "[2"]), "BYLEX"]
    elif kind == "rangebyscore":
        a = ["ZRANGEBYSCORE", k, rng.choice(SCORES), rng.choice(SCORES)]
    else:
        a = ["ZREVRANGE", k, str(rng.randint(-4, 4)), str(rng.randint(-4, 4))]
    if rng.random() < 0.3 and kind != "revrange":
        a.append("REV")
    if rng.random() < 0.4:
        a.append("WITHSCORES")
    if rng.random() < 0.3:
        a += ["LIMIT", str(rng.randint(-1, 2)), str(rng.randint(-1, 3))]
    return a


def norm(cmd, reply):
    """The reply with the order Redis leaves unspecified taken out."""
    name = cmd[0].upper()
    if name == "HGETALL" and reply[0] == "arr":
        pairs = [(reply[1][j], reply[1][j + 1]) for j in range(0, len(reply[1]), 2)]
        return ("pairs", sorted(pairs))
    if name == "HGETALL" and reply[0] == "map":
        return ("map", sorted(reply[1]))
    if name in UNORDERED and reply[0] in ("arr", "set"):
        return (reply[0], sorted(reply[1]))
    if name in ("HSCAN", "SSCAN") and reply[0] == "arr":
        items = reply[1][1][1]
        if name == "HSCAN":
            items = [(items[j], items[j + 1]) for j in range(0, len(items), 2)]
        return ("scan", reply[1][0], sorted(items))
    return reply


class Differential(unittest.TestCase):
    """Every reply of seeded random sequences compared with redis-server's."""

    def setUp(self):
        self.redis = Redis()
        self.kv = Kv()

    def tearDown(self):
        self.kv.stop()
        self.redis.stop()

    def random_member_checks(self, cmd, got, want, oracle):
        """SPOP and SRANDMEMBER pick at random: compare the reply's shape, check
        each member against the oracle, and make the oracle pop the same ones."""
        self.assertEqual(got[0], want[0], cmd)
        if got[0] in ("err", "null", "nullarr", "int"):
            self.assertEqual(got, want, cmd)
            return
        members = [got[1]] if got[0] == "bulk" else [e[1] for e in got[1]]
        if cmd[0] == "SRANDMEMBER" and len(cmd) == 3 and int(cmd[2]) > 0:
            self.assertEqual(len(set(members)), len(members), cmd)
        if got[0] != "bulk":
            self.assertEqual(len(members), len(want[1]), cmd)
        if cmd[0] == "SPOP" and members:
            # Redis popped others: give it back what it took, then take what we took.
            taken = [want[1]] if want[0] == "bulk" else [e[1] for e in want[1]]
            oracle.call("SADD", cmd[1], *taken)
        for m in set(members):
            self.assertEqual(oracle.call("SISMEMBER", cmd[1], m), ("int", 1), (cmd, m))
        if cmd[0] == "SPOP" and members:
            self.assertEqual(oracle.call("SREM", cmd[1], *members), ("int", len(members)), cmd)

    @staticmethod
    def full_scan(c, cmd, first):
        """The sorted elements of a whole scan that began with `first` on the
        oracle (its first reply; the conveyor-kv side starts over)."""
        if first[0] != "arr":
            return first
        seen, cursor = [], b"0"
        while True:
            r = c.call(cmd[0], cmd[1], cursor, *cmd[3:])
            if r[0] != "arr":
                return r
            cursor = r[1][0][1]
            items = [e[1] for e in r[1][1][1]]
            if cmd[0] != "SSCAN":
                items = list(zip(items[::2], items[1::2]))
            seen += items
            if cursor == b"0":
                return sorted(seen)

    def run_sequence(self, seed, steps, resp3):
        rng = random.Random(seed)
        a, b = Conn(self.redis.port), Conn(self.kv.port)
        for c in (a, b):
            c.call("FLUSHALL")
            if resp3:
                self.assertEqual(c.call("HELLO", "3")[0], "map")
        history = []  # for the failure message: what led there
        for step in range(steps):
            cmd = gen(rng)
            history.append(cmd)
            want = a.call(*cmd)
            if cmd[0] in ("SPOP", "SRANDMEMBER"):
                # kv first, so the oracle's state can be made to follow it
                got = b.call(*cmd)
                self.random_member_checks(cmd, got, want, a)
                continue
            if cmd[0] in ("HSCAN", "SSCAN", "ZSCAN"):
                # A large collection's cursors are each server's own: compare
                # what whole scans return.
                got = ("scan", self.full_scan(b, cmd, want))
                want = ("scan", self.full_scan(a, cmd, want))
            else:
                got = b.call(*cmd)
            if cmd[0] == "OBJECT" and want[0] == "bulk" and want[1] in (b"raw", b"embstr", b"int"):
                continue  # strings: APPEND makes Redis's raw what conveyor-kv calls embstr
            if cmd[0] == "HINCRBYFLOAT" and want[0] == "err" and b"not a float" in want[1]:
                pass
            if norm(cmd, got) != norm(cmd, want):
                key = cmd[2] if cmd[0] == "OBJECT" else cmd[1]
                touching = [h for h in history if key in h[1:]]
                self.fail("seed %d step %d resp%d: %r\n  conveyor-kv: %r\n  redis:       %r\n"
                          "  the key's history: %r" % (seed, step, 3 if resp3 else 2, cmd, got, want,
                                                       [" ".join(h)[:80] for h in touching[-12:]]))
        # The whole data set at the end, key by key.
        for k in KEYS:
            self.assertEqual(b.call("TYPE", k), a.call("TYPE", k), k)
            for cmd in (["HGETALL", k], ["LRANGE", k, "0", "-1"], ["SMEMBERS", k],
                        ["ZRANGE", k, "0", "-1", "WITHSCORES"], ["GET", k], ["TTL", k]):
                self.assertEqual(norm(cmd, b.call(*cmd)), norm(cmd, a.call(*cmd)), cmd)
        a.close()
        b.close()

    def test_random_sequences_match_redis_resp2(self):
        for seed in range(1, 7):
            self.run_sequence(seed, 1500, False)

    def test_random_sequences_match_redis_resp3(self):
        for seed in range(101, 105):
            self.run_sequence(seed, 1500, True)

    def test_full_scans_of_large_collections_match(self):
        """HSCAN/SSCAN/ZSCAN of collections past the compact encodings: every
        element once over the whole scan, with COUNT and MATCH."""
        a, b = Conn(self.redis.port), Conn(self.kv.port)
        for c in (a, b):
            c.call("HSET", "h", *[x for j in range(600) for x in ("f%d" % j, "v%d" % j)])
            c.call("SADD", "s", *["m%d" % j for j in range(600)])
            c.call("ZADD", "z", *[x for j in range(600) for x in (str(j), "z%d" % j)])
        for cmd, key in (("HSCAN", "h"), ("SSCAN", "s"), ("ZSCAN", "z")):
            for extra in ([], ["COUNT", "7"], ["MATCH", "*1*", "COUNT", "50"]):
                results = []
                for c in (a, b):
                    seen, cursor = [], b"0"
                    while True:
                        r = c.call(cmd, key, cursor, *extra)
                        self.assertEqual(r[0], "arr", r)
                        cursor = r[1][0][1]
                        items = [e[1] for e in r[1][1][1]]
                        if cmd != "SSCAN":
                            items = list(zip(items[::2], items[1::2]))
                        seen += items
                        if cursor == b"0":
                            break
                    results.append(sorted(seen))
                self.assertEqual(len(set(results[1])), len(results[1]), (cmd, extra))
                self.assertEqual(results[1], results[0], (cmd, extra))
        for c in (a, b):
            self.assertEqual(c.call("OBJECT", "ENCODING", "h"), ("bulk", b"hashtable"))
            self.assertEqual(c.call("OBJECT", "ENCODING", "s"), ("bulk", b"hashtable"))
            self.assertEqual(c.call("OBJECT", "ENCODING", "z"), ("bulk", b"skiplist"))
            for t, k in (("zset", b"z"), ("hash", b"h"), ("set", b"s"), ("string", None)):
                found, cursor = [], b"0"
                while True:
                    r = c.call("SCAN", cursor, "TYPE", t, "COUNT", "100000")
                    cursor = r[1][0][1]
                    found += [e[1] for e in r[1][1][1]]
                    if cursor == b"0":
                        break
                self.assertEqual(found, [k] if k else [], t)


# Every new command, with what makes Redis refuse it.
BAD_INPUT = [
    # (setup, command); the command's reply must equal Redis's
    (["SET", "str", "v"], ["HSET", "str", "f", "v"]), (None, ["HSET", "h"]), (None, ["HSET", "h", "f"]),
    (None, ["HSET", "h", "f", "v", "g"]), (None, ["HMSET", "h", "f"]), (None, ["HSETNX", "h", "f"]),
    (None, ["HGET", "h"]), (None, ["HMGET", "h"]), (None, ["HGETALL"]), (None, ["HDEL", "h"]),
    (["HSET", "h", "f", "x"], ["HINCRBY", "h", "f", "1"]), (None, ["HINCRBY", "h", "f", "1.5"]),
    (["HSET", "h", "n", "9223372036854775807"], ["HINCRBY", "h", "n", "1"]),
    (None, ["HINCRBYFLOAT", "h", "f", "abc"]), (None, ["HINCRBYFLOAT", "h", "f", "inf"]),
    (["HSET", "h", "f", "x"], ["HINCRBYFLOAT", "h", "f", "1"]), (None, ["HLEN"]), (None, ["HEXISTS", "h"]),
    (None, ["HKEYS"]), (None, ["HVALS"]), (None, ["HSTRLEN", "h"]), (None, ["HSCAN", "h"]),
    (None, ["HSCAN", "h", "x"]), (None, ["HSCAN", "h", "0", "COUNT", "0"]),
    (None, ["HSCAN", "h", "0", "COUNT", "x"]), (None, ["HSCAN", "h", "0", "FOO"]),
    (["SET", "str", "v"], ["HGET", "str", "f"]), (["SET", "str", "v"], ["HGETALL", "str"]),
    (["RPUSH", "l", "a"], ["GET", "l"]), (["RPUSH", "l", "a"], ["APPEND", "l", "x"]),
    (["RPUSH", "l", "a"], ["INCR", "l"]), (["RPUSH", "l", "a"], ["STRLEN", "l"]),
    (["RPUSH", "l", "a"], ["GETRANGE", "l", "0", "1"]), (["RPUSH", "l", "a"], ["SET", "l", "v", "GET"]),
    (["RPUSH", "l", "a"], ["GETDEL", "l"]), (["RPUSH", "l", "a"], ["GETSET", "l", "v"]),
    (None, ["LPUSH", "l"]), (None, ["RPUSH", "l"]), (None, ["LPOP"]), (None, ["LPOP", "l", "1", "2"]),
    (["RPUSH", "l", "a"], ["LPOP", "l", "-1"]), (["RPUSH", "l", "a"], ["RPOP", "l", "x"]),
    (None, ["LRANGE", "l", "a", "1"]), (None, ["LRANGE", "l", "0"]), (None, ["LINDEX", "l", "x"]),
    (None, ["LSET", "nokey", "0", "v"]), (["RPUSH", "l", "a"], ["LSET", "l", "5", "v"]),
    (["RPUSH", "l", "a"], ["LSET", "l", "x", "v"]), (None, ["LREM", "l", "x", "v"]),
    (None, ["LTRIM", "l", "0", "x"]), (None, ["BLPOP", "l"]), (None, ["BLPOP", "l", "x"]),
    (None, ["BLPOP", "l", "-1"]), (None, ["BRPOP", "l", "1e30"]), (["SET", "str", "v"], ["BLPOP", "str", "0"]),
    (["SET", "str", "v"], ["LPUSH", "str", "a"]), (None, ["SADD", "s"]), (None, ["SREM", "s"]),
    (None, ["SMEMBERS"]), (None, ["SISMEMBER", "s"]), (None, ["SCARD"]),
    (["SADD", "s", "a"], ["SPOP", "s", "-1"]), (["SADD", "s", "a"], ["SPOP", "s", "1", "2"]),
    (["SADD", "s", "a"], ["SRANDMEMBER", "s", "x"]), (None, ["SINTER"]), (None, ["SUNION"]),
    (None, ["SDIFF"]), (["SET", "str", "v"], ["SINTER", "str"]), (None, ["SSCAN", "s", "-1"]),
    (["SET", "str", "v"], ["SADD", "str", "a"]), (None, ["ZADD", "z", "1"]),
    (None, ["ZADD", "z", "x", "m"]), (None, ["ZADD", "z", "nan", "m"]), (None, ["ZADD", "z", "NX", "XX", "1", "m"]),
    (None, ["ZADD", "z", "GT", "LT", "1", "m"]), (None, ["ZADD", "z", "NX", "GT", "1", "m"]),
    (None, ["ZADD", "z", "INCR", "1", "a", "2", "b"]), (None, ["ZADD", "z", "1", "a", "2"]),
    (["ZADD", "z", "inf", "m"], ["ZINCRBY", "z", "-inf", "m"]), (None, ["ZINCRBY", "z", "x", "m"]),
    (None, ["ZREM", "z"]), (None, ["ZSCORE", "z"]), (None, ["ZCARD"]),
    (["ZADD", "z", "1", "a"], ["ZRANGE", "z", "0", "-1", "LIMIT", "0", "1"]),
    (["ZADD", "z", "1", "a"], ["ZRANGE", "z", "a", "b", "BYLEX", "WITHSCORES"]),
    (["ZADD", "z", "1", "a"], ["ZRANGE", "z", "x", "1", "BYSCORE"]),
    (["ZADD", "z", "1", "a"], ["ZRANGE", "z", "a", "b", "BYLEX"]),
    (["ZADD", "z", "1", "a"], ["ZRANGE", "z", "0", "1", "BYSCORE", "BYLEX"]),
    (["ZADD", "z", "1", "a"], ["ZRANGE", "z", "0", "1", "FOO"]),
    (["ZADD", "z", "1", "a"], ["ZRANGE", "z", "0", "1", "LIMIT", "x", "1", "BYSCORE"]),
    (None, ["ZRANGEBYSCORE", "z", "0"]), (None, ["ZRANGEBYSCORE", "z", "0", "1", "REV"]),
    (None, ["ZREVRANGE", "z", "0", "x"]), (None, ["ZRANK", "z"]), (None, ["ZCOUNT", "z", "x", "1"]),
    (["ZADD", "z", "1", "a"], ["ZPOPMIN", "z", "-1"]), (["ZADD", "z", "1", "a"], ["ZPOPMAX", "z", "x"]),
    (None, ["ZSCAN", "z", "x"]), (["SET", "str", "v"], ["ZADD", "str", "1", "a"]),
    (["SET", "str", "v"], ["ZRANGE", "str", "0", "1"]), (None, ["OBJECT", "ENCODING"]),
    (None, ["OBJECT", "FOO", "k"]), (None, ["RENAME", "nokey", "x"]), (None, ["RENAME", "a"]),
    (None, ["RENAMENX", "nokey", "x"]), (None, ["SCAN", "0", "TYPE"]),
    (None, ["LLEN"]), (None, ["LPUSHX", "l"]), (None, ["RPUSHX"]), (None, ["ZREVRANK", "z"]),
    (None, ["ZREVRANGE", "z", "0"]), (None, ["ZPOPMIN"]), (None, ["ZPOPMAX", "z", "1", "2"]),
    (None, ["ZINCRBY", "z", "1"]), (None, ["SRANDMEMBER"]), (None, ["SPOP"]), (None, ["LINDEX", "l"]),
    (None, ["LTRIM", "l", "0"]), (None, ["LREM", "l", "0"]), (None, ["LSET", "l", "0"]),
    (["SET", "str", "v"], ["LLEN", "str"]), (["SET", "str", "v"], ["LRANGE", "str", "0", "1"]),
    (["SET", "str", "v"], ["SISMEMBER", "str", "a"]), (["SET", "str", "v"], ["ZSCORE", "str", "a"]),
    (["SET", "str", "v"], ["HLEN", "str"]), (["SET", "str", "v"], ["SPOP", "str"]),
    (["SET", "str", "v"], ["ZPOPMIN", "str"]), (["SET", "str", "v"], ["LPOP", "str"]),
    (["SET", "str", "v"], ["HSCAN", "str", "0"]), (["SET", "str", "v"], ["ZCOUNT", "str", "0", "1"]),
    (["HSET", "h", "f", "v"], ["ZRANK", "h", "f"]), (["SADD", "s", "a"], ["HINCRBY", "s", "f", "1"]),
    (["ZADD", "z", "1", "a"], ["SADD", "z", "b"]), (["SADD", "s", "a"], ["RPUSH", "s", "b"]),
]


class BadInput(unittest.TestCase):
    def setUp(self):
        self.redis = Redis()
        self.kv = Kv()

    def tearDown(self):
        self.kv.stop()
        self.redis.stop()

    def test_every_command_refuses_bad_input_as_redis_does(self):
        a, b = Conn(self.redis.port), Conn(self.kv.port)
        errors = 0
        for setup, cmd in BAD_INPUT:
            for c in (a, b):
                c.call("FLUSHALL")
                if setup:
                    c.call(*setup)
            want, got = a.call(*cmd), b.call(*cmd)
            errors += want[0] == "err"
            self.assertEqual(got, want, cmd)
            # Nothing was changed by a refused command.
            self.assertEqual(b.call("DBSIZE"), a.call("DBSIZE"), cmd)
        self.assertGreater(errors, len(BAD_INPUT) * 3 // 4)
        self.assertEqual(b.call("PING"), ("simple", b"PONG"))


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
