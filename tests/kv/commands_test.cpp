// The executor: replies and errors as Redis 7 gives them, on the real store.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "kv_fixture.hpp"

namespace kv = conveyor::kv;
using kvtest::run;

namespace {
struct commands : ::testing::Test {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store();
  kv::server_config cfg;
  std::unique_ptr<kv::executor> ex = std::make_unique<kv::executor>(*st, nullptr, cfg);
  kv::session s;
  std::string r(std::initializer_list<std::string_view> a) { return run(*ex, s, a); }
};
}  // namespace

TEST_F(commands, ping_and_echo_reply_and_unknown_commands_or_wrong_arity_get_redis_errors) {
  EXPECT_EQ(r({"PING"}), "+PONG\r\n");
  EXPECT_EQ(r({"ping", "hi"}), "$2\r\nhi\r\n");
  EXPECT_EQ(r({"ECHO", "x"}), "$1\r\nx\r\n");
  EXPECT_EQ(r({"NOSUCH", "a", "b"}),
            "-ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' \r\n");
  EXPECT_EQ(r({"GET"}), "-ERR wrong number of arguments for 'get' command\r\n");
  EXPECT_EQ(r({"SeT", "k"}), "-ERR wrong number of arguments for 'set' command\r\n");
}

TEST_F(commands, set_honours_nx_xx_get_and_refuses_bad_expiry_options_as_redis_does) {
  EXPECT_EQ(r({"GET", "k"}), "$-1\r\n");
  EXPECT_EQ(r({"SET", "k", "v"}), "+OK\r\n");
  EXPECT_EQ(r({"GET", "k"}), "$1\r\nv\r\n");
  EXPECT_EQ(r({"SET", "k", "w", "NX"}), "$-1\r\n");
  EXPECT_EQ(r({"SET", "k", "w", "XX"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", "new", "w", "XX"}), "$-1\r\n");
  EXPECT_EQ(r({"SET", "k", "z", "GET"}), "$1\r\nw\r\n");
  EXPECT_EQ(r({"SET", "k", "z", "NX", "XX"}), "-ERR syntax error\r\n");
  EXPECT_EQ(r({"SET", "k", "z", "EX", "0"}), "-ERR invalid expire time in 'set' command\r\n");
  EXPECT_EQ(r({"SET", "k", "z", "EX", "abc"}), "-ERR value is not an integer or out of range\r\n");
  EXPECT_EQ(r({"SET", "k", "z", "EX", "10", "PX", "100"}), "-ERR syntax error\r\n");
  EXPECT_EQ(r({"GETSET", "k", "g"}), "$1\r\nz\r\n");
  EXPECT_EQ(r({"GETDEL", "k"}), "$1\r\ng\r\n");
  EXPECT_EQ(r({"GETDEL", "k"}), "$-1\r\n");
  EXPECT_EQ(r({"SETNX", "k", "1"}), ":1\r\n");
  EXPECT_EQ(r({"SETNX", "k", "2"}), ":0\r\n");
}

TEST_F(commands, mset_mget_exists_and_del_count_every_key_named) {
  EXPECT_EQ(r({"MSET", "a", "1", "b", "2"}), "+OK\r\n");
  EXPECT_EQ(r({"MSET", "a", "1", "b"}), "-ERR wrong number of arguments for 'mset' command\r\n");
  EXPECT_EQ(r({"MGET", "a", "nope", "b"}), "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n2\r\n");
  EXPECT_EQ(r({"EXISTS", "a", "a", "nope"}), ":2\r\n");
  EXPECT_EQ(r({"DEL", "a", "nope", "b"}), ":2\r\n");
  EXPECT_EQ(r({"DBSIZE"}), ":0\r\n");
}

TEST_F(commands, incr_refuses_overflow_and_non_integers_and_append_strlen_type_see_strings) {
  EXPECT_EQ(r({"INCR", "n"}), ":1\r\n");
  EXPECT_EQ(r({"INCRBY", "n", "41"}), ":42\r\n");
  EXPECT_EQ(r({"DECR", "n"}), ":41\r\n");
  EXPECT_EQ(r({"DECRBY", "n", "-9"}), ":50\r\n");
  EXPECT_EQ(r({"SET", "big", "9223372036854775807"}), "+OK\r\n");
  EXPECT_EQ(r({"INCR", "big"}), "-ERR increment or decrement would overflow\r\n");
  EXPECT_EQ(r({"SET", "s", "abc"}), "+OK\r\n");
  EXPECT_EQ(r({"INCR", "s"}), "-ERR value is not an integer or out of range\r\n");
  EXPECT_EQ(r({"SET", "s2", " 1"}), "+OK\r\n");
  EXPECT_EQ(r({"INCR", "s2"}), "-ERR value is not an integer or out of range\r\n");
  EXPECT_EQ(r({"APPEND", "s", "de"}), ":5\r\n");
  EXPECT_EQ(r({"GET", "s"}), "$5\r\nabcde\r\n");
  EXPECT_EQ(r({"STRLEN", "s"}), ":5\r\n");
  EXPECT_EQ(r({"STRLEN", "none"}), ":0\r\n");
  EXPECT_EQ(r({"TYPE", "s"}), "+string\r\n");
  EXPECT_EQ(r({"TYPE", "none"}), "+none\r\n");
}

TEST_F(commands, ttl_follows_expire_persist_and_keepttl_and_a_past_time_deletes) {
  EXPECT_EQ(r({"TTL", "k"}), ":-2\r\n");
  EXPECT_EQ(r({"SET", "k", "v"}), "+OK\r\n");
  EXPECT_EQ(r({"TTL", "k"}), ":-1\r\n");
  EXPECT_EQ(r({"EXPIRE", "k", "100"}), ":1\r\n");
  EXPECT_EQ(r({"TTL", "k"}), ":100\r\n");
  EXPECT_EQ(r({"EXPIRE", "k", "50", "GT"}), ":0\r\n");
  EXPECT_EQ(r({"EXPIRE", "k", "50", "NX"}), ":0\r\n");
  EXPECT_EQ(r({"PERSIST", "k"}), ":1\r\n");
  EXPECT_EQ(r({"PERSIST", "k"}), ":0\r\n");
  EXPECT_EQ(r({"PEXPIRE", "k", "100000"}), ":1\r\n");
  auto pttl = r({"PTTL", "k"});
  EXPECT_TRUE(pttl.starts_with(":9") || pttl == ":100000\r\n") << pttl;
  // INCR and APPEND keep the TTL; SET drops it unless KEEPTTL.
  EXPECT_EQ(r({"APPEND", "k", "x"}), ":2\r\n");
  EXPECT_EQ(r({"TTL", "k"}), ":100\r\n");
  EXPECT_EQ(r({"SET", "k", "v", "KEEPTTL"}), "+OK\r\n");
  EXPECT_EQ(r({"TTL", "k"}), ":100\r\n");
  EXPECT_EQ(r({"SET", "k", "v"}), "+OK\r\n");
  EXPECT_EQ(r({"TTL", "k"}), ":-1\r\n");
  // A time in the past deletes.
  EXPECT_EQ(r({"EXPIRE", "k", "-1"}), ":1\r\n");
  EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n");
  EXPECT_EQ(r({"SET", "k", "v", "PX", "30"}), "+OK\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  EXPECT_EQ(r({"GET", "k"}), "$-1\r\n");
  EXPECT_EQ(r({"SET", "k", "v", "PXAT", "1000"}), "+OK\r\n");
  EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n");
}

TEST_F(commands, scan_returns_every_matching_key_once_and_keys_matches_redis_globs) {
  for (int i = 0; i < 100; ++i) r({"SET", "key:" + std::to_string(i), "v"});
  r({"SET", "other", "v"});
  std::set<std::string> seen;
  std::string cursor = "0";
  int rounds = 0;
  do {
    std::string out;
    std::vector<std::string_view> a = {"SCAN", cursor, "MATCH", "key:*", "COUNT", "7"};
    ex->execute(s, a, out);
    // *2\r\n$N\r\n<cursor>\r\n*M\r\n($L\r\n<key>\r\n)*
    std::size_t pos = out.find("\r\n", 4) + 2;
    auto cend = out.find("\r\n", pos);
    cursor = out.substr(pos, cend - pos);
    pos = out.find("\r\n", cend + 2) + 2;  // past *M
    while (pos < out.size()) {
      auto lend = out.find("\r\n", pos);
      auto len = std::stoul(out.substr(pos + 1, lend - pos - 1));
      seen.insert(out.substr(lend + 2, len));
      pos = lend + 2 + len + 2;
    }
    ASSERT_LT(++rounds, 10000);
  } while (cursor != "0");
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(seen.count("other"), 0u);
  EXPECT_EQ(r({"KEYS", "key:9?"}).substr(0, 5), "*10\r\n");
  EXPECT_TRUE(kv::glob_match("a[b-d]*\\*", "acxyz*"));
  EXPECT_FALSE(kv::glob_match("a[^b]", "ab"));
  EXPECT_TRUE(kv::glob_match("*a*a*a*a*a*b", std::string(64, 'a') + "b"));
  EXPECT_FALSE(kv::glob_match("*a*a*a*a*a*b", std::string(64, 'a')));
}

TEST_F(commands, auth_guards_everything_but_auth_hello_and_quit) {
  cfg.requirepass = "secret";
  EXPECT_EQ(r({"GET", "k"}), "-NOAUTH Authentication required.\r\n");
  EXPECT_EQ(r({"NOSUCH"}), "-NOAUTH Authentication required.\r\n");
  EXPECT_EQ(r({"AUTH", "wrong"}),
            "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
  EXPECT_EQ(r({"AUTH", "secre"}),
            "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
  EXPECT_EQ(r({"AUTH", "other", "secret"}),
            "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
  EXPECT_EQ(r({"AUTH", "secret"}), "+OK\r\n");
  EXPECT_EQ(r({"GET", "k"}), "$-1\r\n");
  kv::session s2;
  EXPECT_EQ(run(*ex, s2, {"HELLO", "3", "AUTH", "default", "secret"}).substr(0, 2), "%7");
  EXPECT_EQ(s2.resp, 3);
  EXPECT_EQ(run(*ex, s2, {"GET", "k"}), "_\r\n");
  cfg.requirepass.clear();
  kv::session s3;
  EXPECT_EQ(run(*ex, s3, {"AUTH", "x"}).substr(0, 42),
            "-ERR AUTH <password> called without any pa");
}

TEST_F(commands, hello_client_select_config_command_and_quit_answer_as_redis_does) {
  EXPECT_EQ(r({"HELLO", "4"}), "-NOPROTO unsupported protocol version\r\n");
  EXPECT_EQ(r({"HELLO", "2"}).substr(0, 4), "*14\r");
  EXPECT_EQ(r({"CLIENT", "SETNAME", "me"}), "+OK\r\n");
  EXPECT_EQ(r({"CLIENT", "GETNAME"}), "$2\r\nme\r\n");
  EXPECT_EQ(r({"CLIENT", "SETNAME", "a b"}).substr(0, 4), "-ERR");
  s.id = 7;
  EXPECT_EQ(r({"CLIENT", "ID"}), ":7\r\n");
  EXPECT_EQ(r({"SELECT", "0"}), "+OK\r\n");
  EXPECT_EQ(r({"SELECT", "1"}), "-ERR DB index is out of range\r\n");
  EXPECT_EQ(r({"CONFIG", "GET", "save"}), "*2\r\n$4\r\nsave\r\n$0\r\n\r\n");
  EXPECT_EQ(r({"CONFIG", "GET", "appendonly"}), "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
  EXPECT_EQ(r({"CONFIG", "GET", "nothing*"}), "*0\r\n");
  EXPECT_TRUE(r({"COMMAND", "COUNT"}).starts_with(":"));
  EXPECT_TRUE(r({"COMMAND", "DOCS", "get"}).starts_with("*2\r\n$3\r\nget\r\n"));
  EXPECT_TRUE(r({"COMMAND", "INFO", "get"}).starts_with("*1\r\n*6\r\n$3\r\nget\r\n:2\r\n"));
  auto info = r({"INFO"});
  for (auto f : {"keyspace_hits:", "keyspace_misses:", "evicted_keys:", "used_memory:",
                 "connected_clients:", "total_commands_processed:"})
    EXPECT_NE(info.find(f), std::string::npos) << f;
  EXPECT_EQ(r({"QUIT"}), "+OK\r\n");
  EXPECT_TRUE(s.close_after_reply);
}

TEST_F(commands, info_counts_hits_misses_and_the_one_sided_hook) {
  r({"SET", "a", "1"});
  r({"GET", "a"});
  r({"GET", "a"});
  r({"GET", "b"});
  ex->stats().one_sided_gets = [] { return std::uint64_t{1234}; };
  auto info = r({"INFO", "stats"});
  EXPECT_NE(info.find("keyspace_hits:2\r\n"), std::string::npos) << info;
  EXPECT_NE(info.find("keyspace_misses:1\r\n"), std::string::npos);
  EXPECT_NE(info.find("one_sided_gets:1234\r\n"), std::string::npos);
  EXPECT_EQ(info.find("# Keyspace"), std::string::npos);  // only the section asked for
}

TEST_F(commands, flushall_and_flushdb_empty_the_store_and_refuse_bad_options) {
  r({"SET", "a", "1"});
  EXPECT_EQ(r({"FLUSHALL"}), "+OK\r\n");
  EXPECT_EQ(r({"DBSIZE"}), ":0\r\n");
  EXPECT_EQ(r({"FLUSHDB", "ASYNC"}), "+OK\r\n");
  EXPECT_EQ(r({"FLUSHDB", "BAD"}), "-ERR syntax error\r\n");
}
