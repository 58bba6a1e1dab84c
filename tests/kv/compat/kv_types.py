#!/usr/bin/python3
"""conveyor-kv's hashes, lists, sets and sorted sets against redis-server 7 as
the oracle: seeded random command sequences over every type (and expiry, and
the keyspace commands) sent to both, every reply compared (order-insensitive
only where Redis leaves the order unspecified; kv_types_gen.py makes them),
full scans of large collections, and bad input for every command. The
server's own behaviour around the types (blocking pops, encodings, AOF,
expiry, eviction, redis-benchmark) is kv_types_state.py.

Usage: kv_types.py CONVEYOR_BINARY [unittest args...]
Starts its own `conveyor kv serve --port 0` and a redis-server on a free port.
"""
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_server import KvServer, RedisServer  # noqa: E402
from kv_types_gen import KEYS, gen, norm  # noqa: E402
from resp_conn import Conn  # noqa: E402

BIN = None


class Redis(RedisServer):
    def __init__(self):
        super().__init__("--protected-mode", "no")


class Kv(KvServer):
    def __init__(self, *args):
        super().__init__(BIN, *args)


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


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main()
