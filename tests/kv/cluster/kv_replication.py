#!/usr/bin/python3
"""conveyor-kv's synchronous replication (issue 35), against the real binary:
a real etcd and a 1-shard x 1-replica cluster (`kv cluster create --replicas
1`). Checks that
  - every type written through the primary is on the replica, exactly, as
    soon as the write's reply arrived (the reply waits for the replica's
    acknowledgement), read with READONLY;
  - the replica redirects writes (-MOVED), refuses keyless ones (-READONLY)
    and INFO # Replication says who is who, with offsets;
  - a SIGSTOPped replica holds a SET's reply until it resumes, or past
    --repl-timeout-ms turns it into -NOREPLICAS (no hang, no false OK), on
    RESP and on the RDMA write RPC (`conveyor kv set`); the nodes' shrink
    bound (--repl-isr-lag-ms) is set past the test's waits so that the
    replica stays in the in-sync set and the -NOREPLICAS bound is what
    answers (kv_isr.py tests the shrink, which releases them earlier);
  - a SIGKILLed replica, restarted, catches up (snapshot + stream) with the
    writes made while it was down;
  - garbage sent to the replication endpoint (raw TCP bytes, a silent peer,
    a Conveyor peer with a foreign hello) neither crashes nor stalls the
    primary;
  - `kv cluster up --shards 1 --replicas 1` starts a primary and its
    replica, linked, and SIGINT stops them.

Every process is started here and stopped here; every wait is bounded.

Usage: kv_replication.py CONVEYOR_BINARY [unittest args...]
"""
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_cluster  # noqa: E402
from kv_cluster import wait_until  # noqa: E402

NAME = kv_cluster.NAME
TIMEOUT_MS = 1500  # --repl-timeout-ms of the nodes
# Nothing here tests failover or fencing times (kv_failover does): the
# default lease, so a renewal etcd answers late on a loaded machine does not
# fence a node in the middle of a test (a 2 s lease did, once, beside two
# compiles: CLUSTERDOWN from a healthy replica).
kv_cluster.LEASE_S = 5
ISR_LAG_MS = 60000  # --repl-isr-lag-ms: no shrink within this file's waits


def info(client):
    """INFO replication as redis-py reads it (slaveN lines become dicts)."""
    return {k: v if isinstance(v, dict) else str(v)
            for k, v in client.info("replication").items()}


def dump(client):
    """Every key's type and value (and whether it expires), by type."""
    out = {}
    for k in client.scan_iter(count=500):
        t = client.type(k).decode()
        if t == "string":
            v = client.get(k)
        elif t == "hash":
            v = sorted(client.hgetall(k).items())
        elif t == "list":
            v = client.lrange(k, 0, -1)
        elif t == "set":
            v = sorted(client.smembers(k))
        elif t == "zset":
            v = client.zrange(k, 0, -1, withscores=True)
        else:
            v = None
        out[k] = (t, v, client.pttl(k) > 0)
    return out


class Replication(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd, cls.dir, cls.nodes = kv_cluster.start_cluster(
            "conveyor-kv-repl.", 2, 1, 1, "--repl-timeout-ms", str(TIMEOUT_MS), "--repl-isr-lag-ms",
            str(ISR_LAG_MS), "--rdma-listen", "127.0.0.1:0")
        try:
            # create takes the primaries first by address: the lower port.
            cls.nodes.sort(key=lambda n: n.port)
            cls.primary, cls.replica = cls.nodes
            cls.p = cls.primary.client()
            wait_until(lambda: cls.linked(), 15, "the replica's link up")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def linked(cls):
        try:
            i = info(cls.replica.client())
            return i.get("master_link_status") == "up"
        except redis.RedisError:
            return False

    @classmethod
    def tearDownClass(cls):
        kv_cluster.stop_cluster(cls.etcd, cls.dir, getattr(cls, "nodes", []))

    def reader(self):
        """A READONLY connection to the replica, once it serves: after a
        SIGSTOP longer than its fence (lease 2 s - 0.4 s after its last
        renewal) it answers -CLUSTERDOWN until its keeper renews the lease,
        which a loaded etcd may take a moment to answer."""
        r = redis.Redis(host="127.0.0.1", port=self.replica.port, socket_timeout=10,
                        single_connection_client=True)
        self.assertTrue(r.execute_command("READONLY"))

        def serves():
            try:
                r.get("reader-probe")
                return True
            except redis.ResponseError as e:
                if "CLUSTERDOWN" not in str(e):
                    raise
                return False
        wait_until(serves, 10, "the replica serving READONLY reads")
        return r

    def write_everything(self, prefix, n):
        p, rnd = self.p, random.Random(prefix)
        for i in range(n):
            k = "%s:s:%d" % (prefix, i)
            p.set(k, os.urandom(rnd.randrange(0, 300)))
            if i % 7 == 0:
                p.pexpire(k, 600000)
        for i in range(n // 10):
            p.hset("%s:h:%d" % (prefix, i), mapping={"f%d" % j: str(j) * j for j in range(20)})
            p.rpush("%s:l:%d" % (prefix, i), *[str(j) for j in range(30)])
            p.sadd("%s:set:%d" % (prefix, i), *[str(j) for j in range(25)])
            p.zadd("%s:z:%d" % (prefix, i), {"m%d" % j: j * 1.5 for j in range(25)})
            p.incrby("%s:n" % prefix, i)
        # Large collections (past the compact encodings), a transaction, a
        # script, deletes and pops: every kind of record the executor logs.
        p.hset(prefix + ":bigh", mapping={"f%d" % j: "v" * 100 for j in range(600)})
        p.sadd(prefix + ":bigset", *["member%d" % j for j in range(700)])
        tag = "{%s}" % prefix
        tx = p.pipeline(transaction=True)
        tx.set(tag + ":tx1", "a").lpush(tag + ":tx2", "x", "y").delete(tag + ":tx0")
        tx.execute()
        p.eval("redis.call('set', KEYS[1], 'from-lua'); redis.call('hset', KEYS[2], 'k', 'v')",
               2, tag + ":lua1", tag + ":lua2")
        p.delete(prefix + ":s:1")
        p.lpop("%s:l:0" % prefix)
        p.srem("%s:set:0" % prefix, "3")
        p.zincrby("%s:z:0" % prefix, 10, "m1")
        p.persist("%s:s:7" % prefix)

    def assert_same(self):
        want, got = dump(self.p), dump(self.reader())
        self.assertEqual(len(want), len(got))
        self.assertEqual(want, got)

    def test_1_the_replica_holds_exactly_what_the_primary_acknowledged(self):
        self.write_everything("a", 500)
        # No wait: each reply came after the replica had applied its write.
        self.assert_same()
        i, r = info(self.p), info(self.reader())
        self.assertEqual(i["role"], "master")
        self.assertEqual(i["connected_slaves"], "1")
        self.assertEqual(i["slave0"]["state"], "online")
        self.assertEqual(str(i["slave0"]["port"]), str(self.replica.port))  # its RESP port
        off = int(i["master_repl_offset"])
        self.assertGreater(off, 0)
        self.assertEqual(int(i["slave0"]["offset"]), off)
        self.assertEqual(int(i["slave0"]["lag"]), 0)
        self.assertEqual(r["role"], "slave")
        self.assertEqual(r["master_port"], str(self.primary.port))
        self.assertEqual(r["master_link_status"], "up")
        self.assertEqual(int(r["slave_repl_offset"]), off)

    def test_1b_wait_counts_the_in_sync_replica(self):
        # Synchronous: WAIT answers the in-sync set's size at once, after the
        # write before it is on the replica; on the replica itself there is
        # nobody to wait for.
        self.p.set("{w}k", "v")
        self.assertEqual(self.p.execute_command("WAIT", 1, 0), 1)
        self.assertEqual(self.p.execute_command("WAIT", 0, 0), 1)
        self.assertEqual(self.reader().get("{w}k"), b"v")
        self.assertEqual(self.reader().execute_command("WAIT", 0, 0), 0)

    def test_2_a_replica_redirects_writes_and_serves_readonly_reads(self):
        self.p.set("{r}k", "v")
        plain = self.replica.client()
        with self.assertRaisesRegex(redis.ResponseError, "MOVED"):
            plain.set("{r}k", "w")
        with self.assertRaisesRegex(redis.ResponseError, "MOVED"):
            plain.get("{r}k")  # without READONLY a read is redirected too
        with self.assertRaisesRegex(redis.exceptions.ReadOnlyError, "read only replica"):
            plain.flushall()
        r = self.reader()
        self.assertEqual(r.get("{r}k"), b"v")
        with self.assertRaisesRegex(redis.ResponseError, "MOVED"):
            r.set("{r}k", "w")  # READONLY does not make writes local
        self.assertEqual(self.p.get("{r}k"), b"v")

    def test_3_a_stopped_replica_holds_the_reply_then_it_times_out(self):
        pid = self.replica.proc.pid
        done = {}

        def set_it():
            try:
                done["r"] = redis.Redis(host="127.0.0.1", port=self.primary.port,
                                        socket_timeout=30).set("held", "1")
            except redis.RedisError as e:
                done["r"] = e
            done["t"] = time.monotonic()

        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            th = threading.Thread(target=set_it)
            th.start()
            time.sleep(0.6)
            self.assertNotIn("r", done, "SET answered while the replica was stopped")
            os.kill(pid, signal.SIGCONT)
            th.join(10)
            self.assertIs(done.get("r"), True)
            self.assertLess(done["t"] - t0, TIMEOUT_MS / 1000.0)
            self.assertEqual(self.reader().get("held"), b"1")
            # Stopped past the bound: an error, not OK and not a hang; a read
            # after it on the same connection waits too.
            os.kill(pid, signal.SIGSTOP)
            c = redis.Redis(host="127.0.0.1", port=self.primary.port, socket_timeout=30)
            t0 = time.monotonic()
            with self.assertRaisesRegex(redis.ResponseError, "NOREPLICAS"):
                c.set("held", "2")
            took = time.monotonic() - t0
            self.assertGreaterEqual(took, TIMEOUT_MS / 1000.0 - 0.05)
            self.assertLess(took, TIMEOUT_MS / 1000.0 + 3)
        finally:
            os.kill(pid, signal.SIGCONT)
        # Resumed, it applies what it missed; writes are acknowledged again.
        self.assertTrue(self.p.set("held", "3"))
        self.assertEqual(self.reader().get("held"), b"3")
        self.assert_same()

    def test_3b_an_rdma_write_rpc_waits_for_the_replica_too(self):
        addr = self.p.info("conveyor")["rdma_address"]
        pid = self.replica.proc.pid

        def kv_set(value):
            return subprocess.Popen([kv_cluster.BIN, "kv", "set", "rk", value, "--address", addr,
                                     "--timeout", "20"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)

        os.kill(pid, signal.SIGSTOP)
        try:
            c = kv_set("1")
            time.sleep(0.6)
            self.assertIsNone(c.poll(), "the RPC was answered while the replica was stopped")
            os.kill(pid, signal.SIGCONT)
            out, _ = c.communicate(timeout=20)
            self.assertEqual(c.returncode, 0, out)
            self.assertEqual(self.reader().get("rk"), b"1")
            os.kill(pid, signal.SIGSTOP)
            t0 = time.monotonic()
            c = kv_set("2")
            out, _ = c.communicate(timeout=20)
            took = time.monotonic() - t0
            self.assertNotEqual(c.returncode, 0, out)
            self.assertIn("NOREPLICAS", out)
            self.assertGreaterEqual(took, TIMEOUT_MS / 1000.0 - 0.05)
        finally:
            os.kill(pid, signal.SIGCONT)
        self.assertTrue(self.p.set("rk", "3"))
        self.assertEqual(self.reader().get("rk"), b"3")

    def test_4_a_killed_replica_catches_up_when_it_comes_back(self):
        self.replica.proc.kill()
        self.replica.proc.wait(10)
        self.replica.log.close()
        # Writes while it is down: applied on the primary, answered
        # -NOREPLICAS after the bound (pipelined: one bound for all).
        pipe = self.p.pipeline(transaction=False)
        for i in range(50):
            pipe.set("down:%d" % i, str(i))
        t0 = time.monotonic()
        res = pipe.execute(raise_on_error=False)
        self.assertLess(time.monotonic() - t0, TIMEOUT_MS / 1000.0 + 3)
        self.assertTrue(all(isinstance(x, redis.ResponseError) and "NOREPLICAS" in str(x)
                            for x in res), res[:3])
        self.replica.start()
        wait_until(lambda: self.linked(), 20, "the restarted replica's link up")
        self.write_everything("b", 100)
        self.assert_same()
        self.assertEqual(self.reader().get("down:49"), b"49")
        self.assertIn("snapshot applied", self.replica.read_log())

    def test_5_garbage_at_the_replication_endpoint_harms_nothing(self):
        addr = info(self.p)["repl_address"]
        host, port = addr.rsplit(":", 1)
        # Raw TCP: random bytes, an MPA-like prefix, a silent peer, a peer
        # that closes at once.
        silent = socket.create_connection((host, int(port)), timeout=5)
        for payload in [os.urandom(4096), b"MPA ID Req Frame" + os.urandom(64), b""]:
            s = socket.create_connection((host, int(port)), timeout=5)
            if payload:
                try:
                    s.sendall(payload)
                except OSError:
                    pass
            s.close()
        # A Conveyor peer with a foreign hello (the kv client's): rejected.
        r = kv_cluster.run("kv", "get", "x", "--address", addr, "--timeout", "3", timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("replica hello", r.stderr + r.stdout)
        # The primary still serves and still replicates synchronously.
        t0 = time.monotonic()
        self.assertTrue(self.p.set("after-garbage", "ok"))
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertEqual(self.reader().get("after-garbage"), b"ok")
        silent.close()
        self.assertIsNone(self.primary.proc.poll())


    def test_6_cluster_up_starts_replicas(self):
        base = kv_cluster.consecutive_free_ports(2)
        up, out = kv_cluster.start_up("--shards", "1", "--replicas", "1", "--port", str(base))
        try:
            self.assertIn("1 shard(s) x 1 replica(s)", out, out)
            self.assertIn("replica of", out)
            p = redis.Redis(host="127.0.0.1", port=base, socket_timeout=10)
            r = redis.Redis(host="127.0.0.1", port=base + 1, socket_timeout=10,
                            single_connection_client=True)
            wait_until(lambda: info(r).get("master_link_status") == "up", 15, "the link up")
            self.assertEqual(info(p)["role"], "master")
            self.assertTrue(p.set("up", "1"))
            r.execute_command("READONLY")
            self.assertEqual(r.get("up"), b"1")
            up.send_signal(signal.SIGINT)
            self.assertEqual(up.wait(20), 0, up.stderr.read())
        finally:
            kv_cluster.reap_up(up)


if __name__ == "__main__":
    kv_cluster.BIN = sys.argv.pop(1)
    unittest.main()
