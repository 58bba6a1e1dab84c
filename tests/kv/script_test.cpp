// Scripts in process (script.hpp): SHA-1, the reply bound, the script cache's
// bound, the busy state as another client sees it (driven through
// serve_others, as the loop does), SHUTDOWN NOSAVE, the AOF block (the
// transaction block the AOF loader reads) inside and outside EXEC. The
// replies themselves are compared with Redis in compat/kv_scripts.py.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "aof.hpp"
#include "kv_fixture.hpp"
#include "resp.hpp"
#include "script.hpp"
#include "script_sha1.hpp"

namespace kv = conveyor::kv;
using kvtest::run;

namespace {

struct kv_scripts : ::testing::Test {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store();
  kv::server_config cfg;
  std::unique_ptr<kv::executor> ex = std::make_unique<kv::executor>(*st, nullptr, cfg);
  kv::session s;
  kv::session other;  // another client
  std::string r(std::initializer_list<std::string_view> a) { return run(*ex, s, a); }
  std::string o(std::initializer_list<std::string_view> a) { return run(*ex, other, a); }
};

TEST(kv_script_sha1, known_digests) {
  EXPECT_EQ(kv::sha1_hex(""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(kv::sha1_hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(kv::sha1_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
  EXPECT_EQ(kv::sha1_hex(std::string(1000000, 'a')), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
  // Lengths around the padding boundary (Python's hashlib gave these).
  EXPECT_EQ(kv::sha1_hex(std::string(55, 'x')), "cef734ba81a024479e09eb5a75b6ddae62e6abf1");
  EXPECT_EQ(kv::sha1_hex(std::string(56, 'x')), "901305367c259952f4e7af8323f480d59f81335b");
  EXPECT_EQ(kv::sha1_hex(std::string(64, 'x')), "bb2fa3ee7afb9f54c6dfb5d021f14b1ffe40c163");
  EXPECT_EQ(kv::sha1_hex(std::string(119, 'x')), "4300320394f7ee239bcdce7d3b8bcee173a0cd5c");
}

TEST_F(kv_scripts, a_reply_past_max_reply_is_refused_as_built) {
  s.max_reply = 200;
  EXPECT_EQ(r({"EVAL", "return string.rep('x', 100)", "0"}),
            "$100\r\n" + std::string(100, 'x') + "\r\n");
  EXPECT_EQ(r({"EVAL", "return string.rep('x', 1000)", "0"}),
            "-ERR reply exceeds this client's reply limit\r\n");
  EXPECT_EQ(r({"EVAL", "local t = {} for i = 1, 1000 do t[i] = i end return t", "0"}),
            "-ERR reply exceeds this client's reply limit\r\n");
  // A command's reply inside the script is bounded the same way.
  s.max_reply = 1 << 20;
  r({"SET", "big", std::string(4000, 'v')});
  s.max_reply = 1000;
  auto got = r({"EVAL", "return redis.pcall('get', 'big')", "0"});
  EXPECT_EQ(got, "-ERR reply exceeds this client's reply limit\r\n");
  EXPECT_EQ(r({"EVAL", "return #redis.call('get', 'big')", "0"}).substr(0, 25),
            "-ERR reply exceeds this c");
  s.max_reply = static_cast<std::size_t>(-1);
  EXPECT_EQ(r({"EVAL", "return #redis.call('get', 'big')", "0"}), ":4000\r\n");
}

TEST_F(kv_scripts, errors_and_the_memory_bound_leave_the_state_usable) {
  cfg.lua_memory = 4u << 20;
  const auto error_of = [&](std::string_view body) {
    auto got = r({"EVAL", body, "0"});
    EXPECT_EQ(got.substr(0, 1), "-") << body;
    return got;
  };
  for (int round = 0; round < 3; ++round) {
    EXPECT_NE(
        error_of("local t = {} while true do t[#t+1] = 'x' .. #t end").find("not enough memory"),
        std::string::npos);
    EXPECT_NE(error_of("local s = 'x' while true do s = s .. s end").find("not enough memory"),
              std::string::npos);
    EXPECT_NE(error_of("return redis.call('set', 'k', string.rep('v', 8000000))")
                  .find("not enough memory"),
              std::string::npos);
    error_of("error('boom')");
    error_of("error({err='MY table'})");
    error_of("error(setmetatable({}, {__index = function() error('inner') end}))");
    error_of("return redis.call('incr', 'notanumber', 'x')");
    error_of("local function f() return f() + 1 end return f()");
    error_of("return (");
    // Reads of a large reply turn into Lua values inside the bound.
    r({"SET", "big", std::string(1536u << 10, 'b')});
    EXPECT_NE(
        error_of("local v = redis.call('get', 'big') return v .. v .. v").find("not enough memory"),
        std::string::npos);
    EXPECT_EQ(r({"DEL", "big"}), ":1\r\n");
    EXPECT_EQ(r({"EVAL", "return redis.call('ping')", "0"}), "+PONG\r\n");
    EXPECT_LE(ex->scripts().memory(), cfg.lua_memory);
  }
}

TEST_F(kv_scripts, evaled_scripts_are_bounded_and_loaded_ones_stay) {
  auto loaded = r({"SCRIPT", "LOAD", "return 'kept'"});
  ASSERT_EQ(loaded.substr(0, 5), "$40\r\n");
  const std::string sha = loaded.substr(5, 40);
  for (int i = 0; i < 700; ++i) {
    std::string body = "return " + std::to_string(i);
    ASSERT_EQ(r({"EVAL", body, "0"}), ":" + std::to_string(i) + "\r\n");
  }
  EXPECT_EQ(ex->scripts().cached(), kv::scripting::eval_cache_max + 1);
  EXPECT_EQ(r({"EVALSHA", sha, "0"}), "$4\r\nkept\r\n");
  // The oldest EVAL'd scripts went, the newest stay.
  EXPECT_EQ(r({"SCRIPT", "EXISTS", kv::sha1_hex("return 0"), kv::sha1_hex("return 699")}),
            "*2\r\n:0\r\n:1\r\n");
  EXPECT_EQ(r({"SCRIPT", "FLUSH"}), "+OK\r\n");
  EXPECT_EQ(ex->scripts().cached(), 0u);
  EXPECT_EQ(ex->scripts().memory(), 0u);
  EXPECT_EQ(r({"EVALSHA", sha, "0"}), "-NOSCRIPT No matching script. Please use EVAL.\r\n");
}

TEST_F(kv_scripts, other_clients_get_busy_and_script_kill_ends_a_read_only_script) {
  cfg.busy_reply_threshold_ms = 20;
  std::vector<std::string> seen;
  int served = 0;
  ex->scripts().serve_others = [&] {
    // What the loop does from the hook: another client's commands.
    if (++served == 1) {
      seen.push_back(o({"GET", "k"}));
      seen.push_back(o({"EVAL", "return 1", "0"}));
      seen.push_back(o({"SCRIPT", "LOAD", "return 1"}));
      seen.push_back(o({"SHUTDOWN"}));
      seen.push_back(o({"PING"}));
    } else if (served == 3) {
      seen.push_back(o({"SCRIPT", "KILL"}));
    }
  };
  EXPECT_FALSE(ex->scripts().busy());
  auto got = r({"EVAL", "redis.call('get', 'k') while true do end", "0"});
  EXPECT_EQ(got.substr(0, 46), "-ERR Script killed by user with SCRIPT KILL...");
  const std::string busy =
      "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n";
  ASSERT_EQ(seen.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(seen[i], busy) << i;
  EXPECT_EQ(seen[5], "+OK\r\n");
  EXPECT_FALSE(ex->scripts().busy());
  EXPECT_EQ(ex->scripts().killed(), 1u);
  EXPECT_EQ(o({"SCRIPT", "KILL"}), "-NOTBUSY No scripts in execution right now.\r\n");
  EXPECT_EQ(o({"PING"}), "+PONG\r\n");
  // A script under the threshold never serves anyone.
  served = 0;
  cfg.busy_reply_threshold_ms = 60000;
  EXPECT_EQ(r({"EVAL", "local n = 0 for i = 1, 1000000 do n = n + 1 end return n", "0"}),
            ":1000000\r\n");
  EXPECT_EQ(served, 0);
}

TEST_F(kv_scripts, a_script_that_wrote_is_unkillable_and_shutdown_nosave_drops_its_effects) {
  char dir[] = "/tmp/kv-script-aof-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  kv::aof_options ao;
  ao.path = std::string(dir) + "/appendonly.aof";
  ao.fsync = kv::fsync_policy::no;
  std::string why;
  auto log = kv::aof::open(ao, why);
  ASSERT_TRUE(log) << why;
  ex = std::make_unique<kv::executor>(*st, log.get(), cfg);
  cfg.busy_reply_threshold_ms = 20;
  std::vector<std::string> seen;
  int served = 0, shutdowns = 0;
  ex->hooks().shutdown = [&] { ++shutdowns; };  // SHUTDOWN's hook, NOSAVE's too
  ex->scripts().serve_others = [&] {
    if (++served == 1) {
      seen.push_back(o({"SCRIPT", "KILL"}));
    } else if (served == 2) {
      seen.push_back(o({"SHUTDOWN", "NOSAVE"}));
    }
  };
  auto got =
      r({"EVAL", "redis.call('set', 'a', '1') redis.call('set', 'b', '2') while true do end", "0"});
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].substr(0, 12), "-UNKILLABLE ");
  EXPECT_EQ(seen[1], "");  // no reply: the server goes away
  EXPECT_EQ(shutdowns, 1);
  EXPECT_EQ(got.substr(0, 46), "-ERR Script killed by user with SCRIPT KILL...");
  log->flush();
  std::ifstream f(ao.path, std::ios::binary);
  std::stringstream bytes;
  bytes << f.rdbuf();
  EXPECT_EQ(bytes.str(), "");  // none of the abandoned script's writes
  // A script that ends normally logs its writes as one block.
  served = 100;
  EXPECT_EQ(r({"EVAL", "redis.call('set', 'a', '1') redis.call('del', 'b') return 1", "0"}),
            ":1\r\n");
  log->flush();
  std::ifstream g(ao.path, std::ios::binary);
  std::stringstream bytes2;
  bytes2 << g.rdbuf();
  EXPECT_EQ(
      bytes2.str(),
      "*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n*2\r\n$3\r\nDEL\r\n$1\r\nb\r\n"
      "*1\r\n$4\r\nEXEC\r\n");
  ex.reset();
  log.reset();
  std::remove(ao.path.c_str());
  ::rmdir(dir);
}

// The AOF, in a temporary directory, and what it holds.
struct script_aof {
  char dir[32] = "/tmp/kv-script-aof-XXXXXX";
  std::unique_ptr<kv::aof> log;
  std::string path;
  script_aof() {
    EXPECT_NE(::mkdtemp(dir), nullptr);
    kv::aof_options ao;
    path = ao.path = std::string(dir) + "/appendonly.aof";
    ao.fsync = kv::fsync_policy::no;
    std::string why;
    log = kv::aof::open(ao, why);
    EXPECT_TRUE(log) << why;
  }
  ~script_aof() {
    log.reset();
    std::remove(path.c_str());
    ::rmdir(dir);
  }
  std::string bytes() {
    log->flush();
    std::ifstream f(path, std::ios::binary);
    std::stringstream b;
    b << f.rdbuf();
    return b.str();
  }
};

// Loads `bytes` with the server's loader (load_aof) into `ex`, as a start does.
kv::aof_load_result load_script_log(kv::executor& ex, std::string_view bytes) {
  kv::aof_options o;
  return kv::load_aof(
      bytes.size(),
      [&](std::uint64_t off, char* buf, std::size_t len) -> std::int64_t {
        if (off >= bytes.size()) return 0;
        len = std::min<std::size_t>(len, bytes.size() - off);
        std::memcpy(buf, bytes.data() + off, len);
        return static_cast<std::int64_t>(len);
      },
      [&](std::span<const std::string_view> argv, std::string& why) {
        return ex.replay(argv, why);
      },
      o, {}, 5);
}

std::string aof_record(std::initializer_list<std::string_view> argv) {
  std::string out;
  std::vector<std::string_view> a(argv);
  kv::encode_command(out, a);
  return out;
}

// A script's block is the transaction block: the loader applies it whole, and
// a log cut anywhere inside it (before its EXEC) applies none of it.
TEST_F(kv_scripts, a_scripts_block_replays_whole_and_a_log_cut_inside_it_applies_none) {
  script_aof a;
  ex = std::make_unique<kv::executor>(*st, a.log.get(), cfg);
  EXPECT_EQ(r({"SET", "before", "0"}), "+OK\r\n");
  EXPECT_EQ(r({"EVAL", "redis.call('set', 'x', '1') redis.call('set', 'y', '2') return 1", "0"}),
            ":1\r\n");
  const std::string log = a.bytes();
  const std::string before = aof_record({"SET", "before", "0"});
  const std::string block = aof_record({"MULTI"}) + aof_record({"SET", "x", "1"}) +
                            aof_record({"SET", "y", "2"}) + aof_record({"EXEC"});
  ASSERT_EQ(log, before + block);
  for (std::size_t cut = before.size(); cut <= log.size(); ++cut) {
    auto st2 = env.make_store();
    kv::server_config cfg2;
    kv::executor ex2(*st2, nullptr, cfg2);
    kv::session s2;
    auto res = load_script_log(ex2, std::string_view(log).substr(0, cut));
    const bool whole = cut == log.size();
    EXPECT_EQ(run(ex2, s2, {"MGET", "before", "x", "y"}),
              whole ? "*3\r\n$1\r\n0\r\n$1\r\n1\r\n$1\r\n2\r\n" : "*3\r\n$1\r\n0\r\n$-1\r\n$-1\r\n")
        << "cut at " << cut;
    if (whole) {
      EXPECT_EQ(res.verdict, kv::aof_verdict::clean);
    } else if (cut > before.size()) {
      EXPECT_EQ(res.verdict, kv::aof_verdict::torn_tail) << cut;
      EXPECT_EQ(res.good_bytes, before.size()) << cut;  // cut from its MULTI on
    }
  }
  // Damage: a block inside a block, an EXEC without MULTI.
  {
    auto st2 = env.make_store();
    kv::server_config cfg2;
    kv::executor ex2(*st2, nullptr, cfg2);
    auto res = load_script_log(ex2, aof_record({"MULTI"}) + block);
    EXPECT_EQ(res.verdict, kv::aof_verdict::bad_record);
    EXPECT_EQ(res.why, "MULTI inside a transaction");
    res = load_script_log(ex2, aof_record({"EXEC"}));
    EXPECT_EQ(res.verdict, kv::aof_verdict::bad_record);
    EXPECT_EQ(res.why, "EXEC without MULTI");
  }
}

// EXEC's transaction wrapping and a script's capture compose: a script queued
// in MULTI adds no block of its own (one inside EXEC's would be damage), and
// the log loads whole.
TEST_F(kv_scripts, a_script_inside_exec_is_part_of_the_transactions_block) {
  script_aof a;
  ex = std::make_unique<kv::executor>(*st, a.log.get(), cfg);
  EXPECT_EQ(r({"MULTI"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", "a", "1"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"EVAL", "redis.call('set', 'b', '2') redis.call('set', 'c', '3') return 1", "0"}),
            "+QUEUED\r\n");
  EXPECT_EQ(r({"EVAL", "return redis.call('get', 'b')", "0"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"EXEC"}), "*3\r\n+OK\r\n:1\r\n$1\r\n2\r\n");
  // A transaction whose only writes are a script's: the same single block.
  EXPECT_EQ(r({"MULTI"}), "+OK\r\n");
  EXPECT_EQ(r({"EVAL", "redis.call('del', 'a') redis.call('set', 'd', '4') return 1", "0"}),
            "+QUEUED\r\n");
  EXPECT_EQ(r({"EXEC"}), "*1\r\n:1\r\n");
  // MULTI cannot run in a script (so no EXEC inside one either).
  EXPECT_EQ(r({"EVAL", "return redis.pcall('multi')", "0"}).substr(0, 50),
            "-ERR This Redis command is not allowed from script");
  const std::string log = a.bytes();
  EXPECT_EQ(log, aof_record({"MULTI"}) + aof_record({"SET", "a", "1"}) +
                     aof_record({"SET", "b", "2"}) + aof_record({"SET", "c", "3"}) +
                     aof_record({"EXEC"}) + aof_record({"MULTI"}) + aof_record({"DEL", "a"}) +
                     aof_record({"SET", "d", "4"}) + aof_record({"EXEC"}));
  auto st2 = env.make_store();
  kv::server_config cfg2;
  kv::executor ex2(*st2, nullptr, cfg2);
  kv::session s2;
  auto res = load_script_log(ex2, log);
  EXPECT_EQ(res.verdict, kv::aof_verdict::clean) << res.why;
  EXPECT_EQ(run(ex2, s2, {"MGET", "a", "b", "c", "d"}),
            "*4\r\n$-1\r\n$1\r\n2\r\n$1\r\n3\r\n$1\r\n4\r\n");
}

// SHUTDOWN NOSAVE abandoning a busy script that EXEC runs: the rest of the
// queue does not run and no EXEC record is written, so the loader applies
// none of the transaction (as if the process had died inside it).
TEST_F(kv_scripts, shutdown_nosave_of_a_script_inside_exec_cuts_the_transaction) {
  script_aof a;
  ex = std::make_unique<kv::executor>(*st, a.log.get(), cfg);
  cfg.busy_reply_threshold_ms = 20;
  int shutdowns = 0, served = 0;
  std::string seen;
  ex->hooks().shutdown = [&] { ++shutdowns; };
  ex->scripts().serve_others = [&] {
    if (++served == 1) seen = o({"SHUTDOWN", "NOSAVE"});
  };
  EXPECT_EQ(r({"SET", "before", "0"}), "+OK\r\n");
  EXPECT_EQ(r({"MULTI"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", "a", "1"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"EVAL", "redis.call('set', 'b', '2') while true do end", "0"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"SET", "c", "3"}), "+QUEUED\r\n");
  r({"EXEC"});
  EXPECT_EQ(shutdowns, 1);
  EXPECT_EQ(seen, "");
  EXPECT_EQ(r({"EXISTS", "c"}), ":0\r\n");  // the queue stopped at the script
  const std::string log = a.bytes();
  EXPECT_EQ(log, aof_record({"SET", "before", "0"}) + aof_record({"MULTI"}) +
                     aof_record({"SET", "a", "1"}));
  auto st2 = env.make_store();
  kv::server_config cfg2;
  kv::executor ex2(*st2, nullptr, cfg2);
  kv::session s2;
  auto res = load_script_log(ex2, log);
  EXPECT_EQ(res.verdict, kv::aof_verdict::torn_tail);
  EXPECT_TRUE(res.open_transaction);
  EXPECT_EQ(run(ex2, s2, {"MGET", "before", "a", "b"}), "*3\r\n$1\r\n0\r\n$-1\r\n$-1\r\n");
  // The executor goes on after it (a later EXEC is whole again).
  EXPECT_EQ(r({"MULTI"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", "e", "5"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"EXEC"}), "*1\r\n+OK\r\n");
}

// CONFIG sees the scripts' time limit under both of Redis 7's names.
TEST_F(kv_scripts, config_gets_and_sets_busy_reply_threshold_and_its_alias) {
  EXPECT_EQ(r({"CONFIG", "GET", "busy-reply-threshold"}),
            "*2\r\n$20\r\nbusy-reply-threshold\r\n$4\r\n5000\r\n");
  EXPECT_EQ(r({"CONFIG", "SET", "lua-time-limit", "250"}), "+OK\r\n");
  EXPECT_EQ(cfg.busy_reply_threshold_ms, 250u);
  EXPECT_EQ(r({"CONFIG", "GET", "lua-time-limit"}), "*2\r\n$14\r\nlua-time-limit\r\n$3\r\n250\r\n");
  EXPECT_EQ(r({"CONFIG", "SET", "busy-reply-threshold", "-1"}).substr(0, 60),
            "-ERR CONFIG SET failed (possibly related to argument 'busy-r");
}

}  // namespace
