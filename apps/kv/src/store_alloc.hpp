// conveyor::kv::unit_allocator — the store's allocator of item memory (64-byte
// units), store_impl's (store_impl.hpp). Loop thread only.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace conveyor::kv {

// Best-fit allocator of 64-byte units with coalescing. Its bookkeeping lives in
// ordinary memory: nothing of it is exported.
class unit_allocator {
 public:
  explicit unit_allocator(std::uint64_t units) : total_(units) { reset(); }
  void reset() {
    by_off_.clear();
    by_size_.clear();
    if (total_) insert(0, total_);
  }
  std::optional<std::uint64_t> allocate(std::uint64_t n) {
    auto it = by_size_.lower_bound({n, 0});
    if (it == by_size_.end()) return std::nullopt;
    auto [len, off] = *it;
    by_size_.erase(it);
    by_off_.erase(off);
    if (len > n) insert(off + n, len - n);
    return off;
  }
  void free(std::uint64_t off, std::uint64_t n) {
    auto next = by_off_.lower_bound(off);
    if (next != by_off_.end() && next->first == off + n) {
      n += next->second;
      by_size_.erase({next->second, next->first});
      next = by_off_.erase(next);
    }
    if (next != by_off_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        n += prev->second;
        by_size_.erase({prev->second, prev->first});
        by_off_.erase(prev);
      }
    }
    insert(off, n);
  }
  std::uint64_t largest_free() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  std::uint64_t free_units() const {
    std::uint64_t s = 0;
    for (auto& [o, l] : by_off_) s += l;
    return s;
  }

 private:
  void insert(std::uint64_t off, std::uint64_t n) {
    by_off_.emplace(off, n);
    by_size_.emplace(n, off);
  }
  std::uint64_t total_;
  std::map<std::uint64_t, std::uint64_t> by_off_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;
};

}  // namespace conveyor::kv
