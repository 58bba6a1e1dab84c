// Redis Cluster's CRC16 (XMODEM) and hash-tag rules (slots.hpp).
#include "cluster/slots.hpp"

#include <array>

namespace conveyor::kv::cluster {

namespace {

// One entry per leading byte: the CRC of that byte shifted through the
// polynomial 0x1021 eight times (MSB first, as XMODEM defines it).
constexpr std::array<std::uint16_t, 256> make_table() {
  std::array<std::uint16_t, 256> t{};
  for (unsigned b = 0; b < 256; ++b) {
    auto c = static_cast<std::uint16_t>(b << 8);
    for (int i = 0; i < 8; ++i)
      c = static_cast<std::uint16_t>((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
    t[b] = c;
  }
  return t;
}

constexpr auto table = make_table();

}  // namespace

std::uint16_t crc16(std::string_view bytes) noexcept {
  std::uint16_t c = 0;
  for (char ch : bytes)
    c = static_cast<std::uint16_t>((c << 8) ^
                                   table[((c >> 8) ^ static_cast<unsigned char>(ch)) & 0xff]);
  return c;
}

std::string_view hash_tag(std::string_view key) noexcept {
  auto open = key.find('{');
  if (open == std::string_view::npos) return key;
  auto close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

std::uint16_t slot_of(std::string_view key) noexcept {
  return static_cast<std::uint16_t>(crc16(hash_tag(key)) & (slot_count - 1));
}

}  // namespace conveyor::kv::cluster
