// Collections in the store and the executor: every write to a key of any type
// moves store::version (what WATCH compares); a collection goes with its key
// (DEL, SET over it, expiry, FLUSHALL, RENAME moves it); OBJECT ENCODING
// follows the thresholds; the blocked-client registry keeps arrival order and
// its bound.
#include <gtest/gtest.h>

#include <set>

#include "blocking.hpp"
#include "kv_fixture.hpp"

namespace kv = conveyor::kv;
using kvtest::run;

namespace {
struct kv_types : ::testing::Test {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store();
  kv::server_config cfg;
  std::unique_ptr<kv::executor> ex = std::make_unique<kv::executor>(*st, nullptr, cfg);
  kv::session s;
  std::string r(std::initializer_list<std::string_view> a) { return run(*ex, s, a); }
  std::uint64_t ver(std::string_view k) { return st->key_version(k, kv::now_ms()); }
};
}  // namespace

TEST_F(kv_types, every_write_of_every_type_moves_the_version) {
  EXPECT_NE(ver("k") & kv::store::absent_version, 0u);
  const std::vector<std::vector<std::string_view>> writes = {
      {"SET", "k", "v"},
      {"APPEND", "k", "x"},
      {"PEXPIRE", "k", "100000"},
      {"PERSIST", "k"},
      {"DEL", "k"},
      {"HSET", "k", "f", "1"},
      {"HSET", "k", "f", "1"},
      {"HINCRBY", "k", "f", "2"},
      {"HDEL", "k", "f"},
      {"RPUSH", "k", "a", "b"},
      {"LPUSH", "k", "c"},
      {"LSET", "k", "0", "d"},
      {"LPOP", "k"},
      {"LTRIM", "k", "0", "0"},
      {"LREM", "k", "0", "a"},
      {"SADD", "k", "m", "n"},
      {"SREM", "k", "m"},
      {"SPOP", "k"},
      {"ZADD", "k", "1", "m"},
      {"ZINCRBY", "k", "2", "m"},
      {"ZADD", "k", "XX", "5", "m"},
      {"ZPOPMIN", "k"},
      {"HSET", "big", "f", "v"},
      {"RENAME", "big", "k"},
  };
  std::uint64_t last = ver("k");
  std::set<std::uint64_t> seen{last};
  for (const auto& w : writes) {
    std::string out;
    ex->execute(s, w, out);
    ASSERT_NE(out[0], '-') << w[0] << " " << out;
    const auto v = ver("k");
    if ((v & kv::store::absent_version) == 0) {  // an emptied collection is gone, as no key
      EXPECT_TRUE(seen.insert(v).second) << w[0] << " left the version at " << v;
    } else {
      EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n") << w[0];
    }
    last = v;
  }
  // Reads leave it alone.
  const auto v = ver("k");
  r({"HGETALL", "k"});
  r({"HGET", "k", "f"});
  r({"TYPE", "k"});
  EXPECT_EQ(ver("k"), v);
}

TEST_F(kv_types, a_collection_goes_with_its_key) {
  const auto now = kv::now_ms();
  r({"RPUSH", "l", "a", "b"});
  EXPECT_GT(st->stats().used_bytes, 0u);
  r({"SET", "l", "str"});  // SET over a list: the list's elements are gone
  EXPECT_EQ(r({"TYPE", "l"}), "+string\r\n");
  r({"DEL", "l"});
  EXPECT_EQ(r({"RPUSH", "l", "c"}), ":1\r\n");
  EXPECT_EQ(r({"LRANGE", "l", "0", "-1"}), "*1\r\n$1\r\nc\r\n");
  r({"SADD", "s", "1"});
  EXPECT_EQ(r({"PEXPIREAT", "s", "1"}), ":1\r\n");  // in the past: deleted
  EXPECT_EQ(r({"SADD", "s", "2"}), ":1\r\n");
  EXPECT_EQ(r({"SMEMBERS", "s"}), "*1\r\n$1\r\n2\r\n");
  r({"ZADD", "z", "1", "a"});
  EXPECT_EQ(r({"RENAME", "z", "z2"}), "+OK\r\n");
  EXPECT_EQ(r({"ZSCORE", "z2", "a"}), "$1\r\n1\r\n");
  EXPECT_EQ(r({"EXISTS", "z"}), ":0\r\n");
  r({"FLUSHALL"});
  EXPECT_EQ(st->stats().used_bytes, 0u);
  EXPECT_EQ(r({"ZCARD", "z2"}), ":0\r\n");
  EXPECT_FALSE(st->type_of("z2", now).has_value());
}

TEST_F(kv_types, object_encoding_follows_the_thresholds) {
  r({"HSET", "h", "f", "v"});
  EXPECT_EQ(r({"OBJECT", "ENCODING", "h"}), "$8\r\nlistpack\r\n");
  r({"HSET", "h", "long", std::string(65, 'x')});
  EXPECT_EQ(r({"OBJECT", "ENCODING", "h"}), "$9\r\nhashtable\r\n");
  r({"SADD", "s", "1", "2"});
  EXPECT_EQ(r({"OBJECT", "ENCODING", "s"}), "$6\r\nintset\r\n");
  r({"SADD", "s", "x"});
  EXPECT_EQ(r({"OBJECT", "ENCODING", "s"}), "$9\r\nhashtable\r\n");
  r({"ZADD", "z", "1", "a"});
  EXPECT_EQ(r({"OBJECT", "ENCODING", "z"}), "$8\r\nlistpack\r\n");
  r({"RPUSH", "l", "a"});
  EXPECT_EQ(r({"OBJECT", "ENCODING", "l"}), "$9\r\nquicklist\r\n");
  r({"SET", "n", "12"});
  EXPECT_EQ(r({"OBJECT", "ENCODING", "n"}), "$3\r\nint\r\n");
  EXPECT_EQ(r({"OBJECT", "ENCODING", "nokey"}), "$-1\r\n");
}

TEST_F(kv_types, a_blpop_that_cannot_wait_answers_as_a_timeout) {
  EXPECT_EQ(r({"BLPOP", "q", "0"}), "*-1\r\n");  // no front end to park it
  s.may_block = true;
  EXPECT_EQ(r({"BLPOP", "q", "q2", "1.5"}), "");  // parked: no reply yet
  EXPECT_TRUE(s.blocked);
  EXPECT_EQ(s.block_keys, (std::vector<std::string>{"q", "q2"}));
  EXPECT_GT(s.block_deadline, kv::now_ms());
  s.blocked = false;
  r({"RPUSH", "q2", "x"});
  EXPECT_FALSE(ex->blocking().any_ready());  // nobody registered a wait in this test
  EXPECT_EQ(r({"BLPOP", "q", "q2", "1.5"}), "*2\r\n$2\r\nq2\r\n$1\r\nx\r\n");
}

TEST(kv_blocking_registry, arrival_order_readiness_deadlines_and_the_bound) {
  kv::blocking_registry b;
  b.add(1, {"a", "b"}, 0);
  b.add(2, {"a"}, 100);
  b.add(3, {"b", "b"}, 50);
  b.signal("zzz");  // nobody waits on it
  EXPECT_FALSE(b.any_ready());
  b.signal("a");
  b.signal("a");  // once in the ready list
  std::string key;
  std::vector<std::uint64_t> ids;
  ASSERT_TRUE(b.next_ready(key, ids));
  EXPECT_EQ(key, "a");
  EXPECT_EQ(ids, (std::vector<std::uint64_t>{1, 2}));
  EXPECT_FALSE(b.next_ready(key, ids));
  EXPECT_EQ(b.expired(60), (std::vector<std::uint64_t>{3}));
  EXPECT_FALSE(b.is_blocked(3));
  b.remove(1);  // a client that disconnects
  b.signal("b");
  EXPECT_FALSE(b.next_ready(key, ids));  // nobody waits on b any more
  EXPECT_EQ(b.expired(1000), (std::vector<std::uint64_t>{2}));
  for (std::uint64_t i = 0; i < kv::blocking_registry::max_blocked; ++i) b.add(100 + i, {"k"}, 0);
  EXPECT_TRUE(b.full());
  b.remove(100);
  EXPECT_FALSE(b.full());
}

// RENAME copies the item; when memory refuses the copy, both keys stay as they
// were (before, the destination was unlinked first and lost with the refusal).
TEST_F(kv_types, a_rename_refused_for_memory_loses_neither_key) {
  const std::string big(64 * 1024, 'x');
  EXPECT_EQ(r({"SET", "to", "keep"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", "from", big}), "+OK\r\n");
  const std::string info = r({"INFO", "memory"});
  const auto at = info.find("used_memory:");
  ASSERT_NE(at, std::string::npos) << info;
  const auto used = std::stoull(info.substr(at + 12));
  // Room for what is there and a little more: not for a second copy of `from`.
  EXPECT_EQ(r({"CONFIG", "SET", "maxmemory", std::to_string(used + 1024)}), "+OK\r\n");
  EXPECT_EQ(r({"RENAME", "from", "to"}).substr(0, 4), "-OOM");
  EXPECT_EQ(r({"GET", "to"}), "$4\r\nkeep\r\n");
  EXPECT_EQ(r({"STRLEN", "from"}), ":65536\r\n");
  EXPECT_EQ(r({"CONFIG", "SET", "maxmemory", "0"}), "+OK\r\n");
  EXPECT_EQ(r({"RENAME", "from", "to"}), "+OK\r\n");
  EXPECT_EQ(r({"STRLEN", "to"}), ":65536\r\n");
  EXPECT_EQ(r({"EXISTS", "from"}), ":0\r\n");
}
