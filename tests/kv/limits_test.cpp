// What one command may make the server build or spend: replies bounded as they
// are built (session::max_reply), commands with side effects that check first,
// glob matching with bounded work, and Redis's glob meanings kept.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kv_fixture.hpp"

namespace kv = conveyor::kv;

namespace {

struct limits : ::testing::Test {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store(8u << 20);  // values up to 2 MiB
  kv::server_config cfg;
  std::unique_ptr<kv::executor> ex = std::make_unique<kv::executor>(*st, nullptr, cfg);
  kv::session s;
  std::string run(const std::vector<std::string_view>& a) {
    std::string out;
    ex->execute(s, a, out);
    return out;
  }
  static bool too_large(const std::string& reply) {
    return reply.starts_with("-ERR reply exceeds");
  }
};

}  // namespace

TEST_F(limits, mget_of_one_key_many_times_stops_at_the_reply_bound) {
  const std::string big(1u << 20, 'b');
  ASSERT_EQ(run({"SET", "big", big}), "+OK\r\n");
  s.max_reply = 4u << 20;
  std::vector<std::string_view> argv{"MGET"};
  for (int i = 0; i < 100; ++i) argv.push_back("big");  // 100 MiB of reply unbounded
  std::string out;
  ex->execute(s, argv, out);
  EXPECT_TRUE(too_large(out)) << out.substr(0, 60);
  // Built no further than the bound (plus the string's own growth).
  EXPECT_LE(out.capacity(), 8u << 20);
  // Within the bound it is the usual reply; the output before it is kept.
  std::string two = "+earlier\r\n";
  std::vector<std::string_view> small{"MGET", "big", "none", "big"};
  ex->execute(s, small, two);
  EXPECT_TRUE(two.starts_with("+earlier\r\n*3\r\n$1048576\r\n"));
  EXPECT_EQ(two.size(), 10 + 4 + 2 * (10 + (1u << 20) + 2) + 5);
}

TEST_F(limits, keys_scan_and_command_stop_at_the_reply_bound) {
  for (int i = 0; i < 200; ++i)
    ASSERT_EQ(run({"SET", "key:" + std::to_string(i) + std::string(1000, 'k'), "v"}), "+OK\r\n");
  s.max_reply = 16u << 10;
  EXPECT_TRUE(too_large(run({"KEYS", "*"})));
  EXPECT_TRUE(too_large(run({"KEYS", "key:*"})));
  EXPECT_TRUE(too_large(run({"SCAN", "0", "COUNT", "100000"})));
  std::vector<std::string_view> info{"COMMAND", "INFO"};
  for (int i = 0; i < 10000; ++i) info.push_back("get");
  EXPECT_TRUE(too_large(run(info)));
  EXPECT_EQ(run({"KEYS", "key:7k*"}).substr(0, 4), "*1\r\n");  // small replies still fine
  s.max_reply = 1024;
  EXPECT_TRUE(too_large(run({"COMMAND"})));
  EXPECT_TRUE(too_large(run({"COMMAND", "DOCS"})));
  s.max_reply = static_cast<std::size_t>(-1);
  EXPECT_EQ(run({"KEYS", "*"}).substr(0, 6), "*200\r\n");
}

TEST_F(limits, commands_that_change_data_check_the_reply_fits_first) {
  const std::string big(64u << 10, 'v');
  ASSERT_EQ(run({"SET", "k", big}), "+OK\r\n");
  s.max_reply = 4u << 10;
  EXPECT_TRUE(too_large(run({"GETDEL", "k"})));
  EXPECT_TRUE(too_large(run({"GETSET", "k", "new"})));
  EXPECT_TRUE(too_large(run({"SET", "k", "new", "GET"})));
  EXPECT_TRUE(too_large(run({"GET", "k"})));
  s.max_reply = static_cast<std::size_t>(-1);
  EXPECT_EQ(run({"GET", "k"}), "$65536\r\n" + big + "\r\n");  // nothing was lost
  EXPECT_EQ(run({"GETDEL", "k"}), "$65536\r\n" + big + "\r\n");
}

TEST(glob, redis_meanings) {
  struct row {
    const char* pattern;
    const char* s;
    bool nocase, match;
  };
  const row rows[] = {
      {"*", "", false, true},
      {"*", "abc", false, true},
      {"**", "", false, true},
      {"a*", "abc", false, true},
      {"a*", "bac", false, false},
      {"*c", "abc", false, true},
      {"a**", "a", false, true},
      {"a*a", "a", false, false},
      {"a*b*c", "abbbc", false, true},
      {"*a*b*", "xaxbx", false, true},
      {"*a*b", "xaxbx", false, false},
      {"*a*b", "xaxbxb", false, true},
      {"a?c", "abc", false, true},
      {"a?c", "ac", false, false},
      {"?", "", false, false},
      {"*?", "", false, false},
      {"*?", "a", false, true},
      {"h[ae]llo", "hello", false, true},
      {"h[ae]llo", "hallo", false, true},
      {"h[ae]llo", "hillo", false, false},
      {"h[^e]llo", "hallo", false, true},
      {"h[^e]llo", "hello", false, false},
      {"h[a-b]llo", "hbllo", false, true},
      {"h[a-b]llo", "hcllo", false, false},
      {"h[b-a]llo", "hallo", false, true},  // reversed ranges are swapped
      {"\\*", "*", false, true},
      {"\\*", "a", false, false},
      {"a\\?c", "a?c", false, true},
      {"a\\?c", "abc", false, false},
      {"h\\[ello", "h[ello", false, true},
      {"[\\]]", "]", false, true},
      {"[\\-]", "-", false, true},
      {"[abc", "b", false, true},  // an unterminated class runs to the end
      {"[abc", "d", false, false},
      {"[", "a", false, false},
      {"[]", "x", false, false},   // an empty class matches nothing
      {"[^]", "x", false, true},   // and its negation anything
      {"[a-]", "_", false, true},  // a-] is the range ']'..'a' in Redis
      {"[a-]", "-", false, false},
      {"\\", "\\", false, true},  // a trailing backslash is itself
      {"[x\\", "\\", false, true},
      {"H[A-Z]LLO", "hello", true, true},
      {"[a-z]", "Q", true, true},
      {"[a-z]", "Q", false, false},
      {"[\\A]", "a", true, false},  // an escaped byte in a class is exact
      {"*maxmemory*", "MAXMEMORY-policy", true, true},
      {"user:*:name", "user:42:name", false, true},
      {"user:*:name", "user:42:names", false, false},
      {"*a*a*a*a*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false, false},
  };
  for (const auto& r : rows)
    EXPECT_EQ(kv::glob_match(r.pattern, r.s, r.nocase), r.match)
        << "pattern '" << r.pattern << "' string '" << r.s << "' nocase " << r.nocase;
}

namespace {
// Redis's stringmatchlen, written the plain recursive way (exponential, so
// only for short inputs): the reference glob_pattern must agree with.
bool reference_match(std::string_view p, std::string_view s, bool nocase) {
  auto low = [&](int c) { return nocase && c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; };
  while (!p.empty() && !s.empty()) {
    const char c = p[0];
    if (c == '*') {
      while (p.size() > 1 && p[1] == '*') p.remove_prefix(1);
      if (p.size() == 1) return true;
      for (std::size_t k = 0; k < s.size(); ++k)
        if (reference_match(p.substr(1), s.substr(k), nocase)) return true;
      return false;
    }
    if (c == '?') {
      p.remove_prefix(1);
      s.remove_prefix(1);
      continue;
    }
    if (c == '[') {
      p.remove_prefix(1);
      const bool negate = !p.empty() && p[0] == '^';
      if (negate) p.remove_prefix(1);
      bool match = false;
      while (true) {
        if (p.size() >= 2 && p[0] == '\\') {
          p.remove_prefix(1);
          if (p[0] == s[0]) match = true;
        } else if (p.empty() || p[0] == ']') {
          break;
        } else if (p.size() >= 3 && p[1] == '-') {
          int a = static_cast<signed char>(p[0]), b = static_cast<signed char>(p[2]);
          if (a > b) std::swap(a, b);
          const int x = low(static_cast<signed char>(s[0]));
          if (x >= low(a) && x <= low(b)) match = true;
          p.remove_prefix(2);
        } else if (low(static_cast<signed char>(p[0])) == low(static_cast<signed char>(s[0]))) {
          match = true;
        }
        p.remove_prefix(1);
      }
      if (!p.empty()) p.remove_prefix(1);  // the ']'
      if (negate) match = !match;
      if (!match) return false;
      s.remove_prefix(1);
      continue;
    }
    if (c == '\\' && p.size() >= 2) p.remove_prefix(1);
    if (low(static_cast<signed char>(p[0])) != low(static_cast<signed char>(s[0]))) return false;
    p.remove_prefix(1);
    s.remove_prefix(1);
  }
  if (s.empty())
    while (!p.empty() && p[0] == '*') p.remove_prefix(1);
  return p.empty() && s.empty();
}
}  // namespace

TEST(glob, agrees_with_redis_on_random_patterns) {
  std::mt19937 rng(20261206);
  const std::string pat_alphabet = "ab*?[]^-\\A\xe9";
  const std::string str_alphabet = "abAB-]^\\*?[\xe9";
  auto pick = [&](const std::string& from, std::size_t max) {
    std::string out(rng() % (max + 1), ' ');
    for (auto& ch : out) ch = from[rng() % from.size()];
    return out;
  };
  for (int i = 0; i < 100000; ++i) {
    const auto p = pick(pat_alphabet, 8), s = pick(str_alphabet, 9);
    const bool nocase = (i & 1) != 0;
    ASSERT_EQ(kv::glob_pattern(p, nocase).match(s), reference_match(p, s, nocase))
        << "pattern '" << p << "' string '" << s << "' nocase " << nocase;
  }
}

TEST(glob, a_hostile_pattern_over_a_512_kib_key_does_bounded_work) {
  // '*' then half the key's length of 'a' then 'b', over 512 KiB of 'a': the
  // star-backtracking matcher compared O(pattern x key) bytes (~115 s).
  const std::string key(512u << 10, 'a');
  const std::string a256(256u << 10, 'a'), a128(128u << 10, 'a');
  const std::string tail = "*" + a256 + "b";                // anchored at the end
  const std::string plain = "*" + a256 + "b*";              // searched (memmem)
  const std::string wild = "*" + a128 + "?" + a128 + "b*";  // searched position by position
  const std::string found = "*" + a128 + "?" + a128 + "*";  // a match, at the first place
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t steps = 0;
  EXPECT_FALSE(kv::glob_pattern(tail).match(key, &steps));
  EXPECT_LE(steps, key.size() + tail.size());
  EXPECT_FALSE(kv::glob_pattern(plain).match(key, &steps));
  EXPECT_LE(steps, 4 * (key.size() + plain.size()));
  EXPECT_FALSE(kv::glob_pattern(wild).match(key, &steps));  // the work bound ends it
  EXPECT_LE(steps, 64 * (key.size() + wild.size()) + 4096 + wild.size());
  EXPECT_TRUE(kv::glob_pattern(found).match(key, &steps));
  EXPECT_LE(steps, key.size() + found.size());
  // A pattern longer than any key is not even compiled: it matches nothing.
  const std::string longest(kv::glob_pattern::max_elements, 'x');
  EXPECT_TRUE(kv::glob_pattern(std::string(longest.size(), '?')).match(longest));
  EXPECT_FALSE(kv::glob_pattern("*" + std::string(longest.size() + 1, '?')).match(longest + "x"));
  // A generous bound, not a timing: the quadratic matcher needs minutes here.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST_F(limits, keys_with_a_hostile_pattern_over_a_512_kib_key_returns) {
  const std::string key(512u << 10, 'a');
  ASSERT_EQ(run({"SET", key, "v"}), "+OK\r\n");
  const std::string pattern = "*" + std::string(256u << 10, 'a') + "b";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run({"KEYS", pattern}), "*0\r\n");
  EXPECT_EQ(run({"SCAN", "0", "MATCH", pattern, "COUNT", "100000"}).substr(0, 4), "*2\r\n");
  EXPECT_EQ(run({"KEYS", "*a"}).size(), 4 + 9 + key.size() + 2);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(password, compared_whole) {
  EXPECT_TRUE(kv::password_equal("s3cret", "s3cret"));
  EXPECT_FALSE(kv::password_equal("s3cret", "s3cre"));
  EXPECT_FALSE(kv::password_equal("s3cret", "s3crett"));
  EXPECT_FALSE(kv::password_equal("s3cret", "s3creT"));
  EXPECT_FALSE(kv::password_equal("s3cret", ""));
  EXPECT_FALSE(kv::password_equal("ab", "abab"));  // the cyclic compare is not fooled
  EXPECT_TRUE(kv::password_equal("", ""));
  EXPECT_FALSE(kv::password_equal("", "x"));
}
