// conveyor kv cluster create|status|up: a conveyor-kv cluster from the command
// line (kv_cluster.cpp; docs/KV-CLUSTER.md), through conveyor_kv/cluster.hpp.
#pragma once

#include "cli_fwd.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace conveyor::tool {

struct kv_cluster_options {
  std::string etcd;  // host:port[,host:port...]; up: empty starts a local etcd
  std::string name = "default";
  std::size_t shards = 3;
  std::size_t replicas = 0;
  unsigned wait_s = 30;
  bool json = false;
  std::uint16_t port = 7001;    // up: the first node's RESP port
  std::uint16_t etcd_port = 0;  // up: the local etcd's client port (0: a free one)
  std::string dir;              // up: where the nodes and etcd keep their files (empty: a temp dir)
  std::string shard;            // failover: the shard (id, prefix, or its primary's id or address)
  std::string to;               // failover: the node to promote (empty: an in-sync replica)
  unsigned failover_wait_s = 10;  // failover: for the map that names the new primary
  std::string node;               // add-node, del-node: the node (id, prefix or RESP address)
  bool new_shard = false;         // add-node: the primary of a new, empty shard
  unsigned add_wait_s = 30;       // add-node: for the replica to enter the in-sync set
};

struct kv_cluster_commands {
  CLI::App *create = nullptr, *status = nullptr, *up = nullptr, *failover = nullptr;
  CLI::App *add_node = nullptr, *del_node = nullptr;
};

kv_cluster_commands add_kv_cluster_commands(CLI::App& kv, kv_cluster_options& o);
// Runs whichever of the commands was given; -1 if none was.
int run_kv_cluster(const kv_cluster_commands& c, const kv_cluster_options& o);

}  // namespace conveyor::tool
