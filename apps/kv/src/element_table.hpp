// conveyor::kv::element_table — the elements of a set (V empty) or a hash (V
// the value): a chained hash table, the design of Redis's dict, with the same
// SCAN cursor and its guarantee. Thread safety: none (the loop thread's).
//
// - Buckets are a power of two; an element lives in bucket hash & (size - 1).
//   The table doubles when it holds as many elements as buckets and halves
//   (to twice its elements) below one element in eight buckets. A resize moves
//   the elements incrementally: while it lasts there are two tables, and each
//   insert or erase moves one bucket (Redis's incremental rehash), so no
//   command pays for the whole collection.
// - scan(cursor) visits the buckets in reverse-binary order (the cursor's
//   high bits counted up first; Redis's dictScan), so a bucket of a table of
//   2^k buckets is the set of buckets of a 2^(k+1) table that it splits into:
//   an element present for the whole scan is returned at least once, across
//   any number of resizes (a shrink during the scan may return some twice).
// - Every element is also in a dense array (its position kept in the entry),
//   so random() is uniform and O(1) (SPOP, SRANDMEMBER), and iteration walks
//   that array: the order is arbitrary and changes as elements come and go.
// - An entry is one allocation with its key's bytes after it; entries never
//   move, so pointers to them stay valid until they are erased.
//
// At most 2^32 - 1 elements (insert throws std::length_error past that).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "store_layout.hpp"

namespace conveyor::kv {

// A per-process random seed for the elements' hash: a client cannot aim
// elements at one bucket without knowing it.
inline std::uint64_t element_seed() {
  static const std::uint64_t seed =
      (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  return seed;
}

template <class V>
class element_table {
 public:
  struct entry {
    entry* next;
    std::uint64_t hash;
    std::uint32_t key_len;
    std::uint32_t slot;  // position in dense_
    [[no_unique_address]] V value;
    std::string_view key() const { return {reinterpret_cast<const char*>(this + 1), key_len}; }
  };

  element_table() = default;
  element_table(const element_table&) = delete;
  element_table& operator=(const element_table&) = delete;
  ~element_table() {
    for (auto* e : dense_) destroy(e);
  }

  std::size_t size() const noexcept { return dense_.size(); }
  bool empty() const noexcept { return dense_.empty(); }
  // Iteration over the elements (entry pointers), in no particular order.
  auto begin() const noexcept { return dense_.begin(); }
  auto end() const noexcept { return dense_.end(); }

  entry* find(std::string_view key) const {
    if (dense_.empty()) return nullptr;
    return find(key, hash_of(key));
  }

  // The entry for `key`, and whether it is new (its value then V{}).
  std::pair<entry*, bool> insert(std::string_view key) {
    const auto h = hash_of(key);  // once: a new key is looked up, then linked
    if (auto* e = dense_.empty() ? nullptr : find(key, h)) return {e, false};
    if (dense_.size() >= 0xffffffffu)
      throw std::length_error("kv element_table: too many elements");
    step();
    if (!resizing() && t_[0].used >= t_[0].size) start_resize(t_[0].size ? t_[0].size * 2 : 4);
    auto* e = make(key, h);
    link(t_[resizing() ? 1 : 0], e);
    e->slot = static_cast<std::uint32_t>(dense_.size());
    dense_.push_back(e);
    return {e, true};
  }

  // Removes and frees `e` (an entry of this table).
  void erase(entry* e) {
    unlink(e);
    auto* last = dense_.back();
    dense_[e->slot] = last;
    last->slot = e->slot;
    dense_.pop_back();
    destroy(e);
    step();
    if (!resizing() && t_[0].size > min_size && t_[0].used * 8 < t_[0].size)
      start_resize(std::max<std::size_t>(min_size, std::bit_ceil(t_[0].used * 2)));
  }
  bool erase(std::string_view key) {
    auto* e = find(key);
    if (e == nullptr) return false;
    erase(e);
    return true;
  }

  // A uniformly chosen element; nullptr if empty.
  template <class Urbg>
  entry* random(Urbg& g) const {
    if (dense_.empty()) return nullptr;
    return dense_[std::uniform_int_distribution<std::size_t>(0, dense_.size() - 1)(g)];
  }

  // One step of a SCAN: emit(entry*) for each element of the bucket(s) at
  // `cursor`; returns the next cursor, 0 when the scan is complete.
  template <class Emit>
  std::uint64_t scan(std::uint64_t cursor, Emit&& emit) const {
    if (dense_.empty()) return 0;
    auto visit = [&](const table& t, std::uint64_t b) {
      for (entry* e = t.buckets[b & t.mask]; e != nullptr; e = e->next) emit(e);
    };
    if (!resizing()) {
      visit(t_[0], cursor);
      return next_cursor(cursor, t_[0].mask);
    }
    // Two tables: the bucket of the smaller, then every bucket of the larger
    // that it expands to (they share the smaller's low bits).
    const table& small = t_[0].size <= t_[1].size ? t_[0] : t_[1];
    const table& large = t_[0].size <= t_[1].size ? t_[1] : t_[0];
    visit(small, cursor);
    do {
      visit(large, cursor);
      cursor = next_cursor(cursor, large.mask);
    } while (cursor & (small.mask ^ large.mask));
    return cursor;
  }

 private:
  static constexpr std::size_t min_size = 4;
  struct table {
    std::unique_ptr<entry*[]> buckets;
    std::size_t size = 0;  // 0 or a power of two
    std::uint64_t mask = 0;
    std::size_t used = 0;
  };

  entry* find(std::string_view key, std::uint64_t h) const {
    for (const auto& t : t_) {
      if (t.size == 0) continue;
      for (entry* e = t.buckets[h & t.mask]; e != nullptr; e = e->next)
        if (e->hash == h && e->key() == key) return e;
    }
    return nullptr;
  }

  static std::uint64_t hash_of(std::string_view key) {
    return layout::hash_key(key, element_seed());
  }

  // Redis's reverse-binary increment: the bits above the mask set, the
  // reversed cursor incremented, reversed back.
  static std::uint64_t next_cursor(std::uint64_t v, std::uint64_t mask) {
    v |= ~mask;
    v = reverse(v);
    ++v;
    return reverse(v);
  }
  static std::uint64_t reverse(std::uint64_t v) {
    v = ((v >> 1) & 0x5555555555555555ull) | ((v & 0x5555555555555555ull) << 1);
    v = ((v >> 2) & 0x3333333333333333ull) | ((v & 0x3333333333333333ull) << 2);
    v = ((v >> 4) & 0x0f0f0f0f0f0f0f0full) | ((v & 0x0f0f0f0f0f0f0f0full) << 4);
    return __builtin_bswap64(v);
  }

  static entry* make(std::string_view key, std::uint64_t h) {
    void* p = ::operator new(sizeof(entry) + key.size());
    auto* e = new (p) entry{nullptr, h, static_cast<std::uint32_t>(key.size()), 0, V{}};
    std::memcpy(static_cast<char*>(p) + sizeof(entry), key.data(), key.size());
    return e;
  }
  static void destroy(entry* e) {
    e->~entry();
    ::operator delete(e);
  }
  static void link(table& t, entry* e) {
    auto& head = t.buckets[e->hash & t.mask];
    e->next = head;
    head = e;
    ++t.used;
  }

  void unlink(entry* e) {
    for (auto& t : t_) {
      if (t.size == 0) continue;
      for (entry** p = &t.buckets[e->hash & t.mask]; *p != nullptr; p = &(*p)->next)
        if (*p == e) {
          *p = e->next;
          --t.used;
          return;
        }
    }
  }

  bool resizing() const noexcept { return t_[1].size != 0; }
  void start_resize(std::size_t n) {
    t_[1].buckets.reset(new entry*[n]());
    t_[1].size = n;
    t_[1].mask = n - 1;
    t_[1].used = 0;
    moved_ = 0;
    if (t_[0].used == 0) finish();
  }
  // Moves one non-empty bucket (looking at no more than ten empty ones) of
  // the old table to the new one.
  void step() {
    if (!resizing()) return;
    for (int empty = 0; moved_ < t_[0].size && empty < 10; ++moved_) {
      entry* e = t_[0].buckets[moved_];
      if (e == nullptr) {
        ++empty;
        continue;
      }
      t_[0].buckets[moved_] = nullptr;
      while (e != nullptr) {
        entry* next = e->next;
        --t_[0].used;
        link(t_[1], e);
        e = next;
      }
      ++moved_;
      break;
    }
    if (t_[0].used == 0) finish();
  }
  void finish() {
    t_[0] = std::move(t_[1]);
    t_[1] = table{};
    moved_ = 0;
  }

  table t_[2];
  std::size_t moved_ = 0;  // buckets of t_[0] already moved (while resizing)
  std::vector<entry*> dense_;
};

}  // namespace conveyor::kv
