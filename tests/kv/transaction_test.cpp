// Transactions in the executor and the AOF: EXEC's records are logged between
// MULTI and EXEC records (only when it wrote something); the loader applies a
// transaction only when its EXEC is in the file, whatever byte the file was
// cut at; WATCH compares store::key_version, which every write, deletion and
// expiry changes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "command_context.hpp"
#include "kv_fixture.hpp"
#include "resp.hpp"

namespace kv = conveyor::kv;
using kvtest::run;

namespace {

std::string record(std::initializer_list<std::string_view> argv) {
  std::string out;
  std::vector<std::string_view> a(argv);
  kv::encode_command(out, a);
  return out;
}

// Loads `bytes`; returns the names of the keys the records set, in order.
kv::aof_load_result load(std::string_view bytes, std::vector<std::string>& applied,
                         std::size_t chunk = 7) {
  kv::aof_options o;
  return kv::load_aof(
      bytes.size(),
      [&](std::uint64_t off, char* buf, std::size_t len) -> std::int64_t {
        if (off >= bytes.size()) return 0;
        len = std::min<std::size_t>(len, bytes.size() - off);
        std::memcpy(buf, bytes.data() + off, len);
        return static_cast<std::int64_t>(len);
      },
      [&](std::span<const std::string_view> argv, std::string&) {
        applied.emplace_back(argv.size() > 1 ? argv[1] : argv[0]);
        return true;
      },
      o, {}, chunk);
}

}  // namespace

TEST(kv_transaction_log, a_log_cut_anywhere_applies_all_of_a_transaction_or_none) {
  const std::string before = record({"SET", "a", "1"});
  const std::string tx =
      record({"MULTI"}) + record({"SET", "b", "2"}) + record({"SET", "c", "3"}) + record({"EXEC"});
  const std::string after = record({"SET", "d", "4"});
  const std::string log = before + tx + after;
  for (std::size_t cut = 0; cut <= log.size(); ++cut) {
    std::vector<std::string> applied;
    auto r = load(std::string_view(log).substr(0, cut), applied);
    const bool has_b = std::find(applied.begin(), applied.end(), "b") != applied.end();
    const bool has_c = std::find(applied.begin(), applied.end(), "c") != applied.end();
    EXPECT_EQ(has_b, has_c) << "cut at " << cut;  // never half of it
    EXPECT_EQ(has_b, cut >= before.size() + tx.size()) << "cut at " << cut;
    if (cut > before.size() && cut < before.size() + tx.size()) {
      // Inside the transaction: a torn tail from its MULTI on.
      EXPECT_EQ(r.verdict, kv::aof_verdict::torn_tail) << cut;
      EXPECT_EQ(r.good_bytes, before.size()) << cut;
      EXPECT_EQ(r.open_transaction, cut >= before.size() + record({"MULTI"}).size()) << cut;
      EXPECT_EQ(applied, std::vector<std::string>{"a"}) << cut;
    }
  }
  std::vector<std::string> applied;
  auto r = load(log, applied);
  EXPECT_EQ(r.verdict, kv::aof_verdict::clean);
  EXPECT_EQ(applied, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(r.commands, 4u);
}

TEST(kv_transaction_log, exec_without_multi_and_nested_multi_are_damage) {
  std::vector<std::string> applied;
  auto r = load(record({"SET", "a", "1"}) + record({"EXEC"}), applied);
  EXPECT_EQ(r.verdict, kv::aof_verdict::bad_record);
  EXPECT_EQ(r.command, "EXEC");
  applied.clear();
  r = load(record({"MULTI"}) + record({"MULTI"}) + record({"EXEC"}), applied);
  EXPECT_EQ(r.verdict, kv::aof_verdict::bad_record);
  EXPECT_EQ(r.command, "MULTI");
  EXPECT_TRUE(applied.empty());
}

struct kv_transactions : ::testing::Test {
  kvtest::kv_env env;
  kv::server_config cfg;
  std::unique_ptr<kv::store> st = env.make_store();
  std::string dir, path;
  std::unique_ptr<kv::aof> log;
  std::unique_ptr<kv::executor> ex;
  kv::session s;

  void SetUp() override {
    char tmpl[] = "/tmp/conveyor-kv-tx.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
    path = dir + "/appendonly.aof";
    kv::aof_options o;
    o.path = path;
    std::string why;
    log = kv::aof::open(o, why);
    ASSERT_TRUE(log) << why;
    ex = std::make_unique<kv::executor>(*st, log.get(), cfg);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string file() {
    log->flush();
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

TEST_F(kv_transactions, exec_logs_its_writes_between_multi_and_exec_and_reads_not_at_all) {
  EXPECT_EQ(run(*ex, s, {"MULTI"}), "+OK\r\n");
  EXPECT_EQ(run(*ex, s, {"GET", "a"}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*1\r\n$-1\r\n");
  EXPECT_EQ(file(), "");  // nothing written: no MULTI/EXEC records either
  EXPECT_EQ(run(*ex, s, {"MULTI"}), "+OK\r\n");
  EXPECT_EQ(run(*ex, s, {"SET", "a", "1"}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"INCR", "a"}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"GET", "a"}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*3\r\n+OK\r\n:2\r\n$1\r\n2\r\n");
  EXPECT_EQ(file(), record({"MULTI"}) + record({"SET", "a", "1"}) +
                        record({"SET", "a", "2", "KEEPTTL"}) + record({"EXEC"}));
  // Outside a transaction: plain records.
  run(*ex, s, {"SET", "b", "1"});
  EXPECT_TRUE(file().ends_with(record({"EXEC"}) + record({"SET", "b", "1"})));
}

TEST_F(kv_transactions, key_versions_change_with_every_write_deletion_and_expiry) {
  const auto now = kv::now_ms();
  const auto absent = kv::store::absent_version;
  EXPECT_NE(st->key_version("k", now) & absent, 0u);
  run(*ex, s, {"SET", "k", "v"});
  const auto v1 = st->key_version("k", now);
  EXPECT_NE(v1, 0u);
  EXPECT_EQ(st->key_version("k", now), v1);  // reading changes nothing
  run(*ex, s, {"GET", "k"});
  EXPECT_EQ(st->key_version("k", now), v1);
  run(*ex, s, {"SET", "k", "v"});  // the same value is still a write
  const auto v2 = st->key_version("k", now);
  EXPECT_NE(v2, v1);
  run(*ex, s, {"PEXPIRE", "k", "50"});
  EXPECT_NE(st->key_version("k", now), v2);
  EXPECT_NE(st->key_version("k", kv::now_ms() + 100) & absent, 0u);  // expired: gone
  // An absent key created and deleted again: absent both times, yet not the same.
  const auto before = st->key_version("d", now);
  run(*ex, s, {"SET", "d", "1"});
  EXPECT_EQ(st->key_version("d", now) & absent, 0u);
  run(*ex, s, {"DEL", "d"});
  EXPECT_NE(st->key_version("d", now) & absent, 0u);
  EXPECT_NE(st->key_version("d", now), before);
}

// Redis flags a watched key on every write, so EXEC aborts even when the key
// ends where it started: absent.
TEST_F(kv_transactions, watch_of_an_absent_key_is_broken_by_its_creation_and_deletion) {
  kv::session other;
  const std::vector<std::vector<std::string_view>> creations = {{"SET", "gone", "1"},
                                                                {"HSET", "gone", "f", "1"},
                                                                {"RPUSH", "gone", "m"},
                                                                {"SADD", "gone", "m"},
                                                                {"ZADD", "gone", "1", "m"}};
  for (auto create : creations) {
    SCOPED_TRACE(create[0]);
    EXPECT_EQ(run(*ex, s, {"WATCH", "gone"}), "+OK\r\n");
    std::string out;
    ex->execute(other, create, out);
    EXPECT_EQ(run(*ex, other, {"DEL", "gone"}), ":1\r\n");
    run(*ex, s, {"MULTI"});
    run(*ex, s, {"SET", "x", "1"});
    EXPECT_EQ(run(*ex, s, {"EXEC"}), "*-1\r\n");
  }
  // Untouched, the absent key lets EXEC run.
  run(*ex, s, {"WATCH", "gone"});
  run(*ex, s, {"MULTI"});
  run(*ex, s, {"SET", "x", "1"});
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*1\r\n+OK\r\n");
}

TEST_F(kv_transactions, watch_sees_writes_from_any_session_and_queue_errors_abort) {
  kv::session other;
  run(*ex, s, {"SET", "w", "1"});
  EXPECT_EQ(run(*ex, s, {"WATCH", "w", "absent"}), "+OK\r\n");
  run(*ex, other, {"SET", "w", "2"});  // another client (or an RDMA RPC: same executor)
  run(*ex, s, {"MULTI"});
  run(*ex, s, {"SET", "w", "3"});
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*-1\r\n");
  EXPECT_EQ(run(*ex, s, {"GET", "w"}), "$1\r\n2\r\n");
  // The WATCH is gone after EXEC: the next transaction runs.
  run(*ex, s, {"MULTI"});
  run(*ex, s, {"SET", "w", "3"});
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*1\r\n+OK\r\n");
  // A queue-time error (arity) aborts the whole transaction.
  run(*ex, s, {"MULTI"});
  run(*ex, s, {"SET", "w", "4"});
  EXPECT_EQ(run(*ex, s, {"SET", "w"}), "-ERR wrong number of arguments for 'set' command\r\n");
  EXPECT_EQ(run(*ex, s, {"EXEC"}),
            "-EXECABORT Transaction discarded because of previous errors.\r\n");
  EXPECT_EQ(run(*ex, s, {"GET", "w"}), "$1\r\n3\r\n");
  // RESP3: the aborted EXEC is a null.
  s.resp = 3;
  run(*ex, s, {"WATCH", "w"});
  run(*ex, other, {"DEL", "w"});
  run(*ex, s, {"MULTI"});
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "_\r\n");
}

// WATCH on a key of every type, broken by every write command of the table
// (run by another client) that changes it; a read leaves it intact. Every
// write command in the table must appear here, so a new one is checked too.
TEST_F(kv_transactions, watch_is_broken_by_every_write_of_every_type) {
  using cmds = std::vector<std::vector<std::string>>;
  const cmds none, str = {{"SET", "k", "v"}}, num = {{"SET", "k", "10"}},
                   ttl = {{"SET", "k", "v"}, {"EXPIRE", "k", "1000"}},
                   hash = {{"HSET", "k", "f", "1", "g", "2"}},
                   hash_ttl = {{"HSET", "k", "f", "1"}, {"EXPIRE", "k", "1000"}},
                   list = {{"RPUSH", "k", "a", "b", "c"}}, set = {{"SADD", "k", "a", "b", "c"}},
                   zset = {{"ZADD", "k", "1", "a", "2", "b", "3", "c"}},
                   hash_src = {{"HSET", "src", "f", "1"}}, list_src = {{"RPUSH", "src", "a"}},
                   zset_src = {{"ZADD", "src", "1", "a"}}, str_src = {{"SET", "src", "v"}};
  const std::string future = std::to_string(kv::now_ms() / 1000 + 1000);
  const std::string future_ms = std::to_string(kv::now_ms() + 1000000);
  struct watched_write {
    const cmds* setup;
    std::vector<std::string> write;
  };
  const std::vector<watched_write> cases = {
      // strings and the keyspace
      {&str, {"SET", "k", "x"}},
      {&none, {"SETNX", "k", "x"}},
      {&str, {"SETEX", "k", "100", "x"}},
      {&str, {"PSETEX", "k", "100000", "x"}},
      {&str, {"GETSET", "k", "x"}},
      {&str, {"GETDEL", "k"}},
      {&str, {"DEL", "k"}},
      {&str, {"UNLINK", "k"}},
      {&str, {"MSET", "k", "x", "other", "y"}},
      {&none, {"MSETNX", "k", "x"}},
      {&num, {"INCR", "k"}},
      {&num, {"DECR", "k"}},
      {&num, {"INCRBY", "k", "2"}},
      {&num, {"DECRBY", "k", "2"}},
      {&str, {"APPEND", "k", "x"}},
      {&str, {"EXPIRE", "k", "100"}},
      {&str, {"PEXPIRE", "k", "100000"}},
      {&str, {"EXPIREAT", "k", future}},
      {&str, {"PEXPIREAT", "k", future_ms}},
      {&ttl, {"PERSIST", "k"}},
      {&str, {"FLUSHALL"}},
      {&str, {"FLUSHDB"}},
      {&str, {"RENAME", "k", "k2"}},
      {&str_src, {"RENAMENX", "src", "k"}},
      // hashes
      {&hash, {"HSET", "k", "f", "9"}},
      {&hash, {"HSET", "k", "new", "9"}},
      {&hash, {"HMSET", "k", "f", "9"}},
      {&hash, {"HSETNX", "k", "h", "1"}},
      {&hash, {"HDEL", "k", "f"}},
      {&hash, {"HDEL", "k", "f", "g"}},  // emptied: the key goes
      {&hash, {"HINCRBY", "k", "f", "1"}},
      {&hash, {"HINCRBYFLOAT", "k", "f", "1.5"}},
      {&hash, {"SET", "k", "x"}},  // another type over it
      {&hash, {"DEL", "k"}},
      {&hash, {"EXPIRE", "k", "100"}},
      {&hash_ttl, {"PERSIST", "k"}},
      {&hash, {"RENAME", "k", "k2"}},
      {&hash_src, {"RENAME", "src", "k"}},
      {&hash, {"FLUSHALL"}},
      // lists
      {&list, {"LPUSH", "k", "z"}},
      {&list, {"RPUSH", "k", "z"}},
      {&list, {"LPUSHX", "k", "z"}},
      {&list, {"RPUSHX", "k", "z"}},
      {&list, {"LPOP", "k"}},
      {&list, {"RPOP", "k", "3"}},  // emptied
      {&list, {"BLPOP", "k", "0"}},
      {&list, {"BRPOP", "k", "0"}},
      {&list, {"LSET", "k", "0", "z"}},
      {&list, {"LREM", "k", "0", "a"}},
      {&list, {"LTRIM", "k", "0", "0"}},
      {&list, {"PEXPIRE", "k", "100000"}},
      {&list_src, {"RENAMENX", "src", "k"}},
      // sets
      {&set, {"SADD", "k", "z"}},
      {&set, {"SREM", "k", "a"}},
      {&set, {"SPOP", "k"}},
      {&set, {"SPOP", "k", "3"}},  // emptied
      {&set, {"DEL", "k"}},
      // sorted sets
      {&zset, {"ZADD", "k", "5", "z"}},
      {&zset, {"ZADD", "k", "XX", "9", "a"}},
      {&zset, {"ZINCRBY", "k", "1", "a"}},
      {&zset, {"ZREM", "k", "a"}},
      {&zset, {"ZPOPMIN", "k"}},
      {&zset, {"ZPOPMAX", "k", "3"}},  // emptied
      {&zset_src, {"RENAME", "src", "k"}},
      // a script's writes (the same executor)
      {&hash, {"EVAL", "return redis.call('hset', KEYS[1], 'f', 'x')", "1", "k"}},
      {&list, {"EVAL", "return redis.call('lpop', KEYS[1])", "1", "k"}},
  };
  kv::session other;
  std::set<std::string> covered;
  for (const auto& c : cases) {
    std::string what;
    for (const auto& a : c.write) what += a + " ";
    run(*ex, other, {"FLUSHALL"});
    for (const auto& cmd : *c.setup) {
      std::vector<std::string_view> v(cmd.begin(), cmd.end());
      std::string out;
      ex->execute(other, v, out);
      ASSERT_NE(out[0], '-') << what << out;
    }
    EXPECT_EQ(run(*ex, s, {"WATCH", "k"}), "+OK\r\n");
    std::vector<std::string_view> v(c.write.begin(), c.write.end());
    std::string out;
    ex->execute(other, v, out);
    ASSERT_NE(out[0], '-') << what << out;
    run(*ex, s, {"MULTI"});
    run(*ex, s, {"PING"});
    EXPECT_EQ(run(*ex, s, {"EXEC"}), "*-1\r\n") << what << "did not break the WATCH";
    std::string name;
    for (char ch : c.write[0]) name += static_cast<char>(std::tolower(ch));
    covered.insert(name);
  }
  for (const auto& k : kv::command_table()) {
    if (k.write) {
      EXPECT_TRUE(covered.contains(std::string(k.name))) << k.name << " not checked";
    }
  }
  // Reads of every type leave the WATCH alone.
  run(*ex, other, {"FLUSHALL"});
  run(*ex, other, {"HSET", "h", "f", "1"});
  run(*ex, other, {"RPUSH", "l", "a"});
  run(*ex, other, {"SADD", "s", "a"});
  run(*ex, other, {"ZADD", "z", "1", "a"});
  EXPECT_EQ(run(*ex, s, {"WATCH", "h", "l", "s", "z"}), "+OK\r\n");
  for (std::vector<std::string_view> r : {std::vector<std::string_view>{"HGETALL", "h"},
                                          {"LRANGE", "l", "0", "-1"},
                                          {"SMEMBERS", "s"},
                                          {"ZRANGE", "z", "0", "-1"},
                                          {"TYPE", "h"},
                                          {"OBJECT", "ENCODING", "z"},
                                          {"HSETNX", "h", "f", "2"},
                                          {"SADD", "s", "a"},
                                          {"ZADD", "z", "NX", "5", "a"}}) {
    const auto before = st->key_version(r[1] == "ENCODING" ? r[2] : r[1], kv::now_ms());
    std::string out;
    ex->execute(other, r, out);  // the last three change nothing
    EXPECT_EQ(st->key_version(r[1] == "ENCODING" ? r[2] : r[1], kv::now_ms()), before)
        << r[0] << " " << r[1] << " moved the version";
  }
  run(*ex, s, {"MULTI"});
  run(*ex, s, {"PING"});
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*1\r\n+PONG\r\n");
}

// Inside EXEC nothing blocks: BLPOP on an empty list answers as its timeout.
TEST_F(kv_transactions, blpop_inside_exec_does_not_block) {
  s.may_block = true;  // as a RESP client's session
  run(*ex, s, {"MULTI"});
  EXPECT_EQ(run(*ex, s, {"BLPOP", "empty", "0"}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"RPUSH", "l", "a"}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"BLPOP", "l", "0"}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*3\r\n*-1\r\n:1\r\n*2\r\n$1\r\nl\r\n$1\r\na\r\n");
  EXPECT_FALSE(s.blocked);
  EXPECT_TRUE(s.may_block);
}

TEST_F(kv_transactions, exec_replies_stay_within_the_clients_reply_bound) {
  run(*ex, s, {"SET", "big", std::string(4000, 'x')});
  run(*ex, s, {"MULTI"});
  for (int i = 0; i < 4; ++i) run(*ex, s, {"GET", "big"});
  s.max_reply = 10000;
  auto out = run(*ex, s, {"EXEC"});
  EXPECT_LE(out.size(), 10000u + 64);
  EXPECT_TRUE(out.starts_with("*4\r\n$4000\r\n"));
  EXPECT_NE(out.find("-ERR reply exceeds this client's reply limit\r\n"), std::string::npos);
}
