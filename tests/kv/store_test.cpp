// conveyor::kv::store: index, allocator, expiry, eviction, scan, and the bytes
// it exports as a one-sided reader interprets them (store_layout.hpp).
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "store.hpp"
#include "store_layout.hpp"

namespace kv = conveyor::kv;
namespace L = conveyor::kv::layout;

namespace {

struct fixture : ::testing::Test {
  conveyor::device dev = conveyor::device::open("soft").value();
  conveyor::protection_domain pd = dev.alloc_pd().value();

  std::unique_ptr<kv::store> make(kv::store_options o = {}) {
    if (o.index_buckets == kv::store_options{}.index_buckets) o.index_buckets = 1024;
    if (o.data_bytes == kv::store_options{}.data_bytes) o.data_bytes = 4u << 20;
    auto s = kv::store::create(pd, o);
    EXPECT_TRUE(s.has_value());
    return std::move(*s);
  }
  static std::string str(std::optional<std::string_view> v) {
    return v ? std::string(*v) : "<nil>";
  }
};

// What a one-sided reader would conclude from the exported bytes, read locally.
std::optional<std::string> remote_view(const kv::store& s, std::string_view key) {
  auto d = L::decode(s.describe()).value();
  const auto* idx = reinterpret_cast<const std::byte*>(d.index.addr);
  const auto* data = reinterpret_cast<const std::byte*>(d.data.addr);
  const auto p = L::place(L::hash_key(key, d.seed), d.buckets);
  for (auto g : p.group) {
    std::vector<std::uint64_t> cands;
    EXPECT_EQ(L::match_group(idx + L::bucket_offset(g), g, p.tag, d.seed, cands),
              L::bucket_result::ok);
    for (auto w : cands) {
      auto span = L::item_of(w, d.data.length);
      EXPECT_TRUE(span.has_value());
      auto c = L::check_item(data + span->offset, span->bytes, key, d.seed);
      if (c.result == L::item_result::ok)
        return std::string(reinterpret_cast<const char*>(data + span->offset + c.value_offset),
                           c.value_len);
      EXPECT_EQ(c.result, L::item_result::other_key);
    }
  }
  return std::nullopt;
}

TEST_F(fixture, put_get_erase_and_the_exported_bytes_agree) {
  auto s = make();
  const auto now = kv::now_ms();
  EXPECT_EQ(s->put("a", "1", {}, now), kv::put_status::stored);
  EXPECT_EQ(str(s->get("a", now)), "1");
  EXPECT_EQ(remote_view(*s, "a"), "1");
  EXPECT_EQ(s->put("a", std::string(1000, 'x'), {}, now), kv::put_status::stored);
  EXPECT_EQ(str(s->get("a", now)), std::string(1000, 'x'));
  EXPECT_EQ(remote_view(*s, "a"), std::string(1000, 'x'));
  EXPECT_EQ(s->size(), 1u);
  EXPECT_TRUE(s->contains("a", now));
  EXPECT_TRUE(s->erase("a", now));
  EXPECT_FALSE(s->erase("a", now));
  EXPECT_FALSE(s->get("a", now));
  EXPECT_FALSE(remote_view(*s, "a"));
  EXPECT_EQ(s->size(), 0u);
  EXPECT_EQ(s->put("", "empty key", {}, now), kv::put_status::stored);
  EXPECT_EQ(str(s->get("", now)), "empty key");
  EXPECT_EQ(s->put("k", "", {}, now), kv::put_status::stored);
  EXPECT_EQ(remote_view(*s, "k"), "");
}

TEST_F(fixture, nx_xx_and_keepttl) {
  auto s = make();
  const auto now = kv::now_ms();
  EXPECT_EQ(s->put("k", "v", {.cond = kv::put_cond::if_present}, now), kv::put_status::not_stored);
  EXPECT_EQ(s->put("k", "v", {.cond = kv::put_cond::if_absent}, now), kv::put_status::stored);
  EXPECT_EQ(s->put("k", "w", {.cond = kv::put_cond::if_absent}, now), kv::put_status::not_stored);
  EXPECT_EQ(s->put("k", "w", {.cond = kv::put_cond::if_present, .expire_at = now + 10000}, now),
            kv::put_status::stored);
  EXPECT_EQ(s->expiry("k", now), now + 10000);
  EXPECT_EQ(s->put("k", "x", {.keep_ttl = true}, now), kv::put_status::stored);
  EXPECT_EQ(s->expiry("k", now), now + 10000);
  EXPECT_EQ(s->put("k", "y", {}, now), kv::put_status::stored);
  EXPECT_EQ(s->expiry("k", now), -1);
  EXPECT_FALSE(s->expiry("nope", now));
  EXPECT_EQ(str(s->get("k", now)), "y");
}

TEST_F(fixture, index_holds_many_keys_at_high_load) {
  auto s = make({.index_buckets = 1024, .data_bytes = 8u << 20});
  const auto now = kv::now_ms();
  const int n = 1024 * 7 * 7 / 10;  // 70 % of the slots
  for (int i = 0; i < n; ++i)
    ASSERT_EQ(s->put("key:" + std::to_string(i), "v" + std::to_string(i), {}, now),
              kv::put_status::stored)
        << i;
  EXPECT_EQ(s->size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(str(s->get("key:" + std::to_string(i), now)), "v" + std::to_string(i));
    ASSERT_EQ(remote_view(*s, "key:" + std::to_string(i)), "v" + std::to_string(i));
  }
  EXPECT_FALSE(s->get("key:-1", now));
  // Half removed: the rest still found, the removed ones not.
  for (int i = 0; i < n; i += 2) ASSERT_TRUE(s->erase("key:" + std::to_string(i), now));
  for (int i = 0; i < n; ++i) ASSERT_EQ(s->contains("key:" + std::to_string(i), now), i % 2 == 1);
}

TEST_F(fixture, allocator_reuses_memory_only_after_the_grace_time) {
  auto s = make({.index_buckets = 256, .data_bytes = 64u << 10, .reclaim_grace_ms = 200});
  const auto now = kv::now_ms();
  const std::string big(6000, 'b');
  int stored = 0;
  while (s->put("k" + std::to_string(stored), big, {}, now) == kv::put_status::stored) ++stored;
  ASSERT_GT(stored, 4);
  EXPECT_EQ(s->put("more", big, {}, now), kv::put_status::out_of_memory);  // noeviction
  for (int i = 0; i < stored; ++i) s->erase("k" + std::to_string(i), now);
  EXPECT_EQ(s->stats().retired_pending, static_cast<std::uint64_t>(stored));
  // The retired items hold at least their values' bytes until reclaimed.
  EXPECT_GE(s->stats().retired_bytes, static_cast<std::uint64_t>(stored) * big.size());
  EXPECT_LE(s->stats().retired_bytes, std::uint64_t{64} << 10);
  // Within the grace time the memory is not reused: a write has nowhere to go
  // once the headroom is used.
  int during = 0;
  while (s->put("n" + std::to_string(during), big, {}, now) == kv::put_status::stored) ++during;
  EXPECT_LT(during, stored);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  s->reclaim(kv::now_ms());
  EXPECT_EQ(s->stats().retired_pending, 0u);
  EXPECT_EQ(s->stats().retired_bytes, 0u);
  int after = during;
  while (s->put("n" + std::to_string(after), big, {}, now) == kv::put_status::stored) ++after;
  EXPECT_EQ(after, stored);  // all the memory came back, coalesced
  EXPECT_EQ(s->put("x", std::string(70u << 10, 'x'), {}, now), kv::put_status::too_large);
  auto small = make({.index_buckets = 64, .data_bytes = 1u << 20, .max_key = 8, .max_value = 16});
  EXPECT_EQ(small->put("123456789", "v", {}, now), kv::put_status::too_large);
  EXPECT_EQ(small->put("k", std::string(17, 'v'), {}, now), kv::put_status::too_large);
}

TEST_F(fixture, expiry_lazy_and_active) {
  auto s = make();
  const auto now = kv::now_ms();
  ASSERT_EQ(s->put("t1", "v", {.expire_at = now + 50}, now), kv::put_status::stored);
  ASSERT_EQ(s->put("t2", "v", {.expire_at = now + 50}, now), kv::put_status::stored);
  ASSERT_EQ(s->put("t3", "v", {.expire_at = now + 100000}, now), kv::put_status::stored);
  ASSERT_EQ(s->put("p", "v", {}, now), kv::put_status::stored);
  EXPECT_EQ(s->stats().expires, 3u);
  // Lazy: the key is gone for a reader at the expiry time.
  EXPECT_FALSE(s->get("t1", now + 50));
  EXPECT_EQ(s->size(), 3u);
  // Active: expire_some removes what is due, within its budget.
  EXPECT_EQ(s->expire_some(now + 10, 10), 0u);
  EXPECT_EQ(s->expire_some(now + 60, 10), 1u);
  EXPECT_EQ(s->size(), 2u);
  EXPECT_EQ(s->stats().expired, 2u);
  EXPECT_TRUE(s->set_expiry("p", now + 5, now));
  EXPECT_EQ(s->expiry("p", now), now + 5);
  EXPECT_EQ(remote_view(*s, "p"), "v");  // a TTL change is a new copy; the value stays
  EXPECT_TRUE(s->set_expiry("t3", std::nullopt, now));
  EXPECT_EQ(s->expiry("t3", now), -1);
  EXPECT_FALSE(s->set_expiry("none", now + 5, now));
  EXPECT_EQ(s->expire_some(now + 10, 10), 1u);
  EXPECT_FALSE(s->contains("p", now + 10));
  EXPECT_TRUE(s->contains("t3", now + 200000));
  EXPECT_EQ(s->stats().expires, 0u);
  // The exported item carries the expiry, so a one-sided reader can honour it.
  ASSERT_EQ(s->put("e", "v", {.expire_at = now + 1234}, now), kv::put_status::stored);
  auto d = L::decode(s->describe()).value();
  const auto p = L::place(L::hash_key("e", d.seed), d.buckets);
  std::int64_t seen = 0;
  for (auto g : p.group) {
    std::vector<std::uint64_t> c;
    L::match_group(reinterpret_cast<const std::byte*>(d.index.addr) + L::bucket_offset(g), g, p.tag,
                   d.seed, c);
    for (auto w : c) {
      auto sp = L::item_of(w, d.data.length).value();
      auto ck = L::check_item(reinterpret_cast<const std::byte*>(d.data.addr) + sp.offset, sp.bytes,
                              "e", d.seed);
      if (ck.result == L::item_result::ok) seen = ck.expire_at;
    }
  }
  EXPECT_EQ(seen, now + 1234);
}

TEST_F(fixture, allkeys_lru_evicts_the_untouched_keys) {
  // Grace 0: evicted items' memory is reusable at once (the headroom between
  // maxmemory and data_bytes is what absorbs the grace time otherwise).
  auto s = make({.index_buckets = 4096,
                 .data_bytes = 4u << 20,
                 .maxmemory = 1u << 20,
                 .policy = kv::eviction_policy::allkeys_lru,
                 .reclaim_grace_ms = 0});
  const auto now = kv::now_ms();
  const std::string v(1000, 'v');  // 1 KiB items: about 1000 fit
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(s->put("hot" + std::to_string(i), v, {}, now), kv::put_status::stored);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_EQ(s->put("cold" + std::to_string(i), v, {}, now), kv::put_status::stored) << i;
    if (i % 10 == 0) {
      for (int h = 0; h < 100; ++h) (void)s->get("hot" + std::to_string(h), now);  // touch
    }
  }
  auto st = s->stats();
  EXPECT_LE(st.used_bytes, 1u << 20);
  EXPECT_GT(st.evicted, 3000u);
  int hot = 0;
  for (int h = 0; h < 100; ++h) hot += s->contains("hot" + std::to_string(h), now);
  EXPECT_GE(hot, 90);  // recently used keys survive the sampling
  auto ne = make({.index_buckets = 4096, .data_bytes = 4u << 20, .maxmemory = 1u << 20});
  int n = 0;
  while (ne->put("k" + std::to_string(n), v, {}, now) == kv::put_status::stored) ++n;
  EXPECT_LE(ne->stats().used_bytes, 1u << 20);
  EXPECT_GT(n, 800);
  EXPECT_EQ(ne->stats().evicted, 0u);
}

TEST_F(fixture, scan_reports_every_key_and_ends) {
  auto s = make();
  const auto now = kv::now_ms();
  std::set<std::string> want;
  for (int i = 0; i < 3000; ++i) {
    want.insert("s" + std::to_string(i));
    s->put("s" + std::to_string(i), "v", {}, now);
  }
  std::multiset<std::string> got;
  std::uint64_t cursor = 0;
  int calls = 0;
  do {
    cursor = s->scan(cursor, 10, [&](std::string_view k) { got.insert(std::string(k)); });
    ++calls;
  } while (cursor != 0 && calls < 100000);
  EXPECT_EQ(cursor, 0u);
  EXPECT_GT(calls, 50);
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()), want);
  EXPECT_EQ(got.size(), want.size());  // no rehash: each key once
}

TEST_F(fixture, clear_empties_and_bumps_the_generation) {
  auto s = make();
  const auto now = kv::now_ms();
  for (int i = 0; i < 100; ++i) s->put(std::to_string(i), "v", {.expire_at = now + 100000}, now);
  const auto g0 = L::decode(s->describe())->generation;
  s->clear();
  EXPECT_EQ(s->size(), 0u);
  EXPECT_EQ(s->stats().expires, 0u);
  EXPECT_EQ(s->stats().used_bytes, 0u);
  EXPECT_GT(L::decode(s->describe())->generation, g0);
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(remote_view(*s, std::to_string(i)));
  EXPECT_EQ(s->put("again", "v", {}, now), kv::put_status::stored);
  EXPECT_EQ(remote_view(*s, "again"), "v");
}

TEST(kv_layout, reader_checks_reject_torn_and_hostile_bytes) {
  // Slot words pointing outside the data region are never READ.
  EXPECT_FALSE(L::item_of(L::make_slot(100, 1, 3), 100 * 64));
  EXPECT_FALSE(L::item_of(L::make_slot(99, 2, 3), 100 * 64));
  EXPECT_FALSE(L::item_of(L::make_slot(0, 0, 3), 100 * 64));
  EXPECT_TRUE(L::item_of(L::make_slot(99, 1, 3), 100 * 64));
  // An item whose bytes are a mix of two writes fails its checksum.
  std::vector<std::byte> a(256), b(256);
  auto fill = [](std::vector<std::byte>& buf, char c, std::uint64_t seed) {
    L::item_header h{};
    h.key_len = 3;
    h.value_len = 200;
    h.version = 1;
    std::memcpy(buf.data() + 32, "key", 3);
    std::memset(buf.data() + 35, c, 200);
    std::memcpy(buf.data(), &h, sizeof h);
    h.checksum = L::item_checksum(buf.data(), L::item_bytes(3, 200), seed);
    std::memcpy(buf.data(), &h, sizeof h);
  };
  fill(a, 'a', 7);
  fill(b, 'b', 7);
  EXPECT_EQ(L::check_item(a.data(), a.size(), "key", 7).result, L::item_result::ok);
  EXPECT_EQ(L::check_item(a.data(), a.size(), "kez", 7).result, L::item_result::other_key);
  EXPECT_EQ(L::check_item(a.data(), a.size(), "key", 8).result, L::item_result::torn);
  for (std::size_t cut = 8; cut < 235; cut += 8) {
    auto mixed = a;
    std::memcpy(mixed.data() + cut, b.data() + cut, 256 - cut);
    if (cut >= 235) continue;
    EXPECT_NE(L::check_item(mixed.data(), mixed.size(), "key", 7).result, L::item_result::ok)
        << cut;
  }
  EXPECT_EQ(L::check_item(a.data(), 100, "key", 7).result, L::item_result::torn);  // short read
  // A bucket whose check word does not match its slots is torn.
  std::vector<std::byte> g(128);
  std::uint64_t w[8] = {0, 0, L::make_slot(1, 1, 9), 0, 0, 0, 0, 0};
  w[0] = L::bucket_check(4, w + 1, 7);
  std::memcpy(g.data(), w, 64);
  std::uint64_t e[8] = {};
  e[0] = L::bucket_check(5, e + 1, 7);
  std::memcpy(g.data() + 64, e, 64);
  std::vector<std::uint64_t> out;
  EXPECT_EQ(L::match_group(g.data(), 4, 9, 7, out), L::bucket_result::ok);
  EXPECT_EQ(out.size(), 1u);
  out.clear();
  EXPECT_EQ(L::match_group(g.data(), 5, 9, 7, out), L::bucket_result::torn);  // wrong bucket number
  w[3] = L::make_slot(2, 1, 9);
  std::memcpy(g.data(), w, 64);
  EXPECT_EQ(L::match_group(g.data(), 4, 9, 7, out), L::bucket_result::torn);
  // Descriptions are validated.
  L::description d{.index = {4096, L::bucket_offset(1025), 1},
                   .data = {1 << 20, 1 << 20, 2},
                   .buckets = 1024,
                   .seed = 5,
                   .generation = 1,
                   .reclaim_grace_ms = 500};
  auto bytes = L::encode(d);
  ASSERT_TRUE(L::decode(bytes));
  EXPECT_EQ(L::decode(bytes)->seed, 5u);
  d.buckets = 1000;
  EXPECT_FALSE(L::decode(L::encode(d)));
  d.buckets = 4096;  // the index region would be too short
  EXPECT_FALSE(L::decode(L::encode(d)));
  bytes.resize(10);
  EXPECT_FALSE(L::decode(bytes));
}

}  // namespace
