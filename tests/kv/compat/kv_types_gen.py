"""The random command sequences kv_types.py and kv_types_state.py send: one
random command over every type (strings, hashes, lists, sets, sorted sets,
expiry and the keyspace commands) from a few keys, fields and values chosen so
that commands collide, and a reply's normal form with the order Redis leaves
unspecified taken out. Imported, not run.
"""
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
