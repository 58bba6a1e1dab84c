// Big-endian loads and stores of 16/32/64-bit fields, byte by byte (no
// alignment needed): the remote_region codec and every wire format use them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace conveyor::detail {

inline void put_be16(std::byte* p, std::uint16_t v) noexcept {
  p[0] = std::byte(v >> 8);
  p[1] = std::byte(v);
}
inline void put_be32(std::byte* p, std::uint32_t v) noexcept {
  p[0] = std::byte(v >> 24);
  p[1] = std::byte(v >> 16);
  p[2] = std::byte(v >> 8);
  p[3] = std::byte(v);
}
inline void put_be64(std::byte* p, std::uint64_t v) noexcept {
  put_be32(p, std::uint32_t(v >> 32));
  put_be32(p + 4, std::uint32_t(v));
}
inline std::uint16_t get_be16(const std::byte* p) noexcept {
  return std::uint16_t((std::uint16_t(p[0]) << 8) | std::uint16_t(p[1]));
}
inline std::uint32_t get_be32(const std::byte* p) noexcept {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}
inline std::uint64_t get_be64(const std::byte* p) noexcept {
  return (std::uint64_t(get_be32(p)) << 32) | get_be32(p + 4);
}

}  // namespace conveyor::detail
