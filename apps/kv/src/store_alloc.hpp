// conveyor::kv::unit_allocator — the store's allocator of item memory (64-byte
// units), store_impl's (store_impl.hpp). Loop thread only.
//
// Two-level segregated fit (TLSF, Masmano, Ripoll, Crespo and Real, 2004): the
// free blocks are in lists by size class, two bitmaps say which lists are not
// empty, and a freed block merges with free neighbours at once. allocate and
// free are O(1) (a few cache lines each), where the ordered maps this replaced
// walked two trees of every free block per call and allocated their nodes: at
// 100 000 item writes/s (MSET of 10 keys) they were a third of the server's CPU.
//
// Classes: a size below 32 units has a class of its own (an exact fit); above,
// each power of two is cut into 32 classes. A request takes the first block of
// the first non-empty class whose blocks all fit (good fit: at most 1/32 above
// the smallest block that would do), and when there is none, the first block
// of its own class that fits. So allocate fails only when no free block of n
// units exists, and memory freed by one size is reusable by any other.
//
// The bookkeeping lives in ordinary memory, nothing of it exported: a node per
// free block, and an index of 4 bytes per unit naming the free block that
// starts or ends there (calloc'd, so its pages are touched only where blocks
// have had bounds). An index entry is only a hint, checked against its node, so
// nothing is ever cleared in it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace conveyor::kv {

class unit_allocator {
 public:
  // The most units one allocator manages (node numbers are 32 bits).
  static constexpr std::uint64_t max_units = std::uint64_t{1} << 32;

  explicit unit_allocator(std::uint64_t units) : total_(units) {
    if (units > max_units) throw std::length_error("kv unit_allocator: more than 2^32 units");
    if (units != 0) {
      at_.reset(static_cast<std::uint32_t*>(std::calloc(units, sizeof(std::uint32_t))));
      if (!at_) throw std::bad_alloc();
    }
    reset();
  }

  // Everything free again, one block.
  void reset() {
    nodes_.assign(1, node{});  // node 0 is "none"
    spare_.clear();
    fl_map_ = 0;
    sl_map_.fill(0);
    for (auto& h : heads_) h.fill(none);
    free_units_ = 0;
    if (total_) insert(0, total_);
  }

  // n units (n >= 1), at the returned offset; nullopt if no free block has n.
  std::optional<std::uint64_t> allocate(std::uint64_t n) {
    const auto i = find(n);
    if (i == none) return std::nullopt;
    const std::uint64_t off = nodes_[i].off, len = nodes_[i].len;
    remove(i);
    if (len > n) insert(off + n, len - n);
    return off;
  }

  // Gives back [off, off + n), which allocate returned (n as asked).
  void free(std::uint64_t off, std::uint64_t n) {
    if (off + n < total_) {
      const auto r = at_[off + n];
      if (live(r) && nodes_[r].off == off + n) {
        n += nodes_[r].len;
        remove(r);
      }
    }
    if (off > 0) {
      const auto l = at_[off - 1];
      if (live(l) && nodes_[l].off + nodes_[l].len == off) {
        off = nodes_[l].off;
        n += nodes_[l].len;
        remove(l);
      }
    }
    insert(off, n);
  }

  // Whether allocate(n) would succeed now.
  bool can_allocate(std::uint64_t n) const { return find(n) != none; }
  std::uint64_t free_units() const { return free_units_; }
  // Free blocks (adjacent free memory is always one block).
  std::size_t free_blocks() const { return nodes_.size() - 1 - spare_.size(); }

 private:
  static constexpr unsigned sl_bits = 5;
  static constexpr std::uint32_t sl_count = 1u << sl_bits;
  static constexpr unsigned fl_count = 64 - sl_bits + 1;
  static constexpr std::uint32_t none = 0;

  struct node {
    std::uint64_t off = 0, len = 0;  // len 0: unused
    std::uint32_t prev = none, next = none;
  };
  struct size_class {
    unsigned fl, sl;
  };

  // The class holding blocks of n units.
  static size_class class_of(std::uint64_t n) {
    if (n < sl_count) return {0, static_cast<unsigned>(n)};
    const unsigned top = static_cast<unsigned>(std::bit_width(n)) - 1;
    return {top - sl_bits + 1, static_cast<unsigned>(n >> (top - sl_bits)) - sl_count};
  }
  // The first class whose every block has at least n units.
  static size_class class_at_least(std::uint64_t n) {
    if (n < sl_count) return class_of(n);
    const unsigned top = static_cast<unsigned>(std::bit_width(n)) - 1;
    return class_of(n + (std::uint64_t{1} << (top - sl_bits)) - 1);
  }

  bool live(std::uint32_t i) const { return i != none && i < nodes_.size() && nodes_[i].len; }

  // A free block of at least n units, or none.
  std::uint32_t find(std::uint64_t n) const {
    if (n == 0) return none;
    auto c = class_at_least(n);
    std::uint32_t bits = c.sl < sl_count ? sl_map_[c.fl] & (~0u << c.sl) : 0;
    if (bits == 0 && c.fl + 1 < fl_count) {
      const std::uint64_t fls = fl_map_ & (~std::uint64_t{0} << (c.fl + 1));
      if (fls != 0) {
        c.fl = static_cast<unsigned>(std::countr_zero(fls));
        bits = sl_map_[c.fl];
      }
    }
    if (bits != 0) return heads_[c.fl][static_cast<unsigned>(std::countr_zero(bits))];
    // Nothing in a class that surely fits: a block of n's own class may.
    const auto own = class_of(n);
    for (auto i = heads_[own.fl][own.sl]; i != none; i = nodes_[i].next)
      if (nodes_[i].len >= n) return i;
    return none;
  }

  void insert(std::uint64_t off, std::uint64_t len) {
    std::uint32_t i;
    if (!spare_.empty()) {
      i = spare_.back();
      spare_.pop_back();
    } else {
      i = static_cast<std::uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    const auto c = class_of(len);
    auto& head = heads_[c.fl][c.sl];
    nodes_[i] = node{off, len, none, head};
    if (head != none) nodes_[head].prev = i;
    head = i;
    sl_map_[c.fl] |= 1u << c.sl;
    fl_map_ |= std::uint64_t{1} << c.fl;
    at_[off] = i;
    at_[off + len - 1] = i;
    free_units_ += len;
  }

  void remove(std::uint32_t i) {
    auto& nd = nodes_[i];
    const auto c = class_of(nd.len);
    if (nd.prev != none)
      nodes_[nd.prev].next = nd.next;
    else
      heads_[c.fl][c.sl] = nd.next;
    if (nd.next != none) nodes_[nd.next].prev = nd.prev;
    if (heads_[c.fl][c.sl] == none) {
      sl_map_[c.fl] &= ~(1u << c.sl);
      if (sl_map_[c.fl] == 0) fl_map_ &= ~(std::uint64_t{1} << c.fl);
    }
    free_units_ -= nd.len;
    nd = node{};
    spare_.push_back(i);
  }

  struct free_deleter {
    void operator()(std::uint32_t* p) const noexcept { std::free(p); }
  };

  std::uint64_t total_;
  std::unique_ptr<std::uint32_t[], free_deleter> at_;  // unit -> a free block bounded there
  std::vector<node> nodes_;
  std::vector<std::uint32_t> spare_;  // unused node numbers
  std::uint64_t fl_map_ = 0;
  std::array<std::uint32_t, fl_count> sl_map_{};
  std::array<std::array<std::uint32_t, sl_count>, fl_count> heads_{};
  std::uint64_t free_units_ = 0;
};

}  // namespace conveyor::kv
