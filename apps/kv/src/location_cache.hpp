// conveyor::kv::location_cache — where keys' items were last seen live, for
// the client's one-READ GET (docs/KV.md, "One READ"). An entry is only a
// guess: the item's own checksum, key and live form decide, so a wrong, stale
// or torn entry costs a READ, never a wrong answer. That is also why one cache
// is shared, without locks, by every client of the same store in a process
// (relaxed atomic words; a torn entry is just a wrong guess): clients warm it
// for each other and a process holds one, not one per connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "store_layout.hpp"

namespace conveyor::kv {

class location_cache {
 public:
  // Direct-mapped, `entries` rounded down to a power of two, 16 bytes each,
  // zeroed pages from calloc (touched as entries are used).
  explicit location_cache(std::size_t entries);
  location_cache(const location_cache&) = delete;
  location_cache& operator=(const location_cache&) = delete;

  // The remembered (offset, bytes) of the key whose hash is h.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> find(std::uint64_t h) const;
  void remember(std::uint64_t h, std::uint64_t off, std::uint64_t bytes);
  void forget(std::uint64_t h);

 private:
  struct entry {
    std::uint64_t hash, loc;  // loc: offset in units (40 bits) | size in units (24 bits)
  };
  struct free_deleter {
    void operator()(entry* p) const;
  };
  std::size_t index(std::uint64_t h) const;
  std::unique_ptr<entry, free_deleter> slots_;
  std::size_t mask_ = 0;
};

// The cache of the store `d` describes (its regions and seed), shared by every
// client of this process that asks with the same description; the first asker's
// `entries` sizes it. nullptr when entries is 0.
std::shared_ptr<location_cache> shared_location_cache(const layout::description& d,
                                                      std::size_t entries);

}  // namespace conveyor::kv
