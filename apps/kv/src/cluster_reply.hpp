// conveyor::kv::cluster_reply — what a cluster client reads of a node's
// replies (cluster_client.cpp): CLUSTER INFO's epoch and CLUSTER SLOTS as a
// slot -> node table with each node's RDMA address (the "rdma" entry of its
// metadata map). Pure functions over a RESP2 reply's bytes, which are a
// peer's and hostile: depth, counts and lengths are bounded, every field
// checked, nothing kept that did not validate. Safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/error.hpp>

namespace conveyor::kv::cluster_reply {

inline constexpr std::size_t max_nodes = 4096;
inline constexpr std::size_t max_address_bytes = 262;

struct node_ref {
  std::string id;    // as CLUSTER SLOTS gives it (non-empty)
  std::string rdma;  // "host:port"; empty: the node has no RDMA front end
};

struct slot_table {
  std::vector<node_ref> nodes;      // each once, by id
  std::vector<std::int32_t> owner;  // 16384 entries: an index into nodes, -1 not served
  // The replicas CLUSTER SLOTS lists after each range's primary (indices
  // into nodes), one set per distinct list, at most max_replica_sets;
  // replica_set: 16384 entries, an index into replica_sets, -1 none.
  std::vector<std::vector<std::int32_t>> replica_sets;
  std::vector<std::int32_t> replica_set;
};
inline constexpr std::size_t max_replicas_per_range = 16;

// CLUSTER INFO's reply (a bulk string): its cluster_current_epoch.
// protocol_error naming what is wrong.
result<std::uint64_t> parse_info_epoch(std::string_view reply);

// CLUSTER SLOTS's reply: [[first, last, [host, port, id, {meta}], replicas...], ...].
// An error reply is errc::rejected with its text; anything malformed
// (ranges out of 0..16383 or reversed, a node without an id, too many nodes,
// an address too long) protocol_error.
result<slot_table> parse_slots(std::string_view reply);

}  // namespace conveyor::kv::cluster_reply
