#!/usr/bin/python3
"""conveyor-kv's failover and fencing (issue 35), against the real binary: a
real etcd and a 1-shard x 1-replica cluster with a 2 s lease. Concurrent
clients write unique values and read a few keys, recording invoke and
complete times (history.py), while the test
  - SIGKILLs the primary: the controller promotes the replica once the
    primary's lease expires, clients follow -MOVED to it; the killed node is
    restarted, rejoins as a replica, catches up and is added back to the
    in-sync set (so it can be promoted in the next round); every other kill
    restarts the node at once, before its lease expires (the controller must
    see that another process registered under the primary's id);
  - hands the shard over by hand (`conveyor kv cluster failover`): the
    primary fences itself, waits for its replica, writes the new map;
  - SIGSTOPs the primary for twice the lease, then SIGCONTs it: a GET and a
    SET it had in its socket while stopped are answered with an error
    (-CLUSTERDOWN from its fence, or -MOVED once it read the new map), never
    with a value or OK; it then rejoins as a replica.
After the rounds: a per-key linearizability check of the whole history and a
read-back of every key: 0 violations and 0 acknowledged writes lost. Each
round prints its failover time (the fault to the first acknowledged write
invoked after it).

KV_FAILOVER_KILLS / KV_FAILOVER_HANDOVERS / KV_FAILOVER_STOPS set the rounds (default 6, 2 and 3, about
40 s; ctest's release preset runs 20 and 10, about 2 minutes; the soak in
docs/KV-CLUSTER.md ran more); KV_FAILOVER_LOGS=1 prints the
nodes' logs at the end. Every process is started here
and stopped here; every wait is bounded.

Usage: kv_failover.py CONVEYOR_BINARY [unittest args...]
"""
import json
import os
import random
import signal
import socket
import sys
import time
import unittest

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "history"))
import kv_cluster  # noqa: E402
from kv_cluster import wait_until  # noqa: E402
import linearizability  # noqa: E402
from load import Load as _Load  # noqa: E402

NAME = kv_cluster.NAME
LEASE_S = kv_cluster.LEASE_S
KEYS = ["fo:%d" % i for i in range(24)]
CLIENTS = 4


def Load(addrs, **kw):
    """history/load.py's Load on this file's KEYS with CLIENTS clients."""
    return _Load(addrs, KEYS, CLIENTS, **kw)


def config(etcd):
    return json.loads(etcd.get("/conveyor-kv/%s/config" % NAME))


class Failover(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd, cls.dir, cls.nodes = kv_cluster.start_cluster(
            # The shrink bound past the -NOREPLICAS bound: a replica that a
            # loaded machine stalls for a moment stays in the isr (its writes
            # answer -NOREPLICAS, unknown outcomes) rather than leave it just
            # before a round and leave the failover no candidate. The shrink
            # itself is kv_isr.py's.
            "conveyor-kv-failover.", 2, 1, 1, "--repl-timeout-ms", "1000", "--repl-isr-lag-ms",
            "5000", "--rdma-listen", "127.0.0.1:0")
        try:
            cls.by_id = {n.id: n for n in cls.nodes}
            wait_until(lambda: cls.in_sync(2), 20, "both nodes in the in-sync set")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        kv_cluster.stop_cluster(cls.etcd, cls.dir, getattr(cls, "nodes", []), "KV_FAILOVER_LOGS")

    @classmethod
    def in_sync(cls, n):
        try:
            return len(config(cls.etcd)["shards"][0]["isr"]) == n
        except Exception:
            return False

    def primary(self):
        return self.by_id[config(self.etcd)["shards"][0]["primary"]]

    def rejoin(self, node, old_epoch):
        """The node restarted (or resumed) is a replica again, caught up and
        back in the in-sync set, under a newer map."""
        try:
            wait_until(lambda: self.in_sync(2) and config(self.etcd)["epoch"] > old_epoch
                       and self.primary() is not node, 20,
                       "node %d back in the in-sync set" % node.port)
        except AssertionError:
            # What each node said, and the map, for the report.
            for n in self.nodes:
                print("--- node %d (%s) log tail:\n%s" % (n.port, n.id[:8], n.read_log()[-3000:]),
                      file=sys.stderr)
            print("--- map: %s" % self.etcd.get("/conveyor-kv/%s/config" % NAME), file=sys.stderr)
            raise

    def test_failover_under_load_loses_no_acknowledged_write(self):
        kills = int(os.environ.get("KV_FAILOVER_KILLS", "6"))
        stops = int(os.environ.get("KV_FAILOVER_STOPS", "3"))
        load = Load([("127.0.0.1", n.port) for n in self.nodes])
        handovers = int(os.environ.get("KV_FAILOVER_HANDOVERS", "2"))
        times = {"kill": [], "kill, restarted at once": [], "handover": [], "stop": []}
        try:
            rounds = ["kill"] * kills + ["handover"] * handovers + ["stop"] * stops
            for r, kind in enumerate(rounds):
                time.sleep(0.5)  # writes flow to the current primary
                old = self.primary()
                epoch = config(self.etcd)["epoch"]
                if kind == "kill":
                    t = time.monotonic_ns()
                    old.proc.send_signal(signal.SIGKILL)
                    old.proc.wait(10)
                    dead = time.monotonic_ns()
                    # Every other kill restarts the node at once, long before
                    # its lease expires: it registers again under its id, with
                    # an empty keyspace. The map's primary_boot tells the
                    # controller that this is another process (so the shard
                    # fails over as if the primary were gone), and the node
                    # serves nothing of its shard until then (before that fix
                    # it came back as the primary and its replica resynced
                    # from its empty keyspace: acknowledged writes lost).
                    at_once = r % 2 == 1
                    if at_once:
                        old.log.close()
                        old.start()
                    # Acknowledged by the new primary: invoked once the old one
                    # is dead (a write invoked between t and the kill's landing
                    # may be the old primary's, answered at once). The time is
                    # still counted from the kill.
                    took = load.first_ack_after(dead, 20) + (dead - t) / 1e9
                    if not at_once:
                        old.log.close()
                        old.start()
                    kind = "kill, restarted at once" if at_once else "kill"
                elif kind == "handover":
                    took = self.handover_round(load, old)
                else:
                    took = self.stop_round(load, old)
                times[kind].append(took)
                print("round %d (%s): failover in %.2f s (lease %d s)" % (r + 1, kind, took, LEASE_S),
                      file=sys.stderr, flush=True)
                self.rejoin(old, epoch)
            time.sleep(0.5)
        finally:
            ops = load.finish()
        self.verify(ops)
        for kind, ts in times.items():
            if ts:
                print("failover after %s: min %.2f s, max %.2f s, mean %.2f s over %d rounds" %
                      (kind, min(ts), max(ts), sum(ts) / len(ts), len(ts)), file=sys.stderr)
                # Issue 35's aim is the lease + 1 s (about 2 s and 3 s here on
                # an idle machine); a hung primary's replica needs 2 s of
                # silence to report, and CI's 2 cores are shared: the bounds
                # leave room for a loaded machine, and still catch a failover
                # that waits for the controller's 4 s grace or never comes.
                self.assertLess(max(ts), LEASE_S + (4 if kind == "stop" else 2), ts)

    def test_etcd_stopped_fences_the_nodes_within_the_lease(self):
        """etcd stopped: no node can renew its lease, so each fences itself
        before etcd could expire it (and so before any failover could
        happen): RESP answers -CLUSTERDOWN (no read of a value the node can no
        longer vouch for, no write acknowledged), RDMA connections are refused
        (one-sided GET and the write RPC); etcd back, the cluster serves
        again."""
        wait_until(lambda: self.in_sync(2), 20, "both nodes in the in-sync set")
        p = self.primary()

        def primary_serves():
            try:
                return p.client().set("fence:k", "v1")
            except redis.RedisError:
                return False
        wait_until(primary_serves, 20, "the primary serving writes")
        reg = json.loads(self.etcd.get("/conveyor-kv/%s/nodes/%s" % (NAME, p.id)))
        rdma = reg["rdma"]
        p.client().set("fence:k", "v1")
        r = kv_cluster.run("kv", "get", "--address", rdma, "fence:k", timeout=20)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "v1"), r.stderr)
        c = redis.Redis(host="127.0.0.1", port=p.port, socket_timeout=2,
                        single_connection_client=True)
        t0 = time.monotonic()
        self.etcd.proc.send_signal(signal.SIGSTOP)
        try:
            fenced_at = None
            while time.monotonic() - t0 < 5:
                try:
                    self.assertEqual(c.get("fence:k"), b"v1")
                except redis.ResponseError as e:
                    self.assertTrue(str(e).startswith("CLUSTERDOWN"), str(e))
                    fenced_at = time.monotonic() - t0
                    break
                time.sleep(0.01)
            self.assertIsNotNone(fenced_at, "still serving 5 s after etcd stopped")
            # The last renewal was sent before etcd stopped: the fence falls at
            # most TTL - margin (1.6 s) after it.
            self.assertLess(fenced_at, LEASE_S)
            with self.assertRaises(redis.ResponseError) as w:
                c.set("fence:k", "v2")
            self.assertIn("CLUSTERDOWN", str(w.exception))
            r = kv_cluster.run("kv", "get", "--address", rdma, "fence:k", timeout=20)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertNotIn("v1", r.stdout)
            r = kv_cluster.run("kv", "set", "--address", rdma, "fence:k", "v3", timeout=20)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            print("etcd stopped: the primary fenced after %.2f s (lease %d s)" % (fenced_at, LEASE_S),
                  file=sys.stderr)
        finally:
            self.etcd.proc.send_signal(signal.SIGCONT)
        c.close()

        def serving():
            try:
                q = self.primary()
                q.client().set("fence:k", "v4")
                return q.client().get("fence:k") == b"v4"
            except (redis.RedisError, OSError, ValueError, KeyError):
                return False
        wait_until(serving, 20, "the cluster serving again after etcd came back")
        wait_until(lambda: self.in_sync(2), 20, "both nodes in the in-sync set again")

    def handover_round(self, load, old):
        """`conveyor kv cluster failover`: the primary fences itself, waits for
        the replica to hold every record, and writes the map that promotes
        it. Nothing acknowledged is lost (the history's check) and the old
        primary serves nothing once the new one may acknowledge."""
        # Refusals first: the primary itself, and a node that is not in the shard.
        r = kv_cluster.run("kv", "cluster", "failover", "--etcd", self.etcd.endpoint, "--name",
                           NAME, "--to", old.id)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("already the shard's primary", r.stderr)
        r = kv_cluster.run("kv", "cluster", "failover", "--etcd", self.etcd.endpoint, "--name",
                           NAME, "--to", "f" * 40)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no in-sync replica of the shard", r.stderr)
        t = time.monotonic_ns()
        r = kv_cluster.run("kv", "cluster", "failover", "--etcd", self.etcd.endpoint, "--name",
                           NAME, "--shard", "127.0.0.1:%d" % old.port, timeout=30)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        done = time.monotonic_ns()
        new = self.primary()
        self.assertIsNot(new, old)
        self.assertIn(new.id, r.stdout)  # the state after, as a table
        # The command's time, then the first write acknowledged after it.
        took = (done - t) / 1e9 + load.first_ack_after(done, 20)
        # The old primary never takes a write again: fenced (CLUSTERDOWN)
        # until it reads the new map, then it redirects to the new primary.
        c = redis.Redis(host="127.0.0.1", port=old.port, socket_timeout=2)
        answers = []
        try:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                try:
                    c.set("fo:probe", "x")
                    answers.append("OK")
                except redis.ResponseError as e:
                    answers.append(str(e).split()[0])
                if answers[-1] != "CLUSTERDOWN":
                    break
                time.sleep(0.05)
        finally:
            c.close()
        self.assertEqual(answers[-1], "MOVED", answers)
        self.assertNotIn("OK", answers)
        return took

    def stop_round(self, load, old):
        """SIGSTOP the primary for twice the lease; what it had in its socket
        meanwhile must be answered with an error after SIGCONT."""
        probe_key = random.choice(KEYS)
        probe = socket.create_connection(("127.0.0.1", old.port), timeout=5)
        t = time.monotonic_ns()
        old.proc.send_signal(signal.SIGSTOP)
        try:
            took = load.first_ack_after(t, 2 * LEASE_S + 6)
            # A write acknowledged by the new primary for the probe's key, so
            # that a stale GET would show.
            newp = self.primary()
            self.assertIsNot(newp, old)
            fresh = "fresh-%d" % t
            with load.rec.record(client="probe", key=probe_key, kind="write", value=fresh) as op:
                newp.client().set(probe_key, fresh)
                op.ok()
            left = t / 1e9 + 2 * LEASE_S - time.monotonic()
            if left > 0:
                time.sleep(left)
            probe.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(probe_key), probe_key.encode()) +
                          b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$5\r\nstale\r\n" %
                          (len(probe_key), probe_key.encode()))
        finally:
            old.proc.send_signal(signal.SIGCONT)
        f = probe.makefile("rb")
        t_cont = time.monotonic()
        replies = [f.readline(), f.readline()]
        fenced_in = time.monotonic() - t_cont
        probe.close()
        for rep in replies:
            self.assertTrue(rep.startswith(b"-CLUSTERDOWN") or rep.startswith(b"-MOVED"),
                            "the resumed primary answered %r" % rep)
        print("  resumed primary answered %s in %.3f s" %
              ([r.split()[0].decode() for r in replies], fenced_in), file=sys.stderr)
        return took

    def verify(self, ops):
        p = self.primary().client()
        final = {}
        for k in KEYS:
            v = p.get(k)
            final[k] = None if v is None else v.decode()
        acked = sum(1 for o in ops if o.kind == "write" and o.outcome == "ok")
        unknown = sum(1 for o in ops if o.outcome == "unknown")
        res = linearizability.check(ops)
        lost = linearizability.lost_writes(ops, final)
        print("history: %d operations, %d acknowledged writes, %d unknown; %s; %d lost" %
              (len(ops), acked, unknown, res.report().splitlines()[0], len(lost)), file=sys.stderr)
        self.assertGreater(acked, 100)
        self.assertEqual(res.violations, [], res.report())
        self.assertEqual(res.undecided, [])
        self.assertEqual(lost, [], "\n".join(map(str, lost[:10])))


if __name__ == "__main__":
    kv_cluster.BIN = sys.argv.pop(1)
    unittest.main(verbosity=2)
