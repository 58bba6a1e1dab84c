#!/usr/bin/python3
"""Adding nodes to a conveyor-kv cluster and removing them (issue 35,
`conveyor kv cluster add-node|del-node`), against the real binary: a real
etcd, three nodes and a 1-shard x 1-replica map (`kv cluster create`), so one
node is registered but in no shard. Checks that
  - add-node makes the spare a replica of the shard: it catches up (snapshot,
    then the stream) with every key written before, enters the in-sync set,
    and from then on holds each write as soon as its reply arrived;
  - del-node refuses the shard's primary (its shard owns slots) and removes a
    replica: it leaves the in-sync set, writes are still acknowledged, and
    the removed node serves nothing (-MOVED to the primary);
  - add-node --new-shard makes a node the primary of a shard with no slot
    (no slot moves, its keys are -MOVED elsewhere) and del-node removes that
    shard again;
  - each refusal (a node already in the map, an unknown node, an ambiguous
    or missing name) exits 2 with the reason and leaves the map unchanged.

Every process is started here and stopped here; every wait is bounded.

Usage: kv_membership.py CONVEYOR_BINARY [unittest args...]
"""
import json
import os
import sys
import unittest

import redis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_cluster  # noqa: E402
from kv_cluster import wait_until  # noqa: E402

NAME = kv_cluster.NAME
kv_cluster.LEASE_S = 5  # nothing here tests fencing times


class Membership(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd, cls.dir, cls.nodes = kv_cluster.start_cluster(
            "conveyor-kv-membership.", 3, 1, 1, "--rdma-listen", "127.0.0.1:0")
        try:
            # create takes the nodes by address: primary, replica, then the spare.
            cls.nodes.sort(key=lambda n: n.port)
            cls.primary, cls.replica, cls.spare = cls.nodes
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        kv_cluster.stop_cluster(cls.etcd, cls.dir, getattr(cls, "nodes", []), "KV_MEMBERSHIP_LOGS")

    def admin(self, *args):
        return kv_cluster.run("kv", "cluster", *args, "--etcd", self.etcd.endpoint, "--name", NAME)

    def config(self):
        return json.loads(self.etcd.get("/conveyor-kv/%s/config" % NAME))

    def refused(self, *args, reason):
        before = self.config()
        r = self.admin(*args)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(reason, r.stderr)
        self.assertEqual(self.config(), before, "a refusal changed the map")

    def readonly(self, node):
        r = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=10,
                        single_connection_client=True)
        self.assertTrue(r.execute_command("READONLY"))
        return r

    def test_membership(self):
        p = self.primary.client()
        keys = ["{m}k%d" % i for i in range(300)]
        for i, k in enumerate(keys):
            self.assertTrue(p.set(k, "before-%d" % i))

        # Refusals first: nothing changes.
        self.refused("add-node", "--node", "127.0.0.1:1", reason="no registered node")
        self.refused("add-node", "--node", "127.0.0.1:%d" % self.replica.port,
                     reason="already in the shard map")
        self.refused("del-node", "--node", "127.0.0.1:%d" % self.primary.port,
                     reason="fail the shard over")
        self.refused("del-node", "--node", "127.0.0.1:%d" % self.spare.port,
                     reason="no node in the shard map")
        self.refused("del-node", "--node", "ab", reason="no node in the shard map")

        # The spare joins as a replica: it catches up and enters the isr.
        epoch = self.config()["epoch"]
        r = self.admin("add-node", "--node", self.spare.id[:10], "--shard",
                       "127.0.0.1:%d" % self.primary.port, "--wait-s", "30")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        shard = self.config()["shards"][0]
        self.assertEqual(shard["replicas"], [self.replica.id, self.spare.id])
        self.assertIn(self.spare.id, shard["isr"])
        self.assertGreater(self.config()["epoch"], epoch)
        spare = self.readonly(self.spare)
        wait_until(lambda: spare.get("{m}probe") is None, 10, "the new replica serving reads")
        for i, k in enumerate(keys):
            self.assertEqual(spare.get(k), b"before-%d" % i, k)
        # Synchronous from now on: each write is on it when its reply arrives.
        for i in range(50):
            self.assertTrue(p.set("{m}after%d" % i, "v%d" % i))
            self.assertEqual(spare.get("{m}after%d" % i), b"v%d" % i)

        # The first replica leaves: the map, the isr, and it serves nothing.
        r = self.admin("del-node", "--node", "127.0.0.1:%d" % self.replica.port)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        cfg = self.config()
        self.assertEqual(cfg["shards"][0]["replicas"], [self.spare.id])
        self.assertEqual(sorted(cfg["shards"][0]["isr"]), sorted([self.primary.id, self.spare.id]))
        self.assertNotIn(self.replica.id, [n["id"] for n in cfg["nodes"]])
        gone = self.readonly(self.replica)

        def redirects():
            try:
                gone.get(keys[0])
                return False
            except redis.ResponseError as e:
                return str(e).startswith("MOVED") and str(self.primary.port) in str(e)
        wait_until(redirects, 10, "the removed replica redirecting its former shard's keys")
        for i in range(20):
            self.assertTrue(p.set("{m}later%d" % i, "w%d" % i))
            self.assertEqual(spare.get("{m}later%d" % i), b"w%d" % i)

        # The removed node comes back as the primary of a new, empty shard.
        r = self.admin("add-node", "--node", self.replica.id, "--new-shard")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        cfg = self.config()
        self.assertEqual(len(cfg["shards"]), 2)
        new = [s for s in cfg["shards"] if s["primary"] == self.replica.id][0]
        self.assertEqual(new["slots"], [])
        self.assertEqual(cfg["shards"][0]["slots"], [[0, 16383]])
        status = json.loads(self.admin("status", "--json").stdout)
        self.assertEqual(status["slots_served"], 16384)
        self.refused("add-node", "--node", self.replica.id, "--new-shard",
                     reason="already in the shard map")
        plain = redis.Redis(host="127.0.0.1", port=self.replica.port, socket_timeout=10)
        wait_until(lambda: redirects_plain(plain, keys[1], self.primary.port), 10,
                   "the empty shard's primary redirecting every key")
        self.refused("del-node", "--node", self.primary.id, reason="fail the shard over")
        r = self.admin("del-node", "--node", self.replica.id)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len(self.config()["shards"]), 1)

        # Nothing acknowledged was lost on the way.
        for i, k in enumerate(keys):
            self.assertEqual(p.get(k), b"before-%d" % i)
            self.assertEqual(spare.get(k), b"before-%d" % i)


def redirects_plain(client, key, port):
    try:
        client.set(key, "x")
        return False
    except redis.ResponseError as e:
        return str(e).startswith("MOVED") and ":%d" % port in str(e)


if __name__ == "__main__":
    kv_cluster.BIN = sys.argv.pop(1)
    unittest.main(verbosity=2)
