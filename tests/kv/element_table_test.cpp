// conveyor::kv::element_table (element_table.hpp), the table of a set's or a
// hash's elements: SCAN returns every element present for the whole scan,
// across growing and shrinking resizes in the middle of it; random() picks
// every element alike; big tables; the dense array and the buckets agree.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "element_table.hpp"

namespace kv = conveyor::kv;

namespace {

struct nothing {};
using set_table = kv::element_table<nothing>;
using hash_table = kv::element_table<std::string>;

std::string member(int i) {
  return "element:" + std::to_string(i);
}

// Everything scan() returns from cursor 0 to the end, with `between` run
// after every step (it may change the table).
template <class Table, class Between>
std::multiset<std::string> scan_all(const Table& t, Between&& between, int* steps = nullptr) {
  std::multiset<std::string> seen;
  std::uint64_t cursor = 0;
  int n = 0;
  do {
    cursor = t.scan(cursor, [&](const auto* e) { seen.emplace(e->key()); });
    between();
    ++n;
    EXPECT_LT(n, 1'000'000) << "scan does not end";
    if (n >= 1'000'000) break;
  } while (cursor != 0);
  if (steps) *steps = n;
  return seen;
}

// Writes that leave the elements as they were: each moves a bucket of a
// resize in progress, so one that a burst of erasures started also ends.
void pump(set_table& t, int& budget) {
  if (budget <= 0) return;
  --budget;
  for (int k = 0; k < 2000; ++k) {
    t.insert("pump");
    t.erase("pump");
  }
}

}  // namespace

TEST(kv_element_table, insert_find_erase_and_the_values) {
  hash_table t;
  EXPECT_EQ(t.find("a"), nullptr);
  auto [a, fresh] = t.insert("a");
  EXPECT_TRUE(fresh);
  EXPECT_EQ(a->key(), "a");
  EXPECT_EQ(a->value, "");
  a->value = "1";
  auto [again, fresh2] = t.insert("a");
  EXPECT_FALSE(fresh2);
  EXPECT_EQ(again, a);
  const auto* found = t.find("a");
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->value, "1");
  t.insert(std::string(1000, 'k')).first->value = "long";  // a key past any inline size
  const auto* big = t.find(std::string(1000, 'k'));
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->value, "long");
  t.insert(std::string("\0b", 2));  // binary keys
  EXPECT_NE(t.find(std::string("\0b", 2)), nullptr);
  EXPECT_EQ(t.find("b"), nullptr);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_TRUE(t.erase("a"));
  EXPECT_FALSE(t.erase("a"));
  EXPECT_EQ(t.size(), 2u);
}

// 200 000 elements in and out again: every element found while present, none
// after, and the iteration (the dense array) always holds exactly the live ones.
TEST(kv_element_table, big_table_grows_and_shrinks_and_keeps_every_element) {
  set_table t;
  constexpr int n = 200'000;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(t.insert(member(i)).second);
  ASSERT_EQ(t.size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ASSERT_NE(t.find(member(i)), nullptr) << i;
  std::set<std::string> iterated;
  for (const auto* e : t) iterated.emplace(e->key());
  EXPECT_EQ(iterated.size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; i += 2) ASSERT_TRUE(t.erase(member(i)));
  for (int i = 0; i < n; ++i) ASSERT_EQ(t.find(member(i)) != nullptr, i % 2 == 1) << i;
  for (int i = 1; i < n; i += 2) ASSERT_TRUE(t.erase(member(i)));
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.begin(), t.end());
  for (int i = 0; i < 10; ++i) t.insert(member(i));
  EXPECT_EQ(t.size(), 10u);
}

// 70 000 leaves the table half way through growing from 65 536 buckets: the
// scan walks both tables.
TEST(kv_element_table, a_scan_without_changes_returns_each_element_once) {
  for (int n : {0, 1, 3, 4, 5, 100, 1000, 4096, 70'000}) {
    set_table t;
    for (int i = 0; i < n; ++i) t.insert(member(i));
    int steps = 0;
    auto seen = scan_all(
        t, [] {}, &steps);
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(n)) << n;
    for (int i = 0; i < n; ++i) ASSERT_EQ(seen.count(member(i)), 1u) << n << " " << i;
  }
}

// Redis's guarantee: elements present from the start of a scan to its end
// are returned (at least once), while others come and go and the table grows
// to 16 times its size and shrinks back, at points early and late in the scan
// (a cursor that simply counted buckets would lose elements at a shrink).
TEST(kv_element_table, scan_returns_every_element_present_throughout_across_resizes) {
  constexpr int stable = 3000, extra = 60'000;  // 4096 buckets, then 65536, then back
  // Changes in batches of 5000 (a resize ends within a step or two) and of 50
  // (the scan goes on over both tables of a resize in progress for many steps).
  for (int batch : {5000, 50})
    for (int grow_at : {1, 300, 1500, 3000, 4000}) {
      for (int shrink_after : {1, 40, 2000, 20'000}) {
        std::mt19937_64 rng(static_cast<std::uint64_t>(grow_at * 100'003 + shrink_after));
        set_table t;
        for (int i = 0; i < stable; ++i) t.insert("stable:" + std::to_string(i));
        std::vector<std::string> extras;
        int step = 0, next = 0, pumps = 40;
        auto churn = [&] {
          ++step;
          if (step >= grow_at && next < extra) {  // grows over a few steps
            for (int k = 0; k < batch && next < extra; ++k) {
              extras.push_back("extra:" + std::to_string(next++));
              t.insert(extras.back());
            }
          } else if (next == extra && step >= grow_at + shrink_after) {  // shrinks
            for (int k = 0; k < batch && !extras.empty(); ++k) {
              const auto i = rng() % extras.size();
              t.erase(extras[i]);
              extras[i] = extras.back();
              extras.pop_back();
            }
            pump(t, pumps);
          }
        };
        auto seen = scan_all(t, churn);
        for (int i = 0; i < stable; ++i)
          ASSERT_GE(seen.count("stable:" + std::to_string(i)), 1u)
              << "batch " << batch << ", grow at step " << grow_at << ", shrink " << shrink_after
              << " steps later, i " << i;
        for (const auto& e : seen) ASSERT_TRUE(e.starts_with("stable:") || e.starts_with("extra:"));
      }
    }
}

// The same with a big table shrinking first (most of the set removed while it
// is scanned), then growing back.
TEST(kv_element_table, scan_survives_a_shrink_then_a_growth) {
  for (int shrink_at : {1, 5000, 30'000, 60'000}) {
    set_table t;
    constexpr int stable = 500, big = 60'000;
    for (int i = 0; i < stable; ++i) t.insert("stable:" + std::to_string(i));
    for (int i = 0; i < big; ++i) t.insert(member(i));
    int erased = 0, step = 0, added = big, pumps = 60;
    auto churn = [&] {
      ++step;
      if (step < shrink_at) return;
      if (erased < big)
        for (int k = 0; k < 2000 && erased < big; ++k) t.erase(member(erased++));
      else if (added < 2 * big)  // growth that ends (a table that grows for ever outruns any scan)
        for (int k = 0; k < 300; ++k) t.insert(member(added++));
      pump(t, pumps);
    };
    auto seen = scan_all(t, churn);
    for (int i = 0; i < stable; ++i)
      ASSERT_GE(seen.count("stable:" + std::to_string(i)), 1u) << shrink_at << " " << i;
  }
}

// random() picks every element alike: 50 elements, 200 000 draws, each count
// within 10 % of the expected 4 000 (a fair die leaves it with probability
// well below 10^-9 over all 50).
TEST(kv_element_table, random_picks_every_element_alike) {
  set_table t;
  for (int i = 0; i < 60; ++i) t.insert(member(i));
  for (int i = 50; i < 60; ++i) t.erase(member(i));  // holes in the dense array filled
  std::mt19937_64 rng(7);
  std::map<std::string, int> count;
  constexpr int draws = 200'000;
  for (int i = 0; i < draws; ++i) {
    const auto* e = t.random(rng);
    ASSERT_NE(e, nullptr);
    ++count[std::string(e->key())];
  }
  ASSERT_EQ(count.size(), 50u);
  for (const auto& [k, c] : count) {
    EXPECT_GT(c, 3600) << k;
    EXPECT_LT(c, 4400) << k;
  }
  set_table empty;
  EXPECT_EQ(empty.random(rng), nullptr);
}
