// Unit tests for conveyor::remote_region's stable 28-byte encoding:
// magic "CVRR", version 1, three reserved zero bytes, addr BE64, length BE64,
// rkey BE32.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "byte_helpers.hpp"
#include "conveyor/mr.hpp"

namespace {

using conveyor::errc;
using conveyor::remote_region;
using conveyor::test::to_hex;

const remote_region sample{0x0102030405060708ull, 0x1112131415161718ull, 0xA1B2C3D4u};

TEST(remote_region, encoding_is_28_bytes_magic_version_reserved_then_big_endian_fields) {
  const auto wire = sample.encode();
  ASSERT_EQ(wire.size(), remote_region::encoded_size);
  ASSERT_EQ(remote_region::encoded_size, 28u);
  EXPECT_EQ(to_hex(wire),
            "43565252"
            "01"
            "000000"
            "0102030405060708"
            "1112131415161718"
            "a1b2c3d4");
}

TEST(remote_region, encode_to_writes_the_same_bytes_as_encode) {
  std::array<std::byte, remote_region::encoded_size> out;
  out.fill(std::byte{0xEE});  // the reserved bytes must be written as zero
  sample.encode_to(out);
  EXPECT_EQ(to_hex(out), to_hex(sample.encode()));
}

TEST(remote_region, round_trips_through_encode_and_decode) {
  for (const remote_region r : {sample, remote_region{}, remote_region{~0ull, ~0ull, ~0u},
                                remote_region{0x7F0000001000ull, 4096, 0x00000101u}}) {
    const auto back = remote_region::decode(r.encode());
    ASSERT_TRUE(back.has_value()) << back.error().to_string();
    EXPECT_EQ(*back, r);
  }
}

TEST(remote_region, short_buffer_is_invalid_argument) {
  const auto wire = sample.encode();
  for (std::size_t n = 0; n < remote_region::encoded_size; ++n) {
    const auto r = remote_region::decode(std::span(wire).first(n));
    ASSERT_FALSE(r.has_value()) << "length " << n;
    EXPECT_EQ(r.error().code, errc::invalid_argument) << "length " << n;
  }
}

TEST(remote_region, wrong_magic_is_invalid_argument) {
  const auto good = sample.encode();
  for (std::size_t i = 0; i < 4; ++i) {
    auto bad = good;
    bad[i] ^= std::byte{0x20};  // e.g. "cVRR"
    const auto r = remote_region::decode(bad);
    ASSERT_FALSE(r.has_value()) << "magic byte " << i;
    EXPECT_EQ(r.error().code, errc::invalid_argument);
  }
}

TEST(remote_region, unknown_version_is_invalid_argument) {
  for (std::uint8_t v : {0, 2, 0x81, 0xFF}) {
    auto bad = sample.encode();
    bad[4] = std::byte(v);
    const auto r = remote_region::decode(bad);
    ASSERT_FALSE(r.has_value()) << "version " << int{v};
    EXPECT_EQ(r.error().code, errc::invalid_argument);
  }
}

TEST(remote_region, slice_keeps_the_rkey_and_offsets_the_address) {
  const auto s = sample.slice(0x10, 0x20);
  EXPECT_EQ(s.addr, sample.addr + 0x10);
  EXPECT_EQ(s.length, 0x20u);
  EXPECT_EQ(s.rkey, sample.rkey);
}

}  // namespace
