// conveyor::kv::unit_allocator (store_alloc.hpp) against a model that marks
// every unit: blocks never overlap, freed neighbours merge at once, and
// allocate fails only when no free run of the size exists.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "store_alloc.hpp"

namespace kv = conveyor::kv;

namespace {

struct model {
  std::vector<bool> used;
  explicit model(std::uint64_t n) : used(n, false) {}
  // Maximal free runs.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs() const {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> r;
    for (std::uint64_t i = 0; i < used.size();) {
      if (used[i]) {
        ++i;
        continue;
      }
      std::uint64_t j = i;
      while (j < used.size() && !used[j]) ++j;
      r.emplace_back(i, j - i);
      i = j;
    }
    return r;
  }
  std::uint64_t largest() const {
    std::uint64_t m = 0;
    for (auto [o, l] : runs()) m = std::max(m, l);
    return m;
  }
};

void check_against(const kv::unit_allocator& a, const model& m) {
  const auto r = m.runs();
  std::uint64_t free = 0;
  for (auto [o, l] : r) free += l;
  ASSERT_EQ(a.free_units(), free);
  ASSERT_EQ(a.free_blocks(), r.size());  // adjacent free memory is one block
}

}  // namespace

TEST(kv_unit_allocator, whole_region_then_nothing) {
  kv::unit_allocator a(100);
  EXPECT_FALSE(a.allocate(101));
  EXPECT_FALSE(a.allocate(0));
  auto off = a.allocate(100);
  ASSERT_TRUE(off);
  EXPECT_EQ(*off, 0u);
  EXPECT_FALSE(a.allocate(1));
  EXPECT_FALSE(a.can_allocate(1));
  a.free(0, 100);
  EXPECT_EQ(a.free_blocks(), 1u);
  EXPECT_TRUE(a.can_allocate(100));
}

TEST(kv_unit_allocator, freed_neighbours_merge_both_ways) {
  kv::unit_allocator a(10);
  std::vector<std::uint64_t> off;
  for (int i = 0; i < 10; ++i) off.push_back(*a.allocate(1));
  EXPECT_EQ(a.free_blocks(), 0u);
  a.free(off[3], 1);
  a.free(off[5], 1);
  EXPECT_EQ(a.free_blocks(), 2u);
  EXPECT_FALSE(a.can_allocate(3));
  a.free(off[4], 1);  // joins the block before and the block after
  EXPECT_EQ(a.free_blocks(), 1u);
  auto three = a.allocate(3);
  ASSERT_TRUE(three);
  EXPECT_EQ(*three, off[3] < off[5] ? off[3] : off[5]);
}

// A request above 32 units whose own class holds the only block that fits:
// the search through the classes that surely fit finds nothing, the block is
// still found.
TEST(kv_unit_allocator, the_only_fitting_block_in_the_requests_own_class_is_found) {
  kv::unit_allocator a(1000);
  auto big = a.allocate(1000);
  ASSERT_TRUE(big);
  a.free(0, 101);  // class of 100..101 (each power of two in 32 classes above 32)
  EXPECT_TRUE(a.can_allocate(101));
  auto got = a.allocate(101);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, 0u);
  a.free(0, 100);
  EXPECT_FALSE(a.can_allocate(101));
  EXPECT_FALSE(a.allocate(101));
  EXPECT_TRUE(a.allocate(100));
}

TEST(kv_unit_allocator, random_allocations_and_frees_match_a_unit_model) {
  for (std::uint64_t total : {1ull, 7ull, 64ull, 1000ull, 5000ull}) {
    std::mt19937_64 rng(total * 7919);
    kv::unit_allocator a(total);
    model m(total);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
    for (int step = 0; step < 20000; ++step) {
      const bool do_alloc = live.empty() || rng() % 100 < 55;
      if (do_alloc) {
        // Mostly small sizes (items), sometimes large ones (values of KiBs).
        const std::uint64_t n = rng() % 8 == 0 ? 1 + rng() % 300 : 1 + rng() % 4;
        const bool fits = m.largest() >= n;
        ASSERT_EQ(a.can_allocate(n), fits) << "n=" << n << " total=" << total;
        auto off = a.allocate(n);
        ASSERT_EQ(off.has_value(), fits) << "n=" << n << " total=" << total;
        if (!off) continue;
        ASSERT_LE(*off + n, total);
        for (std::uint64_t u = *off; u < *off + n; ++u) {
          ASSERT_FALSE(m.used[u]) << "unit " << u << " given twice";
          m.used[u] = true;
        }
        live.emplace_back(*off, n);
      } else {
        const auto k = rng() % live.size();
        const auto [off, n] = live[k];
        live[k] = live.back();
        live.pop_back();
        a.free(off, n);
        for (std::uint64_t u = off; u < off + n; ++u) m.used[u] = false;
      }
      if (step % 64 == 0) check_against(a, m);
    }
    for (auto [off, n] : live) a.free(off, n);
    EXPECT_EQ(a.free_blocks(), total ? 1u : 0u);
    EXPECT_EQ(a.free_units(), total);
    // reset() forgets everything; stale index entries mislead nothing after it.
    a.reset();
    EXPECT_TRUE(a.can_allocate(total));
  }
}
