// Transactions in the executor and the AOF: EXEC's records are logged between
// MULTI and EXEC records (only when it wrote something); the loader applies a
// transaction only when its EXEC is in the file, whatever byte the file was
// cut at; WATCH compares store::key_version, which every write, deletion and
// expiry changes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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
  EXPECT_EQ(st->key_version("k", now), 0u);
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
  EXPECT_EQ(st->key_version("k", kv::now_ms() + 100), 0u);  // expired: gone
  run(*ex, s, {"SET", "d", "1"});
  run(*ex, s, {"DEL", "d"});
  EXPECT_EQ(st->key_version("d", now), 0u);
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
