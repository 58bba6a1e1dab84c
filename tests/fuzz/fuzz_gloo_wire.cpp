// libFuzzer target for conveyor-gloo's wire decoders (apps/gloo/src/wire.hpp):
// the message header every SEND carries, the pair address that comes through
// the rendezvous store, and the handshake's hello and reply (connection
// private data from whoever connects). The first input byte picks the
// decoder, the rest is its input. Properties:
//  - each decoder accepts exactly what its rules say (an independent check
//    of length, magic, type, flags);
//  - a decoded value re-encodes to the input, byte for byte, up to the bytes
//    the format ignores (the header's reserved bytes 6..7, the unused tail of
//    each address string); re-decoding gives the same value;
//  - decoded address strings are within their capacity and printable.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.hpp"
#include "wire.hpp"

namespace {

namespace wire = conveyor_gloo::wire;

bool same(const wire::header& a, const wire::header& b) {
  return a.type == b.type && a.flags == b.flags && a.credits == b.credits && a.slot == b.slot &&
         a.token == b.token && a.nbytes == b.nbytes && a.addr == b.addr && a.rkey == b.rkey;
}

bool same(const wire::address& a, const wire::address& b) {
  return a.rank == b.rank && std::memcmp(a.key, b.key, sizeof a.key) == 0 &&
         std::memcmp(a.nonce, b.nonce, sizeof a.nonce) == 0 &&
         std::memcmp(a.host_id, b.host_id, sizeof a.host_id) == 0 && a.forced == b.forced &&
         a.soft == b.soft && a.shm == b.shm && a.verbs == b.verbs;
}

void check_header(const std::byte* in, std::size_t n) {
  auto h = wire::decode(in, n);
  bool want = n >= wire::header_size && wire::get32(in) == wire::msg_magic &&
              std::to_integer<int>(in[4]) >= 1 && std::to_integer<int>(in[4]) <= 10 &&
              (std::to_integer<int>(in[5]) & ~int(wire::flag_notify)) == 0;
  FUZZ_CHECK(h.has_value() == want);
  if (!h) return;
  std::byte out[wire::header_size];
  wire::encode(*h, out);
  std::byte canon[wire::header_size];
  std::memcpy(canon, in, sizeof canon);
  canon[6] = canon[7] = std::byte{0};  // reserved: ignored on decode, zero on encode
  FUZZ_CHECK(std::memcmp(out, canon, sizeof out) == 0);
  auto again = wire::decode(out, sizeof out);
  FUZZ_CHECK(again && same(*again, *h));
}

void check_address(const std::byte* in, std::size_t n) {
  std::vector<char> bytes(reinterpret_cast<const char*>(in), reinterpret_cast<const char*>(in) + n);
  auto a = wire::decode_address(bytes);
  if (n != wire::addr_size || wire::get32(in) != wire::addr_magic) {
    FUZZ_CHECK(!a);
    return;
  }
  struct field {
    std::size_t off, cap;
  };
  const field fields[] = {
      {64, wire::forced_cap}, {80, wire::soft_cap}, {114, wire::shm_cap}, {150, wire::verbs_cap}};
  bool want = true;
  for (auto f : fields) {
    std::size_t len = std::to_integer<std::size_t>(in[f.off]);
    if (len > f.cap - 1) {
      want = false;
      continue;
    }
    for (std::size_t i = 0; i < len; ++i) {
      int c = std::to_integer<int>(in[f.off + 1 + i]);
      if (c < 0x21 || c > 0x7e) want = false;
    }
  }
  FUZZ_CHECK(a.has_value() == want);
  if (!a) return;
  FUZZ_CHECK(a->forced.size() < wire::forced_cap && a->soft.size() < wire::soft_cap &&
             a->shm.size() < wire::shm_cap && a->verbs.size() < wire::verbs_cap);
  auto out = wire::encode(*a);
  FUZZ_CHECK(out.size() == wire::addr_size);
  std::vector<char> canon = bytes;
  for (auto f : fields) {  // the bytes after each string are not part of it
    std::size_t len = std::to_integer<std::size_t>(in[f.off]);
    std::memset(canon.data() + f.off + 1 + len, 0, f.cap - 1 - len);
  }
  FUZZ_CHECK(out == canon);
  auto again = wire::decode_address(out);
  FUZZ_CHECK(again && same(*again, *a));
}

void check_hello(const std::byte* in, std::size_t n) {
  auto h = wire::decode_hello(in, n);
  FUZZ_CHECK(h.has_value() == (n == wire::hello_size && wire::get32(in) == wire::hello_magic));
  if (!h) return;
  auto out = wire::encode(*h);
  FUZZ_CHECK(out.size() == n && std::memcmp(out.data(), in, n) == 0);
}

void check_reply(const std::byte* in, std::size_t n) {
  auto r = wire::decode_reply(in, n);
  FUZZ_CHECK(r.has_value() == (n == wire::reply_size && wire::get32(in) == wire::reply_magic));
  if (!r) return;
  auto out = wire::encode(*r);
  FUZZ_CHECK(out.size() == n && std::memcmp(out.data(), in, n) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  // A copy of exactly the input's length, so ASan sees any read past its end.
  std::vector<std::byte> body(size - 1);
  if (!body.empty()) std::memcpy(body.data(), data + 1, body.size());
  const std::byte* in = body.empty() ? nullptr : body.data();
  // The decoders read fixed offsets only once the length allows them.
  static const std::byte none[1] = {};
  if (in == nullptr) in = none;
  switch (data[0] % 4) {
    case 0:
      check_header(in, body.size());
      break;
    case 1:
      check_address(in, body.size());
      break;
    case 2:
      check_hello(in, body.size());
      break;
    default:
      check_reply(in, body.size());
      break;
  }
  return 0;
}
