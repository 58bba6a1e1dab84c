"""A one-sided reader of a hung cluster node (docs/KV-CLUSTER.md, "What a
one-sided reader checks"): over shm with direct mapping, a GET is one load
from the node's memory and needs none of its CPU, so a SIGSTOPped node keeps
"serving" READs. The reader must stop trusting it within the node's lease,
from the lease word it reads in the same doorbell, with no extra round trip:
before any failover could have promoted another node. Against the real
binary and a real etcd (tests/kv/cluster/kv_cluster.py's), lease 2 s."""
import json
import os
import signal
import sys
import time

import pytest

import conveyor
import conveyor.kv

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kv", "cluster"))
import kv_cluster  # noqa: E402

BUILD = os.environ.get("CONVEYOR_BUILD_DIR", "")
TOOL = os.path.join(BUILD, "tools", "conveyor", "conveyor")


@pytest.fixture
def node(tmp_path):
    if not os.path.exists(kv_cluster.ETCD):
        pytest.fail(kv_cluster.ETCD + " is missing: scripts/bootstrap installs etcd-server")
    kv_cluster.BIN = TOOL
    etcd = kv_cluster.Etcd()
    name = "@kvc-hung-%d" % os.getpid()
    d = tmp_path / "n"
    d.mkdir()
    n = None
    try:
        n = kv_cluster.start_node(etcd, str(d), "--provider", "shm", "--rdma-listen", name)
        r = kv_cluster.run("kv", "cluster", "create", "--etcd", etcd.endpoint, "--name",
                           kv_cluster.NAME, "--shards", "1", "--wait-s", "20")
        assert r.returncode == 0, r.stderr
        yield n, name
    finally:
        if n is not None:
            n.proc.send_signal(signal.SIGCONT)
            why = n.stop()
        etcd.stop()
    assert not why, why


def test_a_stopped_node_is_not_trusted_past_its_lease(node):
    n, name = node
    deadline = time.monotonic() + 20
    while True:  # serving once the map is read and the lease confirmed
        try:
            n.client().set("k", "v1")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    c = conveyor.kv.Client.connect(name, timeout=2.0, max_clock_skew=0.0)
    for _ in range(3):  # the regions are mapped after their first READs
        assert c.get("k") == b"v1"
    n.proc.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    served = 0
    refused_at = None
    try:
        while time.monotonic() - t0 < 3 * kv_cluster.LEASE_S:
            try:
                assert c.get("k") == b"v1"
                served += 1
            except conveyor.Rejected as e:
                assert "CLUSTERDOWN" in str(e), str(e)
                refused_at = time.monotonic() - t0
                break
            time.sleep(0.002)
        # Served with no CPU of the node's (the memory is mapped)...
        assert served > 0, "no GET answered after SIGSTOP: not the direct-mapped path"
        # ...and refused before the lease could expire in etcd.
        assert refused_at is not None, "still trusted %d s after SIGSTOP" % (3 * kv_cluster.LEASE_S)
        assert refused_at < kv_cluster.LEASE_S, refused_at
        assert c.stats()["lease_refusals"] == 1
        print("hung node: %d GETs answered from its memory, refused %.2f s after SIGSTOP "
              "(lease %d s)" % (served, refused_at, kv_cluster.LEASE_S), file=sys.stderr)
    finally:
        n.proc.send_signal(signal.SIGCONT)
    # Back: its lease is renewed (or it registers again) and GETs are answered
    # (a fenced node refuses new RDMA connections too, until then).
    deadline = time.monotonic() + 20
    while True:
        try:
            c2 = conveyor.kv.Client.connect(name, timeout=2.0)
            assert c2.get("k") == b"v1"
            break
        except conveyor.Rejected:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_cluster_client_routes_like_a_redis_cluster_client(tmp_path):
    """conveyor.kv.ClusterClient on a real 3-shard cluster (soft): what it
    writes, redis-py's RedisCluster reads at the same keys, and the other way
    round; MGET spans the shards; the map is learned from any node."""
    from redis.cluster import RedisCluster
    kv_cluster.BIN = TOOL
    etcd = kv_cluster.Etcd()
    nodes = []
    try:
        for i in range(3):
            d = tmp_path / ("n%d" % i)
            d.mkdir()
            nodes.append(kv_cluster.start_node(etcd, str(d), "--rdma-listen", "127.0.0.1:0"))
        r = kv_cluster.run("kv", "cluster", "create", "--etcd", etcd.endpoint, "--name",
                           kv_cluster.NAME, "--shards", "3", "--wait-s", "20")
        assert r.returncode == 0, r.stderr
        rc = RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=5)
        kv_cluster.wait_until(lambda: rc.set("probe", "x"), 20, "the cluster serving")
        rdma = nodes[2].client().info("conveyor")["rdma_address"]
        keys = ["user:%d" % i for i in range(60)]
        with conveyor.kv.ClusterClient.connect(rdma, timeout=5.0) as c:
            for k in keys[:30]:
                c.set(k, "cc-" + k)
            for k in keys[30:]:
                rc.set(k, "rc-" + k)
            for k in keys[:30]:
                assert rc.get(k) == ("cc-" + k).encode()
            got = c.mget(keys + ["absent"])
            assert got[:30] == [("cc-" + k).encode() for k in keys[:30]]
            assert got[30:60] == [("rc-" + k).encode() for k in keys[30:]]
            assert got[60] is None
            assert c.incr("n", 2) == 2 and rc.get("n") == b"2"
            assert c.delete(keys[0]) and rc.get(keys[0]) is None
            s = c.stats()
            assert s["nodes_connected"] == 3, s
            assert s["epoch"] >= 1 and s["moved"] == 0 and s["stale_epochs"] == 0, s
        # The CLI on the same client: -c, as redis-cli's.
        for k in keys[1:4]:
            r = kv_cluster.run("kv", "set", "-c", "--address", rdma, k, "cli-" + k, timeout=30)
            assert (r.returncode, r.stdout) == (0, "OK\n"), r.stderr
            assert rc.get(k) == ("cli-" + k).encode()
            r = kv_cluster.run("kv", "get", "-c", "--address", rdma, k, timeout=30)
            assert (r.returncode, r.stdout) == (0, "cli-%s\n" % k), r.stderr
        r = kv_cluster.run("kv", "del", "-c", "--address", rdma, keys[1], timeout=30)
        assert (r.returncode, r.stdout) == (0, "(integer) 1\n"), r.stderr
        rc.close()
    finally:
        why = [n.stop() for n in nodes]
        etcd.stop()
    assert not any(why), why


def test_replica_reads_are_served_by_the_replicas_memory():
    """ClusterClient(replica_reads=True) on a real 1-shard x 1-replica cluster
    (soft): GETs go to the replica, which holds every acknowledged write, and
    are answered there one-sided; writes still go to the primary."""
    kv_cluster.BIN = TOOL
    etcd, d, nodes = kv_cluster.start_cluster("conveyor-kv-replica-reads.", 2, 1, 1,
                                              "--rdma-listen", "127.0.0.1:0")
    try:
        cfg = json.loads(etcd.get("/conveyor-kv/%s/config" % kv_cluster.NAME))
        kv_cluster.wait_until(lambda: len(json.loads(etcd.get(
            "/conveyor-kv/%s/config" % kv_cluster.NAME))["shards"][0]["isr"]) == 2, 20,
            "the replica in the in-sync set")
        by_id = {n.id: n for n in nodes}
        primary = by_id[cfg["shards"][0]["primary"]]
        rdma = primary.client().info("conveyor")["rdma_address"]
        keys = ["rr:%d" % i for i in range(20)]
        with conveyor.kv.ClusterClient.connect(rdma, timeout=5.0) as w:
            for k in keys:
                w.set(k, "v-" + k)  # acknowledged: on the replica too
        with conveyor.kv.ClusterClient.connect(rdma, timeout=5.0, replica_reads=True) as r:
            assert r.mget(keys) == [("v-" + k).encode() for k in keys]
            assert r.get(keys[0]) == ("v-" + keys[0]).encode()
            s = r.stats()
            assert s["replica_reads"] == len(keys) + 1, s
            r.set("rr:new", "x")  # the primary's
            assert primary.client().get("rr:new") == b"x"
    finally:
        kv_cluster.stop_cluster(etcd, d, nodes)
