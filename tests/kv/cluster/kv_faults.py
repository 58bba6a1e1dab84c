#!/usr/bin/python3
"""conveyor-kv's cluster under three faults (issue 35), against the real
binary: a real etcd and 1-shard x 1-replica clusters with a 2 s lease.

  - etcd killed (SIGKILL) for longer than a lease, then restarted on the same
    data and ports, under a load of clients recording a history: every node
    answers -CLUSTERDOWN within the lease (writes on the primary, reads on
    the primary and READONLY reads on the replica), nothing invoked after
    the lease and before the restart is answered OK; once etcd is back the
    nodes hold their registrations again and the cluster serves reads and
    writes with the same data: 0 linearizability violations, 0 acknowledged
    writes lost.
  - The primary cut off in a network namespace (the test's own: a namespace
    and a veth pair with two addresses of 10.213.x.0/30; the root side holds
    etcd and the replica, the namespace the primary, whose link the test
    sets down): the isolated primary answers -CLUSTERDOWN (asked from inside
    its namespace) within its lease and acknowledges nothing; the replica is
    promoted; clients' acknowledged writes all survive; healed, the old
    primary registers again and rejoins as a replica in the in-sync set.
    Then (the namespace's node made primary again by a clean stop of the
    other) a partition healed the moment etcd dropped the primary's
    registration: its registering again races the failover's CAS; whichever
    wins, nothing acknowledged is lost and the cluster converges.
    Skipped (with the reason) without root or `ip netns`.
  - Garbage at the replication endpoint (random bytes, an MPA header that
    announces too much, a truncated handshake, a silent connection, a
    request whose private data is no hello, hellos of another node, of an
    unknown version, and one naming the real replica with a wrong password;
    300 half-open handshakes at once; 100 foreign hellos in a row): every
    one closed within a bound (at once, or the 5 s handshake timeout), the
    primary's descriptors back to where they were and its memory bounded,
    writes acknowledged meanwhile within a second, and the replica's link,
    its full-sync count, the map's epoch and in-sync set unchanged. (There is
    no controller endpoint: the controller is a role of a node and talks
    only to etcd, so no garbage can be sent to it.)

Each test prints what it measured. Every process is started here and stopped
here by its PID; every wait is bounded. About 25 s.

Usage: kv_faults.py CONVEYOR_BINARY [unittest args...]
"""
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "history"))
import kv_cluster  # noqa: E402
from kv_cluster import wait_until  # noqa: E402
import linearizability  # noqa: E402
from fault_tools import (MPA_REQ, fd_count, free_subnet, hello, ip,  # noqa: E402
                         mpa_p2p_request, mpa_request, netns_unavailable, read_until_closed,
                         rss_kib)
from load import Load as _Load  # noqa: E402

NAME = kv_cluster.NAME
LEASE_S = kv_cluster.LEASE_S
KEYS = ["kf:%d" % i for i in range(16)]
CLIENTS = 3
# -NOREPLICAS past 1 s; the shrink bound past the tests' waits, so that a
# replica a loaded machine stalls for a moment stays a failover candidate
# (kv_failover.py's choice; the shrink is kv_isr.py's).
NODE_ARGS = ("--repl-timeout-ms", "1000", "--repl-isr-lag-ms", "5000")
# The partition's primary binds the wildcard (protected mode wants a
# password then) and the garbage test wants the replicas' password checked.
PASSWORD = "faults-secret"


def cli(node, password=PASSWORD):
    return redis.Redis(host=node.host, port=node.port, socket_timeout=5, password=password)


def Load(addrs, **kw):
    """history/load.py's Load on this file's KEYS with CLIENTS clients."""
    return _Load(addrs, KEYS, CLIENTS, **kw)


def config(etcd):
    return json.loads(etcd.get("/conveyor-kv/%s/config" % NAME))


def in_sync(etcd, n):
    try:
        return len(config(etcd)["shards"][0]["isr"]) == n
    except Exception:
        return False


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def verify(test, ops, client, initial=None):
    """The whole history is linearizable and every acknowledged write is still
    there (read back through `client`, the primary's); `initial`: KEYS'
    values before the history (default: none)."""
    final = {}
    for k in KEYS:
        v = client.get(k)
        final[k] = None if v is None else v.decode()
    acked = sum(1 for o in ops if o.kind == "write" and o.outcome == "ok")
    unknown = sum(1 for o in ops if o.outcome == "unknown")
    res = linearizability.check(ops, initial)
    lost = linearizability.lost_writes(ops, final, initial)
    log("  history: %d operations, %d acknowledged writes, %d unknown; %s; %d lost" %
        (len(ops), acked, unknown, res.report().splitlines()[0], len(lost)))
    test.assertGreater(acked, 50)
    test.assertEqual(res.violations, [], res.report())
    test.assertEqual(res.undecided, [])
    test.assertEqual(lost, [], "\n".join(map(str, lost[:10])))


def write_batch(client, prefix, n):
    """n acknowledged writes; their keys and values."""
    want = {"%s:%d" % (prefix, i): b"%s-v%d" % (prefix.encode(), i) for i in range(n)}
    pipe = client.pipeline(transaction=False)
    for k, v in want.items():
        pipe.set(k, v)
    test_ok = pipe.execute()
    assert all(test_ok), test_ok
    return want


def serves(node, host=None, password=None, key="kf:probe"):
    """The node acknowledges a write and reads it back (its own slots)."""
    try:
        c = redis.Redis(host=host or node.host, port=node.port, socket_timeout=2,
                        password=password)
        v = "s%d" % time.monotonic_ns()
        ok = c.set(key, v) and c.get(key) == v.encode()
        c.close()
        return ok
    except (redis.RedisError, OSError):
        return False


# ---------------------------------------------------------------- etcd outage --

class EtcdOutage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd, cls.dir, cls.nodes = kv_cluster.start_cluster(
            "conveyor-kv-faults-etcd.", 2, 1, 1, *NODE_ARGS)
        try:
            cls.by_id = {n.id: n for n in cls.nodes}
            wait_until(lambda: in_sync(cls.etcd, 2), 20, "both nodes in the in-sync set")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        kv_cluster.stop_cluster(cls.etcd, cls.dir, getattr(cls, "nodes", []), "KV_FAULTS_LOGS")

    def test_etcd_down_longer_than_a_lease_then_back(self):
        etcd = self.etcd
        before = config(etcd)
        p = self.by_id[before["shards"][0]["primary"]]
        r = next(n for n in self.nodes if n is not p)
        wait_until(lambda: serves(p), 20, "the primary serving writes")
        kept = write_batch(p.client(), "pre", 200)
        load = Load([("127.0.0.1", p.port), ("127.0.0.1", r.port)])
        pw = redis.Redis(port=p.port, socket_timeout=1, single_connection_client=True)
        pr = redis.Redis(port=p.port, socket_timeout=1, single_connection_client=True)
        rr = redis.Redis(port=r.port, socket_timeout=1, single_connection_client=True)
        self.assertTrue(rr.execute_command("READONLY"))
        self.assertEqual(rr.get("pre:7"), b"pre-v7")
        logs0 = {n.id: len(n.read_log()) for n in self.nodes}
        try:
            time.sleep(0.5)  # writes flow
            t_stop = time.monotonic_ns()
            etcd.kill()
            # Poll each kind of request until it is refused (at most the
            # lease + 2 s): a write and a read on the primary, a READONLY read
            # on the replica.
            fenced = {}
            probes = {"primary write": lambda: pw.set("kf:fence", "x"),
                      "primary read": lambda: pr.get("pre:1"),
                      "replica read": lambda: rr.get("pre:1")}
            while len(fenced) < len(probes) and time.monotonic_ns() - t_stop < (LEASE_S + 2) * 1e9:
                for what, f in probes.items():
                    if what in fenced:
                        continue
                    try:
                        got = f()
                        if what.endswith("read"):
                            self.assertEqual(got, b"pre-v1", what)  # nothing stale or lost
                    except redis.ResponseError as e:
                        self.assertTrue(str(e).startswith("CLUSTERDOWN"), "%s: %s" % (what, e))
                        fenced[what] = (time.monotonic_ns() - t_stop) / 1e9
                    except redis.TimeoutError:
                        pass  # a write held for the replica: it will be refused
                time.sleep(0.02)
            log("etcd killed: fenced after %s s (lease %d s)" %
                (", ".join("%s %.2f" % kv for kv in sorted(fenced.items())), LEASE_S))
            self.assertEqual(sorted(fenced), sorted(probes), "still served past the lease")
            # The last renewal was sent before etcd died: every fence falls at
            # most TTL - margin after it.
            self.assertLess(max(fenced.values()), LEASE_S)
            # etcd stays down for longer than the lease, and everything is
            # refused meanwhile.
            while time.monotonic_ns() - t_stop < (LEASE_S + 1.5) * 1e9:
                for what, f in probes.items():
                    with self.assertRaises(redis.ResponseError, msg=what) as e:
                        f()
                    self.assertTrue(str(e.exception).startswith("CLUSTERDOWN"), str(e.exception))
                time.sleep(0.1)
            t_restart = time.monotonic_ns()
            etcd.restart()
            t_up = time.monotonic_ns()
            wait_until(lambda: serves(self.by_id[config(etcd)["shards"][0]["primary"]]), 20,
                       "the cluster serving writes again")
            t_serving = time.monotonic_ns()
            wait_until(lambda: all(n.registered() for n in self.nodes), 10,
                       "both nodes registered again")
            wait_until(lambda: in_sync(etcd, 2), 20, "both nodes in the in-sync set again")
            time.sleep(0.5)  # writes flow again
        finally:
            ops = load.finish()
            for c in (pw, pr, rr):
                c.close()
        # Nothing invoked once every lease had run out (the last renewal was
        # before the kill) and before etcd came back was answered OK.
        late = [o for o in ops if o.outcome == "ok" and
                t_stop + LEASE_S * 1e9 <= o.invoke and o.complete <= t_restart]
        self.assertEqual(late, [], "answered while etcd was down: %s" % late[:5])
        after = config(etcd)
        q = self.by_id[after["shards"][0]["primary"]]
        acked_after = [o for o in ops if o.kind == "write" and o.outcome == "ok"
                       and o.invoke >= t_restart]
        self.assertGreater(len(acked_after), 0, "no write acknowledged after etcd came back")
        log("  etcd down %.2f s; it served again %.2f s after its restart (%.2f s to start); "
            "epoch %d -> %d, primary %s" %
            ((t_restart - t_stop) / 1e9, (t_serving - t_up) / 1e9, (t_up - t_restart) / 1e9,
             before["epoch"], after["epoch"], "unchanged" if q is p else "failed over"))
        # How each node got its lease back: etcd keeps leases across its
        # restart (a new leader extends every lease by its TTL), so the node
        # renews the one it had; one found gone makes the node register again.
        how = {}
        for n in self.nodes:
            text = n.read_log()[logs0[n.id]:]
            self.assertIn("fenced", text)
            how[n.port] = "registered again" if "registering again" in text else \
                "renewed its lease" if "the lease is renewed again" in text else "?"
            self.assertNotEqual(how[n.port], "?", text)
        log("  after the restart: %s" % ", ".join(
            "%s %s" % ("primary" if n is p else "replica", how[n.port]) for n in self.nodes))
        c = q.client()
        for k, v in kept.items():
            self.assertEqual(c.get(k), v, k)
        verify(self, ops, c)
        rr = redis.Redis(port=(r if q is p else p).port, socket_timeout=5,
                         single_connection_client=True)
        rr.execute_command("READONLY")
        wait_until(lambda: rr.get("pre:199") == b"pre-v199", 10, "the replica serving reads again")


# ----------------------------------------------------------------- partition --

PROBE = r"""
import socket, sys, time
port, t0, limit, pw = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
def ask(cmd):
    s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
    try:
        s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw.encode()) + cmd)
        f = s.makefile("rb")
        f.readline()
        return f.readline().decode(errors="replace").strip()
    finally:
        s.close()
first = {}
while time.monotonic_ns() - t0 < limit * 1e9 and len(first) < 2:
    for what, cmd in (("write", b"*3\r\n$3\r\nSET\r\n$7\r\nkf:part\r\n$1\r\nx\r\n"),
                      ("read", b"*2\r\n$3\r\nGET\r\n$5\r\npre:1\r\n")):
        if what in first:
            continue
        try:
            rep = ask(cmd)
        except OSError as e:
            rep = "timeout"
        now = (time.monotonic_ns() - t0) / 1e9
        print("%s %.3f %s" % (what, now, rep[:80]), flush=True)
        if rep.startswith("-CLUSTERDOWN"):
            first[what] = now
    time.sleep(0.05)
"""


class Partition(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = netns_unavailable()
        if why:
            raise unittest.SkipTest("partition test skipped: " + why)
        tag = os.getpid()
        cls.ns, cls.veth_root, cls.veth_ns = "cvkvf-%d" % tag, "cvkf%dr" % tag, "cvkf%da" % tag
        x = free_subnet()
        # The primary's address sorts first, so `kv cluster create` makes it
        # the primary.
        cls.ns_ip, cls.root_ip = "10.213.%d.1" % x, "10.213.%d.2" % x
        cls.etcd, cls.dir, cls.nodes = None, None, []
        try:
            ip("netns", "add", cls.ns)
            ip("link", "add", cls.veth_root, "type", "veth", "peer", "name", cls.veth_ns)
            ip("link", "set", cls.veth_ns, "netns", cls.ns)
            ip("addr", "add", cls.root_ip + "/30", "dev", cls.veth_root)
            ip("-n", cls.ns, "addr", "add", cls.ns_ip + "/30", "dev", cls.veth_ns)
            ip("link", "set", cls.veth_root, "up")
            ip("-n", cls.ns, "link", "set", cls.veth_ns, "up")
            ip("-n", cls.ns, "link", "set", "lo", "up")
            cls.etcd = kv_cluster.Etcd(host=cls.root_ip)
            cls.dir = tempfile.mkdtemp(prefix="conveyor-kv-faults-part.")
            for i in range(2):
                os.mkdir(os.path.join(cls.dir, "n%d" % i))
            # The primary binds the wildcard of its namespace (its own
            # address goes while its link is down; the test's probe then asks
            # it on the namespace's loopback) and announces its address.
            args = ("--requirepass", PASSWORD) + NODE_ARGS
            cls.nodes.append(kv_cluster.Node(
                cls.etcd, kv_cluster.free_port(), os.path.join(cls.dir, "n0"), *args,
                host=cls.ns_ip, bind="0.0.0.0", wrap=("ip", "netns", "exec", cls.ns)))
            cls.nodes.append(kv_cluster.Node(
                cls.etcd, kv_cluster.free_port(), os.path.join(cls.dir, "n1"), *args,
                host=cls.root_ip))
            r = kv_cluster.run("kv", "cluster", "create", "--etcd", cls.etcd.endpoint, "--name",
                               NAME, "--shards", "1", "--replicas", "1", "--wait-s", "20")
            if r.returncode != 0:
                raise RuntimeError("cluster create: " + r.stderr)
            wait_until(lambda: in_sync(cls.etcd, 2), 20, "both nodes in the in-sync set")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            kv_cluster.stop_cluster(cls.etcd, cls.dir, cls.nodes, "KV_FAULTS_LOGS")
        finally:
            ip("netns", "del", cls.ns, check=False)  # its veth end goes, and with it the pair
            ip("link", "del", cls.veth_root, check=False)

    def test_a_primary_cut_off_fences_and_is_replaced_and_rejoins(self):
        etcd = self.etcd
        old, new = self.nodes
        before = config(etcd)
        self.assertEqual(before["shards"][0]["primary"], old.id)
        wait_until(lambda: serves(old, password=PASSWORD), 20, "the primary serving writes")
        kept = write_batch(cli(old), "pre", 200)
        load = Load([(old.host, old.port), (new.host, new.port)], password=PASSWORD)
        probe = None
        try:
            time.sleep(0.5)  # writes flow
            ip("-n", self.ns, "link", "set", self.veth_ns, "down")
            # From the moment the link is down: nothing sent after it reaches
            # the primary, so a write acknowledged after it is the new one's.
            t_cut = time.monotonic_ns()
            probe = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, sys.executable, "-c", PROBE, str(old.port),
                 str(t_cut), str(LEASE_S + 4), PASSWORD],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            took = load.first_ack_after(t_cut, LEASE_S + 10)
            t_failed_over = time.monotonic_ns()
            out, err = probe.communicate(timeout=LEASE_S + 10)
            wait_until(lambda: config(etcd)["shards"][0]["primary"] == new.id, 5,
                       "the replica promoted in the map")
            after = config(etcd)
            t_heal = time.monotonic_ns()
            ip("-n", self.ns, "link", "set", self.veth_ns, "up")
            # Healed: the old primary registers again (its lease expired) and
            # rejoins as a replica, caught up, in the in-sync set.
            wait_until(lambda: old.registered() and in_sync(etcd, 2) and
                       config(etcd)["epoch"] > after["epoch"], 20,
                       "the old primary back in the in-sync set")
            t_rejoined = time.monotonic_ns()
            time.sleep(0.5)  # writes flow to the new primary
        finally:
            ops = load.finish()
            if probe is not None and probe.poll() is None:
                probe.kill()
                probe.communicate(timeout=10)
        lines = [ln.split(" ", 2) for ln in out.splitlines()]
        first = {}
        for what, at, rep in lines:
            if rep.startswith("-CLUSTERDOWN") and what not in first:
                first[what] = float(at)
            # The isolated primary acknowledged nothing: its replica was cut off.
            self.assertFalse(rep.startswith("+OK"), "the isolated primary acknowledged a write")
            if what == "read" and not rep.startswith("-") and rep != "timeout":
                self.assertIn(rep, ("$6",), "the isolated primary's read: %s" % rep)
        log("partition: the isolated primary answered -CLUSTERDOWN after %s s (lease %d s); "
            "a write was acknowledged by the promoted replica %.2f s after the cut; healed, the "
            "old primary was back in the in-sync set after %.2f s; epoch %d -> %d -> %d" %
            (", ".join("%s %.2f" % kv for kv in sorted(first.items())), LEASE_S, took,
             (t_rejoined - t_heal) / 1e9, before["epoch"], after["epoch"], config(etcd)["epoch"]))
        self.assertEqual(sorted(first), ["read", "write"], "the probe saw: %s %s" % (out, err))
        self.assertLess(max(first.values()), LEASE_S)
        # The primary's lease expires, then the replica reports its link
        # silent (2 s): about the lease + 1 s, more on a loaded machine.
        self.assertLess(took, LEASE_S + 4)
        self.assertLess(t_failed_over, t_heal)
        self.assertEqual(after["shards"][0]["primary"], new.id)
        self.assertIn("registering again", old.read_log())
        info = cli(old).info("replication")
        self.assertEqual(info["role"], "slave")
        c = cli(new)
        for k, v in kept.items():
            self.assertEqual(c.get(k), v, k)
        verify(self, ops, c)
        # The rejoined node holds the data (READONLY on it).
        rd = redis.Redis(host=old.host, port=old.port, socket_timeout=5, password=PASSWORD,
                         single_connection_client=True)
        rd.execute_command("READONLY")
        wait_until(lambda: rd.get("pre:199") == b"pre-v199", 10, "the old primary serving reads")


    def test_b_a_partition_healed_as_the_lease_expires_loses_nothing(self):
        """The race of the old primary's registering again with the
        controller's failover CAS (which requires its registration absent):
        the link comes back the moment etcd dropped the primary's
        registration. Whichever wins, no acknowledged write is lost and the
        cluster converges (one primary, both nodes in the in-sync set)."""
        etcd = self.etcd
        ns_node, root_node = self.nodes
        if config(etcd)["shards"][0]["primary"] != ns_node.id:
            # test_a left the root node primary: a clean stop revokes its
            # lease and the controller promotes the namespace's node; it
            # comes back as a replica.
            self.assertEqual(root_node.stop(), "")
            wait_until(lambda: config(etcd)["shards"][0]["primary"] == ns_node.id, 15,
                       "the namespace's node promoted")
            root_node.start()
            wait_until(lambda: in_sync(etcd, 2), 20, "both nodes in the in-sync set")
        before = config(etcd)
        wait_until(lambda: serves(ns_node, password=PASSWORD), 20, "the primary serving writes")
        kept = write_batch(cli(ns_node), "pre2", 200)
        # The keys hold test_a's last values: the history starts from them.
        initial = {k: (lambda v: None if v is None else v.decode())(cli(ns_node).get(k))
                   for k in KEYS}
        load = Load([(ns_node.host, ns_node.port), (root_node.host, root_node.port)],
                    password=PASSWORD, tag="b")
        try:
            time.sleep(0.5)
            ip("-n", self.ns, "link", "set", self.veth_ns, "down")
            t_cut = time.monotonic_ns()
            try:
                wait_until(lambda: not ns_node.registered(), LEASE_S + 3,
                           "the cut-off primary's registration expires")
            finally:
                ip("-n", self.ns, "link", "set", self.veth_ns, "up")
            t_heal = time.monotonic_ns()

            def converged():
                try:
                    c = config(etcd)
                    primary = self.nodes[0] if c["shards"][0]["primary"] == ns_node.id \
                        else root_node
                    return ns_node.registered() and root_node.registered() and \
                        in_sync(etcd, 2) and serves(primary, password=PASSWORD)
                except Exception:
                    return False
            wait_until(converged, 20, "one primary serving, both nodes in the in-sync set")
            t_converged = time.monotonic_ns()
            time.sleep(0.5)
        finally:
            ops = load.finish()
        after = config(etcd)
        q = ns_node if after["shards"][0]["primary"] == ns_node.id else root_node
        log("short partition: healed %.2f s after the cut, as the registration expired; "
            "converged %.2f s later: %s (epoch %d -> %d)" %
            ((t_heal - t_cut) / 1e9, (t_converged - t_heal) / 1e9,
             "the old primary kept its shard" if q is ns_node else "the replica was promoted",
             before["epoch"], after["epoch"]))
        c = cli(q)
        for k, v in kept.items():
            self.assertEqual(c.get(k), v, k)
        verify(self, ops, c, initial)


# ------------------------------------------------------------ garbage peers --

class GarbagePeers(unittest.TestCase):
    HANDSHAKE_TIMEOUT_S = 5  # device_options::handshake_timeout_ms's default

    @classmethod
    def setUpClass(cls):
        cls.etcd, cls.dir, cls.nodes = kv_cluster.start_cluster(
            "conveyor-kv-faults-garbage.", 2, 1, 1, "--requirepass", PASSWORD, *NODE_ARGS)
        try:
            cls.by_id = {n.id: n for n in cls.nodes}
            wait_until(lambda: in_sync(cls.etcd, 2), 20, "both nodes in the in-sync set")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        kv_cluster.stop_cluster(cls.etcd, cls.dir, getattr(cls, "nodes", []), "KV_FAULTS_LOGS")

    def client(self, node):
        return redis.Redis(port=node.port, socket_timeout=5, password=PASSWORD,
                           single_connection_client=True)

    def replica_state(self, r):
        i = self.client(r).info("replication")
        return {k: i.get(k) for k in ("role", "master_link_status", "repl_full_syncs",
                                      "master_port")}

    def test_garbage_at_the_replication_endpoint(self):
        cfg = config(self.etcd)
        shard = cfg["shards"][0]
        p, r = self.by_id[shard["primary"]], self.by_id[shard["isr"][-1]]
        self.assertIsNot(p, r)
        pc = self.client(p)
        wait_until(lambda: self.client(r).info("replication").get("master_link_status") == "up",
                   10, "the replica's link up")
        self.assertTrue(pc.set("g:before", "1"))
        host, port = pc.info("replication")["repl_address"].rsplit(":", 1)
        addr = (host, int(port))
        state0 = self.replica_state(r)
        pid = p.proc.pid
        time.sleep(0.3)  # the link settled
        fds0, rss0 = fd_count(pid), rss_kib(pid)
        plog0 = len(p.read_log())
        rlog0 = len(r.read_log())

        def connect():
            return socket.create_connection(addr, timeout=5)

        # Slow ones first, so that their handshake timeout runs meanwhile:
        # 300 half-open handshakes (more than the listener's 256 pending ones:
        # the oldest are closed to make room), then a silent connection and a
        # truncated handshake (the newest: they meet the timeout).
        flood = []
        for _ in range(300):
            s = connect()
            s.sendall(MPA_REQ[:7])
            flood.append(s)
        t_flooded = time.monotonic()
        t_slow = time.monotonic()
        silent = connect()
        truncated = connect()
        truncated.sendall(mpa_request(b"CVKVREPL", length=200))
        # Valid-looking requests that are answered (an MPA reply) and then
        # never speak again (no RTR): one of another node, one naming the
        # replica with a wrong password.
        foreign = "%040x" % random.getrandbits(160)
        no_rtr = connect()
        no_rtr.sendall(mpa_p2p_request(hello(foreign, shard["id"], PASSWORD.encode())))
        no_rtr_impostor = connect()
        no_rtr_impostor.sendall(mpa_p2p_request(hello(r.id, shard["id"], b"guess")))
        time.sleep(0.2)
        fds_flood = fd_count(pid)

        # Each closed at once, after the reply it deserves.
        fast = {
            "random bytes": os.urandom(4096),
            "an MPA header announcing 65535 bytes": mpa_request(b"", length=65535) +
            os.urandom(65536),
            "an MPA revision 9": mpa_request(b"x" * 16, revision=9),
            "private data that is no hello": mpa_request(b"GET / HTTP/1.1\r\n\r\n"),
            "a hello of version 2": mpa_request(hello(r.id, shard["id"], version=2)),
            "a hello with ids that are not hex": mpa_request(hello("z" * 40, "y" * 40)),
            "a hello whose password runs past its end":
            mpa_request(hello(r.id, shard["id"])[:-1] + bytes([200]) + b"short"),
            "a hello of another node (right password)":
            mpa_request(hello(foreign, shard["id"], PASSWORD.encode())),
            "a hello naming the replica, wrong password":
            mpa_request(hello(r.id, shard["id"], b"guess")),
            "a hello naming the replica, no password": mpa_request(hello(r.id, shard["id"])),
        }
        times = {}
        for what, payload in fast.items():
            s = connect()
            t0 = time.monotonic()
            try:
                s.sendall(payload)
            except OSError:
                pass  # closed while we sent: what we want
            got, took = read_until_closed(s, 3)
            s.close()
            self.assertIsNotNone(took, "%s: still open after 3 s" % what)
            times[what] = time.monotonic() - t0
            if what == "private data that is no hello":
                # An MPA reply with the reject flag and the reason.
                self.assertTrue(got.startswith(b"MPA ID Rep Frame"), got[:40])
                self.assertTrue(got[16] & 0x20, "not a rejecting reply: %r" % got[:24])
                self.assertIn(b"not a conveyor-kv replica hello", got)
            # The primary keeps acknowledging writes, replicated, at once.
            t_w = time.monotonic()
            self.assertTrue(pc.set("g:during", what))
            self.assertLess(time.monotonic() - t_w, 1.0, what)

        # 100 foreign hellos in a row: each gets a QP, then is closed; nothing
        # accumulates.
        t0 = time.monotonic()
        for i in range(100):
            s = connect()
            s.sendall(mpa_request(hello(foreign, shard["id"], PASSWORD.encode())))
            got, took = read_until_closed(s, 3)
            s.close()
            self.assertIsNotNone(took, "foreign hello %d: still open after 3 s" % i)
        t_foreign = time.monotonic() - t0

        # The slow ones: closed by the listener within its handshake timeout.
        closed_at = {}
        for what, s in (("a silent connection", silent), ("a truncated handshake", truncated),
                        ("a peer-to-peer hello of another node with no RTR", no_rtr),
                        ("a peer-to-peer hello naming the replica (wrong password) with no RTR",
                         no_rtr_impostor)):
            left = self.HANDSHAKE_TIMEOUT_S + 3 - (time.monotonic() - t_slow)
            got, took = read_until_closed(s, left)
            s.close()
            self.assertIsNotNone(took, "%s: still open %.1f s on" %
                                 (what, time.monotonic() - t_slow))
            closed_at[what] = time.monotonic() - t_slow
        open_flood = 0
        deadline = t_flooded + self.HANDSHAKE_TIMEOUT_S + 3
        for s in flood:
            got, took = read_until_closed(s, max(0.01, deadline - time.monotonic()))
            if took is None:
                open_flood += 1
            s.close()
        self.assertEqual(open_flood, 0, "half-open handshakes never closed")
        # (A few descriptors of slack: the node's etcd clients may reconnect.)
        wait_until(lambda: fd_count(pid) <= fds0 + 4, 5,
                   "the primary's descriptors back to %d" % fds0)
        rss1 = rss_kib(pid)
        log("garbage: closed in %s; 100 foreign hellos in %.2f s; closed after %s; 300 "
            "half-open: the primary held %d descriptors (%d before), all closed; RSS %d -> %d KiB" %
            (", ".join("%.3f s (%s)" % (t, w) for w, t in times.items()), t_foreign,
             ", ".join("%.2f s (%s)" % (t, w) for w, t in closed_at.items()), fds_flood, fds0,
             rss0, rss1))
        for what, t in times.items():
            self.assertLess(t, 2, what)
        for what, t in closed_at.items():
            self.assertLess(t, self.HANDSHAKE_TIMEOUT_S + 2, what)
        # At most 256 pending handshakes (the oldest evicted), plus slack.
        self.assertLessEqual(fds_flood - fds0, 256 + 16)
        self.assertLess(rss1 - rss0, 32 * 1024, "the primary's memory grew")
        # No replica state changed: its link, its full syncs, the map.
        self.assertEqual(self.replica_state(r), state0)
        self.assertEqual(config(self.etcd), cfg)
        self.assertIsNone(p.proc.poll())
        self.assertIsNone(r.proc.poll())
        rlog = r.read_log()[rlog0:]
        self.assertNotIn("link", rlog.lower(), rlog)
        plog = p.read_log()[plog0:]
        self.assertIn("wrong password", plog)
        self.assertIn("is not a replica of this node's shard", plog)
        # Still replicating synchronously: what the primary acknowledged is on
        # the replica.
        self.assertTrue(pc.set("g:after", "2"))
        rd = self.client(r)
        rd.execute_command("READONLY")
        self.assertEqual(rd.get("g:after"), b"2")


if __name__ == "__main__":
    kv_cluster.BIN = sys.argv.pop(1)
    unittest.main(verbosity=2)
