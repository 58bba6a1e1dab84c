// Small helpers for unit tests that compare wire bytes: hex literals to bytes,
// bytes to hex for readable failure messages, and typed views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::test {

// "000e c140 ..." -> bytes; spaces are ignored.
inline std::vector<std::byte> from_hex(std::string_view hex) {
  auto nibble = [](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<unsigned>(c - 'A' + 10);
    return 0x100;  // invalid
  };
  std::vector<std::byte> out;
  unsigned hi = 0x100;
  for (char c : hex) {
    if (c == ' ') continue;
    const unsigned n = nibble(c);
    if (n > 0xF) return {};
    if (hi > 0xF) {
      hi = n;
    } else {
      out.push_back(std::byte((hi << 4) | n));
      hi = 0x100;
    }
  }
  return out;
}

inline std::string to_hex(std::span<const std::byte> b) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (std::byte x : b) {
    const auto v = std::to_integer<unsigned>(x);
    s.push_back(digits[v >> 4]);
    s.push_back(digits[v & 0xF]);
  }
  return s;
}

inline std::vector<std::byte> from_string(std::string_view s) {
  std::vector<std::byte> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = std::byte(static_cast<unsigned char>(s[i]));
  return out;
}

inline std::vector<std::byte> pattern(std::size_t n, unsigned seed = 0) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = std::byte((i * 131u + seed * 7u + 17u) & 0xFFu);
  return out;
}

inline std::uint8_t u8(std::byte b) {
  return std::to_integer<std::uint8_t>(b);
}

}  // namespace conveyor::test
