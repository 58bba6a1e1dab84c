// conveyor kv serve — conveyor-kv's server (apps/kv, docs/KV.md) from the command line.
//
//   conveyor kv serve                       # RESP on 127.0.0.1:7379, no persistence
//   conveyor kv serve --port 6380 --appendonly yes --appendfsync always --dir /var/lib/kv
#include "kv_serve.hpp"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdio>

#include "conveyor_kv/server.hpp"

namespace conveyor::tool {

namespace {
// "1048576", "64mb", "1gb", "512k": Redis's memory units (k/kb/m/mb/g/gb, all powers of 1024).
bool parse_memory(const std::string& s, std::size_t& out) {
  std::size_t i = 0;
  unsigned long long v = 0;
  if (s.empty()) return false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    if (v > (~0ull) / 10) return false;
    v = v * 10 + static_cast<unsigned>(s[i++] - '0');
  }
  if (i == 0) return false;
  std::string unit;
  for (; i < s.size(); ++i)
    unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(s[i]))));
  unsigned long long mul = 1;
  if (unit.empty() || unit == "b")
    mul = 1;
  else if (unit == "k" || unit == "kb")
    mul = 1ull << 10;
  else if (unit == "m" || unit == "mb")
    mul = 1ull << 20;
  else if (unit == "g" || unit == "gb")
    mul = 1ull << 30;
  else
    return false;
  if (v > (~0ull) / mul) return false;
  out = static_cast<std::size_t>(v * mul);
  return true;
}
}  // namespace

void add_kv_serve_options(CLI::App& app, kv_serve_options& o) {
  app.add_option("--port", o.port, "TCP port of the Redis protocol (RESP); 0: any free port")
      ->capture_default_str();
  app.add_option("--bind", o.bind, "address the RESP listener binds")->capture_default_str();
  app.add_option("--requirepass", o.requirepass, "password clients must AUTH with (RESP and RDMA)");
  app.add_option("--protected-mode", o.protected_mode,
                 "yes: with no password, refuse RESP clients from outside loopback (Redis's "
                 "-DENIED)")
      ->check(CLI::IsMember({"yes", "no"}))
      ->capture_default_str();
  app.add_option("--appendonly", o.appendonly, "yes: log every write to the append-only file")
      ->check(CLI::IsMember({"yes", "no"}))
      ->capture_default_str();
  app.add_option("--appendfilename", o.appendfilename, "the append-only file's name, in --dir")
      ->capture_default_str();
  app.add_option("--dir", o.dir, "directory of the append-only file")->capture_default_str();
  app.add_flag("--aof-skip-bad-records", o.aof_skip_bad_records,
               "at start, skip (and name) each append-only file record the store refuses "
               "instead of refusing to start (damage that does not parse still refuses)");
  app.add_option("--appendfsync", o.appendfsync,
                 "always | everysec | no (Redis's meanings; docs/KV.md)")
      ->check(CLI::IsMember({"always", "everysec", "no"}))
      ->capture_default_str();
  app.add_option("--maxmemory", o.maxmemory,
                 "memory for items (bytes, or 64mb, 1gb...); 0: the data region's size")
      ->capture_default_str();
  app.add_option("--maxmemory-policy", o.maxmemory_policy, "noeviction | allkeys-lru")
      ->check(CLI::IsMember({"noeviction", "allkeys-lru"}))
      ->capture_default_str();
  app.add_option("--data-bytes", o.data_bytes,
                 "size of the registered item memory (bytes, or 256mb...)")
      ->capture_default_str();
  app.add_option("--maxclients", o.maxclients, "most RESP connections at once")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "close RESP clients idle this many seconds (0: never)")
      ->capture_default_str();
  app.add_option("--partial-timeout", o.partial_timeout_s,
                 "close RESP clients whose command is still incomplete after this many seconds")
      ->check(CLI::Range(1u, 3600u))
      ->capture_default_str();
  app.add_option("--maxmemory-clients", o.maxmemory_clients,
                 "query and output buffers of all RESP clients together (bytes, or 512mb, 1gb; 0: "
                 "no bound); past it the client holding the most is closed")
      ->capture_default_str();
  app.add_option("--busy-reply-threshold,--lua-time-limit", o.busy_reply_threshold_ms,
                 "ms a script may run before other clients get -BUSY and SCRIPT KILL works")
      ->check(CLI::Range(1u, 3600000u))
      ->capture_default_str();
  app.add_option("--lua-maxmemory", o.lua_maxmemory,
                 "memory of the scripts' Lua state (bytes, or 64mb...); a script past it fails")
      ->capture_default_str();
  app.add_option("--provider", o.provider,
                 "device the store's memory is registered with (soft, shm, verbs...)")
      ->capture_default_str();
  app.add_option("--rdma-listen", o.rdma_listen, "address of the RDMA front end (empty: none)");
  app.add_option("--hash-max-listpack-entries", o.hash_max_listpack_entries,
                 "a hash with more fields is a hashtable and is no longer published for "
                 "one-sided reads (HGET/HGETALL become RPCs)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--hash-max-listpack-value", o.hash_max_listpack_value,
                 "a hash with a longer field or value: the same")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--zset-max-listpack-entries", o.zset_max_listpack_entries,
                 "a sorted set with more members is a skiplist (OBJECT ENCODING)")
      ->capture_default_str();
  app.add_option("--zset-max-listpack-value", o.zset_max_listpack_value,
                 "a sorted set with a longer member: the same")
      ->capture_default_str();
  app.add_option("--set-max-intset-entries", o.set_max_intset_entries,
                 "a set of integers with more members is a hashtable (OBJECT ENCODING)")
      ->capture_default_str();
  app.add_option("--cluster", o.cluster,
                 "join a cluster coordinated by etcd: its endpoints, host:port[,host:port...] "
                 "(docs/KV-CLUSTER.md)");
  app.add_option("--cluster-name", o.cluster_name, "the cluster's name in etcd")
      ->capture_default_str();
  app.add_option("--cluster-announce", o.cluster_announce,
                 "host clients are redirected to (default: --bind, which then must not be "
                 "0.0.0.0)");
  app.add_option("--cluster-lease", o.cluster_lease_s,
                 "seconds of this node's etcd lease: how soon its registration goes after a "
                 "crash")
      ->check(CLI::Range(1u, 3600u))
      ->capture_default_str();
  app.add_option("--cluster-repl-port", o.cluster_repl_port,
                 "port of the replication listener (Conveyor, on --bind; 0: any free port), "
                 "which this node's replicas connect to")
      ->capture_default_str();
  app.add_option("--repl-timeout-ms", o.repl_timeout_ms,
                 "how long a reply waits for every in-sync replica to acknowledge the writes "
                 "before it (past it: -NOREPLICAS)")
      ->check(CLI::Range(10u, 3600000u))
      ->capture_default_str();
  app.add_option("--repl-isr-lag-ms", o.repl_isr_lag_ms,
                 "how long an in-sync replica may leave what was sent to it unacknowledged "
                 "(or have no link) before this node, its primary, removes it from the in-sync "
                 "set (0: half of --repl-timeout-ms, so that the held replies are released "
                 "before their bound)")
      ->check(CLI::Range(0u, 3600000u))
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "no start-up lines on stderr");
}

int run_kv_serve(const kv_serve_options& o) {
  kv::server_options so;
  so.port = o.port;
  so.bind = o.bind;
  so.requirepass = o.requirepass;
  so.protected_mode = o.protected_mode == "yes";
  so.appendonly = o.appendonly == "yes";
  so.appendfilename = o.appendfilename;
  so.dir = o.dir;
  so.appendfsync = o.appendfsync;
  so.maxmemory_policy = o.maxmemory_policy;
  so.maxclients = o.maxclients;
  so.timeout_s = o.timeout_s;
  so.partial_timeout_s = o.partial_timeout_s;
  so.aof_skip_bad_records = o.aof_skip_bad_records;
  so.hash_max_listpack_entries = o.hash_max_listpack_entries;
  so.hash_max_listpack_value = o.hash_max_listpack_value;
  so.zset_max_listpack_entries = o.zset_max_listpack_entries;
  so.zset_max_listpack_value = o.zset_max_listpack_value;
  so.set_max_intset_entries = o.set_max_intset_entries;
  if (!parse_memory(o.maxmemory, so.maxmemory)) {
    std::fprintf(stderr, "conveyor kv serve: --maxmemory %s: a size in bytes (or 64mb, 1gb...)\n",
                 o.maxmemory.c_str());
    return 2;
  }
  if (!parse_memory(o.maxmemory_clients, so.maxmemory_clients)) {
    std::fprintf(stderr,
                 "conveyor kv serve: --maxmemory-clients %s: a size in bytes (or 512mb, 1gb...)\n",
                 o.maxmemory_clients.c_str());
    return 2;
  }
  if (!parse_memory(o.data_bytes, so.data_bytes) || so.data_bytes == 0) {
    std::fprintf(stderr, "conveyor kv serve: --data-bytes %s: a size in bytes (or 256mb...)\n",
                 o.data_bytes.c_str());
    return 2;
  }
  so.busy_reply_threshold_ms = o.busy_reply_threshold_ms;
  if (!parse_memory(o.lua_maxmemory, so.lua_maxmemory) || so.lua_maxmemory < (1u << 20)) {
    std::fprintf(stderr, "conveyor kv serve: --lua-maxmemory %s: a size of at least 1mb\n",
                 o.lua_maxmemory.c_str());
    return 2;
  }
  so.provider = o.provider;
  so.rdma_listen = o.rdma_listen;
  so.quiet = o.quiet;
  for (std::size_t i = 0; i < o.cluster.size();) {
    auto j = o.cluster.find(',', i);
    if (j == std::string::npos) j = o.cluster.size();
    if (j > i) so.cluster.push_back(o.cluster.substr(i, j - i));
    i = j + 1;
  }
  if (!o.cluster.empty() && so.cluster.empty()) {
    std::fprintf(stderr, "conveyor kv serve: --cluster %s: host:port[,host:port...]\n",
                 o.cluster.c_str());
    return 2;
  }
  so.cluster_name = o.cluster_name;
  so.cluster_announce = o.cluster_announce;
  so.cluster_lease_s = o.cluster_lease_s;
  so.cluster_repl_port = o.cluster_repl_port;
  so.repl_timeout_ms = o.repl_timeout_ms;
  so.repl_isr_lag_ms = o.repl_isr_lag_ms;
  return kv::serve(so);
}

}  // namespace conveyor::tool
