// conveyor_kv/cluster.hpp — administering a conveyor-kv cluster (issue 35,
// docs/KV-CLUSTER.md): read what etcd holds about it, create its shard map,
// fail a shard over by hand, add nodes to it and remove them. `conveyor kv
// cluster status|create|up|failover|add-node|del-node` are command lines
// around it.
//
//   conveyor::kv::cluster_admin_options a;
//   a.etcd = {"127.0.0.1:2379"};
//   a.name = "default";
//   auto made = conveyor::kv::create_cluster(a, {.shards = 3});  // waits for 3 nodes
//   if (!made) std::fprintf(stderr, "%s\n", made.error().to_string().c_str());
//   auto st = conveyor::kv::read_cluster_state(a);
//   std::puts(conveyor::kv::to_table(*st).c_str());
//
// etcd is the truth: a node is alive while its registration (bound to its
// lease) exists; the shard map is the config key, created here only if
// absent (compare-and-swap on "does not exist"), so two creates cannot both
// win. Everything read from etcd is validated before it is reported.
//
// Errors (conveyor::result): invalid_argument (options, --replicas over 16, a map
// that already exists, a stored map that is invalid), timed_out (not enough
// nodes registered within the wait), connection_refused / timed_out /
// protocol_error from etcd. Thread safety: the functions share nothing; call
// them from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <conveyor/error.hpp>

namespace conveyor::kv {

struct cluster_admin_options {
  std::vector<std::string> etcd;                    // endpoints, host:port; at least one
  std::string name = "default";                     // the cluster's name (1..64 of [A-Za-z0-9_.-])
  std::chrono::milliseconds request_timeout{2000};  // each etcd call
};

struct cluster_shard_state {
  std::string id;
  std::vector<std::pair<std::uint16_t, std::uint16_t>> slots;  // inclusive ranges
  std::string primary;
  std::vector<std::string> replicas, isr;
};

struct cluster_node_state {
  std::string id;
  std::string resp, rdma;  // from the registration, else from the map
  bool alive = false;      // registered now (its lease holds)
  bool in_map = false;     // named by the shard map
  std::string role;        // "primary", "replica" or "" (in no shard)
  std::string shard;       // the shard's id when in one
};

struct cluster_state {
  std::string name;
  bool has_map = false;
  std::uint64_t epoch = 0;
  std::int64_t map_revision = 0;  // the config key's mod_revision
  std::size_t slots_served = 0;   // of 16384
  std::vector<cluster_shard_state> shards;
  std::vector<cluster_node_state> nodes;  // map nodes, then other registered ones; by address
  std::size_t bad_registrations = 0;      // registrations under nodes/ that did not validate
};

// What etcd holds now. A stored map that does not validate is an
// invalid_argument error naming the problem.
result<cluster_state> read_cluster_state(const cluster_admin_options& a);

// Human-readable (one shard a line, then the nodes) and JSON renderings.
std::string to_table(const cluster_state& s);
std::string to_json(const cluster_state& s);

struct cluster_create_options {
  std::size_t shards = 3;         // 1..1024
  std::size_t replicas = 0;       // per shard: shards * (1 + replicas) nodes must register
  std::chrono::seconds wait{30};  // for `shards` registered nodes
  // Progress lines ("2 of 3 nodes registered"); null: silent.
  std::function<void(const std::string&)> progress;
};

// Waits until at least shards * (1 + replicas) nodes are registered, takes
// that many of them by address, makes the first `shards` primaries, each of
// a shard with an even share of the 16384 slots (Redis's split: 0-5460,
// 5461-10922, 10923-16383 for 3), and the next ones, `replicas` per shard in
// order, its replicas (in the in-sync set from the start; a primary must have
// registered a replication address), and writes the map (epoch 1) only if
// none exists. Returns the state read after.
result<cluster_state> create_cluster(const cluster_admin_options& a,
                                     const cluster_create_options& c);

struct cluster_failover_options {
  // The shard: its id or a unique prefix of it (at least 4 characters), or
  // the id or RESP address of its primary; empty: the cluster's only shard.
  std::string shard;
  // The node to promote: its id or a unique prefix; empty: the first
  // registered in-sync replica of the shard.
  std::string to;
  std::chrono::seconds wait{10};  // for the map that names it
};

// A manual failover without losing or hiding a write (Redis's CLUSTER
// FAILOVER, docs/KV-CLUSTER.md "Manual failover"): puts a hand-over request
// (on a lease of its own, so a stale one vanishes) that the shard's primary
// acts on: it fences itself (no key served, no write, one-sided readers
// refused), waits until the replica holds every record it streamed, and
// writes the map that promotes it by compare-and-swap, then serves as a
// replica. Returns the state read once the map names the new primary.
// Errors: invalid_argument (no such shard or node, the node is not an
// in-sync replica of the shard), timed_out (the primary did not hand over
// within `wait`: dead, fenced, or the replica not caught up within 5 s; its
// log says which), etcd's.
result<cluster_state> failover_cluster(const cluster_admin_options& a,
                                       const cluster_failover_options& f);

struct cluster_add_node_options {
  // The node: a registered node outside the map, by its id, a unique prefix
  // of it (at least 4 characters) or its RESP address.
  std::string node;
  // The shard it joins as a replica (as cluster_failover_options::shard);
  // empty: the shard with the fewest replicas (the first such in the map).
  std::string shard;
  // Instead: the primary of a new shard that owns no slot yet.
  bool new_shard = false;
  // As a replica: how long to wait for it to enter the in-sync set (it
  // catches up first); 0: return once the map names it.
  std::chrono::seconds wait{30};
};

// Adds a registered node to the map by compare-and-swap (Redis's `--cluster
// add-node`, docs/KV-CLUSTER.md "Adding and removing nodes"): as a replica of
// a shard, outside the in-sync set until its primary finds it holds every
// acknowledged write and asks it in, or as the primary of a new, empty shard.
// Returns the state read after. Errors: invalid_argument (no such node or
// shard, the node already in the map, no replication address, the shard
// full), timed_out (the replica was in the map but not in the in-sync set
// within `wait`: its log and its primary's say why), etcd's.
result<cluster_state> add_node_cluster(const cluster_admin_options& a,
                                       const cluster_add_node_options& o);

struct cluster_del_node_options {
  std::string node;  // in the map: its id, a unique prefix of it, or its RESP address
};

// Removes a node from the map by compare-and-swap (Redis's `--cluster
// del-node`): a replica leaves its shard and the in-sync set; a primary only
// with its shard, which must own no slot and have no replica (fail a shard
// over first to retire its primary). The node stays up and registered,
// serving nothing (every key -MOVED) until it is stopped or added again.
// Errors: invalid_argument (not in the map, or the reason it cannot leave),
// etcd's.
result<cluster_state> del_node_cluster(const cluster_admin_options& a,
                                       const cluster_del_node_options& o);

}  // namespace conveyor::kv
