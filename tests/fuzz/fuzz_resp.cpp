// libFuzzer target: conveyor-kv's RESP request parser (apps/kv/src/resp.*).
// Properties: the commands and final status do not depend on how the bytes are
// split across feed() calls; every multibulk command re-encodes and parses back
// to itself; what the parser holds while waiting stays within its limits; the
// inline splitter and glob matcher never crash on any bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "fuzz_check.hpp"
#include "resp.hpp"

namespace {

using conveyor::kv::parse_status;
using conveyor::kv::parser_limits;
using conveyor::kv::request_parser;

struct outcome {
  std::vector<std::vector<std::string>> cmds;
  parse_status last = parse_status::need_more;
};

outcome run(std::string_view in, std::size_t step, const parser_limits& lim) {
  request_parser p(lim);
  outcome o;
  std::vector<std::string_view> argv;
  for (std::size_t i = 0; i < in.size() && o.last != parse_status::error; i += step) {
    p.feed(in.substr(i, step));
    while ((o.last = p.next(argv)) == parse_status::command)
      o.cmds.emplace_back(argv.begin(), argv.end());
    if (o.last == parse_status::need_more) {
      std::size_t bound = lim.max_buffered > lim.max_line + 2 ? lim.max_buffered : lim.max_line + 2;
      FUZZ_CHECK(p.buffered() <= bound);
    }
    if (o.last == parse_status::error) FUZZ_CHECK(p.buffered() == 0);
  }
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::size_t step = 1 + data[0] % 17;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  // Limits small enough for the fuzzer to reach, large enough that the whole
  // input fits (so splitting cannot change which bound trips first).
  parser_limits lim;
  lim.max_bulk = 1024;
  lim.max_args = 64;
  lim.max_line = 256;
  lim.max_buffered = 1 << 20;
  auto whole = run(in, in.size() == 0 ? 1 : in.size(), lim);
  auto split = run(in, step, lim);
  FUZZ_CHECK(whole.last == split.last || in.empty());
  FUZZ_CHECK(whole.cmds == split.cmds);

  for (const auto& c : whole.cmds) {
    if (c.empty()) continue;
    std::vector<std::string_view> v(c.begin(), c.end());
    std::string enc;
    conveyor::kv::encode_command(enc, v);
    parser_limits big;
    request_parser p(big);
    p.feed(enc);
    std::vector<std::string_view> back;
    FUZZ_CHECK(p.next(back) == parse_status::command);
    FUZZ_CHECK(std::vector<std::string>(back.begin(), back.end()) == c);
    FUZZ_CHECK(p.consumed() == enc.size());
  }

  // Tight buffering limit: only the bound is checked (splitting may trip it earlier).
  parser_limits tight = lim;
  tight.max_buffered = 64;
  run(in, step, tight);

  std::vector<std::string> parts;
  conveyor::kv::split_inline(in, parts);
  auto half = in.size() / 2;
  conveyor::kv::glob_match(in.substr(0, half < 64 ? half : 64), in.substr(half));
  return 0;
}
