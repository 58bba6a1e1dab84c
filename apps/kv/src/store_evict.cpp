// conveyor::kv::store — expiry and eviction (store_impl.hpp): active expiry
// from the ordered expiry set, and allkeys-lru's victims, from a sample of
// random buckets or from a new key's two full groups (docs/KV.md, "Memory
// limit, eviction, expiry"). Lazy expiry is find_live's (store.cpp).
#include <random>

#include "store_impl.hpp"

namespace conveyor::kv {

namespace {
namespace L = layout;
}  // namespace

std::size_t store_impl::expire_some(time_ms now, std::size_t budget) {
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

// What `key`'s item grows by when its collection gains `bytes`: a new key
// takes an item (a hash's holds its empty encoding, 5 bytes; the others',
// nothing); a small hash's item is its encoding, which grows by each field's
// bytes and 8 of lengths, less than the 48 per element `bytes` counts.
std::size_t store_impl::item_growth(std::string_view key, std::size_t bytes, time_ms now) {
  const auto f = find_live(key, now);
  if (!f) return L::round_units(L::item_bytes(key.size(), 5)) * L::unit;
  if (type_at(f->item) != value_type::hash) return 0;
  const auto it = objects_.find(key);
  if (it == objects_.end() || it->second->big) return 0;
  const std::size_t now_len = f->item->value_len;
  return (L::round_units(L::item_bytes(key.size(), now_len + bytes)) -
          L::round_units(L::item_bytes(key.size(), now_len))) *
         L::unit;
}

bool store_impl::reserve(std::string_view key, std::size_t bytes, time_ms now) {
  // Far enough below the limit, no lookup: the item grows by less than one
  // item holding `bytes` more (item_growth's largest answer).
  const std::size_t bound = L::round_units(L::item_bytes(key.size(), 5 + bytes)) * L::unit;
  if (live_units_ * L::unit + object_bytes_ + bytes + bound <= limit_) return true;
  bytes += item_growth(key, bytes, now);
  while (live_units_ * L::unit + object_bytes_ + bytes > limit_) {
    if (opts_.policy == eviction_policy::noeviction) return false;
    if (!evict_other(key, now)) return false;
  }
  return true;
}

// Evicts the least recently used of a sample of live keys; false if empty.
bool store_impl::evict_one(time_ms now) {
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

bool store_impl::evict_other(std::string_view key, time_ms now) {
  for (int tries = 0; tries < 4; ++tries) {
    auto f = find(key);
    if (keys_ <= (f ? 1u : 0u)) return false;
    // Shield the key by giving it the newest clock while sampling.
    if (f) lru_[f->slot_index] = ++clock_;
    if (evict_one(now)) return true;
  }
  return false;
}

bool store_impl::evict_from_groups(std::string_view key) {
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

}  // namespace conveyor::kv
