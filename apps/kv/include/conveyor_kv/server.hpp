// conveyor_kv/server.hpp — the conveyor-kv server: opens the device, creates
// the store, replays the append-only file, and runs the Redis protocol (RESP)
// on TCP and, when asked, the RDMA front end, on one thread until stopped.
//
//   conveyor::kv::server_options o;
//   o.port = 7379;                  // RESP (redis-cli -p 7379)
//   o.rdma_listen = "0.0.0.0:7380";  // conveyor::kv::client (one-sided GETs)
//   o.appendonly = true;
//   o.on_ready = [](const conveyor::kv::server_ready& r) { ... r.stop(); };
//   return conveyor::kv::serve(o);   // returns after SIGINT, SIGTERM or r.stop()
//
// `conveyor kv serve` is a command line around this header. docs/KV.md has the
// layout, the consistency of one-sided GETs, durability and trust.
//
// Thread safety: serve() blocks the calling thread, which becomes the server's
// loop thread; server_ready::stop may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace conveyor::kv {

// What a started server tells its caller (server_options::on_ready).
struct server_ready {
  std::uint16_t resp_port = 0;  // the RESP port bound (the one chosen when port was 0)
  std::string rdma_address;     // the RDMA front end's address; empty: none
  std::string node_id;          // cluster mode: this node's id (40 hex); empty otherwise
  // Ends serve() as SIGINT does (the AOF flushed and synced on the way out).
  // Callable from any thread, also after serve() has returned... until the
  // server_ready it came with is gone.
  std::function<void()> stop;
};

// Redis's configuration names where there is one (redis.conf's meanings).
struct server_options {
  // RESP on TCP
  std::string bind = "127.0.0.1";
  std::uint16_t port = 7379;  // Redis's 6379 plus 1000, so both can run side by side; 0: any
  std::string requirepass;    // empty: no AUTH on either front end; at most 200 bytes
  // Redis's protected mode: with no requirepass, RESP clients from outside
  // loopback are refused (-DENIED). kv serve's --protected-mode no turns it off.
  bool protected_mode = true;
  std::size_t maxclients = 10000;   // fitted to the open-file limit at start (one line says so)
  unsigned timeout_s = 0;           // close RESP clients idle this long (0: never)
  unsigned partial_timeout_s = 10;  // close RESP clients whose command stays incomplete this long
  // Query and output buffers of all RESP clients together (0: no bound); past
  // it the client holding the most is closed (Redis's maxmemory-clients).
  std::size_t maxmemory_clients = std::size_t{1} << 30;

  // The append-only file
  bool appendonly = false;
  std::string dir = ".";
  std::string appendfilename = "appendonly.aof";
  std::string appendfsync = "everysec";  // always | everysec | no
  bool aof_skip_bad_records = false;     // at start, skip (and name) records the store refuses

  // Memory
  std::size_t data_bytes = std::size_t{256} << 20;  // registered item memory; grows to maxmemory
  std::size_t maxmemory = 0;                        // 0: data_bytes is the only limit
  std::string maxmemory_policy = "noeviction";      // noeviction | allkeys-lru

  // Scripts (EVAL): past this many ms a running script makes the server answer
  // other clients -BUSY (SCRIPT KILL and SHUTDOWN NOSAVE still work; Redis's
  // busy-reply-threshold, alias lua-time-limit); the Lua state's memory bound
  // (a script past it fails "not enough memory").
  std::uint64_t busy_reply_threshold_ms = 5000;
  std::size_t lua_maxmemory = std::size_t{128} << 20;

  // Collections: where Redis's compact encodings end (OBJECT ENCODING), and
  // with them the publication of a hash for one-sided readers (docs/KV.md).
  std::size_t hash_max_listpack_entries = 512;
  std::size_t hash_max_listpack_value = 64;
  std::size_t zset_max_listpack_entries = 128;
  std::size_t zset_max_listpack_value = 64;
  std::size_t set_max_intset_entries = 512;

  // The device the store's memory is registered with, and the RDMA front end
  std::string provider = "soft";  // soft, shm, verbs...
  std::string rdma_listen;        // the RDMA front end's address (empty: none)

  // Cluster mode (issue 35, docs/KV-CLUSTER.md): the server registers itself
  // in etcd under /conveyor-kv/<cluster_name>/nodes/<id> on a lease of
  // cluster_lease_s seconds, follows the shard map at .../config, and speaks
  // Redis Cluster (CLUSTER SLOTS..., -MOVED, -CROSSSLOT, -CLUSTERDOWN). The id
  // is kept in <dir>/cluster-node.id across restarts.
  std::vector<std::string> cluster;      // etcd endpoints, host:port; empty: not a cluster
  std::string cluster_name = "default";  // 1..64 of [A-Za-z0-9_.-]
  // The host clients are sent to (registrations, -MOVED); empty: `bind`,
  // which then must not be a wildcard (0.0.0.0, ::).
  std::string cluster_announce;
  unsigned cluster_lease_s = 5;  // 1..3600: how soon a dead node's registration goes
  // Synchronous replication (cluster mode): the replication listener's port
  // (a Conveyor listener on `bind` with the device's provider, announced with
  // cluster_announce; 0: any free port), and how long a reply (any reply of
  // a connection, reads too) waits for every in-sync replica to acknowledge
  // the writes before it; past it the reply is -NOREPLICAS. An in-sync
  // replica that leaves what it was sent unacknowledged (or has no link) for
  // repl_isr_lag_ms (0: half of repl_timeout_ms) is removed from the in-sync
  // set by a map CAS its primary proposes (the shrink, docs/KV-CLUSTER.md),
  // which releases the replies it held.
  std::uint16_t cluster_repl_port = 0;
  unsigned repl_timeout_ms = 5000;
  unsigned repl_isr_lag_ms = 0;

  bool quiet = false;  // no start-up lines on stderr
  // Called on the loop thread once both front ends listen.
  std::function<void(const server_ready&)> on_ready;
};

// Runs the server until SIGINT, SIGTERM or server_ready::stop. Returns the
// process exit status: 0 after a stop, 1 if the server could not start (the
// reason on stderr: the device, the AOF, a port in use, a requirepass longer
// than RDMA clients can present, the cluster node id file...), 2 for options
// out of their ranges (appendfsync, maxmemory_policy, data_bytes 0, a cluster
// name or announce address it cannot use). SIGINT, SIGTERM and SIGPIPE
// are blocked in the calling thread (a signalfd reads them).
int serve(const server_options& opts);

}  // namespace conveyor::kv
