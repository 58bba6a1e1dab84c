// libFuzzer target: conveyor-kv's append-only file loader (apps/kv/src/aof.*,
// load_aof over bytes in memory, no file and no store).
// Properties: the verdict, the records applied and every offset do not depend
// on how the reads are split; what the loader holds stays within one record
// plus one read; a clean load consumed every byte; a torn tail holds no
// complete record at a line start (else it would be damage) and is no longer
// than a record; a "complete record follows" verdict points at bytes that a
// fresh RESP parser reads as a command; the records applied are exactly what
// the RESP parser yields for the bytes kept; a record `apply` refuses stops the
// load, or is skipped and counted with skip_bad_records.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "aof.hpp"
#include "fuzz_check.hpp"
#include "resp.hpp"

namespace {

namespace kv = conveyor::kv;

struct outcome {
  kv::aof_load_result r;
  std::vector<std::vector<std::string>> applied;
  std::uint64_t refused = 0;
};

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if ((a[i] | 0x20) != (b[i] | 0x20)) return false;
  return true;
}

outcome load(std::string_view in, std::size_t chunk, const kv::aof_options& o) {
  outcome out;
  out.r = kv::load_aof(
      in.size(),
      [&](std::uint64_t off, char* buf, std::size_t len) -> std::int64_t {
        FUZZ_CHECK(off <= in.size());
        std::size_t n = in.size() - off < len ? in.size() - off : len;
        std::memcpy(buf, in.data() + off, n);
        return static_cast<std::int64_t>(n);
      },
      [&](std::span<const std::string_view> argv, std::string& why) {
        // "BAD ..." stands for a record the store refuses.
        if (iequal(argv[0], "BAD")) {
          ++out.refused;
          why = "refused";
          return false;
        }
        out.applied.emplace_back(argv.begin(), argv.end());
        return true;
      },
      o, {}, chunk);
  return out;
}

bool same(const outcome& a, const outcome& b) {
  return a.r.verdict == b.r.verdict && a.r.commands == b.r.commands && a.r.skipped == b.r.skipped &&
         a.r.good_bytes == b.r.good_bytes && a.r.damage_at == b.r.damage_at &&
         a.r.next_record == b.r.next_record && a.applied == b.applied;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t step = 1 + data[0] % 17;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  // Bounds small enough for the fuzzer to reach.
  kv::aof_options o;
  o.max_bulk = 1024;
  o.max_record = 4096;
  const std::size_t big_chunk = 1u << 16;
  // One record, or one inline line (the parser's line bound), whichever is more.
  const std::size_t hold = std::max<std::size_t>(o.max_record, kv::parser_limits{}.max_line + 64);

  for (bool skip : {false, true}) {
    o.skip_bad_records = skip;
    auto whole = load(in, big_chunk, o);
    auto split = load(in, step, o);
    FUZZ_CHECK(same(whole, split));
    const auto& r = whole.r;
    FUZZ_CHECK(r.peak_buffered <= hold + big_chunk);
    FUZZ_CHECK(split.r.peak_buffered <= hold + step);
    FUZZ_CHECK(r.commands == whole.applied.size());
    FUZZ_CHECK(r.good_bytes <= in.size());
    if (skip) {
      FUZZ_CHECK(r.verdict != kv::aof_verdict::bad_record);
      FUZZ_CHECK(r.skipped == whole.refused);
    } else {
      FUZZ_CHECK(r.skipped == 0);
      FUZZ_CHECK((r.verdict == kv::aof_verdict::bad_record) == (whole.refused == 1));
    }
    switch (r.verdict) {
      case kv::aof_verdict::clean:
        FUZZ_CHECK(r.good_bytes == in.size());
        break;
      case kv::aof_verdict::torn_tail: {
        FUZZ_CHECK(r.good_bytes < in.size());
        auto tail = in.substr(r.good_bytes);
        FUZZ_CHECK(tail.size() <= hold);
        FUZZ_CHECK(kv::find_complete_record(tail, o.max_bulk) == std::string_view::npos);
        break;
      }
      case kv::aof_verdict::damaged:
        FUZZ_CHECK(r.damage_at == r.good_bytes);
        if (r.next_record != 0) {
          FUZZ_CHECK(r.next_record > r.damage_at && r.next_record < in.size());
          kv::request_parser p;
          p.feed(in.substr(r.next_record));
          std::vector<std::string_view> argv;
          FUZZ_CHECK(p.next(argv) == kv::parse_status::command && !argv.empty());
        }
        break;
      case kv::aof_verdict::bad_record:
        FUZZ_CHECK(r.damage_at == r.good_bytes && !r.command.empty());
        break;
      case kv::aof_verdict::read_error:
        FUZZ_CHECK(false);  // the reads above never fail
        break;
    }
    // Oracle: the RESP parser with no tight bound, over the bytes kept, yields
    // exactly the records applied (and the refused ones).
    kv::parser_limits lim;
    lim.max_bulk = o.max_bulk;
    lim.max_buffered = o.max_record;
    kv::request_parser p(lim);
    p.feed(in.substr(0, r.good_bytes));
    std::vector<std::string_view> argv;
    std::vector<std::vector<std::string>> seen;
    while (p.next(argv) == kv::parse_status::command)
      if (!argv.empty() && !iequal(argv[0], "BAD")) seen.emplace_back(argv.begin(), argv.end());
    FUZZ_CHECK(p.consumed() == r.good_bytes);
    FUZZ_CHECK(seen == whole.applied);
  }
  return 0;
}
