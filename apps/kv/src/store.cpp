// conveyor::kv::store — the store's string interface, its publication of items
// and their reclamation (the class is store_impl.hpp's; the collections' side
// is store_collections.cpp, expiry and eviction store_evict.cpp; layout in
// store_layout.hpp, the argument in docs/KV.md). One writer (the loop thread);
// remote readers at any time. Every change is published the same way: write a
// new, immutable item in free memory, then store the slot word (release) and
// the bucket's check word; the old item is retired and its memory reused only
// reclaim_grace_ms later.
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <random>

#include <sys/mman.h>
#include <unistd.h>

#include "store_impl.hpp"

namespace conveyor::kv {

time_ms now_ms() noexcept {
  return layout::now_ms();
}

namespace {

namespace L = layout;

// Retirement times in microseconds of the monotonic clock: an item is freed
// grace ms after it was retired, which is right before its slot changes: early
// by the few stores in between and at most the 1 us of truncation, far less
// than the bucket READ that precedes any reader's item READ (docs/KV.md).
std::int64_t steady_us() noexcept {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

store_impl::store_impl(memory_region index, memory_region data, const store_options& o,
                       std::uint64_t buckets, std::uint64_t seed)
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
  h->flags = opts_.cluster_header ? L::header_cluster : 0;
  for (std::uint64_t b = 0; b <= buckets_; ++b) publish_check(b);
}

std::optional<std::string_view> store_impl::get(std::string_view key, time_ms now) {
  auto f = find_live(key, now);
  if (!f) return std::nullopt;
  lru_[f->slot_index] = ++clock_;
  if (f->item->type != static_cast<std::uint32_t>(value_type::string)) return std::nullopt;
  return value_of(f->item);
}

put_status store_impl::put(std::string_view key, std::string_view value, const put_options& po,
                           time_ms now) {
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

bool store_impl::erase(std::string_view key, time_ms now) {
  auto f = find_live(key, now);
  if (!f) return false;
  unlink(*f);
  return true;
}

bool store_impl::contains(std::string_view key, time_ms now) {
  return find_live(key, now).has_value();
}

void store_impl::set_limits(std::size_t maxmemory, eviction_policy policy) {
  opts_.maxmemory = maxmemory;
  opts_.policy = policy;
  limit_ = maxmemory ? std::min<std::size_t>(maxmemory, data_mr_.size()) : data_mr_.size() / 8 * 7;
}

std::uint64_t store_impl::key_version(std::string_view key, time_ms now) {
  auto f = find_live(key, now);
  if (!f) return absent_version | written_[stripe(key)];
  // A new item (any write to a string, a TTL change, RENAME, a hash's
  // republished encoding) or a change to the key's collection (changed()).
  std::uint64_t v = f->item->version;
  if (auto it = objects_.find(key); it != objects_.end()) v = std::max(v, it->second->version);
  return v;
}

std::optional<time_ms> store_impl::expiry(std::string_view key, time_ms now) {
  auto f = find_live(key, now);
  if (!f) return std::nullopt;
  return f->item->expire_at ? f->item->expire_at : -1;
}

bool store_impl::set_expiry(std::string_view key, std::optional<time_ms> at, time_ms now) {
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

void store_impl::clear() {
  for (std::uint64_t b = 0; b <= buckets_; ++b) {
    auto* s = slots(b);
    bool any = false;
    for (std::size_t i = 0; i < L::slots_per_bucket; ++i) {
      if (!load_slot(s[i])) continue;
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

std::uint64_t store_impl::scan(std::uint64_t cursor, std::size_t count,
                               const std::function<void(std::string_view)>& fn) {
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

void store_impl::reclaim(time_ms) {
  const auto t = steady_us();
  const std::int64_t grace_us = std::int64_t{opts_.reclaim_grace_ms} * 1000;
  while (!retired_.empty() && retired_.front().at + grace_us <= t) {
    alloc_.free(retired_.front().off, retired_.front().units);
    retired_units_ -= retired_.front().units;
    retired_.pop_front();
  }
}

void store_impl::reclaim_all() {
  for (const auto& r : retired_) alloc_.free(r.off, r.units);
  retired_.clear();
  retired_units_ = 0;
}

store_stats store_impl::stats() const {
  store_stats s;
  s.keys = keys_;
  s.expires = expires_.size();
  s.used_bytes = live_units_ * L::unit + object_bytes_;
  s.capacity_bytes = limit_;
  s.evicted = evicted_;
  s.expired = expired_;
  s.retired_pending = retired_.size();
  s.retired_bytes = retired_units_ * L::unit;
  return s;
}

std::vector<std::byte> store_impl::describe() const {
  L::description d;
  d.index = index_mr_.remote();
  d.data = data_mr_.remote();
  d.buckets = buckets_;
  d.seed = seed_;
  // Read by the RDMA acceptor thread while clear() bumps it on the loop.
  auto* h = reinterpret_cast<L::index_header*>(index_mr_.data());
  d.generation = std::atomic_ref<std::uint64_t>(h->generation).load(std::memory_order_acquire);
  d.reclaim_grace_ms = opts_.reclaim_grace_ms;
  d.flags = opts_.cluster_header ? L::header_cluster : 0;
  return L::encode(d);
}

// ---- the cluster words (store_layout.hpp index_header) ------------------

namespace {
enum : std::size_t { w_epoch = 0, w_valid_until = 1, w_write_version = 2, w_acked_version = 3 };
void store_word(std::uint64_t& w, std::uint64_t v) {
  std::atomic_ref<std::uint64_t>(w).store(v, std::memory_order_release);
}
}  // namespace

void store_impl::note_change() {
  // Before the change: a reader that sees the change, then READs the words,
  // sees at least this version (release orders it before the slot stores).
  store_word(header_word(w_write_version), version_);
  if (acked_follows_) store_word(header_word(w_acked_version), version_);
}

void store_impl::set_acked_follows(bool follows) {
  acked_follows_ = follows;
  // Every change so far counts as acknowledged: under the old in-sync set
  // it was (an empty one acknowledges at once), and a replica joins the set
  // only once it holds what came before (docs/KV-CLUSTER.md).
  set_acked_version(version_);
}

void store_impl::set_acked_version(std::uint64_t v) {
  auto& w = header_word(w_acked_version);
  if (v > std::atomic_ref<std::uint64_t>(w).load(std::memory_order_relaxed)) store_word(w, v);
}

void store_impl::set_valid_until(std::int64_t realtime_ms) {
  store_word(header_word(w_valid_until), static_cast<std::uint64_t>(realtime_ms));
}

void store_impl::set_epoch(std::uint64_t epoch) {
  store_word(header_word(w_epoch), epoch);
}

// ---- publication ------------------------------------------------------

void store_impl::publish_check(std::uint64_t b) {
  auto* s = slots(b);
  std::uint64_t copy[L::slots_per_bucket];
  for (std::size_t i = 0; i < L::slots_per_bucket; ++i) copy[i] = load_slot(s[i]);
  std::atomic_ref<std::uint64_t>(s[-1]).store(L::bucket_check(b, copy, seed_),
                                              std::memory_order_release);
}

std::optional<store_impl::found> store_impl::find(std::string_view key) const {
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

std::optional<store_impl::found> store_impl::find_live(std::string_view key, time_ms now) {
  auto f = find(key);
  if (f && f->item->expire_at && f->item->expire_at <= now) {  // lazy expiry
    unlink(*f);
    ++expired_;
    return std::nullopt;
  }
  return f;
}

// An item stops being its key's current value, the one way any does (its
// slot is switched or cleared right after): it goes on the retired list with
// the time, its memory reused only reclaim_grace_ms later, and its checksum
// word takes the retired form (~checksum) before the slot changes, so a reader
// that READs it at a remembered location (docs/KV.md, "One READ") falls back
// to the buckets, while a reader that came through the old slot still accepts
// it within the grace time. At most one item of a key is ever live. The list
// entry comes first: if it cannot be allocated, nothing a reader sees changed.
void store_impl::retire(std::uint64_t w) {
  ++version_;
  note_change();
  const auto* it = item_at(w);
  const auto units = L::round_units(L::item_bytes(it->key_len, it->value_len));
  retired_.push_back({L::slot_offset_units(w), units, steady_us()});
  retired_units_ += units;
  std::atomic_ref<std::uint64_t> sum(const_cast<L::item_header*>(it)->checksum);
  sum.store(~sum.load(std::memory_order_relaxed), std::memory_order_release);
}

void store_impl::forget_expiry(const L::item_header* it) {
  if (it->expire_at) expires_.erase({it->expire_at, std::string(key_of(it))});
}

void store_impl::unlink(const found& f) {
  auto& w = slots(f.bucket)[f.slot];
  const auto old = load_slot(w);
  forget_expiry(f.item);
  drop_object(f.item);
  live_units_ -= L::round_units(L::item_bytes(f.item->key_len, f.item->value_len));
  retire(old);
  store_slot(w, 0);
  publish_check(f.bucket);
  --keys_;
}

// A free slot for a new key: in the less loaded of its two groups.
std::optional<std::pair<std::uint64_t, std::size_t>> store_impl::free_slot(std::string_view key) {
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

// Publishes a new item for `key`. keep_object: the key's collection stays
// (a new TTL, a republished hash); otherwise a collection it held is dropped.
put_status store_impl::write(std::string_view key, std::string_view value, value_type type,
                             std::int64_t expire, std::optional<found> old, std::uint64_t units,
                             time_ms now, bool keep_object) {
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
  // 2. The old item retired first (it waits out the grace time from here),
  // then the slot switched (release: the item's bytes are visible first), then
  // the new item live, then the check word. The server's own bookkeeping of
  // the old item goes before: dropping a large collection takes time that
  // would otherwise come out of the readers' grace.
  auto& w = slots(where->first)[where->second];
  const auto prev = load_slot(w);
  if (old) {
    forget_expiry(old->item);
    if (!keep_object) drop_object(old->item);
    live_units_ -= old_units;
  } else {
    ++keys_;
  }
  if (prev) retire(prev);
  note_change();
  const auto hash = L::hash_key(key, seed_);
  store_slot(w, L::make_slot(*off, units, L::place(hash, buckets_).tag));
  std::atomic_ref<std::uint64_t>(it->checksum).store(sum, std::memory_order_release);
  written_[hash % written_.size()] = it->version;
  publish_check(where->first);
  live_units_ += units;
  if (expire) expires_.emplace(expire, std::string(key));
  lru_[where->first * L::slots_per_bucket + where->second] = ++clock_;
  return put_status::stored;
}

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
