#!/usr/bin/python3
"""conveyor-kv's in-sync set shrink (issue 35), against the real binary: a
real etcd and a 1-shard x 1-replica cluster (5 s lease, so that a replica
stopped for the shrink keeps its registration; --repl-timeout-ms 3000, so
the shrink bound is 1.5 s). Concurrent clients write unique values
and read (history/load.py's Load on kv_failover.py's keys, with a 5 s socket timeout so that a held
reply is seen released, not timed out) while the test
  - SIGKILLs the replica: the primary asks it out of the in-sync set by a
    shard-map CAS, and the writes held meanwhile are released once the map
    without it is in force: acknowledged, never -NOREPLICAS; the first
    acknowledged write invoked after the kill comes within the -NOREPLICAS
    bound (the time is printed);
  - restarts the replica: it catches up (snapshot + stream) and is added back
    to the in-sync set under a newer map, and writes wait for it again.
    Then a per-key linearizability check of the whole history and a
    read-back of every key from the primary and the replica: 0 violations,
    0 acknowledged writes lost;
  - SIGSTOPs the replica: a RESP SET and an RDMA write RPC (`conveyor kv
    set`) are held while it is still in the in-sync set, then answered OK
    (not -NOREPLICAS) once the shrink's map is in force, after the shrink
    bound and before the -NOREPLICAS bound; SIGCONTed, the replica (its link
    was closed) reconnects, catches up and rejoins.

Every process is started here and stopped here; every wait is bounded.

Usage: kv_isr.py CONVEYOR_BINARY [unittest args...]
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "history"))
import kv_cluster  # noqa: E402
from kv_cluster import wait_until  # noqa: E402
import kv_failover  # noqa: E402
import linearizability  # noqa: E402

NAME = kv_cluster.NAME
LEASE_S = 5
TIMEOUT_MS = 3000  # --repl-timeout-ms: -NOREPLICAS past it; the shrink at half of it


def config(etcd):
    return json.loads(etcd.get("/conveyor-kv/%s/config" % NAME))


class Shrink(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd, cls.dir, cls.nodes = kv_cluster.start_cluster(
            "conveyor-kv-isr.", 2, 1, 1, "--repl-timeout-ms", str(TIMEOUT_MS), "--rdma-listen",
            "127.0.0.1:0")
        try:
            cls.nodes.sort(key=lambda n: n.port)  # create takes the lower port as the primary
            cls.primary, cls.replica = cls.nodes
            wait_until(lambda: cls.isr() == [cls.primary.id, cls.replica.id], 20,
                       "both nodes in the in-sync set")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        kv_cluster.stop_cluster(cls.etcd, cls.dir, getattr(cls, "nodes", []), "KV_ISR_LOGS")

    @classmethod
    def isr(cls):
        try:
            return config(cls.etcd)["shards"][0]["isr"]
        except Exception:
            return None

    def both_in_sync(self, newer_than=0):
        """The replica in the map's isr. (A loaded machine can stall a healthy
        replica past the shrink bound: it leaves and rejoins by itself, and
        the tests wait for it to be back before each fault.)"""
        wait_until(lambda: self.isr() == [self.primary.id, self.replica.id]
                   and config(self.etcd)["epoch"] > newer_than, 15,
                   "the replica back in the in-sync set")

    def replica_reader(self):
        """A READONLY connection to the replica once it serves (a resumed
        node may be fenced for a moment, until its lease is renewed)."""
        r = redis.Redis(host="127.0.0.1", port=self.replica.port, socket_timeout=10,
                        single_connection_client=True)
        r.execute_command("READONLY")

        def serves():
            try:
                r.get("x")
                return True
            except redis.ResponseError as e:
                if "CLUSTERDOWN" not in str(e):
                    raise
                return False
        wait_until(serves, 10, "the replica serving READONLY reads")
        return r

    def test_1_a_killed_replica_leaves_the_isr_and_rejoins_after_catching_up(self):
        self.assertEqual(config(self.etcd)["shards"][0]["primary"], self.primary.id)
        load = kv_failover.Load([("127.0.0.1", n.port) for n in self.nodes], timeout=5)
        try:
            time.sleep(1.0)  # writes flow, each waiting for the replica
            self.both_in_sync()
            epoch = config(self.etcd)["epoch"]
            t = time.monotonic_ns()
            self.replica.proc.send_signal(signal.SIGKILL)
            self.replica.proc.wait(10)
            # From the kill to the first acknowledged write invoked once the
            # replica was gone (one invoked between the signal and the
            # process's end may still have been acknowledged by it).
            dead = time.monotonic_ns()
            self.replica.log.close()
            took = load.first_ack_after(dead, 10) + (dead - t) / 1e9
            print("replica killed: writes acknowledged again after %.2f s (shrink bound %.1f s, "
                  "-NOREPLICAS bound %.1f s)" % (took, TIMEOUT_MS / 2000, TIMEOUT_MS / 1000),
                  file=sys.stderr, flush=True)
            self.assertLess(took, TIMEOUT_MS / 1000)
            # The primary acknowledged without it only under a map without it.
            after = config(self.etcd)
            self.assertEqual(after["shards"][0]["isr"], [self.primary.id])
            self.assertEqual(after["shards"][0]["primary"], self.primary.id)
            self.assertGreater(after["epoch"], epoch)
            self.assertIn(self.replica.id, after["shards"][0]["replicas"])
            log = self.primary.read_log()
            self.assertIn("asking for it to leave the in-sync set", log)
            self.assertIn("removed from the in-sync set", log)
            time.sleep(0.5)  # writes go on without it
            # Restarted: it catches up and is back in the isr under a newer map.
            shrunk = config(self.etcd)["epoch"]
            self.replica.start()
            self.both_in_sync(shrunk)
            print("restarted replica back in the in-sync set", file=sys.stderr, flush=True)
            time.sleep(1.0)  # writes wait for it again
        finally:
            ops = load.finish()
        self.assertIn("snapshot applied", self.replica.read_log())
        # Held replies were released by the shrink, never turned into errors.
        noreplicas = [o for o in ops if "NOREPLICAS" in (o.error or "")]
        self.assertEqual(noreplicas, [])
        p = self.primary.client()
        # With the replica in the isr, a write acknowledged now is on it, and
        # so is every write before it.
        self.both_in_sync()
        self.assertTrue(p.set("last", "1"))
        r = self.replica_reader()
        final = {}
        for k in kv_failover.KEYS:
            v = p.get(k)
            final[k] = None if v is None else v.decode()
            self.assertEqual(r.get(k), v, k)
        acked = sum(1 for o in ops if o.kind == "write" and o.outcome == "ok")
        unknown = [o for o in ops if o.outcome == "unknown"]
        res = linearizability.check(ops)
        lost = linearizability.lost_writes(ops, final)
        print("history: %d operations, %d acknowledged writes, %d unknown; %s; %d lost" %
              (len(ops), acked, len(unknown), res.report().splitlines()[0], len(lost)),
              file=sys.stderr)
        self.assertGreater(acked, 100)
        self.assertEqual(res.violations, [], res.report())
        self.assertEqual(res.undecided, [])
        self.assertEqual(lost, [], "\n".join(map(str, lost[:10])))

    def test_2_a_stopped_replica_leaves_the_isr_and_the_held_replies_are_released(self):
        self.both_in_sync()
        p = self.primary.client()
        addr = p.info("conveyor")["rdma_address"]
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
            rpc = subprocess.Popen([kv_cluster.BIN, "kv", "set", "rk", "1", "--address", addr,
                                    "--timeout", "20"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
            time.sleep(0.5)
            # Still in the isr: held.
            self.assertNotIn("r", done, "SET answered while the replica was in the isr")
            self.assertIsNone(rpc.poll(), "the RPC was answered while the replica was in the isr")
            th.join(10)
            out, _ = rpc.communicate(timeout=20)
            took = done["t"] - t0
            print("replica stopped: the held SET answered after %.2f s" % took, file=sys.stderr,
                  flush=True)
            self.assertIs(done.get("r"), True)
            self.assertEqual(rpc.returncode, 0, out)
            self.assertGreaterEqual(took, TIMEOUT_MS / 2000 - 0.05)
            self.assertLess(took, TIMEOUT_MS / 1000)
            self.assertEqual(self.isr(), [self.primary.id])
            shrunk = config(self.etcd)["epoch"]
        finally:
            os.kill(pid, signal.SIGCONT)
        # Resumed: its link was closed when it was asked out; it connects
        # again, catches up and rejoins.
        self.both_in_sync(shrunk)
        self.assertTrue(p.set("held", "2"))
        r = self.replica_reader()
        self.assertEqual(r.get("held"), b"2")
        self.assertEqual(r.get("rk"), b"1")


if __name__ == "__main__":
    kv_cluster.BIN = sys.argv.pop(1)
    kv_cluster.LEASE_S = LEASE_S
    unittest.main(verbosity=2)
