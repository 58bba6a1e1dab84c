// Expiry arithmetic at its bounds (every form refuses what would overflow, as
// Redis does) and the replay of logged expiry times that are already past.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <string>
#include <thread>

#include "kv_fixture.hpp"

namespace kv = conveyor::kv;
using kvtest::run;

namespace {

constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t i64_min = std::numeric_limits<std::int64_t>::min();

struct expiry : ::testing::Test {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store();
  kv::server_config cfg;
  std::unique_ptr<kv::executor> ex = std::make_unique<kv::executor>(*st, nullptr, cfg);
  kv::session s;
  std::string r(std::initializer_list<std::string_view> a) { return run(*ex, s, a); }
  bool replay(std::initializer_list<std::string_view> a, std::string& why) {
    std::vector<std::string_view> v(a);
    return ex->replay(v, why);
  }
  // A positive remaining time, in ms (PTTL's reply parsed).
  std::int64_t pttl(std::string_view k) {
    auto t = r({"PTTL", k});
    return std::stoll(t.substr(1));
  }
};

std::string str(std::int64_t v) {
  return std::to_string(v);
}

}  // namespace

TEST_F(expiry, psetex_at_int64_max_is_refused_as_redis_does) {
  EXPECT_EQ(r({"PSETEX", "k", str(i64_max), "v"}),
            "-ERR invalid expire time in 'psetex' command\r\n");
  EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n");
  // The largest accepted relative times still give a positive, sane TTL.
  EXPECT_EQ(r({"PSETEX", "k", str(i64_max - kv::now_ms() - 60'000), "v"}), "+OK\r\n");
  EXPECT_GT(pttl("k"), 0);
  EXPECT_EQ(r({"PSETEX", "k", "0", "v"}), "-ERR invalid expire time in 'psetex' command\r\n");
  EXPECT_EQ(r({"PSETEX", "k", "-5", "v"}), "-ERR invalid expire time in 'psetex' command\r\n");
}

TEST_F(expiry, setex_at_its_bound_never_overflows) {
  // The old bound (v <= max/1000 - now/1000) let v * 1000 + now overflow when
  // now % 1000 > 807: wait for such a phase, so the case is the same every run.
  auto now = kv::now_ms();
  for (int i = 0; i < 200 && (now % 1000 < 850 || now % 1000 > 950); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    now = kv::now_ms();
  }
  ASSERT_TRUE(now % 1000 >= 850 && now % 1000 <= 950) << now;
  const std::int64_t bound = i64_max / 1000 - now / 1000;
  EXPECT_EQ(r({"SETEX", "k", str(bound), "v"}), "-ERR invalid expire time in 'setex' command\r\n");
  EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n");
  EXPECT_EQ(r({"SETEX", "k", str(i64_max), "v"}),
            "-ERR invalid expire time in 'setex' command\r\n");
  // One second less fits (until now % 1000 passes 807 a second later).
  EXPECT_EQ(r({"SETEX", "k", str(bound - 2), "v"}), "+OK\r\n");
  EXPECT_GT(pttl("k"), 0);
}

TEST_F(expiry, every_expiry_form_is_overflow_checked) {
  const auto mx = str(i64_max), mn = str(i64_min);
  for (auto opt : {"EX", "PX", "EXAT"}) {
    EXPECT_EQ(r({"SET", "k", "v", opt, mx}), "-ERR invalid expire time in 'set' command\r\n")
        << opt;
    EXPECT_EQ(r({"SET", "k", "v", opt, mn}), "-ERR invalid expire time in 'set' command\r\n")
        << opt;
  }
  EXPECT_EQ(r({"SET", "k", "v", "PXAT", mn}), "-ERR invalid expire time in 'set' command\r\n");
  EXPECT_EQ(r({"SET", "k", "v", "PXAT", mx}), "+OK\r\n");  // absolute: far away, no arithmetic
  EXPECT_GT(pttl("k"), 0);
  EXPECT_EQ(r({"SET", "k", "v", "EX", str(i64_max / 1000)}),
            "-ERR invalid expire time in 'set' command\r\n");
  EXPECT_EQ(r({"SET", "k", "v"}), "+OK\r\n");
  EXPECT_EQ(r({"EXPIRE", "k", mx}), "-ERR invalid expire time in 'expire' command\r\n");
  EXPECT_EQ(r({"EXPIRE", "k", mn}), "-ERR invalid expire time in 'expire' command\r\n");
  EXPECT_EQ(r({"PEXPIRE", "k", mx}), "-ERR invalid expire time in 'pexpire' command\r\n");
  EXPECT_EQ(r({"EXPIREAT", "k", mx}), "-ERR invalid expire time in 'expireat' command\r\n");
  EXPECT_EQ(r({"TTL", "k"}), ":-1\r\n");
  EXPECT_EQ(r({"PEXPIREAT", "k", mx}), ":1\r\n");
  EXPECT_GT(pttl("k"), 0);
}

TEST_F(expiry, replay_of_an_expiry_in_the_past_is_a_deletion) {
  std::string why;
  // What an older server logged for PSETEX k INT64_MAX: a negative PXAT.
  EXPECT_EQ(r({"SET", "k", "old"}), "+OK\r\n");
  EXPECT_TRUE(replay({"SET", "k", "v", "PXAT", "-9223370240324708176"}, why)) << why;
  EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n");
  for (auto t : {"0", "1", "-1", "-9223372036854775808"}) {
    EXPECT_EQ(r({"SET", "k", "old"}), "+OK\r\n");
    EXPECT_TRUE(replay({"SET", "k", "v", "PXAT", t}, why)) << t << ": " << why;
    EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n") << t;
    EXPECT_EQ(r({"SET", "k", "old"}), "+OK\r\n");
    EXPECT_TRUE(replay({"SET", "k", "v", "EXAT", t}, why)) << t << ": " << why;
    EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n") << t;
    EXPECT_EQ(r({"SET", "k", "old"}), "+OK\r\n");
    EXPECT_TRUE(replay({"PEXPIREAT", "k", t}, why)) << t << ": " << why;
    EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n") << t;
    EXPECT_EQ(r({"SET", "k", "old"}), "+OK\r\n");
    EXPECT_TRUE(replay({"EXPIREAT", "k", t}, why)) << t << ": " << why;
    EXPECT_EQ(r({"EXISTS", "k"}), ":0\r\n") << t;
  }
  // A past time on a key that does not exist is no error either.
  EXPECT_TRUE(replay({"SET", "absent", "v", "PXAT", "-5"}, why)) << why;
  EXPECT_EQ(r({"DBSIZE"}), ":0\r\n");
  // Clients still get Redis's errors for the same times.
  EXPECT_EQ(r({"SET", "k", "v", "PXAT", "-5"}), "-ERR invalid expire time in 'set' command\r\n");
  EXPECT_EQ(r({"SET", "k", "v", "PXAT", "0"}), "-ERR invalid expire time in 'set' command\r\n");
  // A future time replays as a TTL.
  const auto later = str(kv::now_ms() + 100'000);
  EXPECT_TRUE(replay({"SET", "k", "v", "PXAT", later}, why)) << why;
  EXPECT_GT(pttl("k"), 90'000);
}

TEST_F(expiry, a_refused_replayed_record_says_what_and_why) {
  std::string why;
  EXPECT_FALSE(replay({"SET", "k", "v", "PX", "0"}, why));
  EXPECT_NE(why.find("SET"), std::string::npos) << why;
  EXPECT_NE(why.find("invalid expire time"), std::string::npos) << why;
  EXPECT_FALSE(replay({"GET", "k"}, why));
  EXPECT_NE(why.find("not a logged command"), std::string::npos) << why;
}
