// The append-only file: replay, a truncated tail, a corrupt file, rewrite.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  for (std::size_t cut = 0; cut <= full.size(); ++cut) {
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

namespace {
// 1000 small records, the 11th of which carries a 20000-byte value; sets the
// offset of that value's length digits.
std::string thousand_records(std::size_t* eleventh_len_at) {
  std::string out;
  for (int i = 0; i < 1000; ++i) {
    std::string k = "key" + std::to_string(i);
    std::string v = i == 10 ? std::string(20000, 'v') : "value" + std::to_string(i);
    std::string rec;
    std::vector<std::string_view> a{"SET", k, v};
    kv::encode_command(rec, a);
    if (i == 10) *eleventh_len_at = out.size() + rec.find("$20000") + 1;
    out += rec;
  }
  return out;
}
}  // namespace

TEST_F(aof_case, a_damaged_length_mid_file_refuses_to_start_and_leaves_the_file) {
  std::size_t at = 0;
  std::string log = thousand_records(&at);
  ASSERT_EQ(log[at], '2');
  log[at] = '9';  // $20000 -> $90000: runs past the end of the file
  append_raw(log);
  auto r = restart();
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(contents() == log) << "file now " << file_size() << " bytes, was " << log.size();
  EXPECT_TRUE(side_files().empty());
  // The message names where the damage is (record 11's start).
  const auto rec11 = std::to_string(log.rfind("*3\r\n", at));
  EXPECT_NE(r.why.find(rec11), std::string::npos) << r.why;
}

TEST_F(aof_case, a_torn_last_record_is_cut_and_kept_in_a_side_file) {
  std::size_t at = 0;
  std::string log = thousand_records(&at);
  append_raw(log);
  const std::string torn = record({"SET", "late", std::string(5000, 'z')}).substr(0, 3000);
  append_raw(torn);
  auto r = restart();
  ASSERT_TRUE(r.ok) << r.why;
  EXPECT_EQ(r.rr.commands, 1000u);
  EXPECT_EQ(r.rr.truncated_bytes, torn.size());
  EXPECT_TRUE(contents() == log) << "file now " << file_size() << " bytes, was " << log.size();
  auto side = side_files();
  ASSERT_EQ(side.size(), 1u);
  EXPECT_EQ(read_file(side[0]), torn);
  kv::session s;
  EXPECT_EQ(run(*r.ex, s, {"DBSIZE"}), ":1000\r\n");
  EXPECT_EQ(run(*r.ex, s, {"EXISTS", "late"}), ":0\r\n");
}

TEST_F(aof_case, a_refused_record_names_offset_and_command_and_can_be_skipped) {
  append_raw(record({"SET", "a", "1"}));
  const auto bad_at = file_size();
  append_raw(record({"SET", "b", "2", "PX", "0"}));  // no server logs this: refused
  append_raw(record({"SET", "c", "3"}));
  const auto before = contents();
  auto r = restart();
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.why.find("offset " + std::to_string(bad_at)), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("SET"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("invalid expire time"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("--aof-skip-bad-records"), std::string::npos) << r.why;
  EXPECT_TRUE(contents() == before);
  // With the option the record is skipped and counted, the others load.
  auto st = env.make_store();
  kv::aof_options o;
  o.path = path;
  o.skip_bad_records = true;
  std::string why;
  auto log = kv::aof::open(o, why);
  ASSERT_TRUE(log) << why;
  kv::executor ex(*st, log.get(), cfg);
  kv::replay_result rr;
  ASSERT_TRUE(log->replay(
      [&](std::span<const std::string_view> a, std::string& w) { return ex.replay(a, w); }, rr,
      why))
      << why;
  EXPECT_EQ(rr.commands, 2u);
  EXPECT_EQ(rr.skipped, 1u);
  kv::session s;
  EXPECT_EQ(run(ex, s, {"MGET", "a", "b", "c"}), "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n3\r\n");
  EXPECT_TRUE(contents() == before);
}

namespace {
// load_aof over bytes in memory, short reads of `step` bytes.
kv::aof_load_result load_bytes(std::string_view bytes, const kv::aof_options& o, std::size_t chunk,
                               std::uint64_t* applied = nullptr) {
  return kv::load_aof(
      bytes.size(),
      [&](std::uint64_t off, char* buf, std::size_t len) -> std::int64_t {
        if (off >= bytes.size()) return 0;
        len = std::min<std::size_t>(len, bytes.size() - off);
        std::memcpy(buf, bytes.data() + off, len);
        return static_cast<std::int64_t>(len);
      },
      [&](std::span<const std::string_view>, std::string&) {
        if (applied) ++*applied;
        return true;
      },
      o, {}, chunk);
}
}  // namespace

TEST(aof_load, memory_at_start_is_bounded_by_one_record_not_by_the_file) {
  // 4 MiB of records; record 11's value length grown by damage to a length
  // that fits the bounds but not the rest of the file.
  std::string log;
  std::size_t damaged_at = 0;
  for (int i = 0; i < 4096; ++i) {
    std::string rec, k = "k" + std::to_string(i);
    std::string v(1000, static_cast<char>('a' + i % 26));
    std::vector<std::string_view> a{"SET", k, v};
    if (i == 10) damaged_at = log.size();
    kv::encode_command(rec, a);
    if (i == 10) rec.replace(rec.find("$1000\r\n"), 7, "$60000\r\n");
    log += rec;
  }
  kv::aof_options o;
  o.max_bulk = 64u << 10;
  o.max_record = (64u << 10) + 4096;
  const std::size_t chunk = 4096;
  auto r = load_bytes(log, o, chunk);
  EXPECT_EQ(r.verdict, kv::aof_verdict::damaged);
  EXPECT_EQ(r.damage_at, damaged_at);
  EXPECT_EQ(r.commands, 10u);
  EXPECT_LE(r.peak_buffered, o.max_record + chunk);
  // A length above the bounds is damage at once, whatever follows.
  std::string big = log.substr(0, damaged_at) + "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$999999999\r\nvv";
  r = load_bytes(big, o, chunk);
  EXPECT_EQ(r.verdict, kv::aof_verdict::damaged);
  EXPECT_EQ(r.damage_at, damaged_at);
  EXPECT_LE(r.peak_buffered, o.max_record + chunk);
  // The same record torn at the end of the file (no record after it) is a tail.
  std::string tail = log.substr(0, damaged_at) + "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$60000\r\nvv";
  r = load_bytes(tail, o, chunk);
  EXPECT_EQ(r.verdict, kv::aof_verdict::torn_tail);
  EXPECT_EQ(r.good_bytes, damaged_at);
}

TEST(aof_load, every_cut_of_a_log_is_a_torn_tail_or_clean_and_chunking_does_not_matter) {
  std::string log;
  std::vector<std::size_t> ends;
  for (int i = 0; i < 6; ++i) {
    std::string v = i == 3 ? std::string(300, 'x') : "v" + std::to_string(i);
    std::string k = "key" + std::to_string(i);
    std::vector<std::string_view> a{"SET", k, v, "PXAT", "1234567890123"};
    kv::encode_command(log, a);
    ends.push_back(log.size());
  }
  kv::aof_options o;
  for (std::size_t cut = 0; cut <= log.size(); ++cut) {
    std::uint64_t want = 0;
    while (want < ends.size() && ends[want] <= cut) ++want;
    for (std::size_t chunk : {1u, 7u, 4096u}) {
      std::uint64_t applied = 0;
      auto r = load_bytes(std::string_view(log).substr(0, cut), o, chunk, &applied);
      const bool boundary = cut == 0 || (want > 0 && ends[want - 1] == cut);
      EXPECT_EQ(r.verdict, boundary ? kv::aof_verdict::clean : kv::aof_verdict::torn_tail)
          << "cut " << cut << " chunk " << chunk;
      EXPECT_EQ(r.commands, want);
      EXPECT_EQ(applied, want);
      EXPECT_EQ(r.good_bytes, want ? ends[want - 1] : 0u);
    }
  }
}

TEST(aof_load, a_complete_record_inside_an_unfinished_one_is_found) {
  const std::string rec = "*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n";
  const std::string head = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$90\r\nab\r\n";
  EXPECT_EQ(kv::find_complete_record(head + rec, 1024), head.size());
  EXPECT_EQ(kv::find_complete_record("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$90\r\nab" + rec, 1024),
            std::string_view::npos);  // not at a line start: part of a value
  EXPECT_EQ(kv::find_complete_record("x\r\n" + rec.substr(0, rec.size() - 1), 1024),
            std::string_view::npos);  // itself incomplete
  EXPECT_EQ(kv::find_complete_record("x\r\n*1\r\n$1\r\n7\r\n", 1024),
            std::string_view::npos);  // not a command name
  EXPECT_EQ(kv::find_complete_record(rec, 1024),
            std::string_view::npos);  // offset 0 is the record itself
}
