// libFuzzer target: conveyor-kv's replication protocol bytes
// (apps/kv/src/repl/wire.*), which a primary reads from its replicas and a
// replica from its primary. Properties: no input crashes either reader; a
// message that decodes re-encodes to the same header bytes and is never one
// the other side would also accept; a hello that decodes re-encodes to the
// same bytes (up to its password's end).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "repl/wire.hpp"

namespace repl = conveyor::kv::repl;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = conveyor::fuzz::as_bytes(data, size);
  std::string why;
  for (auto who : {repl::reader::primary, repl::reader::replica}) {
    auto h = repl::decode(in, who, why);
    if (!h) continue;
    std::array<std::byte, repl::header_bytes> again;
    repl::encode(*h, again);
    FUZZ_CHECK(conveyor::fuzz::same_bytes(again, in.first(repl::header_bytes)));
    FUZZ_CHECK(h->len == size - repl::header_bytes);
    const auto other = who == repl::reader::primary ? repl::reader::replica : repl::reader::primary;
    FUZZ_CHECK(!repl::decode(in, other, why).has_value());
  }
  if (auto h = repl::decode_hello(in, why)) {
    const auto again = repl::encode_hello(*h);
    FUZZ_CHECK(again.size() <= size);
    FUZZ_CHECK(conveyor::fuzz::same_bytes(again, in.first(again.size())));
  }
  return 0;
}
