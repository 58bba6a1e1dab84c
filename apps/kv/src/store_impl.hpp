// conveyor::kv::store_impl — the store's implementation (store.hpp's contract),
// private to its sources: store.cpp (the string interface, publication and
// reclamation of items), store_collections.cpp (types, the collections'
// objects, RENAME), store_evict.cpp (expiry and eviction). Layout in
// store_layout.hpp, the argument in docs/KV.md.
//
// Thread safety: as store — one writer (the loop thread); remote readers read
// the registered memory at any time.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "store.hpp"
#include "store_alloc.hpp"
#include "store_layout.hpp"

namespace conveyor::kv {

class store_impl final : public store {
 public:
  store_impl(memory_region index, memory_region data, const store_options& o, std::uint64_t buckets,
             std::uint64_t seed);

  // ---- strings, keys, reclamation (store.cpp) ----------------------------
  std::optional<std::string_view> get(std::string_view key, time_ms now) override;
  put_status put(std::string_view key, std::string_view value, const put_options& po,
                 time_ms now) override;
  bool erase(std::string_view key, time_ms now) override;
  bool contains(std::string_view key, time_ms now) override;
  void set_limits(std::size_t maxmemory, eviction_policy policy) override;
  std::uint64_t key_version(std::string_view key, time_ms now) override;
  std::optional<time_ms> expiry(std::string_view key, time_ms now) override;
  bool set_expiry(std::string_view key, std::optional<time_ms> at, time_ms now) override;
  std::size_t size() const override { return keys_; }
  void clear() override;
  std::uint64_t scan(std::uint64_t cursor, std::size_t count,
                     const std::function<void(std::string_view)>& fn) override;
  void reclaim(time_ms) override;
  void reclaim_all() override;
  store_stats stats() const override;
  std::vector<std::byte> describe() const override;
  std::uint64_t current_version() const override { return version_; }
  void set_acked_follows(bool follows) override;
  void set_acked_version(std::uint64_t v) override;
  void set_valid_until(std::int64_t realtime_ms) override;
  void set_epoch(std::uint64_t epoch) override;

  // ---- types (store_collections.cpp) -------------------------------------
  std::optional<value_type> type_of(std::string_view key, time_ms now) override;
  std::optional<value_type> peek_type(std::string_view key) const override;
  collection* find_collection(std::string_view key, value_type t, time_ms now,
                              bool* wrong) override;
  collection* create_collection(std::string_view key, value_type t, time_ms now) override;
  void changed(std::string_view key, time_ms now) override;
  bool can_publish(std::string_view key, std::size_t extra, time_ms now) override;
  bool rename(std::string_view from, std::string_view to, time_ms now, bool* oom) override;
  const encoding_limits& encodings() const override { return opts_.encodings; }

  // ---- expiry and eviction (store_evict.cpp) -----------------------------
  std::size_t expire_some(time_ms now, std::size_t budget) override;
  bool reserve(std::string_view key, std::size_t bytes, time_ms now) override;
  std::size_t item_growth(std::string_view key, std::size_t bytes, time_ms now);

 private:
  struct found {
    std::uint64_t bucket;
    std::size_t slot;        // 0..6 within the bucket
    std::size_t slot_index;  // bucket*7 + slot (the LRU shadow)
    const layout::item_header* item;
  };
  struct retired_item {
    std::uint64_t off, units;
    std::int64_t at;
  };

  std::uint64_t* slots(std::uint64_t b) const {
    return reinterpret_cast<std::uint64_t*>(index_mr_.data() + layout::bucket_offset(b)) + 1;
  }
  static std::uint64_t load_slot(std::uint64_t& w) {
    return std::atomic_ref<std::uint64_t>(w).load(std::memory_order_relaxed);
  }
  static void store_slot(std::uint64_t& w, std::uint64_t v) {
    std::atomic_ref<std::uint64_t>(w).store(v, std::memory_order_release);
  }
  const layout::item_header* item_at(std::uint64_t w) const {
    return reinterpret_cast<const layout::item_header*>(
        data_mr_.data() + layout::slot_offset_units(w) * layout::unit);
  }
  static value_type type_at(const layout::item_header* it) {
    return static_cast<value_type>(it->type);
  }
  static std::string_view key_of(const layout::item_header* it) {
    return {reinterpret_cast<const char*>(it + 1), it->key_len};
  }
  static std::string_view value_of(const layout::item_header* it) {
    return {reinterpret_cast<const char*>(it + 1) + it->key_len, it->value_len};
  }

  // Publication and reclamation (store.cpp).
  void publish_check(std::uint64_t b);
  // Before a change a reader can see: write_version (and acked_version while
  // it follows) = version_.
  void note_change();
  std::uint64_t& header_word(std::size_t i) const {
    return reinterpret_cast<std::uint64_t*>(index_mr_.data() + layout::header_words_offset)[i];
  }
  std::optional<found> find(std::string_view key) const;
  std::optional<found> find_live(std::string_view key, time_ms now);
  void retire(std::uint64_t w);
  void forget_expiry(const layout::item_header* it);
  void unlink(const found& f);
  std::optional<std::pair<std::uint64_t, std::size_t>> free_slot(std::string_view key);
  put_status write(std::string_view key, std::string_view value, value_type type,
                   std::int64_t expire, std::optional<found> old, std::uint64_t units, time_ms now,
                   bool keep_object);
  // The collections' objects (store_collections.cpp).
  void drop_object(const layout::item_header* it);
  // Eviction (store_evict.cpp).
  bool evict_one(time_ms now);
  bool evict_other(std::string_view key, time_ms now);
  bool evict_from_groups(std::string_view key);

  memory_region index_mr_, data_mr_;
  store_options opts_;
  std::uint64_t buckets_, seed_;
  std::uint64_t limit_ = 0;
  unit_allocator alloc_;
  std::vector<std::uint32_t> lru_;
  std::uint32_t clock_ = 0;
  std::mt19937_64 rng_;
  std::deque<retired_item> retired_;
  std::set<std::pair<time_ms, std::string>> expires_;
  std::uint64_t version_ = 0, keys_ = 0, live_units_ = 0, retired_units_ = 0;
  bool acked_follows_ = true;
  // The version of the last item written for a key of each stripe (keys by
  // hash): an absent key's version (key_version), so that a key created and
  // deleted again between WATCH and EXEC is seen. A write to another key of the
  // stripe changes it too: a transaction may then abort without need (safe;
  // one chance in 4096 for each write in between), never the other way.
  std::array<std::uint64_t, 4096> written_{};
  std::size_t stripe(std::string_view key) const {
    return layout::hash_key(key, seed_) % written_.size();
  }
  std::uint64_t evicted_ = 0, expired_ = 0;
  struct key_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view k) const noexcept {
      return std::hash<std::string_view>{}(k);
    }
  };
  std::unordered_map<std::string, std::unique_ptr<collection>, key_hash, std::equal_to<>> objects_;
  std::uint64_t object_bytes_ = 0;  // collections' elements, counted against the limit
  std::string scratch_;             // a hash's encoding being published
};

}  // namespace conveyor::kv
