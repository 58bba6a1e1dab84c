// The append-only file: replay, a truncated tail, a corrupt file, rewrite.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "kv_fixture.hpp"
#include "resp.hpp"

namespace kv = conveyor::kv;
using kvtest::run;

namespace {

struct aof_case : ::testing::Test {
  kvtest::kv_env env;
  kv::server_config cfg;
  std::string dir;
  std::string path;

  void SetUp() override {
    char tmpl[] = "/tmp/conveyor-kv-aof.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
    path = dir + "/appendonly.aof";
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::unique_ptr<kv::aof> open_log(kv::fsync_policy p = kv::fsync_policy::always) {
    kv::aof_options o;
    o.path = path;
    o.fsync = p;
    std::string why;
    auto a = kv::aof::open(o, why);
    EXPECT_TRUE(a) << why;
    return a;
  }

  // A fresh store and executor with the file replayed into it.
  struct restarted {
    std::unique_ptr<kv::store> st;
    std::unique_ptr<kv::aof> log;
    std::unique_ptr<kv::executor> ex;
    kv::replay_result rr;
    bool ok = false;
    std::string why;
  };
  restarted restart(std::size_t data_bytes = 8u << 20) {
    restarted r;
    r.st = env.make_store(data_bytes);
    r.log = open_log();
    r.ex = std::make_unique<kv::executor>(*r.st, r.log.get(), cfg);
    r.ok = r.log->replay(
        [&](std::span<const std::string_view> a, std::string& w) { return r.ex->replay(a, w); },
        r.rr, r.why);
    return r;
  }

  std::uint64_t file_size() {
    struct stat st {};
    ::stat(path.c_str(), &st);
    return static_cast<std::uint64_t>(st.st_size);
  }
  std::string contents() {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  void append_raw(std::string_view bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::app);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string record(std::initializer_list<std::string_view> argv) {
    std::string out;
    std::vector<std::string_view> a(argv);
    kv::encode_command(out, a);
    return out;
  }
  // Files next to the log other than the log itself (side files of a cut tail).
  std::vector<std::string> side_files() {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().string() != path) out.push_back(e.path().string());
    return out;
  }
  static std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

}  // namespace

TEST_F(aof_case, every_write_is_replayed_with_absolute_expiry) {
  {
    auto st = env.make_store();
    auto log = open_log();
    kv::executor ex(*st, log.get(), cfg);
    kv::session s;
    run(ex, s, {"SET", "a", "1"});
    run(ex, s, {"INCRBY", "a", "9"});
    run(ex, s, {"APPEND", "a", "x"});
    run(ex, s, {"SET", "ttl", "v", "EX", "100"});
    run(ex, s, {"SET", "short", "v", "PX", "50"});
    run(ex, s, {"MSET", "m1", "1", "m2", "2"});
    run(ex, s, {"DEL", "m2"});
    run(ex, s, {"SET", "p", "v", "EX", "100"});
    run(ex, s, {"PERSIST", "p"});
    run(ex, s, {"SET", "e", "v"});
    run(ex, s, {"EXPIRE", "e", "200"});
    run(ex, s, {"GET", "a"});  // reads are not logged
    run(ex, s, {"SET", "gone", "v"});
    run(ex, s, {"GETDEL", "gone"});
    EXPECT_TRUE(log->flush());
    auto text = contents();
    EXPECT_NE(text.find("PXAT"), std::string::npos);
    EXPECT_NE(text.find("PEXPIREAT"), std::string::npos);
    EXPECT_EQ(text.find("$3\r\nGET\r\n"), std::string::npos);
    EXPECT_EQ(text.find("$2\r\nEX\r\n"), std::string::npos);  // relative times never reach the log
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(80));  // "short" expires meanwhile
  auto r = restart();
  ASSERT_TRUE(r.ok) << r.why;
  EXPECT_EQ(r.rr.truncated_bytes, 0u);
  kv::session s;
  EXPECT_EQ(run(*r.ex, s, {"GET", "a"}), "$3\r\n10x\r\n");
  auto ttl = run(*r.ex, s, {"TTL", "ttl"});
  EXPECT_TRUE(ttl == ":100\r\n" || ttl == ":99\r\n") << ttl;
  EXPECT_EQ(run(*r.ex, s, {"EXISTS", "short"}), ":0\r\n");
  EXPECT_EQ(run(*r.ex, s, {"MGET", "m1", "m2"}), "*2\r\n$1\r\n1\r\n$-1\r\n");
  EXPECT_EQ(run(*r.ex, s, {"TTL", "p"}), ":-1\r\n");
  auto ettl = run(*r.ex, s, {"TTL", "e"});
  EXPECT_TRUE(ettl == ":200\r\n" || ettl == ":199\r\n") << ettl;
  EXPECT_EQ(run(*r.ex, s, {"EXISTS", "gone"}), ":0\r\n");
  EXPECT_EQ(run(*r.ex, s, {"DBSIZE"}), ":5\r\n");
}

TEST_F(aof_case, a_truncated_tail_is_cut_and_never_taken_as_data) {
  {
    auto st = env.make_store();
    auto log = open_log();
    kv::executor ex(*st, log.get(), cfg);
    kv::session s;
    run(ex, s, {"SET", "a", "1"});
    run(ex, s, {"SET", "b", "2"});
    log->flush();
  }
  auto good = file_size();
  // A record cut mid-value, as a crash during write() leaves it.
  const std::string_view cut = "*3\r\n$3\r\nSET\r\n$1\r\nc\r\n$10\r\n12345";
  append_raw(cut);
  {
    auto r = restart();
    ASSERT_TRUE(r.ok) << r.why;
    EXPECT_EQ(r.rr.commands, 2u);
    EXPECT_EQ(r.rr.truncated_bytes, cut.size());
    EXPECT_EQ(file_size(), good);
    kv::session s;
    EXPECT_EQ(run(*r.ex, s, {"EXISTS", "c"}), ":0\r\n");
    // Writes after the cut land on a clean record boundary.
    run(*r.ex, s, {"SET", "d", "4"});
    r.log->flush();
  }
  auto r = restart();
  ASSERT_TRUE(r.ok) << r.why;
  kv::session s;
  EXPECT_EQ(run(*r.ex, s, {"MGET", "a", "b", "c", "d"}),
            "*4\r\n$1\r\n1\r\n$1\r\n2\r\n$-1\r\n$1\r\n4\r\n");
}

TEST_F(aof_case, cut_at_every_byte_replays_a_prefix) {
  std::string full;
  {
    auto st = env.make_store();
    auto log = open_log(kv::fsync_policy::no);
    kv::executor ex(*st, log.get(), cfg);
    kv::session s;
    for (int i = 0; i < 5; ++i)
      run(ex, s, {"SET", "k" + std::to_string(i), "value" + std::to_string(i)});
    log->flush();
  }
  full = contents();
  for (std::size_t cut = 0; cut <= full.size(); cut += 3) {
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(full.data(), static_cast<std::streamsize>(cut));
    }
    auto r = restart();
    ASSERT_TRUE(r.ok) << "cut " << cut << ": " << r.why;
    EXPECT_EQ(r.rr.bytes + r.rr.truncated_bytes, cut);
    EXPECT_EQ(r.st->size(), r.rr.commands);
    kv::session s;
    for (std::uint64_t i = 0; i < r.rr.commands; ++i)
      EXPECT_EQ(run(*r.ex, s, {"GET", "k" + std::to_string(i)}),
                "$6\r\nvalue" + std::to_string(i) + "\r\n");
  }
}

TEST_F(aof_case, a_corrupt_file_refuses_to_start) {
  append_raw("*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n");
  append_raw("this is not RESP\r\n*1\r\n$8\r\nFLUSHALL\r\n");
  auto r = restart();
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.why.find("not a logged command"), std::string::npos) << r.why;
  std::remove(path.c_str());
  append_raw("*2\r\n$3\r\nSET\r\n$x\r\n");
  auto r2 = restart();
  EXPECT_FALSE(r2.ok);
  EXPECT_NE(r2.why.find("not a valid append-only file"), std::string::npos) << r2.why;
}

TEST_F(aof_case, rewrite_compacts_to_the_current_state) {
  auto st = env.make_store();
  kv::aof_options o;
  o.path = path;
  o.fsync = kv::fsync_policy::no;
  o.rewrite_min_size = 4096;
  std::string why;
  auto log = kv::aof::open(o, why);
  ASSERT_TRUE(log);
  kv::executor ex(*st, log.get(), cfg);
  kv::session s;
  for (int i = 0; i < 2000; ++i)
    run(ex, s, {"SET", "k" + std::to_string(i % 10), std::to_string(i)});
  run(ex, s, {"SET", "t", "v", "EX", "300"});
  log->flush();
  EXPECT_TRUE(log->rewrite_due());
  auto before = file_size();
  ASSERT_TRUE(log->rewrite(*st, why)) << why;
  EXPECT_LT(file_size(), before / 20);
  EXPECT_EQ(log->size(), file_size());
  EXPECT_FALSE(log->rewrite_due());
  run(ex, s, {"SET", "after", "rewrite"});  // appends go to the new file
  log->flush();
  log.reset();
  auto r = restart();
  ASSERT_TRUE(r.ok) << r.why;
  kv::session s2;
  EXPECT_EQ(run(*r.ex, s2, {"GET", "k3"}), "$4\r\n1993\r\n");
  EXPECT_EQ(run(*r.ex, s2, {"GET", "after"}), "$7\r\nrewrite\r\n");
  auto ttl = run(*r.ex, s2, {"TTL", "t"});
  EXPECT_TRUE(ttl == ":300\r\n" || ttl == ":299\r\n") << ttl;
  EXPECT_EQ(run(*r.ex, s2, {"DBSIZE"}), ":12\r\n");
}

TEST_F(aof_case, bgrewriteaof_command_and_flushall_are_logged) {
  auto st = env.make_store();
  auto log = open_log();
  kv::executor ex(*st, log.get(), cfg);
  kv::session s;
  run(ex, s, {"SET", "a", "1"});
  run(ex, s, {"FLUSHALL"});
  run(ex, s, {"SET", "b", "2"});
  EXPECT_EQ(run(ex, s, {"BGREWRITEAOF"}), "+Background append only file rewriting started\r\n");
  EXPECT_EQ(contents(), "*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\n2\r\n");
  kv::executor none(*st, nullptr, cfg);
  EXPECT_EQ(run(none, s, {"BGREWRITEAOF"}).substr(0, 4), "-ERR");
}

TEST_F(aof_case, an_overflowing_expiry_never_reaches_the_log_and_restart_works) {
  {
    auto st = env.make_store();
    auto log = open_log();
    kv::executor ex(*st, log.get(), cfg);
    kv::session s;
    run(ex, s, {"SET", "a", "1"});
    EXPECT_EQ(
        run(ex, s, {"PSETEX", "k", std::to_string(std::numeric_limits<std::int64_t>::max()), "v"}),
        "-ERR invalid expire time in 'psetex' command\r\n");
    // SETEX at the old bound, in the phase of the second where it overflowed.
    auto now = kv::now_ms();
    for (int i = 0; i < 200 && (now % 1000 < 850 || now % 1000 > 950); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      now = kv::now_ms();
    }
    auto bound = std::numeric_limits<std::int64_t>::max() / 1000 - now / 1000;
    EXPECT_EQ(run(ex, s, {"SETEX", "j", std::to_string(bound), "v"}),
              "-ERR invalid expire time in 'setex' command\r\n");
    run(ex, s, {"SET", "b", "2"});
    EXPECT_TRUE(log->flush());
    EXPECT_EQ(contents().find("PXAT"), std::string::npos) << contents();
  }
  auto r = restart();
  ASSERT_TRUE(r.ok) << r.why;
  kv::session s;
  EXPECT_EQ(run(*r.ex, s, {"MGET", "a", "b", "k", "j"}),
            "*4\r\n$1\r\n1\r\n$1\r\n2\r\n$-1\r\n$-1\r\n");
}

TEST_F(aof_case, a_logged_expiry_in_the_past_replays_as_a_deletion) {
  // An older server logged PSETEX k INT64_MAX as a negative PXAT.
  append_raw(record({"SET", "k", "v"}));
  append_raw(record({"SET", "k", "v", "PXAT", "-9223370240324708176"}));
  append_raw(record({"SET", "gone", "v", "PXAT", "1"}));
  append_raw(record({"SET", "j", "1"}));
  append_raw(record({"PEXPIREAT", "j", "-7"}));
  append_raw(record({"SET", "live", "1"}));
  auto r = restart();
  ASSERT_TRUE(r.ok) << r.why;
  EXPECT_EQ(r.rr.commands, 6u);
  kv::session s;
  EXPECT_EQ(run(*r.ex, s, {"DBSIZE"}), ":1\r\n");
  EXPECT_EQ(run(*r.ex, s, {"GET", "live"}), "$1\r\n1\r\n");
}

TEST_F(aof_case, replay_of_heavy_overwrites_fits_the_store_it_came_from) {
  // A 1 MiB data region; one key overwritten 40 times with 200 KiB values: the
  // live data fits, the 8 MB written do not. At run time the writes came more
  // than the reclaim grace apart; replay runs them back to back.
  const std::size_t data_bytes = 1u << 20;
  std::string last;
  for (int i = 0; i < 40; ++i) {
    last.assign(200u << 10, static_cast<char>('a' + i % 26));
    last += std::to_string(i);
    append_raw(record({"SET", "big", last}));
    append_raw(record({"SET", "small" + std::to_string(i), "x"}));
  }
  auto r = restart(data_bytes);
  ASSERT_TRUE(r.ok) << r.why;
  EXPECT_EQ(r.rr.commands, 80u);
  kv::session s;
  EXPECT_EQ(run(*r.ex, s, {"GET", "big"}),
            "$" + std::to_string(last.size()) + "\r\n" + last + "\r\n");
  EXPECT_EQ(run(*r.ex, s, {"DBSIZE"}), ":41\r\n");
}

