// conveyor::kv collections — the canonical hashes, lists, sets and sorted sets,
// in the server's ordinary memory (one object per key, owned by the store).
// The store publishes an item for every key (type, expiry, and for a small
// hash its encoding, store_layout.hpp); the elements themselves live here, so
// a write to a large collection costs what Redis's does, not a rewrite of the
// whole collection (docs/KV.md, "Collections").
//
// Hashes and sets are hash tables with Redis's SCAN cursor (element_table.hpp:
// an element present for a whole scan is reported at least once, across
// resizes). Sorted sets keep their members ordered by (hash of the member,
// member): a ZSCAN cursor is a position in that order.
// Thread safety: loop thread only (as the store).
#pragma once

#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "element_table.hpp"
#include "store_layout.hpp"

namespace conveyor::kv {

using layout::value_type;

// Redis's listpack/intset thresholds: below them Redis reports the compact
// encoding, and a hash below them is published for one-sided readers. A
// collection that passes one converts for good (as Redis's do).
struct encoding_limits {
  std::size_t hash_max_listpack_entries = 512;
  std::size_t hash_max_listpack_value = 64;
  std::size_t zset_max_listpack_entries = 128;
  std::size_t zset_max_listpack_value = 64;
  std::size_t set_max_intset_entries = 512;
};

// The order of a sorted set's members in ZSCAN. Never 0, so a cursor of 0
// means "start" and "done" as in Redis.
inline std::uint64_t element_hash(std::string_view s) noexcept {
  return layout::hash_key(s, 0x6b76656c656d656eull) | 1;
}
using element_key = std::pair<std::uint64_t, std::string>;
inline element_key element_of(std::string_view s) {
  return {element_hash(s), std::string(s)};
}

// Bytes the store charges against maxmemory per element, above its own bytes.
inline constexpr std::size_t element_overhead = 48;

struct collection {
  explicit collection(value_type t) : type(t) {}
  virtual ~collection() = default;
  virtual std::size_t size() const = 0;
  const value_type type;
  std::uint64_t version = 0;  // the store's write counter at the last change
  std::size_t bytes = 0;      // what it holds (the commands keep it), for maxmemory
  std::size_t charged = 0;    // what the store has counted of it (store::changed)
  bool big = false;           // past the compact encoding's thresholds (one way)
};

struct hash_object final : collection {
  hash_object() : collection(value_type::hash) {}
  std::size_t size() const override { return fields.size(); }
  using field = element_table<std::string>::entry;  // key() the field, value its value
  element_table<std::string> fields;
};

struct list_object final : collection {
  list_object() : collection(value_type::list) {}
  std::size_t size() const override { return items.size(); }
  std::deque<std::string> items;
};

struct set_object final : collection {
  set_object() : collection(value_type::set) {}
  std::size_t size() const override { return members.size(); }
  struct no_value {};
  using member = element_table<no_value>::entry;
  element_table<no_value> members;
};

struct zset_object final : collection {
  zset_object() : collection(value_type::zset) {}
  std::size_t size() const override { return scores.size(); }
  // Score order with ranks in O(log n) (ZRANK, ZRANGE by index).
  using ranked =
      __gnu_pbds::tree<std::pair<double, std::string>, __gnu_pbds::null_type,
                       std::less<std::pair<double, std::string>>, __gnu_pbds::rb_tree_tag,
                       __gnu_pbds::tree_order_statistics_node_update>;
  std::map<element_key, double> scores;  // member -> score, in hash order (ZSCAN)
  ranked order;
};

// Appends the commands that rebuild `c` at `key` (the AOF rewrite): HSET,
// RPUSH, SADD or ZADD in batches of 64 elements (object_aof.cpp).
void encode_collection(std::string& out, std::string_view key, const collection& c);

// Redis's reply form of a score (%.17g; inf and -inf), for RESP2's bulk and
// RESP3's double alike, and the AOF.
std::string score_str(double d);

}  // namespace conveyor::kv
