#!/usr/bin/python3
"""conveyor-kv as a cluster (issue 35), against the real binary: a real etcd
(/usr/bin/etcd on free loopback ports, its own data directory) and three
`conveyor kv serve --cluster` nodes, the map made by `conveyor kv cluster
create`, then unchanged Redis Cluster clients: redis-py's RedisCluster,
redis-cli -c, redis-benchmark --cluster. Faults: a node killed with SIGKILL
(its registration goes with its lease; restarted, it comes back with its id),
an invalid shard map in etcd (ignored: the nodes keep serving with the last
good one). And `conveyor kv cluster up`, stopped by SIGINT with no process
left behind.

Every process is started here and stopped here (SIGTERM, then SIGKILL);
every wait is bounded.

Usage: kv_cluster.py CONVEYOR_BINARY [unittest args...]
"""
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import redis
from redis.cluster import RedisCluster

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compat"))
from kv_server import free_port  # noqa: E402
from resp_conn import Conn  # noqa: E402

BIN = None
ETCD = "/usr/bin/etcd"
NAME = "kvtest"
LEASE_S = 2


def stop_process(p, timeout=5):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


class Etcd:
    """One etcd member on free ports of `host` (loopback by default), in a
    temporary directory."""

    def __init__(self, host="127.0.0.1"):
        self.dir = tempfile.mkdtemp(prefix="conveyor-kv-cluster-etcd.")
        for _ in range(3):
            client, peer = free_port(), free_port()
            if client == peer:
                continue
            self.endpoint = "%s:%d" % (host, client)
            curl, purl = "http://" + self.endpoint, "http://%s:%d" % (host, peer)
            self.cmd = [ETCD, "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
                        "--listen-client-urls", curl, "--advertise-client-urls", curl,
                        "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                        "--initial-cluster", "t=" + purl, "--heartbeat-interval", "50",
                        "--election-timeout", "250"]
            self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
            if self.launch():
                return
        raise RuntimeError("etcd did not start")

    def launch(self):
        """Starts self.cmd; True once it serves (else it is stopped again)."""
        start = os.path.getsize(os.path.join(self.dir, "etcd.log"))
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        # Ours once its own log says it serves on the port: a port taken
        # between free_port() and etcd's bind would have another etcd answer.
        serving = ("serving insecure client requests on " + self.endpoint).encode()
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                self.call("kv/range", {"key": b64("/probe")})
                with open(os.path.join(self.dir, "etcd.log"), "rb") as f:
                    f.seek(start)
                    if serving in f.read():
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        stop_process(self.proc)
        return False

    def kill(self):
        """SIGKILL (a crash): its data directory and ports stay for restart()."""
        self.proc.kill()
        self.proc.wait(10)

    def restart(self):
        """The same member again: same data directory, same ports."""
        if not self.launch():
            raise RuntimeError("etcd did not restart on " + self.endpoint)

    def call(self, method, body):
        req = urllib.request.Request("http://%s/v3/%s" % (self.endpoint, method),
                                     data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def get(self, key):
        kvs = self.call("kv/range", {"key": b64(key)}).get("kvs", [])
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def put(self, key, value):
        self.call("kv/put", {"key": b64(key), "value": b64(value)})

    def stop(self):
        stop_process(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def b64(s):
    return base64.b64encode(s if isinstance(s, bytes) else s.encode()).decode()


class Node:
    """`conveyor kv serve --cluster` on a fixed port with its own directory
    (kept across restarts: the node id lives there). `host` is the address it
    announces and clients use, `bind` what it binds (default: `host`); `wrap`
    a command it is run under that execs it (e.g. `ip netns exec NS`), so that
    the process is still the node."""

    def __init__(self, etcd, port, dir, *extra, host="127.0.0.1", bind=None, wrap=()):
        self.etcd, self.port, self.dir, self.extra = etcd, port, dir, list(extra)
        self.host, self.bind, self.wrap = host, bind or host, list(wrap)
        if host != "127.0.0.1" or self.bind != host:
            self.extra += ["--bind", self.bind, "--cluster-announce", host]
        self.start()

    def start(self):
        """Starts it on self.port; a restart whose port another process took
        meanwhile (parallel tests take free ports too) moves to a free one:
        the node keeps its id and registers its new address."""
        for attempt in range(3):
            try:
                return self.start_once()
            except RuntimeError as e:
                if "Address already in use" not in str(e) or attempt == 2:
                    raise
                self.log.close()
                self.port = free_port()

    def start_once(self):
        self.log_path = os.path.join(self.dir, "serve.log")
        self.log = open(self.log_path, "ab")
        self.log_start = self.log.tell()
        self.proc = subprocess.Popen(
            [*self.wrap, BIN, "kv", "serve", "--port", str(self.port), "--dir", self.dir,
             "--data-bytes", "64mb", "--cluster", self.etcd.endpoint, "--cluster-name", NAME,
             "--cluster-lease", str(LEASE_S), *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        # The port is bound before the node joins (its id file is written as
        # it joins): both, before the test goes on. Bound by this process: its
        # own log line says so (a restart finds the id file of its last run,
        # and another process may answer on the port).
        id_file = os.path.join(self.dir, "cluster-node.id")
        bound = ("RESP on %s:%d " % (self.bind, self.port)).encode()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("node exited: " + self.read_log())
            if os.path.exists(id_file):
                with open(self.log_path, "rb") as f:
                    f.seek(self.log_start)
                    if bound in f.read():
                        break
            time.sleep(0.05)
        with open(id_file) as f:
            self.id = f.read().strip()

    def read_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def registered(self):
        return self.etcd.get("/conveyor-kv/%s/nodes/%s" % (NAME, self.id)) is not None

    def client(self):
        return redis.Redis(host=self.host, port=self.port, socket_timeout=10)

    def stop(self):
        """Stops it (SIGTERM: a clean stop is exit 0); returns why not, or ""."""
        stop_process(self.proc)
        self.log.close()
        if "ThreadSanitizer" in self.read_log() or "AddressSanitizer" in self.read_log():
            return "node %d: a sanitizer report: %s" % (self.port, self.read_log()[-3000:])
        if self.proc.returncode != 0:
            return "node %d exited %s: %s" % (self.port, self.proc.returncode,
                                              self.read_log()[-2000:])
        return ""


def start_node(etcd, dir, *extra):
    """A node on a free port, tried again on another when the port was taken
    meanwhile (free_port's answer is only a hint)."""
    for attempt in range(3):
        try:
            return Node(etcd, free_port(), dir, *extra)
        except RuntimeError as e:
            if "Address already in use" not in str(e) or attempt == 2:
                raise


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("not within %s s: %s" % (timeout, what))


def run(*args, timeout=60):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def start_up(*args):
    """`conveyor kv cluster up ARGS`, read until it prints how to connect (at
    most 60 s): (the process, what it printed). The caller stops it."""
    up = subprocess.Popen([BIN, "kv", "cluster", "up", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    out = ""
    deadline = time.monotonic() + 60
    while "redis-cli -c -p" not in out and time.monotonic() < deadline:
        line = up.stdout.readline()
        if not line:
            break
        out += line
    return up, out


def reap_up(up):
    """Kills a `cluster up` that is still running (a test that failed early)
    and closes its pipes."""
    if up.poll() is None:
        up.kill()
        up.wait(10)
    up.stdout.close()
    up.stderr.close()


def stop_cluster(etcd, dir, nodes, logs_env=None):
    """Stops the nodes, then etcd, and removes the folder start_cluster made;
    raises with what went wrong (a node that did not exit cleanly or left a
    sanitizer report). With the environment variable `logs_env` set, prints
    each node's log tail first."""
    problems = [n.stop() for n in nodes]
    if logs_env and os.environ.get(logs_env):
        for n in nodes:
            print("---- node %d\n%s" % (n.port, n.read_log()[-6000:]), file=sys.stderr)
    if etcd is not None:
        etcd.stop()
    if dir:
        shutil.rmtree(dir, ignore_errors=True)
    problems = [p for p in problems if p]
    if problems:
        raise AssertionError("\n".join(problems))


def start_cluster(prefix, count, shards, replicas, *extra):
    """A local etcd, `count` nodes (each given `extra`) in a new temporary
    folder, and the map `kv cluster create` writes for them: (etcd, folder,
    nodes). What was started is stopped again if any of it fails."""
    etcd = Etcd()
    folder = tempfile.mkdtemp(prefix=prefix)
    nodes = []
    try:
        for i in range(count):
            d = os.path.join(folder, "n%d" % i)
            os.mkdir(d)
            nodes.append(start_node(etcd, d, *extra))
        r = run("kv", "cluster", "create", "--etcd", etcd.endpoint, "--name", NAME,
                "--shards", str(shards), "--replicas", str(replicas), "--wait-s", "20")
        if r.returncode != 0:
            raise RuntimeError("cluster create: " + r.stderr)
    except BaseException:
        for n in nodes:
            n.stop()
        etcd.stop()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return etcd, folder, nodes


class Cluster(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd, cls.dir, cls.nodes = start_cluster("conveyor-kv-cluster.", 3, 3, 0)
        try:
            cls.map_json = cls.etcd.get("/conveyor-kv/%s/config" % NAME)
            for n in cls.nodes:  # every node has the map
                wait_until(lambda n=n: n.client().execute_command("CLUSTER", "INFO").find(
                    b"cluster_state:ok") >= 0, 10, "node %d has the map" % n.port)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.etcd, cls.dir, cls.nodes)

    def cluster_client(self):
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, socket_timeout=10)

    def test_redis_py_cluster_writes_and_reads_keys_across_every_shard(self):
        rc = self.cluster_client()
        keys = ["key:%d" % i for i in range(2000)]
        for i, k in enumerate(keys):
            self.assertTrue(rc.set(k, "v%d" % i))
        for i, k in enumerate(keys):
            self.assertEqual(rc.get(k), b"v%d" % i)
        # Each node holds the keys of its own slots, and only those.
        sizes = [n.client().dbsize() for n in self.nodes]
        self.assertTrue(all(s > 400 for s in sizes), sizes)
        for n in self.nodes:
            c = n.client()
            for k in c.scan_iter(count=1000):
                node = rc.get_node_from_key(k)
                self.assertEqual(node.port, n.port, k)
        # Hash tags: one slot, one node, one MGET.
        self.assertTrue(rc.mset({"{user1}.a": "1", "{user1}.b": "2"}))
        self.assertEqual(rc.mget("{user1}.a", "{user1}.b", "{user1}.c"), [b"1", b"2", None])
        rc.close()

    def test_a_cross_slot_command_gets_crossslot_from_the_node(self):
        rc = self.cluster_client()
        with self.assertRaises(redis.exceptions.ResponseError) as e:
            rc.execute_command("MSET", "a", "1", "b", "2", target_nodes=rc.get_primaries()[0])
        self.assertIn("Keys in request don't hash to the same slot", str(e.exception))
        raw = self.nodes[0].client()
        with self.assertRaises(redis.exceptions.ResponseError) as e:
            raw.execute_command("MSET", "a", "1", "b", "2")
        self.assertIn("CROSSSLOT", str(e.exception))
        rc.close()

    def test_redis_cli_c_follows_moved(self):
        port = str(self.nodes[0].port)
        for i in range(20):
            k = "cli:%d" % i
            r = subprocess.run(["redis-cli", "-c", "-p", port, "SET", k, "x%d" % i],
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(r.stdout.strip(), "OK", r.stderr)
            r = subprocess.run(["redis-cli", "-c", "-p", port, "GET", k],
                               capture_output=True, text=True, timeout=20)
            self.assertEqual(r.stdout.strip(), "x%d" % i)
        # Without -c the redirect itself: "foo" is slot 12182, asked of a node
        # that does not own it.
        owner = None
        for first, last, primary, *_ in self.nodes[0].client().execute_command("CLUSTER", "SLOTS"):
            if first <= 12182 <= last:
                owner = primary[1]
        other = next(n for n in self.nodes if n.port != owner)
        r = subprocess.run(["redis-cli", "-p", str(other.port), "GET", "foo"],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual((r.stdout + r.stderr).strip(), "MOVED 12182 127.0.0.1:%d" % owner)

    def test_redis_benchmark_cluster_completes(self):
        r = subprocess.run(["redis-benchmark", "--cluster", "-p", str(self.nodes[1].port), "-t",
                            "set,get", "-n", "5000", "-q"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SET:", r.stdout)
        self.assertIn("GET:", r.stdout)
        self.assertIn("Cluster has 3 master nodes", r.stdout)

    def test_cluster_status_and_create_refusals(self):
        r = run("kv", "cluster", "status", "--etcd", self.etcd.endpoint, "--name", NAME, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        st = json.loads(r.stdout)
        self.assertEqual(st["slots_served"], 16384)
        self.assertEqual(len(st["shards"]), 3)
        self.assertEqual(sum(1 for n in st["nodes"] if n["alive"] and n["role"] == "primary"), 3)
        r = run("kv", "cluster", "status", "--etcd", self.etcd.endpoint, "--name", NAME)
        self.assertIn("16384 of 16384 slots served", r.stdout)
        r = run("kv", "cluster", "create", "--etcd", self.etcd.endpoint, "--name", NAME,
                "--shards", "3")
        self.assertEqual(r.returncode, 2)
        self.assertIn("already has a shard map", r.stderr)
        r = run("kv", "cluster", "create", "--etcd", self.etcd.endpoint, "--name", "other",
                "--shards", "3", "--replicas", "17")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--replicas 17: 0 to 16", r.stderr)
        # Not enough nodes: a bounded wait, then a clear error.
        r = run("kv", "cluster", "create", "--etcd", self.etcd.endpoint, "--name", "empty",
                "--shards", "1", "--wait-s", "1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("0 of 1 node(s) registered", r.stderr)

    def test_an_invalid_map_in_etcd_is_ignored_and_the_last_good_one_kept(self):
        key = "/conveyor-kv/%s/config" % NAME
        rc = self.cluster_client()
        rc.set("before", "1")
        try:
            self.etcd.put(key, '{"epoch": 2, "shards": "garbage"}')
            for n in self.nodes:
                wait_until(lambda n=n: "ignoring the shard map" in n.read_log(), 10,
                           "node %d logs the invalid map" % n.port)
            info = self.nodes[0].client().execute_command("CLUSTER", "INFO")
            self.assertIn(b"cluster_state:ok", info)
            self.assertIn(b"cluster_current_epoch:1", info)
            rc2 = self.cluster_client()
            self.assertEqual(rc2.get("before"), b"1")
            self.assertTrue(rc2.set("after", "2"))
            self.assertEqual(rc2.get("after"), b"2")
            rc2.close()
        finally:
            self.etcd.put(key, self.map_json)
        rc.close()

    def test_a_spare_node_redirects_resp_and_rdma_writes_and_leaves_on_stop(self):
        d = os.path.join(self.dir, "spare")
        os.mkdir(d)
        spare = start_node(self.etcd, d, "--rdma-listen", "127.0.0.1:0")
        try:
            wait_until(spare.registered, 10, "the spare registers")
            wait_until(lambda: b"cluster_state:ok" in spare.client().execute_command(
                "CLUSTER", "INFO"), 10, "the spare has the map")
            nodes = spare.client().execute_command("CLUSTER", "NODES").decode()
            self.assertIn("%s 127.0.0.1:%d@%d myself,master" % (spare.id, spare.port,
                                                               spare.port + 10000), nodes)
            with self.assertRaises(redis.exceptions.ResponseError) as e:
                spare.client().set("foo", "x")
            self.assertTrue(str(e.exception).startswith("MOVED 12182 "), str(e.exception))
            # The RDMA front end's write RPC runs through the same routing.
            m = None
            wait_until(lambda: "RDMA on" in spare.read_log(), 10, "the RDMA line")
            for line in spare.read_log().splitlines():
                if "RDMA on" in line:
                    m = line.split("RDMA on ")[1].split()[0]
            r = run("kv", "set", "--address", m, "foo", "x", timeout=30)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("MOVED 12182", r.stdout + r.stderr)
            st = json.loads(run("kv", "cluster", "status", "--etcd", self.etcd.endpoint, "--name",
                                NAME, "--json").stdout)
            me = [n for n in st["nodes"] if n["id"] == spare.id]
            self.assertEqual(len(me), 1)
            self.assertTrue(me[0]["alive"])
            self.assertEqual(me[0]["role"], "")
            self.assertTrue(me[0]["rdma"].startswith("127.0.0.1:"), me[0])
        finally:
            problem = spare.stop()
        self.assertEqual(problem, "")
        self.assertFalse(spare.registered())  # a clean stop revokes the lease

    def test_a_wildcard_bind_needs_an_announce(self):
        r = run("kv", "serve", "--port", "0", "--bind", "0.0.0.0", "--cluster",
                self.etcd.endpoint, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--cluster-announce", r.stderr)

    def test_cluster_replies_have_the_shapes_of_a_real_redis_cluster(self):
        redis_dir = tempfile.mkdtemp(prefix="conveyor-kv-cluster-redis.")
        procs, ports = [], []
        try:
            for _ in range(3):
                port = cluster_bus_free_port()
                ports.append(port)
                d = os.path.join(redis_dir, str(port))
                os.mkdir(d)
                procs.append(subprocess.Popen(
                    ["/usr/bin/redis-server", "--port", str(port), "--bind", "127.0.0.1",
                     "--cluster-enabled", "yes", "--save", "", "--appendonly", "no", "--dir", d],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            def answers(port):
                try:
                    return redis.Redis(host="127.0.0.1", port=port).ping()
                except redis.exceptions.ConnectionError:
                    return False
            for port in ports:
                wait_until(lambda port=port: answers(port), 10, "redis up")
            r = subprocess.run(["redis-cli", "--cluster", "create",
                                *["127.0.0.1:%d" % p for p in ports],
                                "--cluster-replicas", "0", "--cluster-yes"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            wait_until(lambda: all(b"cluster_state:ok" in redis.Redis(host="127.0.0.1", port=p).execute_command(
                "CLUSTER", "INFO") for p in ports), 20, "the redis cluster is ok")
            ours, theirs = self.nodes[0].port, ports[0]
            for proto in (2, 3):
                for sub in ("SLOTS", "SHARDS"):
                    a = self.shape_of(ours, proto, "CLUSTER", sub)
                    b = self.shape_of(theirs, proto, "CLUSTER", sub)
                    # Same split of the slots too (redis-cli's and ours).
                    self.assertEqual(a, b, "CLUSTER %s in RESP%d" % (sub, proto))
            line = re.compile(r"^[0-9a-f]{40} 127\.0\.0\.1:\d+@\d+ (myself,)?master - \d+ \d+ \d+ "
                              r"connected( \d+(-\d+)?)*$")
            for port in (ours, theirs):
                text = redis.Redis(host="127.0.0.1", port=port).execute_command("CLUSTER", "NODES").decode()
                lines = text.strip().split("\n")
                self.assertEqual(len(lines), 3)
                for ln in lines:
                    self.assertRegex(ln, line)
                self.assertEqual(sum(1 for ln in lines if "myself" in ln), 1)
                self.assertEqual(sorted(ln.split()[8] for ln in lines),
                                 ["0-5460", "10923-16383", "5461-10922"])

            def info(port):
                text = redis.Redis(host="127.0.0.1", port=port).execute_command("CLUSTER", "INFO").decode()
                return dict(ln.split(":", 1) for ln in text.strip().split("\r\n"))
            a, b = info(ours), info(theirs)
            self.assertLessEqual(set(a), set(b))
            for k in ("cluster_state", "cluster_slots_assigned", "cluster_slots_ok",
                      "cluster_known_nodes", "cluster_size"):
                self.assertEqual(a[k], b[k], k)
        finally:
            for p in procs:
                stop_process(p)
            shutil.rmtree(redis_dir, ignore_errors=True)

    @staticmethod
    def shape_of(port, proto, *cmd):
        """The reply with what differs between two clusters (ids, ports)
        blanked, sorted by first slot, in the given protocol."""
        c = Conn(port)
        if proto == 3:
            c.call("HELLO", "3")
        reply = c.call(*cmd)
        c.close()

        def norm(x):
            t = x[0]
            if t == "bulk":
                v = x[1]
                return ("bulk", b"<id>" if re.fullmatch(rb"[0-9a-f]{40}", v) else v)
            if t == "int":
                return ("int", "<port>" if x[1] > 16383 else x[1])
            if t in ("arr", "set"):
                return (t, [norm(y) for y in x[1]])
            if t == "map":
                return (t, [(norm(k), norm(v)) for k, v in x[1]])
            return x
        items = norm(reply)[1]
        return sorted(items, key=repr)

    def test_zz_a_killed_node_leaves_with_its_lease_and_returns_with_its_id(self):
        n = self.nodes[2]
        self.assertTrue(n.registered())
        old_id = n.id
        n.proc.kill()  # SIGKILL: no revoke, the lease must expire
        n.proc.wait(10)
        n.log.close()
        t0 = time.monotonic()
        wait_until(lambda: not n.registered(), LEASE_S + 8, "the registration expires")
        self.assertLess(time.monotonic() - t0, LEASE_S + 8)
        n.start()
        self.assertEqual(n.id, old_id)
        wait_until(n.registered, 10, "the node registers again")
        rc = self.cluster_client()
        wait_until(lambda: rc.set("foo", "back"), 10, "the restarted node serves its slots")
        self.assertEqual(rc.get("foo"), b"back")
        rc.close()


def cluster_bus_free_port():
    """A free port whose cluster bus port (+10000, redis-server's) is free
    and in range: an ephemeral port often is not."""
    for _ in range(200):
        p = free_port()
        if p + 10000 > 65535:
            p = p - 30000
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 10000))
                return p
            except OSError:
                continue
    raise RuntimeError("no port with a free cluster bus port")


def consecutive_free_ports(n):
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no consecutive free ports")


class Up(unittest.TestCase):
    def children(self, pid):
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def test_cluster_up_starts_a_working_cluster_and_sigint_stops_everything(self):
        base = consecutive_free_ports(3)
        up, out = start_up("--shards", "3", "--port", str(base))
        try:
            self.assertIn("redis-cli -c -p %d" % base, out, out)
            kids = self.children(up.pid)
            self.assertEqual(len(kids), 4, kids)  # etcd and three nodes
            # `up` prints once the map is in etcd; each node reads it from its
            # watch a moment later (longer on a loaded machine).
            for port in range(base, base + 3):
                wait_until(lambda port=port: b"cluster_state:ok" in redis.Redis(
                    port=port, socket_timeout=5).execute_command("CLUSTER", "INFO"), 10,
                    "node %d has the map" % port)
            rc = RedisCluster(host="127.0.0.1", port=base, socket_timeout=10)
            for i in range(100):
                rc.set("up:%d" % i, i)
            self.assertEqual(rc.get("up:42"), b"42")
            rc.close()
            up.send_signal(signal.SIGINT)
            self.assertEqual(up.wait(20), 0, up.stderr.read())
            for k in kids:
                self.assertFalse(os.path.exists("/proc/%d" % k) and
                                 open("/proc/%d/stat" % k).read().split()[2] != "Z",
                                 "child %d still runs" % k)
        finally:
            reap_up(up)

    def test_cluster_up_reports_a_node_that_cannot_start_and_leaves_nothing(self):
        base = consecutive_free_ports(2)
        port = base + 1  # the second node's, taken here
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", port))
            taken.listen()
            t0 = time.monotonic()
            r = subprocess.run([BIN, "kv", "cluster", "up", "--shards", "2", "--port", str(base)],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertLess(time.monotonic() - t0, 20)  # not the whole --wait-s 30
        self.assertIn("node %d exited at start" % port, r.stderr)
        self.assertIn("Address already in use", r.stderr)
        m = re.search(r"data in (\S+)/etcd", r.stderr)
        self.assertIsNotNone(m, r.stderr)
        left = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        if m.group(1).encode() in f.read():
                            left.append(pid)
                except OSError:
                    pass
        self.assertEqual(left, [], "processes of the failed `up` still run")
        shutil.rmtree(m.group(1), ignore_errors=True)

    def test_cluster_up_never_uses_an_etcd_it_did_not_start(self):
        # Another cluster's etcd on the port `up` gives its own etcd (a free port
        # taken between its choice and etcd's bind): `up` must see that its etcd
        # could not listen, not write its map into the other one (it used to
        # answer "cluster default already has a shard map" or, worse, join it).
        other = Etcd()
        try:
            port = int(other.endpoint.rsplit(":", 1)[1])
            r = subprocess.run([BIN, "kv", "cluster", "up", "--shards", "1", "--etcd-port",
                                str(port), "--port", str(consecutive_free_ports(1))],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("etcd could not listen on 127.0.0.1:%d (address already in use)" % port,
                          r.stderr)
            reply = other.call("kv/range", {"key": b64("/conveyor-kv/"),
                                            "range_end": b64("/conveyor-kv0")})
            self.assertNotIn("kvs", reply, "up wrote into an etcd it did not start")
        finally:
            other.stop()


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main()
