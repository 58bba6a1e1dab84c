// One-sided hash reads (HGET, HMGET, HGETALL) over RDMA, on soft and shm,
// through the real executor: a small hash comes from its item with no server
// thread involved, a large one through the RPC fallback; keys of another type
// answer WRONGTYPE, never their item's bytes; readers racing HSET/HDEL never see
// a hash mixing two writes, also with memory reused at once (grace 0).
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <array>
#include <atomic>
#include <map>
#include <thread>

#include "conveyor_kv/client.hpp"
#include "rdma_server_fixture.hpp"

namespace kv = conveyor::kv;
using namespace std::chrono_literals;

namespace {

using kvtest::must;
using kvtest::rpcs;
using kvtest::server;
using kvtest::small_store;

class kv_rdma_hash : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<kv::client> connect(server& s, std::uint32_t depth = 4) {
    kv::client_options o{.depth = depth};
    auto c = kv::client::connect(GetParam() + ":kvc", s.rdma->address(), o);
    EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().to_string());
    return c ? std::move(*c) : nullptr;
  }
  static std::string call(kv::client& c, std::initializer_list<std::string_view> a) {
    return must(c.command(std::span(a.begin(), a.size())));
  }
};

using fields = std::vector<std::pair<std::string, std::string>>;
fields sorted(fields f) {
  std::sort(f.begin(), f.end());
  return f;
}

TEST_P(kv_rdma_hash, small_hashes_are_read_one_sided_large_ones_by_rpc) {
  server s(GetParam(), small_store(), {}, rpcs::executor);
  auto c = connect(s);
  ASSERT_TRUE(c);
  EXPECT_EQ(call(*c, {"HSET", "h", "name", "ann", "age", "41", "", "empty field"}), ":3\r\n");
  const auto rpcs_before = s.handled.load();
  EXPECT_EQ(sorted(must(c->hgetall("h"))),
            (fields{{"", "empty field"}, {"age", "41"}, {"name", "ann"}}));
  EXPECT_EQ(must(c->hget("h", "name")), "ann");
  EXPECT_EQ(must(c->hget("h", "nope")), std::nullopt);
  const std::array<std::string_view, 3> want{"age", "nope", "name"};
  EXPECT_EQ(must(c->hmget("h", want)),
            (std::vector<std::optional<std::string>>{"41", std::nullopt, "ann"}));
  EXPECT_EQ(must(c->hgetall("absent")), fields{});
  EXPECT_EQ(must(c->hget("absent", "f")), std::nullopt);
  EXPECT_EQ(s.handled.load(), rpcs_before) << "a small hash's reads went to the server";
  EXPECT_EQ(c->stats().hash_one_sided, 4u);  // the absent key's reads were misses
  // A field update publishes a whole new item: the next read sees it.
  call(*c, {"HSET", "h", "age", "42"});
  call(*c, {"HDEL", "h", ""});
  EXPECT_EQ(sorted(must(c->hgetall("h"))), (fields{{"age", "42"}, {"name", "ann"}}));
  // The last field gone: the key is gone.
  call(*c, {"HDEL", "h", "age", "name"});
  EXPECT_EQ(must(c->hgetall("h")), fields{});
  EXPECT_EQ(call(*c, {"EXISTS", "h"}), ":0\r\n");

  // Past hash-max-listpack-entries (512): the item says "ask the server".
  fields big;
  std::vector<std::string> argv{"HSET", "big"};
  for (int i = 0; i < 600; ++i) {
    big.emplace_back("f" + std::to_string(i), "v" + std::to_string(i));
    argv.push_back(big.back().first);
    argv.push_back(big.back().second);
  }
  std::vector<std::string_view> views(argv.begin(), argv.end());
  EXPECT_EQ(must(c->command(views)), ":600\r\n");
  const auto before = c->stats().hash_rpc_reads;
  EXPECT_EQ(sorted(must(c->hgetall("big"))), sorted(big));
  EXPECT_EQ(must(c->hget("big", "f17")), "v17");
  EXPECT_EQ(must(c->hget("big", "zzz")), std::nullopt);
  EXPECT_EQ(c->stats().hash_rpc_reads, before + 3);
  // A value longer than hash-max-listpack-value (64) also ends publication.
  call(*c, {"HSET", "long", "f", std::string(65, 'x')});
  EXPECT_EQ(must(c->hget("long", "f")), std::string(65, 'x'));
  EXPECT_EQ(c->stats().hash_rpc_reads, before + 4);
}

TEST_P(kv_rdma_hash, other_types_answer_wrongtype_never_their_bytes) {
  server s(GetParam(), small_store(), {}, rpcs::executor);
  auto c = connect(s);
  ASSERT_TRUE(c);
  call(*c, {"HSET", "h", "f", "v"});
  call(*c, {"RPUSH", "l", "a"});
  call(*c, {"SADD", "s", "a"});
  call(*c, {"ZADD", "z", "1", "a"});
  call(*c, {"SET", "str", "v"});
  for (std::string_view k : {"h", "l", "s", "z"}) {
    auto g = c->get(k);
    ASSERT_FALSE(g) << k;
    EXPECT_EQ(g.error().code, conveyor::errc::rejected);
    EXPECT_TRUE(g.error().context.starts_with("WRONGTYPE")) << g.error().to_string();
    std::array<std::byte, 64> buf{};
    EXPECT_FALSE(c->get_into(k, buf)) << k;
  }
  for (std::string_view k : {"str", "l", "s", "z"}) {
    auto h = c->hgetall(k);
    ASSERT_FALSE(h) << k;
    EXPECT_TRUE(h.error().context.starts_with("WRONGTYPE")) << h.error().to_string();
    EXPECT_FALSE(c->hget(k, "f")) << k;
  }
  // MGET reads another type as nil, as Redis's does.
  const std::array<std::string_view, 3> keys{"str", "h", "l"};
  EXPECT_EQ(must(c->mget(keys)),
            (std::vector<std::optional<std::string>>{"v", std::nullopt, std::nullopt}));
  // SET replaces a hash with a string (the hash's elements go with it).
  call(*c, {"SET", "h", "now a string"});
  EXPECT_EQ(must(c->get("h")), "now a string");
  EXPECT_EQ(call(*c, {"HGET", "h", "f"}),
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
}

// Every write leaves the hash consistent: all its fields carry the write's
// sequence number, and it has fields f0..f14 or f0..f29 (HSET of 30, HDEL of
// the last 15). A read mixing two writes would show two numbers or another
// shape. Two hot hashes in a small store: with a grace of 0 an item's memory is
// reused at once, under readers still holding its slot word.
void mixed_hash_case(const std::string& provider, std::uint32_t grace_ms,
                     const std::function<std::unique_ptr<kv::client>(server&)>& connect) {
  kv::store_options so = small_store();
  so.index_buckets = 64;
  so.data_bytes = 2u << 20;
  so.reclaim_grace_ms = grace_ms;
  server s(provider, so, {}, rpcs::executor);
  auto value = [](std::uint64_t seq, int f) {
    std::string v = std::to_string(seq) + ":";
    const std::size_t len = 12 + (seq * 31 + static_cast<std::uint64_t>(f) * 7) % 50;
    while (v.size() < len) v += static_cast<char>('a' + (seq + v.size()) % 26);
    return v;
  };
  constexpr int nhashes = 2, nfields = 30, kept = 15;  // HDEL keeps f0..f14
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> reads{0}, bad{0}, writes{0}, one_sided{0};
  std::atomic<int> failures{0};
  {
    auto c = connect(s);
    ASSERT_TRUE(c);
    for (int h = 0; h < nhashes; ++h) {
      std::vector<std::string> a{"HSET", "hash" + std::to_string(h)};
      for (int f = 0; f < nfields; ++f)
        a.push_back("f" + std::to_string(f)), a.push_back(value(0, f));
      std::vector<std::string_view> v(a.begin(), a.end());
      ASSERT_EQ(must(c->command(v)), ":" + std::to_string(nfields) + "\r\n");
    }
  }
  auto writer = [&](int id) {
    auto c = connect(s);
    if (!c) return ++failures, void();
    for (std::uint64_t seq = 1; !stop.load(); ++seq) {
      const std::string key = "hash" + std::to_string((seq + id) % nhashes);
      std::vector<std::string> a;
      if (seq % 3 == 0) {
        a = {"HDEL", key};
        for (int f = kept; f < nfields; ++f) a.push_back("f" + std::to_string(f));
      } else {
        a = {"HSET", key};
        const auto mark = seq * 2 + static_cast<std::uint64_t>(id);
        for (int f = 0; f < nfields; ++f)
          a.push_back("f" + std::to_string(f)), a.push_back(value(mark, f));
      }
      std::vector<std::string_view> v(a.begin(), a.end());
      auto r = c->command(v);
      if (!r || (*r)[0] == '-') {
        if (r && r->starts_with("-OOM")) {  // retired items in their grace: back-pressure
          std::this_thread::sleep_for(1ms);
          continue;
        }
        ADD_FAILURE() << (r ? *r : r.error().to_string());
        return ++failures, void();
      }
      ++writes;
    }
  };
  auto reader = [&](int id) {
    auto c = connect(s);
    if (!c) return ++failures, void();
    for (int round = 0; !stop.load(); ++round) {
      const std::string key = "hash" + std::to_string((round + id) % nhashes);
      auto h = c->hgetall(key);
      if (!h) {
        ADD_FAILURE() << h.error().to_string();
        return ++failures, void();
      }
      ++reads;
      std::map<std::string, std::string> m(h->begin(), h->end());
      const bool shape = m.size() == kept || m.size() == nfields;
      std::string seq;
      bool same = true;
      for (std::size_t f = 0; f < m.size() && shape; ++f) {
        auto it = m.find("f" + std::to_string(f));
        if (it == m.end()) {
          same = false;
          break;
        }
        const auto mark = it->second.substr(0, it->second.find(':'));
        if (f == 0) seq = mark;
        const std::uint64_t n = std::stoull(mark);
        same = same && mark == seq && it->second == value(n, static_cast<int>(f));
      }
      if (!shape || !same) ++bad;
    }
    one_sided += c->stats().hash_one_sided;
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i) ts.emplace_back(writer, i);
  for (int i = 0; i < 2; ++i) ts.emplace_back(reader, i);
  constexpr std::uint64_t min_reads = 500, min_writes = 200;
  const auto began = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - began < 30s && failures.load() == 0 &&
         (std::chrono::steady_clock::now() - began < 2s || reads.load() <= min_reads ||
          writes.load() <= min_writes))
    std::this_thread::sleep_for(20ms);
  stop = true;
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(reads.load(), min_reads);
  EXPECT_GT(writes.load(), min_writes);
  // Small hashes: reads are one-sided (an item that found no room is published
  // as "ask the server" until the next write: those few go by RPC).
  EXPECT_GT(one_sided.load(), reads.load() / 2);
  std::printf("hash reads %llu writes %llu\n", static_cast<unsigned long long>(reads.load()),
              static_cast<unsigned long long>(writes.load()));
}

TEST_P(kv_rdma_hash, hash_readers_never_see_a_mixed_hash) {
  mixed_hash_case(GetParam(), 500, [&](server& s) { return connect(s); });
}

TEST_P(kv_rdma_hash, hash_readers_never_see_a_mixed_hash_with_immediate_reuse) {
  mixed_hash_case(GetParam(), 0, [&](server& s) { return connect(s); });
}

INSTANTIATE_TEST_SUITE_P(providers, kv_rdma_hash, ::testing::Values("soft", "shm"),
                         [](const auto& p) { return p.param; });

}  // namespace
