// Unit tests for MPA FPDU framing (src/providers/soft/wire): the ULPDU length,
// pad and CRC of tagged and untagged FPDUs, byte for byte.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "byte_helpers.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace conveyor::wire;
using namespace conveyor::test;

// ------------------------------------------------------------ FPDU framing ----

TEST(fpdu_framing, zero_length_write_rtr_is_exactly_the_tshark_verified_bytes) {
  // IWARP.md section 1.2: STag 1, TO 0, CRC on; tshark reports "Good CRC32".
  const auto want = from_hex("000e c140 00000001 0000000000000000 ebd34c5f");
  const auto got = encode_tagged(rdmap_op::write, true, 1, 0, {}, true);
  EXPECT_EQ(to_hex(got), to_hex(want));
  EXPECT_TRUE(check_fpdu_crc(got));
}

TEST(fpdu_framing, header_writer_plus_finish_fpdu_builds_the_same_write_rtr) {
  std::vector<std::byte> buf(fpdu_size(ddp::tagged_hdr), std::byte{0xAA});
  EXPECT_EQ(write_tagged_header(buf.data(), rdmap_op::write, true, 1, 0, 0), tagged_header_size);
  finish_fpdu(buf, true);
  EXPECT_EQ(to_hex(buf),
            "000e"
            "c140"
            "00000001"
            "0000000000000000"
            "ebd34c5f");
}

TEST(fpdu_framing, pad_is_minus_two_plus_len_mod_4_not_len_plus_two_mod_4) {
  // Lengths where the SoftUiWarp formula (len + 2) % 4 gives the wrong answer.
  EXPECT_EQ(fpdu_pad(1), 1u);
  EXPECT_EQ(fpdu_pad(3), 3u);
  EXPECT_EQ(fpdu_pad(5), 1u);
  EXPECT_EQ(fpdu_pad(7), 3u);
  // And a table of known values.
  EXPECT_EQ(fpdu_pad(0), 2u);
  EXPECT_EQ(fpdu_pad(2), 0u);
  EXPECT_EQ(fpdu_pad(14), 0u);
  EXPECT_EQ(fpdu_pad(16), 2u);
  EXPECT_EQ(fpdu_pad(17), 1u);
  EXPECT_EQ(fpdu_pad(18), 0u);
  EXPECT_EQ(fpdu_pad(19), 3u);
  EXPECT_EQ(fpdu_pad(46), 0u);
  EXPECT_EQ(fpdu_pad(65535), 3u);
}

TEST(fpdu_framing, pad_makes_every_fpdu_a_multiple_of_four) {
  for (std::size_t len = 0; len <= max_ulpdu; ++len) {
    const std::size_t pad = fpdu_pad(len);
    ASSERT_LT(pad, 4u) << len;
    ASSERT_EQ((2 + len + pad) % 4, 0u) << len;
    ASSERT_EQ(fpdu_size(len), 2 + len + pad + 4) << len;
    ASSERT_EQ(fpdu_size(len) % 4, 0u) << len;
  }
}

TEST(fpdu_framing, read_request_ulpdu_length_is_46) {
  const auto f = encode_read_request({}, 1, false);
  EXPECT_EQ(get_be16(f.data()), 46);
  EXPECT_EQ(f.size(), fpdu_size(46));
  EXPECT_EQ(f.size(), 52u);
}

TEST(fpdu_framing, empty_tagged_write_ulpdu_length_is_14) {
  const auto f = encode_tagged(rdmap_op::write, true, 1, 0, {}, false);
  EXPECT_EQ(get_be16(f.data()), 14);
  EXPECT_EQ(f.size(), 20u);
}

TEST(fpdu_framing, ulpdu_length_counts_ddp_header_and_payload_only) {
  for (std::size_t n : {0u, 1u, 2u, 3u, 4u, 5u, 100u, 1447u}) {
    const auto payload = pattern(n);
    const auto t = encode_tagged(rdmap_op::write, true, 9, 0, payload, false);
    EXPECT_EQ(get_be16(t.data()), ddp::tagged_hdr + n) << n;
    EXPECT_EQ(t.size(), fpdu_size(ddp::tagged_hdr + n)) << n;
    const auto u = encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, payload, false);
    EXPECT_EQ(get_be16(u.data()), ddp::untagged_hdr + n) << n;
    EXPECT_EQ(u.size(), fpdu_size(ddp::untagged_hdr + n)) << n;
  }
}

TEST(fpdu_framing, untagged_header_length_counts_extra_header_and_payload) {
  std::array<std::byte, untagged_header_size> h{};
  EXPECT_EQ(write_untagged_header(h.data(), rdmap_op::read_request, true, qn::read_request, 5, 0, 0,
                                  read_request_hdr, 0),
            untagged_header_size);
  EXPECT_EQ(get_be16(h.data()), 46);
  EXPECT_EQ(write_untagged_header(h.data(), rdmap_op::send, false, qn::send, 5, 7, 0, 3, 10),
            untagged_header_size);
  EXPECT_EQ(get_be16(h.data()), 18 + 3 + 10);
}

TEST(fpdu_framing, header_bytes_follow_rfc5041_layout) {
  std::array<std::byte, untagged_header_size> u{};
  write_untagged_header(u.data(), rdmap_op::send_se_inv, false, 0x01020304u, 0x05060708u,
                        0x090A0B0Cu, 0x0D0E0F10u, 0, 0);
  // len=18, ctrl: T=0 L=0 DV=1; RV=1 op=6; inv stag; QN; MSN; MO
  EXPECT_EQ(to_hex(u),
            "0012"
            "01"
            "46"
            "0d0e0f10"
            "01020304"
            "05060708"
            "090a0b0c");
  std::array<std::byte, tagged_header_size> t{};
  write_tagged_header(t.data(), rdmap_op::read_response, false, 0xCAFEBABEu, 0x1122334455667788ull,
                      0);
  EXPECT_EQ(to_hex(t),
            "000e"
            "81"
            "42"
            "cafebabe"
            "1122334455667788");
}

TEST(fpdu_framing, pad_bytes_are_zero_and_precede_the_crc) {
  const auto payload = pattern(3, 9);  // ulpdu 17 -> 2 + 17 = 19 -> pad 1
  auto f = encode_tagged(rdmap_op::write, true, 2, 0, payload, true);
  ASSERT_EQ(f.size(), 2u + 17u + 1u + 4u);
  EXPECT_EQ(u8(f[19]), 0u);
  EXPECT_EQ(get_crc(f.data() + 20), crc32c(std::span(f).first(20)));
}

TEST(fpdu_framing, finish_fpdu_without_crc_writes_a_zero_crc_field_and_zero_pad) {
  std::vector<std::byte> f(fpdu_size(ddp::tagged_hdr + 1), std::byte{0xAA});
  write_tagged_header(f.data(), rdmap_op::write, true, 3, 0, 1);
  f[tagged_header_size] = std::byte{0x55};
  finish_fpdu(f, false);
  ASSERT_EQ(f.size(), 24u);  // 2 + 15 + pad 3 + 4
  EXPECT_EQ(to_hex(std::span(f).subspan(17)),
            "000000"
            "00000000");
}

TEST(fpdu_framing, finish_fpdu_with_crc_overwrites_garbage_pad_and_trailer) {
  std::vector<std::byte> f(fpdu_size(ddp::untagged_hdr + 2), std::byte{0xEE});
  write_untagged_header(f.data(), rdmap_op::send, true, qn::send, 1, 0, 0, 0, 2);
  f[20] = std::byte{1};
  f[21] = std::byte{2};
  finish_fpdu(f, true);
  const auto clean =
      encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, from_hex("0102"), true);
  EXPECT_EQ(to_hex(f), to_hex(clean));
}

TEST(fpdu_framing, check_fpdu_crc_detects_every_flipped_bit) {
  const auto good = encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, pattern(11), true);
  ASSERT_TRUE(check_fpdu_crc(good));
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = good;
      bad[i] ^= std::byte(1u << bit);
      ASSERT_FALSE(check_fpdu_crc(bad)) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(fpdu_framing, pad_bytes_are_covered_by_the_crc) {
  auto f = encode_tagged(rdmap_op::write, true, 2, 0, pattern(1), true);  // pad 3
  ASSERT_EQ(fpdu_pad(get_be16(f.data())), 3u);
  f[2 + 15] = std::byte{0x01};  // first pad byte
  EXPECT_FALSE(check_fpdu_crc(f));
}

TEST(fpdu_framing, check_fpdu_crc_is_false_without_crc_and_on_truncation) {
  const auto nocrc = encode_tagged(rdmap_op::write, true, 1, 0, pattern(20), false);
  EXPECT_EQ(get_crc(nocrc.data() + nocrc.size() - 4), 0u);
  EXPECT_FALSE(check_fpdu_crc(nocrc));
  const auto good = encode_tagged(rdmap_op::write, true, 1, 0, pattern(20), true);
  for (std::size_t n = 0; n < good.size(); ++n)
    ASSERT_FALSE(check_fpdu_crc(std::span(good).first(n))) << "prefix " << n;
}

TEST(fpdu_framing, largest_fpdu_has_ulpdu_65535_and_pad_3) {
  const auto payload = pattern(max_ulpdu - ddp::tagged_hdr, 4);
  const auto f = encode_tagged(rdmap_op::write, false, 0x77, 1ull << 40, payload, true);
  EXPECT_EQ(get_be16(f.data()), 65535);
  EXPECT_EQ(f.size(), 2u + 65535u + 3u + 4u);
  EXPECT_TRUE(check_fpdu_crc(f));
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->payload_len, payload.size());
  EXPECT_EQ(h->pad, 3u);
  EXPECT_EQ(h->total(), f.size());
}

}  // namespace
