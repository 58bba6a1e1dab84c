// Unit tests for the key table: validation of every access, revocation, random bits.
#include "providers/swnic/key_table.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

using conveyor::access;
using conveyor::detail::key_check;
using conveyor::detail::key_table;

namespace {
struct fixture : ::testing::Test {
  key_table kt;
  std::vector<std::byte> buf = std::vector<std::byte>(4096);
  std::uint64_t base() const { return reinterpret_cast<std::uint64_t>(buf.data()); }
};
}  // namespace

TEST_F(fixture, live_key_with_right_and_range_is_ok_and_points_at_addr) {
  auto k = kt.add(buf.data(), buf.size(), access::local_write | access::remote_read, 7).value();
  key_table::guard g;
  std::byte* p = nullptr;
  EXPECT_EQ(kt.acquire(k, 7, base() + 100, 50, access::remote_read, g, &p), key_check::ok);
  EXPECT_EQ(p, buf.data() + 100);
  EXPECT_TRUE(g);
}

TEST_F(fixture, whole_region_is_in_bounds_but_one_byte_past_is_not) {
  auto k = kt.add(buf.data(), buf.size(), access::remote_read, 1).value();
  key_table::guard g;
  std::byte* p = nullptr;
  EXPECT_EQ(kt.acquire(k, 1, base(), 4096, access::remote_read, g, &p), key_check::ok);
  EXPECT_EQ(kt.acquire(k, 1, base() + 1, 4096, access::remote_read, g, &p),
            key_check::out_of_bounds);
  EXPECT_EQ(kt.acquire(k, 1, base() - 1, 2, access::remote_read, g, &p), key_check::out_of_bounds);
  EXPECT_EQ(kt.acquire(k, 1, base() + 4096, 1, access::remote_read, g, &p),
            key_check::out_of_bounds);
  // Overflowing address arithmetic must not wrap into the region.
  EXPECT_EQ(kt.acquire(k, 1, base() + 8, ~std::uint64_t{0}, access::remote_read, g, &p),
            key_check::out_of_bounds);
  EXPECT_FALSE(g);
}

TEST_F(fixture, missing_right_is_no_access) {
  auto k = kt.add(buf.data(), buf.size(), access::remote_read, 1).value();
  key_table::guard g;
  std::byte* p = nullptr;
  EXPECT_EQ(kt.acquire(k, 1, base(), 8, access::remote_write, g, &p), key_check::no_access);
  EXPECT_EQ(kt.acquire(k, 1, base(), 8, access::remote_atomic, g, &p), key_check::no_access);
}

TEST_F(fixture, key_of_another_protection_domain_is_refused) {
  auto k = kt.add(buf.data(), buf.size(), access::remote_read, 1).value();
  key_table::guard g;
  std::byte* p = nullptr;
  EXPECT_EQ(kt.acquire(k, 2, base(), 8, access::remote_read, g, &p), key_check::wrong_pd);
}

TEST_F(fixture, removed_key_is_invalid_at_once_and_slot_reuse_gives_a_new_key) {
  auto k = kt.add(buf.data(), buf.size(), access::remote_read, 1).value();
  kt.remove(k);
  key_table::guard g;
  std::byte* p = nullptr;
  EXPECT_EQ(kt.acquire(k, 1, base(), 8, access::remote_read, g, &p), key_check::invalid_key);
  auto k2 = kt.add(buf.data(), buf.size(), access::remote_read, 1).value();
  EXPECT_NE(k, k2);
  EXPECT_EQ(kt.acquire(k, 1, base(), 8, access::remote_read, g, &p), key_check::invalid_key);
}

TEST_F(fixture, keys_carry_random_bits) {
  std::set<std::uint32_t> low;
  std::vector<std::uint32_t> keys;
  for (int i = 0; i < 64; ++i) {
    keys.push_back(kt.add(buf.data(), buf.size(), access::remote_read, 1).value());
    low.insert(keys.back() & 0xFFFF);
  }
  EXPECT_GT(low.size(), 50u);  // 64 draws of 16 random bits
  for (auto k : keys) EXPECT_GE(k, 0x10000u) << "keys 0 and 1 are reserved on the wire";
}

TEST_F(fixture, zero_and_garbage_keys_are_invalid) {
  key_table::guard g;
  std::byte* p = nullptr;
  EXPECT_EQ(kt.acquire(0, 1, 0, 0, access::none, g, &p), key_check::invalid_key);
  EXPECT_EQ(kt.acquire(1, 1, 0, 0, access::none, g, &p), key_check::invalid_key);
  EXPECT_EQ(kt.acquire(0xFFFFFFFF, 1, 0, 0, access::none, g, &p), key_check::invalid_key);
}

TEST_F(fixture, remove_waits_for_an_access_in_progress) {
  auto k = kt.add(buf.data(), buf.size(), access::remote_write, 1).value();
  key_table::guard g;
  std::byte* p = nullptr;
  ASSERT_EQ(kt.acquire(k, 1, base(), 8, access::remote_write, g, &p), key_check::ok);
  std::atomic<bool> removed{false};
  std::thread t([&] {
    kt.remove(k);
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(removed.load()) << "deregistration returned while the engine still held the key";
  g.release();
  t.join();
  EXPECT_TRUE(removed.load());
}

TEST_F(fixture, a_peer_invalidates_only_an_invalidatable_key_of_its_own_protection_domain) {
  auto remote = kt.add(buf.data(), 1024,
                       access::local_write | access::remote_write | access::remote_invalidate, 1)
                    .value();
  auto local = kt.add(buf.data() + 1024, 1024, access::local_write, 1).value();
  auto other =
      kt.add(buf.data() + 2048, 1024, access::remote_read | access::remote_invalidate, 2).value();
  // Every remote right but not registered invalidatable: a plain verbs MR.
  auto plain = kt.add(buf.data() + 3072, 1024,
                      access::local_write | access::remote_write | access::remote_read |
                          access::remote_atomic,
                      1)
                   .value();
  key_table::guard g;
  std::byte* p = nullptr;
  EXPECT_EQ(kt.invalidate_remote(other, 1), key_check::wrong_pd);
  EXPECT_EQ(kt.invalidate_remote(local, 1), key_check::no_access);
  EXPECT_EQ(kt.invalidate_remote(plain, 1), key_check::no_access);
  EXPECT_EQ(kt.acquire(plain, 1, base() + 3072, 8, access::remote_read, g, &p), key_check::ok);
  EXPECT_EQ(kt.invalidate_remote(remote ^ 0x5A5Au, 1), key_check::invalid_key);
  EXPECT_EQ(kt.invalidate_remote(0, 1), key_check::invalid_key);
  // The refused keys are untouched.
  EXPECT_EQ(kt.acquire(other, 2, base() + 2048, 8, access::remote_read, g, &p), key_check::ok);
  EXPECT_EQ(kt.acquire(local, 1, base() + 1024, 8, access::local_write, g, &p), key_check::ok);
  g.release();
  EXPECT_EQ(kt.invalidate_remote(remote, 1), key_check::ok);
  EXPECT_EQ(kt.acquire(remote, 1, base(), 8, access::remote_write, g, &p), key_check::invalid_key);
  EXPECT_EQ(kt.invalidate_remote(remote, 1), key_check::invalid_key) << "already invalidated";
}
