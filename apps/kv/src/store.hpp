// conveyor::kv::store — the data of conveyor-kv: a hash index and the items it
// points to, both in memory registered with Conveyor and exported read-only to
// RDMA clients, who look keys up with one-sided READs (docs/KV.md: layout and
// the consistency argument).
//
// Thread safety: one writer. Every member function is called from the server's
// loop thread only (server_loop). Remote readers read the registered memory
// concurrently at any time; the store publishes each change so that a reader
// sees either the old item or the new one, and detects (version + checksum)
// anything else.
#pragma once

#include <conveyor/conveyor.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "object.hpp"

namespace conveyor::kv {

// Milliseconds since the Unix epoch (CLOCK_REALTIME), the unit of expiry times.
using time_ms = std::int64_t;
time_ms now_ms() noexcept;

enum class eviction_policy { noeviction, allkeys_lru };

struct store_options {
  std::size_t index_buckets = 1u << 18;  // rounded up to a power of two
  std::size_t data_bytes = 256u << 20;   // registered item memory
  std::size_t maxmemory = 0;             // 0: data_bytes is the only limit
  eviction_policy policy = eviction_policy::noeviction;
  std::size_t max_key = 512u << 10;   // longest key accepted
  std::size_t max_value = 64u << 20;  // longest value accepted (<= data_bytes)
  // A replaced or deleted item's memory is reused only this long after it was
  // unlinked: the bound a one-sided GET must finish within (a slower one
  // notices and retries; docs/KV.md, "Reclamation").
  std::uint32_t reclaim_grace_ms = 500;
  std::uint64_t seed = 0;  // hash seed; 0: random
  // Give the data region's pages back after allocation (resident only as items
  // use them). Only for devices that reach the memory through this process's
  // mapping (soft, shm; !device_attr::registration_pins_pages): a NIC's
  // registration pins the pages it was given.
  bool release_data_pages = false;
  // When a collection stops being "small" (Redis's encodings; a hash is
  // published for one-sided readers only while small).
  encoding_limits encodings{};
  // A cluster node's store: the index header's cluster words are kept
  // (store_layout.hpp index_header) and RDMA clients are told to check them.
  bool cluster_header = false;
};

enum class put_cond { always, if_absent /*NX*/, if_present /*XX*/ };

struct put_options {
  put_cond cond = put_cond::always;
  std::optional<time_ms> expire_at;  // absolute; nullopt: no TTL unless keep_ttl
  bool keep_ttl = false;             // SET ... KEEPTTL (and APPEND/INCR keep the TTL)
};

enum class put_status {
  stored,
  not_stored /*NX/XX said no*/,
  out_of_memory /*noeviction and full*/,
  too_large
};

struct store_stats {
  std::uint64_t keys = 0, expires = 0;  // live keys, keys with a TTL
  std::uint64_t used_bytes = 0, capacity_bytes = 0;
  std::uint64_t evicted = 0, expired = 0;  // totals
  std::uint64_t retired_pending = 0;       // items waiting for reclamation (epochs)
  std::uint64_t retired_bytes = 0;         // the data memory they hold until then
};

class store {
 public:
  // Registers the index and the data memory with `pd` (remote_read only for the
  // peer keys; the store writes locally).
  static result<std::unique_ptr<store>> create(protection_domain& pd, const store_options& opts);
  virtual ~store() = default;

  // The value of a live string key (an expired key is removed here: lazy
  // expiry); nullopt for no key and for a key of another type (type_of tells).
  // The view stays valid until the next non-const call.
  virtual std::optional<std::string_view> get(std::string_view key, time_ms now) = 0;
  // Stores a string; a key of another type is replaced (SET's meaning).
  virtual put_status put(std::string_view key, std::string_view value, const put_options& opts,
                         time_ms now) = 0;
  virtual bool erase(std::string_view key, time_ms now) = 0;
  virtual bool contains(std::string_view key, time_ms now) = 0;
  // The key's version: it changes with every write to the key, of any type
  // (every new item gets the next store-wide number, and so does every change
  // to a collection, changed()). While the key does not exist (expired keys
  // included) it has absent_version set and changes whenever the key is
  // written, so a key created and deleted again between two calls is seen
  // (other keys' writes may change it too). WATCH compares it at EXEC.
  static constexpr std::uint64_t absent_version = std::uint64_t{1} << 63;
  virtual std::uint64_t key_version(std::string_view key, time_ms now) = 0;
  // nullopt: no such key; a value of -1: the key has no TTL; otherwise the absolute expiry.
  virtual std::optional<time_ms> expiry(std::string_view key, time_ms now) = 0;
  // Sets (or, with nullopt, removes) a live key's TTL; false if the key does not exist.
  virtual bool set_expiry(std::string_view key, std::optional<time_ms> at, time_ms now) = 0;
  virtual std::size_t size() const = 0;
  virtual void clear() = 0;
  // Cursor iteration as Redis SCAN: calls `fn` for keys of about `count` buckets and
  // returns the next cursor (0 when done). Keys present for the whole scan are
  // reported at least once.
  virtual std::uint64_t scan(std::uint64_t cursor, std::size_t count,
                             const std::function<void(std::string_view key)>& fn) = 0;
  // Active expiry: removes up to `budget` expired keys; returns how many.
  virtual std::size_t expire_some(time_ms now, std::size_t budget) = 0;
  // Reclaims retired items that no reader can still be reading (epochs; docs/KV.md).
  virtual void reclaim(time_ms now) = 0;
  // Frees every retired item at once, grace or not. Only while no reader can
  // exist: before the front ends start (the AOF replay), when back-to-back
  // overwrites would otherwise hold the data region in grace and run it out.
  virtual void reclaim_all() = 0;
  virtual store_stats stats() const = 0;
  // CONFIG SET maxmemory / maxmemory-policy: the limit applies from the next
  // write (keys above a lowered limit are evicted as writes need room).
  virtual void set_limits(std::size_t maxmemory, eviction_policy policy) = 0;

  // ---- types (object.hpp). Every key has an item (type, expiry); a
  // collection's elements are an object the store owns and drops with the key.
  // The type of a live key (lazy expiry); nullopt: no such key.
  virtual std::optional<value_type> type_of(std::string_view key, time_ms now) = 0;
  // The type of the key's item without expiring anything (inside scan's callback).
  virtual std::optional<value_type> peek_type(std::string_view key) const = 0;
  // The live collection at `key`; nullptr if there is none, and then *wrong
  // says whether the key holds another type.
  virtual collection* find_collection(std::string_view key, value_type t, time_ms now,
                                      bool* wrong) = 0;
  // A new, empty collection at an absent key, its item published; nullptr if
  // the store has no room (OOM). The caller fills it and calls changed().
  virtual collection* create_collection(std::string_view key, value_type t, time_ms now) = 0;
  // After the commands changed `key`'s collection (and its `bytes`): an empty
  // one is deleted (Redis's semantics); otherwise its version moves, its memory
  // is counted, and a small hash's item is published anew.
  virtual void changed(std::string_view key, time_ms now) = 0;
  // Makes room under maxmemory for `bytes` more of `key`'s collection and for
  // what its item grows by with them: a new key's item, a small hash's
  // republished encoding (allkeys-lru evicts other keys, never `key`); false:
  // the write must answer OOM.
  virtual bool reserve(std::string_view key, std::size_t bytes, time_ms now) = 0;
  // Before a write to a hash that is published for one-sided readers: whether
  // the store can allocate its next item (its encoding grown by up to `extra`
  // bytes) now. False: answer OOM before changing anything (memory held by
  // retired items in their grace time; transient). True for any other key.
  virtual bool can_publish(std::string_view key, std::size_t extra, time_ms now) = 0;
  // RENAME: the value, type and expiry move; `to` is replaced. False: no `from`
  // (or, with *oom, no room for the new item).
  virtual bool rename(std::string_view from, std::string_view to, time_ms now, bool* oom) = 0;
  virtual const encoding_limits& encodings() const = 0;

  // What an RDMA client needs to find keys: the exported regions and the layout
  // parameters (the generation changes when the table moves). Opaque bytes that
  // rdma_server sends in its accept private data and client decodes.
  virtual std::vector<std::byte> describe() const = 0;

  // The index header's cluster words (cluster_header; docs/KV-CLUSTER.md,
  // "What a one-sided reader checks"). Every change a reader can see stores
  // the store's version in write_version first; while acked_follows (the
  // default: no in-sync replica to wait for) acked_version moves with it,
  // otherwise only set_acked_version moves it (never back).
  // set_valid_until and set_epoch may be called from any thread; the others
  // from the loop thread.
  virtual std::uint64_t current_version() const = 0;
  virtual void set_acked_follows(bool follows) = 0;
  virtual void set_acked_version(std::uint64_t v) = 0;
  virtual void set_valid_until(std::int64_t realtime_ms) = 0;
  virtual void set_epoch(std::uint64_t epoch) = 0;
};

}  // namespace conveyor::kv
