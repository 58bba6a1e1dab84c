// conveyor::kv::cluster — adding nodes to the shard map and removing them
// (`conveyor kv cluster add-node|del-node`, docs/KV-CLUSTER.md "Adding and
// removing nodes"): pure functions from a map to the next one, written by the
// admin with rewrite_shard_map (controller.hpp), the same read-compute-CAS
// every other change of the map uses.
//
//   auto n = with_replica_added(m, reg, shard_index);  // epoch + 1, or why not
//   auto d = with_node_removed(m, node_id);
//
// Nothing here moves a slot: a shard's keys stay where they are, so no change
// these make can lose or hide an acknowledged write.
//
// Plain functions: thread-compatible.
#pragma once

#include <cstddef>
#include <expected>
#include <string>
#include <string_view>

#include "cluster/shard_map.hpp"

namespace conveyor::kv::cluster {

// The map with registered node `n` made a replica of m.shards[shard] (epoch +
// 1). Not in the isr: the shard's primary streams to it, it catches up
// (snapshot, then the stream) and the primary asks it into the isr once it
// holds every acknowledged write, as for a replica that restarted. Refused,
// with the reason: `n` already in the map, the shard already has
// max_replicas, its primary or `n` has no replication address.
std::expected<shard_map, std::string> with_replica_added(const shard_map& m,
                                                         const node_registration& n,
                                                         std::size_t shard);

// The map with registered node `n` the primary of a new shard `shard_id` that
// owns no slot yet (epoch + 1): every key gets -MOVED there until slots move
// to it. Refused when `n` is already in the map or the map holds max_shards.
std::expected<shard_map, std::string> with_shard_added(const shard_map& m,
                                                       const node_registration& n,
                                                       std::string_view shard_id);

// The map without node `id` (epoch + 1). A replica leaves its shard and the
// isr (the primary then no longer waits for it: a write it acknowledges
// later is on the rest of the isr, which always holds the primary). A
// primary leaves only with its shard, and only a shard that owns no slot and
// has no replica left; otherwise the reason says what to do first (fail it
// over to a replica, or remove the replicas of an empty shard). A node not in
// the map: refused.
std::expected<shard_map, std::string> with_node_removed(const shard_map& m, std::string_view id);

}  // namespace conveyor::kv::cluster
