"""A recorded client load on a cluster for the fault tests (kv_failover.py,
kv_faults.py): `clients` threads, each one RESP connection that follows
-MOVED and moves to another node on errors, writing unique values (75 %) and
reading `keys`, every operation recorded with its invoke and complete times
(history.py) for the linearizability check. Outcomes: -MOVED is answered
before anything runs (a write that failed); any other error or a lost
connection after a write was sent leaves it unknown (it may have been
applied); a read that failed is a failure."""
import random
import threading
import time

import redis

import history


class Load:
    def __init__(self, addrs, keys, clients, password=None, tag="c", timeout=1):
        self.addrs = list(addrs)  # (host, port)
        self.timeout = timeout  # each client's socket timeout, seconds
        self.keys = list(keys)
        self.password = password
        self.tag = tag  # the values' prefix: unique across loads on the same keys
        self.rec = history.Recorder()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(clients)]
        for t in self.threads:
            t.start()

    def next_addr(self, addr):
        return self.addrs[(self.addrs.index(addr) + 1) % len(self.addrs)] \
            if addr in self.addrs else self.addrs[0]

    def run(self, i):
        rnd = random.Random(i)
        addr = self.addrs[i % len(self.addrs)]
        conn, n = None, 0
        while not self.stop.is_set():
            if conn is None:
                try:
                    conn = redis.Redis(host=addr[0], port=addr[1], socket_timeout=self.timeout,
                                       socket_connect_timeout=1, password=self.password,
                                       single_connection_client=True)
                except (redis.RedisError, OSError):  # nothing was sent
                    addr = self.next_addr(addr)
                    time.sleep(0.02)
                    continue
            key, write = rnd.choice(self.keys), rnd.random() < 0.75
            n += 1
            value = "%s%d-%d" % (self.tag, i, n)
            op = self.rec.record(client="c%d" % i, key=key, kind="write" if write else "read",
                                 value=value if write else None)
            try:
                if write:
                    conn.set(key, value)
                    op.ok()
                else:
                    op.ok(conn.get(key))
                continue
            except redis.ResponseError as e:
                msg = str(e)
                if msg.startswith("MOVED") or not write:
                    op.fail(msg[:100])
                else:
                    op.unknown(msg[:100])
                if msg.startswith("MOVED"):
                    host, port = msg.split()[2].rsplit(":", 1)
                    addr = (host, int(port))
                else:
                    addr = self.next_addr(addr)
                    time.sleep(0.02)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                if write:
                    op.unknown(str(e)[:100])
                else:
                    op.fail(str(e)[:100])
                addr = self.next_addr(addr)
                time.sleep(0.02)
            try:
                conn.close()
            except Exception:
                pass
            conn = None

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        return self.rec.ops()

    def first_ack_after(self, t_ns, timeout):
        """Seconds from t_ns to the completion of the first acknowledged write
        invoked after it (waits up to `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            acks = [o.complete for o in self.rec.ops()
                    if o.kind == "write" and o.outcome == "ok" and o.invoke >= t_ns]
            if acks:
                return (min(acks) - t_ns) / 1e9
            time.sleep(0.05)
        raise AssertionError("no write acknowledged within %s s of the fault" % timeout)
