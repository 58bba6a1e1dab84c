// conveyor::kv::cluster — the cluster's configuration document (the `config`
// key in etcd) and a node's registration (`nodes/<id>`), with their JSON forms
// and the checks every reader applies before trusting one (issue 35).
//
//   {"epoch": 7,
//    "shards": [{"id": "<40 hex>", "slots": [[0, 5460]], "primary": "<node id>",
//                "primary_boot": "<its registration's boot_id>",
//                "isr": ["<node id>", ...], "replicas": ["<node id>", ...]}, ...],
//    "nodes":  [{"id": "<40 hex>", "resp": "10.0.0.1:7000", "rdma": "10.0.0.1:17000",
//               "repl": "10.0.0.1:27000"}, ...]}
//
//   auto m = parse_shard_map(text);               // result<shard_map>, validated
//   auto t = slot_table::build(*m).value();
//   if (auto s = t.shard_of(slot_of(key))) route_to(m->shards[*s].primary);
//
// A shard is a primary and its replicas (node ids; the primary is not among its
// replicas). `isr` is the in-sync set that every acknowledged write reached: it
// always holds the primary, and otherwise only the shard's replicas. Slot
// ranges are inclusive, within 0..16383, and no slot belongs to two shards;
// slots that no shard owns are allowed (the cluster answers -CLUSTERDOWN for
// them) and reported by uncovered_slots(). Every node a shard names is listed
// in `nodes`, and a node serves at most one shard. Ids (nodes and shards) are
// 40 lowercase hex characters, as Redis's node and shard ids are.
//
// `primary_boot` names the process the map made primary: the boot_id of its
// registration when the map was written. A node that restarts keeps its id
// but not its boot_id (nor, without an AOF, its data), so a registration under
// the primary's id with another boot_id is a new process, not the primary:
// the controller fails the shard over as if the primary were gone, and the
// restarted node serves nothing of the shard until the map changes
// (docs/KV-CLUSTER.md, "A primary that restarts"). Optional: empty in a map
// written before it existed, then the controller records the live one.
//
// The JSON readers take hostile input: any document that is not exactly this
// shape (a wrong type, a missing or unknown field, a value out of range, more
// than the bounds below) is an invalid_argument error naming the first
// problem. Unknown fields are refused rather than skipped: a node that does
// not understand a field (say, a migration in progress) must not act on a
// map it would misread.
//
// Plain values: thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/error.hpp>

namespace conveyor::kv::cluster {

// Bounds on what a document may hold (a reader allocates no more than these allow).
inline constexpr std::size_t max_document_bytes = std::size_t{4} << 20;
inline constexpr std::size_t max_shards = 1024;
inline constexpr std::size_t max_nodes = 4096;
inline constexpr std::size_t max_replicas = 16;        // per shard, besides the primary
inline constexpr std::size_t max_slot_ranges = 16384;  // over all shards
inline constexpr std::size_t max_address_bytes = 262;  // "[v6]:port" or a DNS name and port
inline constexpr std::size_t max_boot_id_bytes = 64;

// Slots first..last, both included.
struct slot_range {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
  friend bool operator==(const slot_range&, const slot_range&) = default;
};

// How clients reach a node.
struct node_info {
  std::string id;    // 40 hex
  std::string resp;  // "host:port" of its Redis protocol listener
  std::string rdma;  // "host:port" of its RDMA listener; empty when it has none
  // "host:port" of its replication listener (a Conveyor listener its replicas
  // connect to, replication.hpp); empty when it has none
  std::string repl;
  friend bool operator==(const node_info&, const node_info&) = default;
};

struct shard {
  std::string id;  // 40 hex
  std::vector<slot_range> slots;
  std::string primary;
  std::vector<std::string> isr;       // in-sync: the primary and some replicas
  std::vector<std::string> replicas;  // not the primary
  std::string primary_boot;           // the primary's boot_id; empty: not recorded
  friend bool operator==(const shard&, const shard&) = default;
};

struct shard_map {
  std::uint64_t epoch = 0;  // previous map's + 1 (the CAS guard is etcd's mod_revision)
  std::vector<shard> shards;
  std::vector<node_info> nodes;
  friend bool operator==(const shard_map&, const shard_map&) = default;
};

// What a node writes under nodes/<id>, bound to its lease.
struct node_registration {
  std::string id;       // 40 hex, kept in the node's data directory across restarts
  std::string resp;     // as node_info
  std::string rdma;     // as node_info
  std::string boot_id;  // changes at every start: 1..64 of [A-Za-z0-9_-]
  std::string repl;     // as node_info
  friend bool operator==(const node_registration&, const node_registration&) = default;
};

// True for 40 lowercase hex characters.
bool valid_id(std::string_view id) noexcept;
// True for 1..64 of [A-Za-z0-9_-] (a registration's boot_id).
bool valid_boot_id(std::string_view boot) noexcept;
// True for "host:port": an IPv4 address, a bracketed IPv6 address or a DNS
// name, and a port 1..65535.
bool valid_address(std::string_view addr) noexcept;

// Every rule above; the error names the first one broken.
result<void> validate(const shard_map& m);
result<void> validate(const node_registration& r);

// The slot ranges no shard owns, in order (empty when all 16384 are owned).
// The map must be valid.
std::vector<slot_range> uncovered_slots(const shard_map& m);

// The node with this id in m.nodes, or nullptr.
const node_info* find_node(const shard_map& m, std::string_view id) noexcept;

// JSON: to_json writes the document above (compact); the parsers refuse
// anything else (and anything larger than max_document_bytes) and validate.
std::string to_json(const shard_map& m);
std::string to_json(const node_registration& r);
result<shard_map> parse_shard_map(std::string_view text);
result<node_registration> parse_node_registration(std::string_view text);

// slot -> shard in O(1), built from a valid map (32 KiB).
class slot_table {
 public:
  // Validates m; the table holds positions into m.shards, so it goes with
  // that map and no other.
  static result<slot_table> build(const shard_map& m);
  // The position in m.shards of the shard that owns `slot`, nullopt when none
  // does (or slot >= 16384).
  std::optional<std::size_t> shard_of(std::uint16_t slot) const noexcept;

 private:
  static constexpr std::uint16_t none = 0xffff;
  std::vector<std::uint16_t> owner_;
};

}  // namespace conveyor::kv::cluster
