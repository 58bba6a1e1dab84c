// The RESP request parser (incremental, inline, bounded) and the reply writer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "resp.hpp"

namespace kv = conveyor::kv;

namespace {

std::vector<std::string> to_strings(const std::vector<std::string_view>& v) {
  return {v.begin(), v.end()};
}

// Every command the parser yields for `input` fed in pieces of `step` bytes.
std::vector<std::vector<std::string>> parse_all(std::string_view input, std::size_t step,
                                                kv::parse_status* last = nullptr,
                                                const kv::parser_limits& lim = {}) {
  kv::request_parser p(lim);
  std::vector<std::vector<std::string>> cmds;
  std::vector<std::string_view> argv;
  kv::parse_status st = kv::parse_status::need_more;
  for (std::size_t i = 0; i < input.size(); i += step) {
    p.feed(input.substr(i, step));
    while ((st = p.next(argv)) == kv::parse_status::command) cmds.push_back(to_strings(argv));
    if (st == kv::parse_status::error) break;
  }
  if (last) *last = st;
  return cmds;
}

}  // namespace

TEST(resp_parser, multibulk_commands_in_one_piece_and_byte_by_byte) {
  std::string in = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nva\r\nl\r\n*1\r\n$4\r\nPING\r\n";
  for (std::size_t step : {in.size(), std::size_t{1}, std::size_t{3}, std::size_t{7}}) {
    auto cmds = parse_all(in, step);
    ASSERT_EQ(cmds.size(), 2u) << "step " << step;
    EXPECT_EQ(cmds[0], (std::vector<std::string>{"SET", "k", "va\r\nl"}));
    EXPECT_EQ(cmds[1], (std::vector<std::string>{"PING"}));
  }
}

TEST(resp_parser, binary_values_and_empty_bulks) {
  std::string v("\0\xff\r\n*$", 6);
  std::string in = "*3\r\n$3\r\nSET\r\n$0\r\n\r\n$6\r\n" + v + "\r\n";
  auto cmds = parse_all(in, 2);
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_EQ(cmds[0][1], "");
  EXPECT_EQ(cmds[0][2], v);
}

TEST(resp_parser, inline_commands_with_quotes_as_redis_cli_sends_them) {
  auto cmds = parse_all("PING\r\nset k \"a b\\x41\\n\" 'it\\'s'\nget   k\r\n\r\n", 1);
  ASSERT_EQ(cmds.size(), 4u);
  EXPECT_EQ(cmds[0], (std::vector<std::string>{"PING"}));
  EXPECT_EQ(cmds[1], (std::vector<std::string>{"set", "k", "a bA\n", "it's"}));
  EXPECT_EQ(cmds[2], (std::vector<std::string>{"get", "k"}));
  EXPECT_TRUE(cmds[3].empty());  // a blank line is an empty command, skipped by the server
}

TEST(resp_parser, unbalanced_quotes_are_a_protocol_error) {
  kv::parse_status st;
  parse_all("set k \"abc\r\n", 100, &st);
  EXPECT_EQ(st, kv::parse_status::error);
}

TEST(resp_parser, raw_control_bytes_in_an_inline_command_are_a_protocol_error) {
  kv::parse_status st;
  parse_all(std::string("\0\xff\xfegarbage\r\n", 13), 100, &st);
  EXPECT_EQ(st, kv::parse_status::error);
  parse_all("set k \x1b[2J\r\n", 100, &st);
  EXPECT_EQ(st, kv::parse_status::error);
  auto ok = parse_all("set k \"\\x00\\x1b\" \xc3\xa9\r\n", 100, &st);  // escapes and UTF-8 are fine
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0][2], std::string("\0\x1b", 2));
  EXPECT_EQ(ok[0][3], "\xc3\xa9");
}

// An RDMA client pointed at the RESP port sends an MPA request frame (no line
// end in it): it is answered at once, not left to its handshake timeout.
TEST(resp_parser, an_rdma_connection_request_is_an_error_at_once_naming_rdma_listen) {
  // RFC 5044's request key, then flags, revision, PD length and a kv hello.
  std::string mpa("MPA ID Req Frame\x50\x02\x00\x0c", 20);
  mpa += std::string(
      "\x80\x10\x80\x10"
      "CVKH"
      "\x00\x00\x00\x00",
      12);
  for (std::size_t step : {std::size_t{1}, std::size_t{7}, mpa.size()}) {
    kv::request_parser p;
    std::vector<std::string_view> argv;
    kv::parse_status st = kv::parse_status::need_more;
    for (std::size_t i = 0; i < mpa.size() && st == kv::parse_status::need_more; i += step) {
      p.feed(std::string_view(mpa).substr(i, step));
      st = p.next(argv);
    }
    EXPECT_EQ(st, kv::parse_status::error) << "fed " << step << " bytes at a time";
    EXPECT_NE(p.error().find("--rdma-listen"), std::string::npos) << p.error();
  }
  // A command that merely starts with "MPA" is a command.
  kv::parse_status st;
  auto ok = parse_all("MPA ID\r\n", 100, &st);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0][0], "MPA");
}

TEST(resp_parser, empty_and_null_multibulk_are_skipped) {
  auto cmds = parse_all("*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n", 1);
  ASSERT_EQ(cmds.size(), 3u);
  EXPECT_TRUE(cmds[0].empty());
  EXPECT_TRUE(cmds[1].empty());
  EXPECT_EQ(cmds[2][0], "PING");
}

TEST(resp_parser, huge_bulk_length_is_refused_before_any_allocation) {
  kv::request_parser p;
  p.feed("*1\r\n$99999999999\r\n");
  std::vector<std::string_view> argv;
  EXPECT_EQ(p.next(argv), kv::parse_status::error);
  EXPECT_NE(p.error().find("invalid bulk length"), std::string::npos);
  EXPECT_EQ(p.buffered(), 0u);
  // Once failed, it stays failed.
  p.feed("*1\r\n$4\r\nPING\r\n");
  EXPECT_EQ(p.next(argv), kv::parse_status::error);
}

TEST(resp_parser, bulk_length_above_the_limit_is_an_error) {
  kv::parser_limits lim;
  lim.max_bulk = 10;
  kv::parse_status st;
  auto ok = parse_all("*1\r\n$10\r\n0123456789\r\n", 100, &st, lim);
  EXPECT_EQ(ok.size(), 1u);
  parse_all("*1\r\n$11\r\n01234567890\r\n", 100, &st, lim);
  EXPECT_EQ(st, kv::parse_status::error);
}

TEST(resp_parser, too_many_arguments_is_an_error) {
  kv::parser_limits lim;
  lim.max_args = 4;
  kv::parse_status st;
  parse_all("*5\r\n", 100, &st, lim);
  EXPECT_EQ(st, kv::parse_status::error);
  parse_all("a b c d e\r\n", 100, &st, lim);
  EXPECT_EQ(st, kv::parse_status::error);
}

TEST(resp_parser, malformed_lengths_and_prefixes) {
  for (std::string_view bad :
       {"*x\r\n", "*1\r\n$x\r\n", "*1\r\n$-1\r\n", "*1\r\n:4\r\nPING\r\n", "*1\r\n$4\r\nPINGxx",
        "*1\n", "*2\r\n$1\r\na\r\n+OK\r\n", "*1\r\n$ 4\r\nPING\r\n", "*1\r\n$4\r\nPING\r\r"}) {
    kv::parse_status st;
    parse_all(bad, 1, &st);
    EXPECT_EQ(st, kv::parse_status::error) << bad;
  }
}

TEST(resp_parser, a_line_without_newline_is_bounded) {
  kv::parser_limits lim;
  lim.max_line = 100;
  kv::parse_status st;
  parse_all(std::string(101, 'a'), 1000, &st, lim);
  EXPECT_EQ(st, kv::parse_status::error);
  parse_all("*" + std::string(200, '1'), 1000, &st, lim);
  EXPECT_EQ(st, kv::parse_status::error);
  parse_all(std::string(99, 'a'), 1000, &st, lim);
  EXPECT_EQ(st, kv::parse_status::need_more);
}

TEST(resp_parser, buffered_bytes_of_one_command_are_bounded) {
  kv::parser_limits lim;
  lim.max_buffered = 1000;
  kv::request_parser p(lim);
  std::vector<std::string_view> argv;
  // Many small arguments, each within every other bound, never completing.
  p.feed("*100000\r\n");
  kv::parse_status st = kv::parse_status::need_more;
  for (int i = 0; i < 200 && st == kv::parse_status::need_more; ++i) {
    p.feed("$1\r\nx\r\n");
    st = p.next(argv);
  }
  EXPECT_EQ(st, kv::parse_status::error);
  EXPECT_LE(p.buffered(), 0u);
}

TEST(resp_parser, a_large_value_arriving_in_many_pieces) {
  std::string value(1 << 20, 'v');
  std::string in = "*2\r\n$3\r\nGET\r\n$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
  auto cmds = parse_all(in, 1000);
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_EQ(cmds[0][1], value);
}

TEST(resp_parser, consumed_stops_at_the_last_complete_command) {
  kv::request_parser p;
  std::string one = "*1\r\n$4\r\nPING\r\n";
  p.feed(one + one + "*2\r\n$3\r\nGET\r\n$5\r\nab");
  std::vector<std::string_view> argv;
  EXPECT_EQ(p.next(argv), kv::parse_status::command);
  EXPECT_EQ(p.next(argv), kv::parse_status::command);
  EXPECT_EQ(p.next(argv), kv::parse_status::need_more);
  EXPECT_EQ(p.consumed(), 2 * one.size());
  EXPECT_TRUE(p.partial());
  p.feed("cde\r\n");
  EXPECT_EQ(p.next(argv), kv::parse_status::command);
  EXPECT_EQ(to_strings(argv), (std::vector<std::string>{"GET", "abcde"}));
  EXPECT_FALSE(p.partial());
}

TEST(resp_reply, resp2_and_resp3_encodings) {
  std::string o2, o3;
  kv::reply r2(o2, 2), r3(o3, 3);
  for (auto* r : {&r2, &r3}) {
    r->simple("OK");
    r->error("ERR bad\r\nthing");
    r->integer(-42);
    r->bulk("ab");
    r->null();
    r->map(1);
    r->bulk("k");
    r->bulk("v");
    r->set(0);
  }
  EXPECT_EQ(
      o2,
      "+OK\r\n-ERR bad  thing\r\n:-42\r\n$2\r\nab\r\n$-1\r\n*2\r\n$1\r\nk\r\n$1\r\nv\r\n*0\r\n");
  EXPECT_EQ(
      o3, "+OK\r\n-ERR bad  thing\r\n:-42\r\n$2\r\nab\r\n_\r\n%1\r\n$1\r\nk\r\n$1\r\nv\r\n~0\r\n");
}

TEST(resp_reply, encoded_commands_parse_back) {
  std::string out;
  std::vector<std::string_view> in = {"SET", "key", std::string_view("\0\r\n", 3), ""};
  kv::encode_command(out, in);
  auto cmds = parse_all(out, 1);
  ASSERT_EQ(cmds.size(), 1u);
  EXPECT_EQ(cmds[0], (std::vector<std::string>{"SET", "key", std::string("\0\r\n", 3), ""}));
}
