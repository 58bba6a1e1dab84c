// conveyor kv serve: options and entry point (kv_serve.cpp).
#pragma once

#include "cli_fwd.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace conveyor::tool {

struct kv_serve_options {
  std::uint16_t port = 7379;  // Redis's 6379 plus 1000, so both can run side by side
  std::string bind = "127.0.0.1";
  std::string requirepass;
  std::string appendonly = "no";
  std::string protected_mode = "yes";
  std::string appendfilename = "appendonly.aof";
  std::string dir = ".";
  std::string appendfsync = "everysec";
  std::string maxmemory = "0";
  std::string maxmemory_policy = "noeviction";
  std::string data_bytes = "256mb";
  std::size_t maxclients = 10000;
  unsigned timeout_s = 0;
  unsigned partial_timeout_s = 10;
  unsigned busy_reply_threshold_ms = 5000;
  std::string lua_maxmemory = "128mb";
  bool aof_skip_bad_records = false;
  std::string maxmemory_clients = "1gb";
  std::string provider = "soft";
  std::string rdma_listen;
  bool quiet = false;
  // Cluster mode (docs/KV-CLUSTER.md): etcd endpoints, comma-separated.
  std::string cluster;
  std::string cluster_name = "default";
  std::string cluster_announce;
  unsigned cluster_lease_s = 5;
  std::uint16_t cluster_repl_port = 0;  // the replication listener (0: any free port)
  unsigned repl_timeout_ms = 5000;      // how long a reply waits for its replicas' acks
  unsigned repl_isr_lag_ms = 0;  // an in-sync replica silent this long leaves the isr (0: half)
  // Collections' encodings (Redis's names and defaults; docs/KV.md).
  std::size_t hash_max_listpack_entries = 512, hash_max_listpack_value = 64;
  std::size_t zset_max_listpack_entries = 128, zset_max_listpack_value = 64;
  std::size_t set_max_intset_entries = 512;
};

void add_kv_serve_options(CLI::App& app, kv_serve_options& o);
int run_kv_serve(const kv_serve_options& o);

}  // namespace conveyor::tool
