// conveyor::kv::store — the implementation (layout in store_layout.hpp, the
// argument in docs/KV.md). One writer (the loop thread); remote readers at any
// time. Every change is published the same way: write a new, immutable item in
// free memory, then store the slot word (release) and the bucket's check word;
// the old item is retired and its memory reused only reclaim_grace_ms later.
#include "store.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include <sys/mman.h>
#include <unistd.h>

#include "store_alloc.hpp"
#include "store_layout.hpp"

namespace conveyor::kv {

time_ms now_ms() noexcept {
  return layout::now_ms();
}

namespace {

namespace L = layout;

// Retirement times in microseconds of the monotonic clock: an item is freed
// grace ms after it was unlinked, early by at most the 1 us of truncation, far
// less than the bucket READ that precedes any reader's item READ (docs/KV.md).
std::int64_t steady_us() noexcept {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

class store_impl final : public store {
 public:
  store_impl(memory_region index, memory_region data, const store_options& o, std::uint64_t buckets,
             std::uint64_t seed)
      : index_mr_(std::move(index)),
        data_mr_(std::move(data)),
        opts_(o),
        buckets_(buckets),
        seed_(seed),
        alloc_(data_mr_.size() / L::unit),
        lru_((buckets + 1) * L::slots_per_bucket, 0),
        rng_(seed ^ 0x2545f491) {
    limit_ = opts_.maxmemory ? std::min(opts_.maxmemory, data_mr_.size())
                             : data_mr_.size() / 8 * 7;  // headroom for retired items
    auto* h = reinterpret_cast<L::index_header*>(index_mr_.data());
    h->magic = L::index_magic;
    h->version = L::format_version;
    h->generation = 1;
    h->buckets = buckets_;
    h->seed = seed_;
    for (std::uint64_t b = 0; b <= buckets_; ++b) publish_check(b);
  }

  std::optional<std::string_view> get(std::string_view key, time_ms now) override {
    auto f = find_live(key, now);
    if (!f) return std::nullopt;
    lru_[f->slot_index] = ++clock_;
    if (f->item->type != static_cast<std::uint32_t>(value_type::string)) return std::nullopt;
    return value_of(f->item);
  }

  put_status put(std::string_view key, std::string_view value, const put_options& po,
                 time_ms now) override {
    if (key.size() > opts_.max_key || value.size() > opts_.max_value) return put_status::too_large;
    const std::uint64_t units = L::round_units(L::item_bytes(key.size(), value.size()));
    if (units * L::unit > limit_) return put_status::too_large;
    auto old = find_live(key, now);
    if (po.cond == put_cond::if_absent && old) return put_status::not_stored;
    if (po.cond == put_cond::if_present && !old) return put_status::not_stored;
    std::int64_t expire = 0;
    if (po.keep_ttl && old)
      expire = old->item->expire_at;
    else if (po.expire_at)
      expire = std::max<std::int64_t>(*po.expire_at, 1);
    return write(key, value, value_type::string, expire, old, units, now, false);
  }

  bool erase(std::string_view key, time_ms now) override {
    auto f = find_live(key, now);
    if (!f) return false;
    unlink(*f);
    return true;
  }

  bool contains(std::string_view key, time_ms now) override {
    return find_live(key, now).has_value();
  }

  void set_limits(std::size_t maxmemory, eviction_policy policy) override {
    opts_.maxmemory = maxmemory;
    opts_.policy = policy;
    limit_ =
        maxmemory ? std::min<std::size_t>(maxmemory, data_mr_.size()) : data_mr_.size() / 8 * 7;
  }

  std::uint64_t key_version(std::string_view key, time_ms now) override {
    auto f = find_live(key, now);
    if (!f) return absent_version | written_[stripe(key)];
    // A new item (any write to a string, a TTL change, RENAME, a hash's
    // republished encoding) or a change to the key's collection (changed()).
    std::uint64_t v = f->item->version;
    if (auto it = objects_.find(key); it != objects_.end()) v = std::max(v, it->second->version);
    return v;
  }

  std::optional<time_ms> expiry(std::string_view key, time_ms now) override {
    auto f = find_live(key, now);
    if (!f) return std::nullopt;
    return f->item->expire_at ? f->item->expire_at : -1;
  }

  bool set_expiry(std::string_view key, std::optional<time_ms> at, time_ms now) override {
    auto f = find_live(key, now);
    if (!f) return false;
    const std::int64_t expire = at ? std::max<std::int64_t>(*at, 1) : 0;
    if (expire == f->item->expire_at) return true;
    // Items are immutable: a new TTL is a new copy of the item.
    const std::string k(key_of(f->item));
    const std::string v(value_of(f->item));
    const auto units = L::round_units(L::item_bytes(k.size(), v.size()));
    return write(k, v, type_at(f->item), expire, f, units, now, true) == put_status::stored;
  }

  std::size_t size() const override { return keys_; }

  void clear() override {
    for (std::uint64_t b = 0; b <= buckets_; ++b) {
      auto* s = slots(b);
      bool any = false;
      for (std::size_t i = 0; i < L::slots_per_bucket; ++i) {
        if (!load_slot(s[i])) continue;
        unpublish(item_at(s[i]));
        retire(s[i]);
        store_slot(s[i], 0);
        any = true;
      }
      if (any) publish_check(b);
    }
    keys_ = 0;
    live_units_ = 0;
    expires_.clear();
    objects_.clear();
    object_bytes_ = 0;
    auto* h = reinterpret_cast<L::index_header*>(index_mr_.data());
    std::atomic_ref<std::uint64_t>(h->generation).fetch_add(1, std::memory_order_release);
  }

  std::uint64_t scan(std::uint64_t cursor, std::size_t count,
                     const std::function<void(std::string_view)>& fn) override {
    const time_ms now = now_ms();
    std::uint64_t b = cursor;
    for (std::size_t n = 0; b <= buckets_ && n < std::max<std::size_t>(count, 1); ++b, ++n) {
      auto* s = slots(b);
      for (std::size_t i = 0; i < L::slots_per_bucket; ++i) {
        const auto w = load_slot(s[i]);
        if (!w) continue;
        const auto* it = item_at(w);
        if (it->expire_at && it->expire_at <= now) continue;
        fn(key_of(it));
      }
    }
    return b > buckets_ ? 0 : b;
  }

  std::size_t expire_some(time_ms now, std::size_t budget) override {
    std::size_t n = 0;
    while (n < budget && !expires_.empty() && expires_.begin()->first <= now) {
      const std::string key = expires_.begin()->second;
      auto f = find(key);
      if (f && f->item->expire_at && f->item->expire_at <= now) {
        unlink(*f);
        ++expired_;
      } else {
        expires_.erase(expires_.begin());  // stale entry: never left, but be safe
      }
      ++n;
    }
    return n;
  }

  void reclaim(time_ms) override {
    const auto t = steady_us();
    const std::int64_t grace_us = std::int64_t{opts_.reclaim_grace_ms} * 1000;
    while (!retired_.empty() && retired_.front().at + grace_us <= t) {
      alloc_.free(retired_.front().off, retired_.front().units);
      retired_units_ -= retired_.front().units;
      retired_.pop_front();
    }
  }

  void reclaim_all() override {
    for (const auto& r : retired_) alloc_.free(r.off, r.units);
    retired_.clear();
    retired_units_ = 0;
  }

  store_stats stats() const override {
    store_stats s;
    s.keys = keys_;
    s.expires = expires_.size();
    s.used_bytes = live_units_ * L::unit + object_bytes_;
    s.capacity_bytes = limit_;
    s.evicted = evicted_;
    s.expired = expired_;
    s.retired_pending = retired_.size();
    return s;
  }

  // ---- types -------------------------------------------------------------

  std::optional<value_type> type_of(std::string_view key, time_ms now) override {
    auto f = find_live(key, now);
    if (!f) return std::nullopt;
    return type_at(f->item);
  }

  std::optional<value_type> peek_type(std::string_view key) const override {
    auto f = find(key);
    if (!f) return std::nullopt;
    return type_at(f->item);
  }

  collection* find_collection(std::string_view key, value_type t, time_ms now,
                              bool* wrong) override {
    *wrong = false;
    auto f = find_live(key, now);
    if (!f) return nullptr;
    lru_[f->slot_index] = ++clock_;
    if (type_at(f->item) != t) {
      *wrong = true;
      return nullptr;
    }
    auto it = objects_.find(key);
    return it == objects_.end() ? nullptr : it->second.get();
  }

  collection* create_collection(std::string_view key, value_type t, time_ms now) override {
    if (key.size() > opts_.max_key || find_live(key, now)) return nullptr;
    std::unique_ptr<collection> o;
    switch (t) {
      case value_type::hash:
        o = std::make_unique<hash_object>();
        break;
      case value_type::list:
        o = std::make_unique<list_object>();
        break;
      case value_type::set:
        o = std::make_unique<set_object>();
        break;
      case value_type::zset:
        o = std::make_unique<zset_object>();
        break;
      case value_type::string:
        return nullptr;
    }
    std::string value;
    if (t == value_type::hash) L::encode_hash_begin(value, 0);
    const auto units = L::round_units(L::item_bytes(key.size(), value.size()));
    if (write(key, value, t, 0, std::nullopt, units, now, false) != put_status::stored)
      return nullptr;
    o->version = version_;
    auto* raw = o.get();
    objects_.insert_or_assign(std::string(key), std::move(o));
    return raw;
  }

  void changed(std::string_view key, time_ms now) override {
    auto f = find(key);
    auto it = objects_.find(key);
    if (!f || it == objects_.end()) return;
    collection& o = *it->second;
    if (o.size() == 0) {
      unlink(*f);  // drops the object
      return;
    }
    object_bytes_ = object_bytes_ - o.charged + o.bytes;
    o.charged = o.bytes;
    o.version = ++version_;
    lru_[f->slot_index] = ++clock_;
    if (o.type != value_type::hash) return;
    // A hash's item is its encoding while it is small, then the served mark.
    auto& h = static_cast<hash_object&>(o);
    const auto& lim = opts_.encodings;
    if (!h.big && h.fields.size() > lim.hash_max_listpack_entries) h.big = true;
    const bool was_served = value_of(f->item) == std::string_view("\x02", 1);
    if (h.big && was_served) return;
    if (h.big) {
      scratch_.assign(1, static_cast<char>(L::hash_served));
    } else {
      L::encode_hash_begin(scratch_, static_cast<std::uint32_t>(h.fields.size()));
      for (const auto* e : h.fields) L::encode_hash_field(scratch_, e->key(), e->value);
    }
    const std::string k(key);
    auto units = L::round_units(L::item_bytes(k.size(), scratch_.size()));
    if (write(k, scratch_, value_type::hash, f->item->expire_at, f, units, now, true) ==
        put_status::stored)
      return;
    // No room for the encoding (the commands asked can_publish first, so this
    // is a write past maxmemory): the one-sided readers are sent to the
    // server rather than left with the old fields. Retired memory is never
    // freed early here: a reader within the grace time relies on it.
    scratch_.assign(1, static_cast<char>(L::hash_served));
    units = L::round_units(L::item_bytes(k.size(), 1));
    if (auto g = find(k); g && write(k, scratch_, value_type::hash, g->item->expire_at, g, units,
                                     now, true) == put_status::stored)
      return;
    std::fprintf(stderr,
                 "conveyor kv: no memory to republish hash '%.64s': its one-sided readers see "
                 "the previous version until its next write\n",
                 k.c_str());
  }

  bool reserve(std::string_view key, std::size_t bytes, time_ms now) override {
    while (live_units_ * L::unit + object_bytes_ + bytes > limit_) {
      if (opts_.policy == eviction_policy::noeviction) return false;
      if (!evict_other(key, now)) return false;
    }
    return true;
  }

  bool can_publish(std::string_view key, std::size_t extra, time_ms now) override {
    auto f = find(key);
    if (!f || type_at(f->item) != value_type::hash) return true;
    auto it = objects_.find(key);
    if (it == objects_.end() || it->second->big) return true;
    const auto need = L::round_units(L::item_bytes(key.size(), f->item->value_len + extra));
    if (alloc_.can_allocate(need)) return true;
    reclaim(now);
    return alloc_.can_allocate(need);
  }

  bool rename(std::string_view from, std::string_view to, time_ms now, bool* oom) override {
    *oom = false;
    auto f = find_live(from, now);
    if (!f) return false;
    if (from == to) return true;
    const std::string key(to);
    const std::string value(value_of(f->item));
    const auto type = type_at(f->item);
    const auto expire = f->item->expire_at;
    std::unique_ptr<collection> obj;
    if (auto it = objects_.find(from); it != objects_.end()) {
      obj = std::move(it->second);
      objects_.erase(it);
    }
    auto restore = [&] {
      if (obj) objects_.insert_or_assign(std::string(from), std::move(obj));
    };
    if (auto d = find_live(to, now)) unlink(*d);
    const auto units = L::round_units(L::item_bytes(key.size(), value.size()));
    if (key.size() > opts_.max_key ||
        write(key, value, type, expire, std::nullopt, units, now, true) != put_status::stored) {
      restore();
      *oom = true;
      return false;
    }
    if (auto g = find(from)) unlink(*g);  // its object was taken out first: kept
    if (obj) {
      obj->version = version_;
      objects_.insert_or_assign(key, std::move(obj));
    }
    return true;
  }

  const encoding_limits& encodings() const override { return opts_.encodings; }

  std::vector<std::byte> describe() const override {
    L::description d;
    d.index = index_mr_.remote();
    d.data = data_mr_.remote();
    d.buckets = buckets_;
    d.seed = seed_;
    // Read by the RDMA acceptor thread while clear() bumps it on the loop.
    auto* h = reinterpret_cast<L::index_header*>(index_mr_.data());
    d.generation = std::atomic_ref<std::uint64_t>(h->generation).load(std::memory_order_acquire);
    d.reclaim_grace_ms = opts_.reclaim_grace_ms;
    return L::encode(d);
  }

 private:
  struct found {
    std::uint64_t bucket;
    std::size_t slot;        // 0..6 within the bucket
    std::size_t slot_index;  // bucket*7 + slot (the LRU shadow)
    const L::item_header* item;
  };
  struct retired_item {
    std::uint64_t off, units;
    std::int64_t at;
  };

  std::uint64_t* slots(std::uint64_t b) const {
    return reinterpret_cast<std::uint64_t*>(index_mr_.data() + L::bucket_offset(b)) + 1;
  }
  static std::uint64_t load_slot(std::uint64_t& w) {
    return std::atomic_ref<std::uint64_t>(w).load(std::memory_order_relaxed);
  }
  static void store_slot(std::uint64_t& w, std::uint64_t v) {
    std::atomic_ref<std::uint64_t>(w).store(v, std::memory_order_release);
  }
  void publish_check(std::uint64_t b) {
    auto* s = slots(b);
    std::uint64_t copy[L::slots_per_bucket];
    for (std::size_t i = 0; i < L::slots_per_bucket; ++i) copy[i] = load_slot(s[i]);
    std::atomic_ref<std::uint64_t>(s[-1]).store(L::bucket_check(b, copy, seed_),
                                                std::memory_order_release);
  }
  const L::item_header* item_at(std::uint64_t w) const {
    return reinterpret_cast<const L::item_header*>(data_mr_.data() +
                                                   L::slot_offset_units(w) * L::unit);
  }
  static value_type type_at(const L::item_header* it) { return static_cast<value_type>(it->type); }
  void drop_object(const L::item_header* it) {
    if (type_at(it) == value_type::string) return;
    auto o = objects_.find(key_of(it));
    if (o == objects_.end()) return;
    object_bytes_ -= o->second->charged;
    objects_.erase(o);
  }
  static std::string_view key_of(const L::item_header* it) {
    return {reinterpret_cast<const char*>(it + 1), it->key_len};
  }
  static std::string_view value_of(const L::item_header* it) {
    return {reinterpret_cast<const char*>(it + 1) + it->key_len, it->value_len};
  }

  std::optional<found> find(std::string_view key) const {
    const auto p = L::place(L::hash_key(key, seed_), buckets_);
    for (auto g : p.group)
      for (std::uint64_t b = g; b < g + L::buckets_per_group; ++b) {
        auto* s = slots(b);
        for (std::size_t i = 0; i < L::slots_per_bucket; ++i) {
          const auto w = load_slot(s[i]);
          if (!w || L::slot_tag(w) != p.tag) continue;
          const auto* it = item_at(w);
          if (key_of(it) == key) return found{b, i, b * L::slots_per_bucket + i, it};
        }
      }
    return std::nullopt;
  }
  std::optional<found> find_live(std::string_view key, time_ms now) {
    auto f = find(key);
    if (f && f->item->expire_at && f->item->expire_at <= now) {  // lazy expiry
      unlink(*f);
      ++expired_;
      return std::nullopt;
    }
    return f;
  }

  // An item stops being its key's current value: its checksum word takes the
  // retired form (~checksum) before the slot changes, so a reader that READs
  // it at a remembered location (docs/KV.md, "One READ") falls back to the
  // buckets, while a reader that came through the old slot still accepts it
  // within the grace time. At most one item of a key is ever live.
  static void unpublish(const L::item_header* it) {
    std::atomic_ref<std::uint64_t> w(const_cast<L::item_header*>(it)->checksum);
    w.store(~w.load(std::memory_order_relaxed), std::memory_order_release);
  }
  void retire(std::uint64_t w) {
    const auto* it = item_at(w);
    const auto units = L::round_units(L::item_bytes(it->key_len, it->value_len));
    retired_.push_back({L::slot_offset_units(w), units, steady_us()});
    retired_units_ += units;
  }
  void forget_expiry(const L::item_header* it) {
    if (it->expire_at) expires_.erase({it->expire_at, std::string(key_of(it))});
  }
  void unlink(const found& f) {
    auto& w = slots(f.bucket)[f.slot];
    const auto old = load_slot(w);
    forget_expiry(f.item);
    drop_object(f.item);
    live_units_ -= L::round_units(L::item_bytes(f.item->key_len, f.item->value_len));
    unpublish(f.item);
    store_slot(w, 0);
    publish_check(f.bucket);
    retire(old);
    --keys_;
  }

  // A free slot for a new key: in the less loaded of its two groups.
  std::optional<std::pair<std::uint64_t, std::size_t>> free_slot(std::string_view key) {
    const auto p = L::place(L::hash_key(key, seed_), buckets_);
    std::optional<std::pair<std::uint64_t, std::size_t>> best;
    std::size_t best_used = ~std::size_t{0};
    for (auto g : p.group) {
      std::size_t used = 0;
      std::optional<std::pair<std::uint64_t, std::size_t>> first_free;
      for (std::uint64_t b = g; b < g + L::buckets_per_group; ++b)
        for (std::size_t i = 0; i < L::slots_per_bucket; ++i) {
          if (load_slot(slots(b)[i]))
            ++used;
          else if (!first_free)
            first_free = std::pair{b, i};
        }
      if (first_free && used < best_used) {
        best = first_free;
        best_used = used;
      }
    }
    return best;
  }

  // Evicts the least recently used of a sample of live keys; false if empty.
  bool evict_one(time_ms now) {
    if (keys_ == 0) return false;
    std::optional<found> victim;
    std::uint32_t oldest = ~0u;
    std::size_t seen = 0;
    std::uniform_int_distribution<std::uint64_t> pick(0, buckets_);
    for (int probe = 0; probe < 64 && seen < 16; ++probe) {
      std::uint64_t b = pick(rng_);
      for (std::uint64_t k = 0; k < 8 && seen < 16; ++k, b = (b + 1) % (buckets_ + 1)) {
        auto* s = slots(b);
        for (std::size_t i = 0; i < L::slots_per_bucket; ++i) {
          const auto w = load_slot(s[i]);
          if (!w) continue;
          ++seen;
          const auto idx = b * L::slots_per_bucket + i;
          if (lru_[idx] < oldest || !victim) {
            oldest = lru_[idx];
            victim = found{b, i, idx, item_at(w)};
          }
        }
      }
    }
    if (!victim) {  // sparse table: walk it
      for (std::uint64_t b = 0; b <= buckets_ && !victim; ++b)
        for (std::size_t i = 0; i < L::slots_per_bucket && !victim; ++i)
          if (auto w = load_slot(slots(b)[i]))
            victim = found{b, i, b * L::slots_per_bucket + i, item_at(w)};
      if (!victim) return false;
    }
    (void)now;
    unlink(*victim);
    ++evicted_;
    return true;
  }

  // Publishes a new item for `key`. keep_object: the key's collection stays
  // (a new TTL, a republished hash); otherwise a collection it held is dropped.
  put_status write(std::string_view key, std::string_view value, value_type type,
                   std::int64_t expire, std::optional<found> old, std::uint64_t units, time_ms now,
                   bool keep_object) {
    auto units_of = [](const std::optional<found>& f) -> std::uint64_t {
      return f ? L::round_units(L::item_bytes(f->item->key_len, f->item->value_len)) : 0;
    };
    std::uint64_t old_units = units_of(old);
    // The memory limit: live bytes after this write.
    while ((live_units_ - old_units + units) * L::unit + object_bytes_ > limit_) {
      if (opts_.policy == eviction_policy::noeviction) return put_status::out_of_memory;
      // Keep the key being written out of the sample's reach.
      if (!evict_other(key, now)) return put_status::out_of_memory;
      old = find(key);
      old_units = units_of(old);
    }
    std::optional<std::pair<std::uint64_t, std::size_t>> where;
    if (old)
      where = std::pair{old->bucket, old->slot};
    else {
      where = free_slot(key);
      while (!where && opts_.policy == eviction_policy::allkeys_lru) {
        // Both groups are full: evict the least recently used key among them.
        if (!evict_from_groups(key)) break;
        where = free_slot(key);
      }
      if (!where) return put_status::out_of_memory;
    }
    auto off = alloc_.allocate(units);
    if (!off) {
      reclaim(now);
      off = alloc_.allocate(units);
      if (!off) return put_status::out_of_memory;  // retired items still in their grace time
    }
    // 1. The new item, complete, in memory no reader can reach yet.
    auto* it = reinterpret_cast<L::item_header*>(data_mr_.data() + *off * L::unit);
    const std::size_t bytes = L::item_bytes(key.size(), value.size());
    it->version = ++version_;
    it->expire_at = expire;
    it->key_len = static_cast<std::uint32_t>(key.size());
    it->type = static_cast<std::uint32_t>(type);
    it->value_len = static_cast<std::uint32_t>(value.size());
    std::memcpy(it + 1, key.data(), key.size());
    std::memcpy(reinterpret_cast<char*>(it + 1) + key.size(), value.data(), value.size());
    // Retired form until it is published (step 2): a remembered location that
    // reuses this memory never reads it as its key's current value early.
    const auto sum = L::item_checksum(reinterpret_cast<const std::byte*>(it), bytes, seed_);
    it->checksum = ~sum;
    // 2. The old item retired first, then the slot switched (release: the
    // item's bytes are visible first), then the new item live, then the check
    // word.
    auto& w = slots(where->first)[where->second];
    const auto prev = load_slot(w);
    if (prev) unpublish(item_at(prev));
    if (old) {
      forget_expiry(old->item);
      if (!keep_object) drop_object(old->item);
      live_units_ -= old_units;
    } else {
      ++keys_;
    }
    const auto hash = L::hash_key(key, seed_);
    store_slot(w, L::make_slot(*off, units, L::place(hash, buckets_).tag));
    std::atomic_ref<std::uint64_t>(it->checksum).store(sum, std::memory_order_release);
    written_[hash % written_.size()] = it->version;
    publish_check(where->first);
    // 3. The old item waits out the grace time.
    if (prev) retire(prev);
    live_units_ += units;
    if (expire) expires_.emplace(expire, std::string(key));
    lru_[where->first * L::slots_per_bucket + where->second] = ++clock_;
    return put_status::stored;
  }

  bool evict_other(std::string_view key, time_ms now) {
    for (int tries = 0; tries < 4; ++tries) {
      auto f = find(key);
      if (keys_ <= (f ? 1u : 0u)) return false;
      // Shield the key by giving it the newest clock while sampling.
      if (f) lru_[f->slot_index] = ++clock_;
      if (evict_one(now)) return true;
    }
    return false;
  }

  bool evict_from_groups(std::string_view key) {
    const auto p = L::place(L::hash_key(key, seed_), buckets_);
    std::optional<found> victim;
    std::uint32_t oldest = ~0u;
    for (auto g : p.group)
      for (std::uint64_t b = g; b < g + L::buckets_per_group; ++b)
        for (std::size_t i = 0; i < L::slots_per_bucket; ++i) {
          const auto w = load_slot(slots(b)[i]);
          if (!w) continue;
          const auto idx = b * L::slots_per_bucket + i;
          if (!victim || lru_[idx] < oldest) {
            oldest = lru_[idx];
            victim = found{b, i, idx, item_at(w)};
          }
        }
    if (!victim) return false;
    unlink(*victim);
    ++evicted_;
    return true;
  }

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
  // The version of the last item written for a key of each stripe (keys by
  // hash): an absent key's version (key_version), so that a key created and
  // deleted again between WATCH and EXEC is seen. A write to another key of the
  // stripe changes it too: a transaction may then abort without need (safe;
  // one chance in 4096 for each write in between), never the other way.
  std::array<std::uint64_t, 4096> written_{};
  std::size_t stripe(std::string_view key) const {
    return L::hash_key(key, seed_) % written_.size();
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

}  // namespace

result<std::unique_ptr<store>> store::create(protection_domain& pd, const store_options& opts) {
  if (opts.data_bytes < 4 * L::unit || opts.data_bytes / L::unit > L::max_offset_units ||
      opts.data_bytes / L::unit > unit_allocator::max_units)
    return make_error(errc::invalid_argument,
                      "kv store: data_bytes out of range (256 GiB at most)");
  if (opts.max_key > L::max_key_len)
    return make_error(errc::invalid_argument, "kv store: max_key above 16 MiB - 1");
  if (opts.index_buckets == 0 || opts.index_buckets > (1ull << 32))
    return make_error(errc::invalid_argument, "kv store: index_buckets out of range");
  const std::uint64_t buckets = std::bit_ceil(std::max<std::uint64_t>(opts.index_buckets, 2));
  const std::size_t data_bytes = opts.data_bytes / L::unit * L::unit;
  const auto rights = access::local_write | access::remote_read;
  auto index = pd.allocate_memory(L::bucket_offset(buckets + 1), rights);
  if (!index) return std::unexpected(index.error());
  auto data = pd.allocate_memory(data_bytes, rights);
  if (!data) return std::unexpected(data.error());
  // allocate_memory populates every page (what a NIC registration pins); where
  // the provider reaches the memory through this process's mapping, the pages
  // go back now, read as zeros again, and only those items use are resident:
  // an idle server holds its index, not its data region. shm's memfd is shared
  // with the peers that map it, so its pages are punched out of the file
  // (MADV_REMOVE) rather than only unmapped here.
  if (opts.release_data_pages) {
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t whole = data->size() / page * page;
    if (whole != 0 && ::madvise(data->data(), whole, MADV_REMOVE) != 0)
      ::madvise(data->data(), whole, MADV_DONTNEED);
  }
  std::uint64_t seed = opts.seed;
  if (!seed)
    seed = std::random_device{}() | (static_cast<std::uint64_t>(std::random_device{}()) << 32) | 1;
  return std::unique_ptr<store>(
      new store_impl(std::move(*index), std::move(*data), opts, buckets, seed));
}

}  // namespace conveyor::kv
