// Unit tests for the iWARP wire codecs' CRC32c (RFC 3720 vectors, incremental
// updates, its byte order on the wire) and the big-endian helpers. The other
// layers: wire_framing_test.cpp (MPA FPDU framing), wire_header_test.cpp
// (DDP/RDMAP header parsing), wire_rdmap_test.cpp (control message bodies),
// wire_mpa_test.cpp (MPA Request/Reply).
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "byte_helpers.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace conveyor::wire;
using namespace conveyor::test;

// ------------------------------------------------------------------ CRC32c ----

std::uint32_t crc_of(const std::vector<std::byte>& v) {
  return crc32c(v);
}

TEST(crc32c, matches_rfc3720_vector_32_zero_bytes) {
  EXPECT_EQ(crc_of(std::vector<std::byte>(32, std::byte{0x00})), 0x8A9136AAu);
}

TEST(crc32c, matches_rfc3720_vector_32_ff_bytes) {
  EXPECT_EQ(crc_of(std::vector<std::byte>(32, std::byte{0xFF})), 0x62A8AB43u);
}

TEST(crc32c, matches_rfc3720_vector_32_incrementing_bytes) {
  std::vector<std::byte> v(32);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::byte(i);
  EXPECT_EQ(crc_of(v), 0x46DD794Eu);
}

TEST(crc32c, matches_rfc3720_vector_32_decrementing_bytes) {
  std::vector<std::byte> v(32);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::byte(31 - i);
  EXPECT_EQ(crc_of(v), 0x113FDB5Cu);
}

TEST(crc32c, matches_check_value_for_123456789) {
  EXPECT_EQ(crc_of(from_string("123456789")), 0xE3069283u);
}

TEST(crc32c, of_empty_input_is_zero) {
  EXPECT_EQ(crc32c(bytes{}), 0u);
}

TEST(crc32c, incremental_update_equals_one_shot_at_every_split) {
  const auto data = pattern(300, 5);
  const std::uint32_t whole = crc32c(data);
  for (std::size_t split = 0; split <= data.size(); ++split) {
    std::uint32_t run = crc32c_init;
    run = crc32c_update(run, data.data(), split);
    run = crc32c_update(run, data.data() + split, data.size() - split);
    ASSERT_EQ(crc32c_final(run), whole) << "split at " << split;
  }
}

TEST(crc32c, incremental_update_byte_by_byte_equals_one_shot) {
  const auto data = pattern(97, 3);
  std::uint32_t run = crc32c_init;
  for (std::byte b : data) run = crc32c_update(run, &b, 1);
  EXPECT_EQ(crc32c_final(run), crc32c(data));
  // A zero-length update changes nothing.
  EXPECT_EQ(crc32c_update(run, data.data(), 0), run);
}

TEST(crc32c, crc_is_little_endian_on_the_wire) {
  std::array<std::byte, 4> b{};
  put_crc(b.data(), 0x12345678u);
  EXPECT_EQ(to_hex(b), "78563412");
  EXPECT_EQ(get_crc(b.data()), 0x12345678u);
}

// ---------------------------------------------------------- byte order ----

TEST(byte_order, big_endian_helpers_round_trip) {
  std::array<std::byte, 8> b{};
  put_be16(b.data(), 0x0102);
  EXPECT_EQ(to_hex(std::span(b).first(2)), "0102");
  EXPECT_EQ(get_be16(b.data()), 0x0102);
  put_be32(b.data(), 0xA1B2C3D4u);
  EXPECT_EQ(to_hex(std::span(b).first(4)), "a1b2c3d4");
  EXPECT_EQ(get_be32(b.data()), 0xA1B2C3D4u);
  put_be64(b.data(), 0x0102030405060708ull);
  EXPECT_EQ(to_hex(b), "0102030405060708");
  EXPECT_EQ(get_be64(b.data()), 0x0102030405060708ull);
}

}  // namespace
