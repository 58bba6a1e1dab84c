// The server's start-up and main loop (conveyor_kv/server.hpp): the public
// options become the store's, the AOF's and the front ends' own.
#include "conveyor_kv/server.hpp"

#include <conveyor/conveyor.hpp>

#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>

#include "aof.hpp"
#include "cluster/cluster_node.hpp"
#include "commands.hpp"
#include "node_fence.hpp"
#include "rdma_server.hpp"
#include "repl/node_role.hpp"
#include "repl/wire.hpp"
#include "resp_server.hpp"
#include "script.hpp"
#include "server_loop.hpp"
#include "store.hpp"
#include "store_layout.hpp"

namespace conveyor::kv {

namespace {

// server_ready::stop outlives the loop it stops: after serve() returns it does nothing.
struct stop_handle {
  std::mutex mu;
  server_loop* loop = nullptr;
  void stop() {
    std::lock_guard lk(mu);
    if (loop) loop->stop();
  }
  void detach() {
    std::lock_guard lk(mu);
    loop = nullptr;
  }
};

}  // namespace

int serve(const server_options& so) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "conveyor kv serve: %s\n", why.c_str());
    return 1;
  };
  auto bad = [](const std::string& why) {
    std::fprintf(stderr, "conveyor kv serve: %s\n", why.c_str());
    return 2;
  };
  fsync_policy fsync = fsync_policy::everysec;
  if (!parse_fsync_policy(so.appendfsync, fsync))
    return bad("appendfsync " + so.appendfsync + ": always, everysec or no");
  if (so.maxmemory_policy != "noeviction" && so.maxmemory_policy != "allkeys-lru")
    return bad("maxmemory-policy " + so.maxmemory_policy + ": noeviction or allkeys-lru");
  if (so.data_bytes == 0) return bad("the data region (data-bytes) cannot be empty");
  // Cluster mode: the host other nodes' clients are sent to. A wildcard bind
  // is no address anyone can reach, so it needs an explicit announce.
  std::string announce = so.cluster_announce.empty() ? so.bind : so.cluster_announce;
  if (!so.cluster.empty()) {
    if (!cluster::valid_cluster_name(so.cluster_name))
      return bad("cluster-name '" + so.cluster_name.substr(0, 80) +
                 "': 1 to 64 of A-Z a-z 0-9 _ - .");
    if (announce.empty() || announce == "0.0.0.0" || announce == "::" || announce == "[::]")
      return bad("cluster mode needs the address clients reach this node at: bind " + so.bind +
                 " is a wildcard, set --cluster-announce");
    if (so.requirepass.size() > repl::max_hello_password)
      return bad("requirepass is " + std::to_string(so.requirepass.size()) + " bytes: at most " +
                 std::to_string(repl::max_hello_password) +
                 " in cluster mode (replicas present it in their connection request)");
    if (so.cluster_lease_s < 1 || so.cluster_lease_s > 3600)
      return bad("cluster-lease " + std::to_string(so.cluster_lease_s) + ": 1 to 3600 seconds");
    if (announce.find(':') != std::string::npos && announce.front() != '[')
      announce = "[" + announce + "]";  // an IPv6 host in host:port
    if (!cluster::valid_address(announce + ":1"))
      return bad("cluster-announce " + announce.substr(0, 80) +
                 ": an IPv4 or IPv6 address or a DNS name");
  }
  server_config cfg;  // what INFO and CONFIG GET report; maxclients as fitted below
  cfg.requirepass = so.requirepass;
  cfg.bind = so.bind;
  cfg.port = so.port;
  cfg.dir = so.dir;
  cfg.appendonly = so.appendonly;
  cfg.appendfilename = so.appendfilename;
  cfg.appendfsync = so.appendfsync;
  cfg.maxmemory = so.maxmemory;
  cfg.maxmemory_policy = so.maxmemory_policy;
  cfg.maxclients = so.maxclients;
  cfg.timeout_s = so.timeout_s;
  cfg.busy_reply_threshold_ms = so.busy_reply_threshold_ms;
  cfg.lua_memory = so.lua_maxmemory;
  store_options sto;
  // A maxmemory above the data region grows the region to hold it.
  sto.data_bytes = std::max(so.data_bytes, so.maxmemory);
  sto.maxmemory = so.maxmemory;
  sto.policy = so.maxmemory_policy == "allkeys-lru" ? eviction_policy::allkeys_lru
                                                    : eviction_policy::noeviction;
  if (sto.max_value > sto.data_bytes) sto.max_value = sto.data_bytes;
  sto.cluster_header = !so.cluster.empty();
  sto.encodings = {so.hash_max_listpack_entries, so.hash_max_listpack_value,
                   so.zset_max_listpack_entries, so.zset_max_listpack_value,
                   so.set_max_intset_entries};
  // SIGINT/SIGTERM end the loop cleanly (the AOF is flushed and synced on the
  // way out). Blocked before any thread starts (the device's engine threads
  // inherit the mask), so only the signalfd sees them.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGPIPE);
  if (cfg.requirepass.size() > layout::max_password)
    return fail("requirepass is " + std::to_string(cfg.requirepass.size()) + " bytes: at most " +
                std::to_string(layout::max_password) +
                " (RDMA clients present it in their connection request)");
  {
    // Every client is a descriptor: fit maxclients to RLIMIT_NOFILE (raising the
    // soft limit when the hard one allows) rather than meet EMFILE under load.
    // The server's own descriptors (device, loop, AOF, RDMA connections) are
    // reserved as Redis does.
    const std::size_t reserved = 32 + (so.rdma_listen.empty() ? 0 : 4 * 64);
    rlimit rl{};
    const rlim_t want = static_cast<rlim_t>(cfg.maxclients + reserved);
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < want) {
      rlimit up = rl;
      up.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
      if (up.rlim_cur > rl.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
      if (rl.rlim_cur < want) {
        if (rl.rlim_cur <= reserved + 1)
          return fail("the open-file limit (" + std::to_string(rl.rlim_cur) +
                      ", ulimit -n) leaves no room for clients: at least " +
                      std::to_string(reserved + 2) + " needed");
        cfg.maxclients = static_cast<std::size_t>(rl.rlim_cur) - reserved;
        std::fprintf(stderr,
                     "conveyor kv serve: maxclients lowered from %zu to %zu to fit the open-file "
                     "limit %llu (ulimit -n; %zu descriptors kept for the server)\n",
                     so.maxclients, cfg.maxclients, static_cast<unsigned long long>(rl.rlim_cur),
                     reserved);
      }
    }
  }
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  device_options dopts;
  // The loop drains its CQs with poll() and sleeps in epoll: soft's engine must
  // not take those polls for a busy poller and park (shm's parks too; arm()
  // now wakes it, core/sw_cq.cpp).
  dopts.software.engine_park = false;
  auto dev = device::open(so.provider, dopts);
  if (!dev) return fail("opening device " + so.provider + ": " + dev.error().to_string());
  auto pd = dev->alloc_pd();
  if (!pd) return fail("allocating a protection domain: " + pd.error().to_string());
  // Released pages fault in again where the device reads memory through our
  // mapping; a pinned registration would keep the old pages.
  sto.release_data_pages = !dev->attr().registration_pins_pages;
  auto st = store::create(*pd, sto);
  if (!st) return fail("creating the store: " + st.error().to_string());
  store& data = **st;

  cfg.protected_mode = so.protected_mode;
  {
    std::random_device rd;
    static constexpr char hex[] = "0123456789abcdef";
    for (int i = 0; i < 40; ++i) cfg.run_id += hex[rd() % 16];
  }
  if (!so.quiet && cfg.requirepass.empty() && (so.bind == "0.0.0.0" || so.bind == "::"))
    std::fprintf(stderr,
                 "conveyor kv serve: warning: listening on %s with no password: protected mode "
                 "%s (set --requirepass)\n",
                 so.bind.c_str(),
                 so.protected_mode ? "refuses every client from outside loopback"
                                   : "is off, so anyone who can reach the port has the data");

  // Both ports are bound before the AOF is read: a second server on the same
  // ports (and directory) fails here, before it could read or cut the log.
  std::unique_ptr<aof> log;
  executor exec(data, nullptr, cfg);
  server_loop loop;
  int sfd = ::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) return fail("signalfd failed");
  struct fd_closer {
    int fd;
    ~fd_closer() { ::close(fd); }
  } sfd_close{sfd};
  loop.add_fd(sfd, EPOLLIN, [&](unsigned) {
    signalfd_siginfo si{};
    while (::read(sfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) loop.stop();
    }
  });
  exec.hooks().shutdown = [&loop] { loop.stop(); };
  // A script past busy-reply-threshold keeps the other clients served from
  // its count hook; SHUTDOWN NOSAVE then stops the loop through the hook
  // above, as SHUTDOWN does (script.hpp).
  exec.scripts().serve_others = [&loop] { loop.serve_ready_now(); };

  resp_server_options ro;
  ro.bind = so.bind;
  ro.port = so.port;
  ro.maxclients = cfg.maxclients;
  ro.maxmemory_clients = so.maxmemory_clients;
  ro.log = !so.quiet;
  ro.partial_timeout = std::chrono::seconds(so.partial_timeout_s);
  ro.limits.max_bulk = sto.max_value > sto.max_key ? sto.max_value : sto.max_key;
  ro.limits.max_buffered = sto.max_value + sto.max_key + (1u << 20);
  resp_server resp(loop, exec, ro);
  std::string why;
  // The RDMA front end: one-sided GETs need nothing of this process's threads;
  // write RPCs run through the same executor, the AOF flushed before each reply.
  std::unique_ptr<rdma_server> rdma;
  if (!so.rdma_listen.empty()) {
    rdma_server_options rdo;
    rdo.address = so.rdma_listen;
    rdo.requirepass = so.requirepass;
    rdo.accept_later = true;
    rdo.max_message = static_cast<std::uint32_t>(
        std::min<std::size_t>(sto.max_value + sto.max_key + 4096, 64u << 20));
    rdo.max_message =
        std::max<std::uint32_t>(std::min<std::uint32_t>(rdo.max_message, 1u << 20), 64u << 10);
    auto r = rdma_server::start(
        *dev, *pd, data, loop,
        [&](session& s, std::span<const std::string_view> argv, std::string& out) {
          exec.execute(s, argv, out);
          if (log) log->flush();
        },
        rdo);
    if (!r) {
      loop.remove_fd(sfd);
      return fail("RDMA front end on " + so.rdma_listen + ": " + r.error().to_string());
    }
    rdma = std::move(*r);
    exec.stats().rdma_clients = [&rdma] { return rdma->stats().connections_current; };
    exec.stats().rdma_requirepass = [&rdma](std::string_view p) {
      return rdma->set_requirepass(p);
    };
    exec.stats().rdma_info = [&rdma, provider = so.provider](std::string& t) {
      const auto rs = rdma->stats();
      const auto sv = rdma->served();
      t += "provider:" + provider + "\r\n";
      t += "rdma_address:" + rdma->address() + "\r\n";
      t += "rdma_connected_clients:" + std::to_string(rs.connections_current) + "\r\n";
      t += "rdma_connections_received:" + std::to_string(rs.connections_total) + "\r\n";
      t += "rdma_rpcs:" + std::to_string(rs.rpcs) + "\r\n";
      // What the device's engine served to one-sided READs (rdma_server.hpp:
      // shm's direct loads and verbs NICs are not counted here).
      t += "rdma_reads_served:" + std::to_string(sv.reads_served) + "\r\n";
      t += "rdma_read_bytes_served:" + std::to_string(sv.read_bytes) + "\r\n";
    };
  }
  // The RESP port last: a client (or a script) that sees it answer finds the
  // RDMA front end listening too (python.kv's wrong-password case was once
  // refused by the RDMA address when it connected right after the port).
  if (!resp.listen(why)) {
    loop.remove_fd(sfd);
    return fail(why);
  }
  cfg.port = resp.port();  // INFO's tcp_port, CONFIG GET port: the port bound

  if (so.appendonly) {
    aof_options ao;
    ao.path = so.dir + "/" + so.appendfilename;
    ao.fsync = fsync;
    // A record holds one key and one value at most (plus a few short arguments).
    ao.max_bulk = std::max(sto.max_value, sto.max_key);
    ao.max_record = sto.max_value + sto.max_key + (1u << 20);
    ao.skip_bad_records = so.aof_skip_bad_records;
    log = aof::open(ao, why);
    if (!log) {
      loop.remove_fd(sfd);
      return fail(why);
    }
    exec.set_log(log.get());
    replay_result rr;
    auto t0 = std::chrono::steady_clock::now();
    bool ok = log->replay([&](std::span<const std::string_view> argv,
                              std::string& w) { return exec.replay(argv, w); },
                          rr, why);
    // A log cut inside a MULTI/EXEC block (EXEC's or a script's writes) was
    // cut off there by the loader, none of the block applied (aof.hpp).
    if (!ok) {
      loop.remove_fd(sfd);
      return fail(why);
    }
    if (!so.quiet)
      std::fprintf(
          stderr,
          "conveyor kv serve: replayed %llu commands (%llu bytes) from %s in %.3f s, "
          "%zu keys%s\n",
          static_cast<unsigned long long>(rr.commands), static_cast<unsigned long long>(rr.bytes),
          log->options().path.c_str(),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), data.size(),
          rr.skipped ? (", " + std::to_string(rr.skipped) + " bad records skipped").c_str() : "");
  }
  if (rdma) rdma->start_accepting();

  // Cluster mode: the replication listener (its replicas connect to it as
  // soon as the map names them) streams every write; replies wait for the
  // in-sync replicas' acknowledgements (repl/, docs/KV-CLUSTER.md).
  node_fence fence(exec, rdma.get());           // cluster mode's fence (loop thread)
  std::unique_ptr<cluster::cluster_node> node;  // started below; used from the loop thread
  std::unique_ptr<repl::node_role> role;
  if (!so.cluster.empty()) {
    repl::role_options rpo;
    const std::string host = so.bind.find(':') != std::string::npos ? "[" + so.bind + "]" : so.bind;
    // An shm device listens on names, not ports: its replication listener
    // takes a generated name on this host, which is not announced (the map
    // holds host:port addresses), so such a node serves shards without
    // replicas; replicas need soft (or verbs).
    const bool named = dev->attr().transport_type == transport::shm;
    if (!named) rpo.primary.address = host + ":" + std::to_string(so.cluster_repl_port);
    rpo.primary.ack_timeout_ms = so.repl_timeout_ms;
    rpo.primary.isr_lag_ms = so.repl_isr_lag_ms;
    rpo.limits = ro.limits;  // a record is bounded as a client's command is
    rpo.log = [](const std::string& line) {
      std::fprintf(stderr, "conveyor kv serve: %s\n", line.c_str());
    };
    rpo.primary.log = rpo.log;
    // Failover's inputs: a caught-up replica joins the isr by a map CAS; a
    // replica's link going up or down is published for the controller.
    rpo.primary.on_join = [&node](const std::string& id) {
      if (node) node->request_isr_add(id);
    };
    // The shrink: an in-sync replica that stopped acknowledging leaves the
    // isr by a map CAS this node proposes (docs/KV-CLUSTER.md).
    rpo.primary.on_leave = [&node](const std::string& id) {
      if (node) node->request_isr_remove(id);
    };
    rpo.report = [&node](const cluster::offset_report& r) {
      if (node) node->report_offset(r);
    };
    // A replica connects (and lets a snapshot empty its keyspace) only once
    // etcd says it is not synced (docs/KV-CLUSTER.md "Synchronous replication").
    rpo.publish = [&node](const cluster::offset_report& r) {
      return node && node->publish_offset(r, std::chrono::milliseconds(1000));
    };
    auto r = repl::node_role::start(*dev, *pd, loop, exec, std::move(rpo));
    if (!r) {
      loop.remove_fd(sfd);
      return fail("replication listener on " + host + ":" + std::to_string(so.cluster_repl_port) +
                  ": " + r.error().to_string());
    }
    role = std::move(*r);
    // Held replies of both front ends go out as the replicas acknowledge.
    if (rdma) rdma->set_sync(exec.sync());
    exec.sync()->on_advance = [&resp, &rdma] {
      resp.replicated();
      if (rdma) rdma->replicated();
    };
    exec.stats().replication_info = [&role](std::string& t) { role->info(t); };
  }

  // Cluster mode: join once the ports are bound and the data is loaded. The
  // node's thread hands each valid shard map to this loop, which alone reads it.
  if (!so.cluster.empty()) {
    cluster::node_options no;
    no.endpoints = so.cluster;
    no.cluster_name = so.cluster_name;
    no.dir = so.dir;
    no.resp = announce + ":" + std::to_string(resp.port());
    // An RDMA front end on host:port is announced with the same host; one
    // named for shm ("@name") is reachable on this host only: not announced.
    if (rdma)
      if (const auto p = cluster::split_address(rdma->address()).second; p != 0)
        no.rdma = announce + ":" + std::to_string(p);
    if (const auto p = cluster::split_address(role->address()).second; p != 0)
      no.repl = announce + ":" + std::to_string(p);
    no.lease_ttl = std::chrono::seconds(so.cluster_lease_s);
    no.on_view = [&loop, &exec, &role, &fence](std::shared_ptr<const cluster::cluster_view> v) {
      loop.post([&exec, &role, &fence, v = std::move(v)] {
        exec.set_cluster(v);
        role->set_view(*v);
        exec.data().set_epoch(v->map.epoch);
        // A hand-over ends when the map names another primary (it was written).
        if (fence.handing_over() && cluster::primary_of(*v) == nullptr) {
          std::fprintf(stderr,
                       "conveyor kv serve: cluster: hand-over done: serving as a replica\n");
          fence.end_handover();
        }
      });
    };
    // Fencing: the deadline comes in order with the maps (both posted).
    no.on_lease = [&loop, &fence](std::chrono::steady_clock::time_point until) {
      loop.post([&fence, until] { fence.lease(until); });
    };
    // A manual failover (docs/KV-CLUSTER.md "Manual failover"): fenced at
    // once; the 20 ms timer below asks for the map's CAS once the replica
    // holds every record.
    no.on_handover = [&loop, &exec, &fence](const std::string& to) {
      loop.post([&exec, &fence, to] {
        const auto* v = exec.cluster();
        const auto* sh = v ? cluster::primary_of(*v) : nullptr;
        const bool in_sync = sh && to != sh->primary &&
                             std::find(sh->isr.begin(), sh->isr.end(), to) != sh->isr.end();
        if (!in_sync || fence.handing_over()) {
          std::fprintf(stderr, "conveyor kv serve: cluster: hand-over to %.8s refused: %s\n",
                       to.c_str(),
                       fence.handing_over() ? "one is under way"
                                            : "not an in-sync replica of this node's shard");
          return;
        }
        fence.begin_handover(to, std::chrono::steady_clock::now() + std::chrono::seconds(5));
      });
    };
    no.on_handover_done = [&loop, &fence](bool written, const std::string& reason) {
      loop.post([&fence, written, reason] {
        if (written || !fence.handing_over()) return;  // written: the new map ends it
        std::fprintf(stderr, "conveyor kv serve: cluster: hand-over abandoned: %s\n",
                     reason.c_str());
        fence.end_handover();
      });
    };
    no.log = [](const std::string& line) {
      std::fprintf(stderr, "conveyor kv serve: cluster: %s\n", line.c_str());
    };
    // Fenced until the first lease.
    fence.lease(std::chrono::steady_clock::time_point::min());
    auto n = cluster::cluster_node::start(std::move(no));
    if (!n) {
      loop.remove_fd(sfd);
      return fail(n.error().to_string());
    }
    node = std::move(*n);
    cfg.cluster_enabled = true;
    cfg.cluster_my_id = node->id();
    cfg.cluster_address = announce + ":" + std::to_string(resp.port());
    if (!so.quiet)
      std::fprintf(stderr, "conveyor kv serve: cluster %s, node %s, etcd %zu endpoint(s)\n",
                   so.cluster_name.c_str(), node->id().c_str(), so.cluster.size());
  }

  // Fencing (cluster/controller.hpp): commands check the deadline
  // themselves; here, every 20 ms, the held RESP replies of a fenced node
  // become errors and its RDMA connections are closed (one-sided readers
  // stop), and they are accepted again once the lease is renewed.
  if (!so.cluster.empty()) {
    auto was = std::make_shared<bool>(false);
    loop.every(std::chrono::milliseconds(20), [&exec, &resp, &rdma, &fence, &role, &node, was] {
      if (fence.handing_over() && !fence.cas_asked()) {
        if (role->replica_caught_up(fence.to())) {
          fence.set_cas_asked();
          node->write_handover(fence.to());
        } else if (std::chrono::steady_clock::now() >= fence.deadline()) {
          std::fprintf(stderr,
                       "conveyor kv serve: cluster: hand-over abandoned: replica %.8s did not "
                       "acknowledge every record within 5 s\n",
                       fence.to().c_str());
          fence.end_handover();
        }
      }
      const bool f = exec.fenced();
      if (f) resp.replicated();
      if (f == *was) return;
      *was = f;
      if (rdma && f) rdma->close_all();
      std::fprintf(
          stderr, "conveyor kv serve: cluster: %s\n",
          f ? (fence.handing_over() ? "fenced for a hand-over; serving nothing"
                                    : "fenced: the lease is not confirmed; serving nothing")
            : "lease confirmed: serving");
    });
  }

  // Active expiry and reclamation ten times a second (Redis's hz 10), the AOF's
  // once-a-second sync and its rewrite check.
  loop.every(std::chrono::milliseconds(100), [&] {
    auto now = now_ms();
    data.expire_some(now, 200);
    data.reclaim(now);
    exec.sample_ops(now);
  });
  // Reclamation also runs every loop iteration (a no-op when nothing is due):
  // under a write load, freeing 100 ms worth of retired items at once stalled
  // the loop for milliseconds; spread out, each pass frees a few.
  loop.before_wait([&] { data.reclaim(0); });
  if (log)
    loop.every(std::chrono::milliseconds(1000), [&] {
      log->tick();
      if (log->rewrite_due()) {
        std::string w;
        if (!log->rewrite(data, w))
          std::fprintf(stderr, "conveyor kv serve: AOF rewrite failed: %s\n", w.c_str());
      }
    });
  if (!so.quiet)
    std::fprintf(stderr, "conveyor kv serve: RESP on %s:%u (provider %s, appendonly %s%s%s)\n",
                 so.bind.c_str(), resp.port(), so.provider.c_str(), so.appendonly ? "yes" : "no",
                 so.appendonly ? ", appendfsync " : "",
                 so.appendonly ? std::string(to_string(fsync)).c_str() : "");
  if (rdma && !so.quiet)
    std::fprintf(stderr, "conveyor kv serve: RDMA on %s (provider %s)\n", rdma->address().c_str(),
                 so.provider.c_str());
  auto stopper = std::make_shared<stop_handle>();
  stopper->loop = &loop;
  if (so.on_ready) {
    server_ready ready;
    ready.resp_port = resp.port();
    ready.rdma_address = rdma ? rdma->address() : std::string();
    ready.node_id = cfg.cluster_my_id;
    ready.stop = [stopper] { stopper->stop(); };
    so.on_ready(ready);
  }
  loop.run();
  stopper->detach();
  if (node) node->stop();  // the registration goes now, not a lease later
  if (rdma) rdma->set_sync(nullptr);
  role.reset();  // replies still held for replication are never sent
  rdma.reset();
  if (log && !log->sync())
    std::fprintf(stderr, "conveyor kv serve: the AOF's last sync failed: %s\n",
                 log->last_error().c_str());
  exec.set_log(nullptr);
  loop.remove_fd(sfd);
  if (!so.quiet) std::fprintf(stderr, "conveyor kv serve: stopped\n");
  return 0;
}

}  // namespace conveyor::kv
