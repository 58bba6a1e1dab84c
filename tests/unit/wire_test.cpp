// Unit tests for the iWARP wire codecs (src/providers/soft/wire): CRC32c, MPA
// FPDU framing (length, pad, CRC), DDP/RDMAP header parsing and the control
// message bodies (Read Request, Terminate, RFC 7306 atomics and immediate data).
// MPA Request/Reply frames are in wire_mpa_test.cpp.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "byte_helpers.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace conveyor::wire;
using conveyor::test::from_hex;
using conveyor::test::from_string;
using conveyor::test::pattern;
using conveyor::test::to_hex;
using conveyor::test::u8;

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

// ------------------------------------------------------- FPDU header parsing ----

struct sample {
  std::string name;
  rdmap_op op;
  std::vector<std::byte> fpdu;
  bool crc;
};

terminate_msg sample_terminate() {
  terminate_msg t;
  t.layer = term_layer::ddp;
  t.etype = term::ddp_tagged;
  t.ecode = term::ddp_t_inv_stag;
  const auto offending = encode_tagged(rdmap_op::write, true, 0x42, 0x10, pattern(6), false);
  t.ddp_header.assign(offending.begin() + 2, offending.begin() + 16);
  t.ddp_segment_length = 20;
  t.has_segment_length = true;
  return t;
}

read_request sample_read_request() {
  return {0x11223344u, 0x0102030405060708ull, 0x1000u, 0x55667788u, 0x1112131415161718ull};
}

atomic_request sample_atomic() {
  atomic_request a;
  a.kind = atomic_kind::cmp_swap;
  a.request_id = 0x0BADF00Du;
  a.stag = 0x00ABCD01u;
  a.to = 0x00007F0000001000ull;
  a.add_swap = 0x1111111111111111ull;
  a.add_swap_mask = 0xFFFF0000FFFF0000ull;
  a.compare = 0x2222222222222222ull;
  a.compare_mask = 0x00000000FFFFFFFFull;
  return a;
}

std::vector<sample> all_samples() {
  std::vector<sample> s;
  s.push_back({"write", rdmap_op::write,
               encode_tagged(rdmap_op::write, true, 0x1234, 0x1000, pattern(37), true), true});
  s.push_back(
      {"write_rtr", rdmap_op::write, encode_tagged(rdmap_op::write, true, 1, 0, {}, true), true});
  s.push_back({"read_response", rdmap_op::read_response,
               encode_tagged(rdmap_op::read_response, false, 0xABCD, 0xFFFF000000000000ull,
                             pattern(100), false),
               false});
  s.push_back({"send", rdmap_op::send,
               encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, pattern(5), true), true});
  s.push_back(
      {"send_inv", rdmap_op::send_inv,
       encode_untagged(rdmap_op::send_inv, true, qn::send, 2, 0, 0xDEADBEEFu, pattern(8), false),
       false});
  s.push_back({"send_se", rdmap_op::send_se,
               encode_untagged(rdmap_op::send_se, false, qn::send, 3, 4096, 0, pattern(3), true),
               true});
  s.push_back({"send_se_inv", rdmap_op::send_se_inv,
               encode_untagged(rdmap_op::send_se_inv, true, qn::send, 4, 0, 0x100u, {}, true),
               true});
  s.push_back({"read_request", rdmap_op::read_request,
               encode_read_request(sample_read_request(), 7, true), true});
  s.push_back({"terminate", rdmap_op::terminate, encode_terminate(sample_terminate(), true), true});
  s.push_back({"immediate", rdmap_op::immediate,
               encode_immediate(0x0102030405060708ull, false, 9, false), false});
  s.push_back(
      {"immediate_se", rdmap_op::immediate_se, encode_immediate(~0ull, true, 10, true), true});
  s.push_back({"atomic_request", rdmap_op::atomic_request,
               encode_atomic_request(sample_atomic(), 1, true), true});
  s.push_back({"atomic_response", rdmap_op::atomic_response,
               encode_atomic_response({0x0BADF00Du, 0x2222222222222222ull}, 1, false), false});
  return s;
}

// Independent of wire::is_tagged/queue_of on purpose: the test must not check the codec against
// itself.
bool tagged_per_rfc5040(rdmap_op op) {
  return op == rdmap_op::write || op == rdmap_op::read_response;
}

std::uint32_t expected_qn(rdmap_op op) {
  switch (op) {
    case rdmap_op::read_request:
      return qn::read_request;
    case rdmap_op::terminate:
      return qn::terminate;
    case rdmap_op::atomic_request:
    case rdmap_op::atomic_response:
      return qn::atomic;
    default:
      return qn::send;
  }
}

TEST(fpdu_header, every_opcode_parses_with_consistent_lengths) {
  std::set<rdmap_op> seen;
  for (const auto& s : all_samples()) {
    SCOPED_TRACE(s.name);
    const auto h = parse_fpdu_header(s.fpdu);
    ASSERT_TRUE(h.has_value()) << to_string(h.error());
    seen.insert(h->opcode);
    EXPECT_EQ(h->opcode, s.op);
    EXPECT_EQ(h->tagged, tagged_per_rfc5040(s.op));
    EXPECT_EQ(h->ulpdu_len, get_be16(s.fpdu.data()));
    EXPECT_EQ(h->header_len + h->payload_len, 2u + h->ulpdu_len);
    EXPECT_EQ(h->pad, fpdu_pad(h->ulpdu_len));
    EXPECT_EQ(h->total(), s.fpdu.size());
    EXPECT_EQ(check_fpdu_crc(s.fpdu), s.crc);
    if (h->tagged) {
      EXPECT_EQ(h->header_len, tagged_header_size);
    } else {
      EXPECT_EQ(h->qn, expected_qn(s.op));
      EXPECT_GE(h->header_len, untagged_header_size);
    }
  }
  EXPECT_EQ(seen.size(), 12u) << "a sample per RDMAP opcode 0x0..0xB";
}

TEST(fpdu_header, tagged_write_fields_are_decoded) {
  const auto f =
      encode_tagged(rdmap_op::write, false, 0xA0B0C0D0u, 0x0102030405060708ull, pattern(9), false);
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  EXPECT_TRUE(h->tagged);
  EXPECT_FALSE(h->last);
  EXPECT_EQ(h->stag, 0xA0B0C0D0u);
  EXPECT_EQ(h->to, 0x0102030405060708ull);
  EXPECT_EQ(h->header_len, 16u);
  EXPECT_EQ(h->payload_len, 9u);
}

TEST(fpdu_header, untagged_send_fields_are_decoded) {
  const auto f = encode_untagged(rdmap_op::send_inv, true, qn::send, 0xFFFFFFFFu, 0x12345678u,
                                 0xCAFEF00Du, pattern(2), false);
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  EXPECT_FALSE(h->tagged);
  EXPECT_TRUE(h->last);
  EXPECT_EQ(h->opcode, rdmap_op::send_inv);
  EXPECT_EQ(h->qn, qn::send);
  EXPECT_EQ(h->msn, 0xFFFFFFFFu);
  EXPECT_EQ(h->mo, 0x12345678u);
  EXPECT_EQ(h->inv_stag, 0xCAFEF00Du);
  EXPECT_EQ(h->header_len, 20u);
  EXPECT_EQ(h->payload_len, 2u);
}

TEST(fpdu_header, control_messages_count_their_fixed_header_as_header) {
  for (const auto& s : all_samples()) {
    SCOPED_TRACE(s.name);
    const auto h = parse_fpdu_header(s.fpdu);
    ASSERT_TRUE(h.has_value());
    // The sizes as the RFCs give them, written out here rather than taken
    // from the constants the parser uses: MPA's 2-byte length plus DDP's
    // 18-byte untagged header, then RDMAP's fixed part of each message.
    std::size_t extra = 0;
    switch (s.op) {
      case rdmap_op::read_request:
        extra = 4 + 8 + 4 + 4 + 8;  // RFC 5040 4.4: sink STag, TO, size, source STag, TO
        break;
      case rdmap_op::atomic_request:
        extra = 4 + 4 + 4 + 8 + 8 + 8 + 8 + 8;  // RFC 7306 4.1: code, id, STag, TO, 4 operands
        break;
      case rdmap_op::atomic_response:
        extra = 4 + 8;  // RFC 7306 4.2: original request id, original value
        break;
      case rdmap_op::immediate:
      case rdmap_op::immediate_se:
        extra = 8;  // RFC 7306 5: 8 bytes of immediate data
        break;
      case rdmap_op::terminate:
        // RFC 5040 4.8: a Terminate carries no payload; all of it is header.
        extra = h->ulpdu_len - 18;
        break;
      default:
        continue;
    }
    EXPECT_EQ(h->header_len, 2 + 18 + extra);
    EXPECT_EQ(h->payload_len, 0u);
  }
}

TEST(fpdu_header, need_more_on_every_truncated_prefix_of_the_header) {
  for (const auto& s : all_samples()) {
    SCOPED_TRACE(s.name);
    const auto full = parse_fpdu_header(s.fpdu);
    ASSERT_TRUE(full.has_value());
    for (std::size_t n = 0; n < full->header_len; ++n) {
      const auto h = parse_fpdu_header(std::span(s.fpdu).first(n));
      ASSERT_FALSE(h.has_value()) << "prefix " << n;
      ASSERT_EQ(h.error(), wire_error::need_more) << "prefix " << n;
    }
    // From the full header on, the payload and trailer need not be there yet.
    for (std::size_t n = full->header_len; n <= s.fpdu.size(); ++n) {
      const auto h = parse_fpdu_header(std::span(s.fpdu).first(n));
      ASSERT_TRUE(h.has_value()) << "prefix " << n;
      ASSERT_EQ(h->header_len, full->header_len);
      ASSERT_EQ(h->total(), full->total());
    }
  }
}

TEST(fpdu_header, coalesced_fpdus_parse_back_to_back) {
  std::vector<std::byte> stream;
  const auto samples = all_samples();
  for (const auto& s : samples) stream.insert(stream.end(), s.fpdu.begin(), s.fpdu.end());
  std::size_t off = 0;
  for (const auto& s : samples) {
    SCOPED_TRACE(s.name);
    const auto h = parse_fpdu_header(std::span(stream).subspan(off));
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, s.op);
    EXPECT_EQ(check_fpdu_crc(std::span(stream).subspan(off, h->total())), s.crc);
    off += h->total();
  }
  EXPECT_EQ(off, stream.size());
}

TEST(fpdu_header, tagged_bit_that_disagrees_with_the_opcode_is_rejected) {
  for (const auto& s : all_samples()) {
    SCOPED_TRACE(s.name);
    auto f = s.fpdu;
    f[2] ^= std::byte{ddp::tagged};
    const auto h = parse_fpdu_header(f);
    ASSERT_FALSE(h.has_value());
    EXPECT_EQ(h.error(), wire_error::bad_opcode);
  }
}

TEST(fpdu_header, ddp_version_other_than_1_is_rejected) {
  for (const auto& s : all_samples()) {
    SCOPED_TRACE(s.name);
    for (unsigned dv : {0u, 2u, 3u}) {
      auto f = s.fpdu;
      f[2] = std::byte((u8(f[2]) & ~0x03u) | dv);
      const auto h = parse_fpdu_header(f);
      ASSERT_FALSE(h.has_value()) << "DV " << dv;
      EXPECT_EQ(h.error(), wire_error::bad_ddp_version) << "DV " << dv;
    }
  }
}

TEST(fpdu_header, rdmap_version_other_than_1_is_rejected) {
  for (const auto& s : all_samples()) {
    SCOPED_TRACE(s.name);
    for (unsigned rv : {0u, 2u, 3u}) {
      auto f = s.fpdu;
      f[3] = std::byte((u8(f[3]) & 0x3Fu) | (rv << 6));
      const auto h = parse_fpdu_header(f);
      ASSERT_FALSE(h.has_value()) << "RV " << rv;
      EXPECT_EQ(h.error(), wire_error::bad_rdmap_version) << "RV " << rv;
    }
  }
}

TEST(fpdu_header, version_is_checked_as_soon_as_the_control_bytes_arrive) {
  auto f = encode_tagged(rdmap_op::write, true, 1, 0, {}, false);
  f[2] = std::byte(u8(f[2]) & ~0x03u);
  const auto h = parse_fpdu_header(std::span(f).first(4));
  ASSERT_FALSE(h.has_value());
  EXPECT_EQ(h.error(), wire_error::bad_ddp_version);
}

TEST(fpdu_header, unknown_opcodes_0xc_to_0xf_are_rejected) {
  for (bool tagged : {false, true}) {
    for (unsigned op = 0xC; op <= 0xF; ++op) {
      auto f = tagged
                   ? encode_tagged(rdmap_op::write, true, 1, 0, pattern(64), false)
                   : encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, pattern(64), false);
      f[3] = std::byte((u8(f[3]) & 0xF0u) | op);
      const auto h = parse_fpdu_header(f);
      ASSERT_FALSE(h.has_value()) << "opcode " << op;
      EXPECT_EQ(h.error(), wire_error::bad_opcode) << "opcode " << op;
    }
  }
}

TEST(fpdu_header, reserved_ddp_and_rdmap_bits_are_ignored_on_receive) {
  auto f = encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, pattern(4), false);
  f[2] = std::byte(u8(f[2]) | 0x3Cu);
  f[3] = std::byte(u8(f[3]) | 0x30u);
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, rdmap_op::send);
  EXPECT_TRUE(h->last);
  EXPECT_FALSE(h->tagged);
}

TEST(fpdu_header, queue_number_wrong_for_the_opcode_is_rejected) {
  const std::uint32_t candidates[] = {0u, 1u, 2u, 3u, 4u, 0xFFFFFFFFu};
  for (const auto& s : all_samples()) {
    if (is_tagged(s.op)) continue;
    SCOPED_TRACE(s.name);
    for (std::uint32_t q : candidates) {
      if (q == expected_qn(s.op)) continue;
      auto f = s.fpdu;
      put_be32(f.data() + 8, q);
      const auto h = parse_fpdu_header(f);
      ASSERT_FALSE(h.has_value()) << "QN " << q;
      EXPECT_EQ(h.error(), wire_error::bad_qn) << "QN " << q;
    }
  }
}

void expect_bad_length(std::vector<std::byte> f, std::uint16_t ulpdu_len) {
  put_be16(f.data(), ulpdu_len);
  const auto h = parse_fpdu_header(f);
  ASSERT_FALSE(h.has_value()) << "ULPDU length " << ulpdu_len;
  EXPECT_EQ(h.error(), wire_error::bad_length) << "ULPDU length " << ulpdu_len;
}

TEST(fpdu_header, ulpdu_shorter_than_the_ddp_header_is_bad_length) {
  const auto w = encode_tagged(rdmap_op::write, true, 1, 0, pattern(8), false);
  for (std::uint16_t len = 0; len < ddp::tagged_hdr; ++len) expect_bad_length(w, len);
  const auto s = encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, pattern(8), false);
  for (std::uint16_t len = 0; len < ddp::untagged_hdr; ++len) expect_bad_length(s, len);
}

TEST(fpdu_header, fixed_size_control_messages_with_wrong_length_are_bad_length) {
  const auto rr = encode_read_request(sample_read_request(), 1, false);
  for (std::uint16_t len : {18, 45, 47, 100, 65535}) expect_bad_length(rr, len);
  const auto ar = encode_atomic_request(sample_atomic(), 1, false);
  for (std::uint16_t len : {18, 69, 71}) expect_bad_length(ar, len);
  const auto ap = encode_atomic_response({1, 2}, 1, false);
  for (std::uint16_t len : {18, 29, 31}) expect_bad_length(ap, len);
  const auto im = encode_immediate(5, false, 1, false);
  for (std::uint16_t len : {18, 25, 27}) expect_bad_length(im, len);
}

TEST(fpdu_header, terminate_without_room_for_the_control_word_is_bad_length) {
  const auto t = encode_terminate(terminate_msg{}, false);
  ASSERT_EQ(get_be16(t.data()), 22);
  for (std::uint16_t len = 0; len < 22; ++len) expect_bad_length(t, len);
}

// ------------------------------------------------------------- Read Request ----

TEST(read_request, encodes_to_the_rfc5040_layout) {
  const auto f = encode_read_request(sample_read_request(), 1, false);
  EXPECT_EQ(to_hex(f),
            "002e"
            "41"
            "41"
            "00000000"
            "00000001"
            "00000001"
            "00000000"
            "11223344"
            "0102030405060708"
            "00001000"
            "55667788"
            "1112131415161718"
            "00000000");
}

TEST(read_request, round_trips_through_parse_and_decode) {
  const auto rr = sample_read_request();
  const auto f = encode_read_request(rr, 0x80000001u, true);
  ASSERT_TRUE(check_fpdu_crc(f));
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, rdmap_op::read_request);
  EXPECT_EQ(h->qn, qn::read_request);
  EXPECT_EQ(h->msn, 0x80000001u);
  EXPECT_EQ(h->mo, 0u);
  EXPECT_TRUE(h->last);
  const auto d = decode_read_request(std::span(f).subspan(untagged_header_size, read_request_hdr));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->sink_stag, rr.sink_stag);
  EXPECT_EQ(d->sink_to, rr.sink_to);
  EXPECT_EQ(d->size, rr.size);
  EXPECT_EQ(d->src_stag, rr.src_stag);
  EXPECT_EQ(d->src_to, rr.src_to);
}

TEST(read_request, zero_length_read_rtr_uses_source_stag_1) {
  read_request rtr;
  rtr.src_stag = 1;
  const auto f = encode_read_request(rtr, 1, false);
  EXPECT_EQ(get_be16(f.data()), 46);
  const auto d = decode_read_request(std::span(f).subspan(untagged_header_size));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->size, 0u);
  EXPECT_EQ(d->sink_stag, 0u);
  EXPECT_EQ(d->src_stag, 1u);
}

TEST(read_request, short_body_needs_more) {
  const auto f = encode_read_request(sample_read_request(), 1, false);
  for (std::size_t n = 0; n < read_request_hdr; ++n) {
    const auto d = decode_read_request(std::span(f).subspan(untagged_header_size, n));
    ASSERT_FALSE(d.has_value());
    EXPECT_EQ(d.error(), wire_error::need_more);
  }
}

// ---------------------------------------------------------------- Terminate ----

TEST(terminate, control_word_bit_layout_is_layer_etype_code_m_d_r) {
  terminate_msg t;
  EXPECT_EQ(t.control_word(), 0u);
  t.layer = term_layer::llp;
  EXPECT_EQ(t.control_word(), 0x20000000u);
  t.layer = term_layer::ddp;
  EXPECT_EQ(t.control_word(), 0x10000000u);
  t.etype = 0xF;
  EXPECT_EQ(t.control_word(), 0x1F000000u);
  t.etype = 0x12;  // only 4 bits fit
  EXPECT_EQ(t.control_word(), 0x12000000u);
  t.ecode = 0xFF;
  EXPECT_EQ(t.control_word(), 0x12FF0000u);
  t.has_segment_length = true;
  EXPECT_EQ(t.control_word(), 0x12FF8000u);
  t.ddp_header.resize(14);
  EXPECT_EQ(t.control_word(), 0x12FFC000u);
  t.rdmap_header.resize(28);
  EXPECT_EQ(t.control_word(), 0x12FFE000u);
  t.has_segment_length = false;
  EXPECT_EQ(t.control_word(), 0x12FF6000u);
}

TEST(terminate, llp_crc_error_without_headers_is_qn2_msn1_mo0) {
  terminate_msg t;
  t.layer = term_layer::llp;
  t.etype = 0;
  t.ecode = term::llp_crc;
  const auto f = encode_terminate(t, false);
  EXPECT_EQ(to_hex(f),
            "0016"
            "41"
            "47"
            "00000000"
            "00000002"
            "00000001"
            "00000000"
            "20020000"
            "00000000");
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, rdmap_op::terminate);
  EXPECT_EQ(h->qn, qn::terminate);
  EXPECT_EQ(h->msn, 1u);
  EXPECT_EQ(h->mo, 0u);
  EXPECT_EQ(h->header_len, 24u);
  const auto d = decode_terminate(std::span(f).subspan(untagged_header_size, 4));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->layer, term_layer::llp);
  EXPECT_EQ(d->etype, 0u);
  EXPECT_EQ(d->ecode, term::llp_crc);
  EXPECT_FALSE(d->has_segment_length);
  EXPECT_TRUE(d->ddp_header.empty());
  EXPECT_TRUE(d->rdmap_header.empty());
}

TEST(terminate, with_tagged_ddp_header_round_trips_and_sets_m_and_d) {
  const auto t = sample_terminate();
  const auto f = encode_terminate(t, true);
  ASSERT_TRUE(check_fpdu_crc(f));
  EXPECT_EQ(get_be16(f.data()), 18 + 4 + 2 + 14);
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  const auto body =
      std::span(f).subspan(untagged_header_size, h->header_len - untagged_header_size);
  EXPECT_EQ(get_be32(body.data()), 0x1100C000u);  // DDP, tagged buffer, invalid STag, M|D
  const auto d = decode_terminate(body);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->layer, term_layer::ddp);
  EXPECT_EQ(d->etype, term::ddp_tagged);
  EXPECT_EQ(d->ecode, term::ddp_t_inv_stag);
  EXPECT_TRUE(d->has_segment_length);
  EXPECT_EQ(d->ddp_segment_length, 20);
  EXPECT_EQ(to_hex(d->ddp_header), to_hex(t.ddp_header));
  EXPECT_TRUE(d->rdmap_header.empty());
}

TEST(terminate, ddp_header_forces_the_segment_length_field) {
  auto t = sample_terminate();
  t.has_segment_length = false;  // the encoder still writes the 2-byte slot and M
  const auto f = encode_terminate(t, false);
  const auto body = std::span(f).subspan(untagged_header_size, get_be16(f.data()) - 18);
  EXPECT_EQ(get_be32(body.data()) & 0xE000u, 0xC000u);
  const auto d = decode_terminate(body);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->has_segment_length);
  EXPECT_EQ(to_hex(d->ddp_header), to_hex(t.ddp_header));
}

TEST(terminate, with_untagged_ddp_and_read_request_headers_round_trips) {
  const auto rr_fpdu = encode_read_request(sample_read_request(), 3, false);
  terminate_msg t;
  t.layer = term_layer::rdmap;
  t.etype = term::rdmap_remote_prot;
  t.ecode = term::rdmap_access;
  t.has_segment_length = true;
  t.ddp_segment_length = 46;
  t.ddp_header.assign(rr_fpdu.begin() + 2, rr_fpdu.begin() + 20);
  t.rdmap_header.assign(rr_fpdu.begin() + 20, rr_fpdu.begin() + 48);
  const auto f = encode_terminate(t, true);
  EXPECT_EQ(get_be16(f.data()), 18 + 4 + 2 + 18 + 28);
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  const auto d = decode_terminate(
      std::span(f).subspan(untagged_header_size, h->header_len - untagged_header_size));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->control_word(), 0x0102E000u);
  EXPECT_EQ(d->ddp_segment_length, 46);
  EXPECT_EQ(to_hex(d->ddp_header), to_hex(t.ddp_header));
  EXPECT_EQ(to_hex(d->rdmap_header), to_hex(t.rdmap_header));
  const auto inner = decode_read_request(d->rdmap_header);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->src_stag, sample_read_request().src_stag);
}

TEST(terminate, siw_layout_copied_from_the_mpa_length_field_decodes) {
  // siw copies the offending header from its MPA length field and overwrites
  // that field with the DDP segment length: [seglen(2)][DDP hdr(14)].
  const auto offending = encode_tagged(rdmap_op::write, true, 0x99, 0x40, pattern(30), false);
  std::vector<std::byte> body(4 + 16);
  put_be32(body.data(), 0x1100C000u);
  std::copy(offending.begin(), offending.begin() + 16, body.begin() + 4);
  put_be16(body.data() + 4, 44);
  const auto d = decode_terminate(body);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->ddp_segment_length, 44);
  ASSERT_EQ(d->ddp_header.size(), 14u);
  EXPECT_EQ(get_be32(d->ddp_header.data() + 2), 0x99u);
}

TEST(terminate, truncated_body_is_rejected) {
  const auto rr_fpdu = encode_read_request(sample_read_request(), 3, false);
  terminate_msg t;
  t.layer = term_layer::rdmap;
  t.etype = term::rdmap_remote_op;
  t.ecode = term::rdmap_unexpected_op;
  t.ddp_header.assign(rr_fpdu.begin() + 2, rr_fpdu.begin() + 20);
  t.rdmap_header.assign(rr_fpdu.begin() + 20, rr_fpdu.begin() + 48);
  const auto f = encode_terminate(t, false);
  const auto body = std::span(f).subspan(untagged_header_size, 4 + 2 + 18 + 28);
  ASSERT_TRUE(decode_terminate(body).has_value());
  for (std::size_t n = 0; n < body.size(); ++n) {
    const auto d = decode_terminate(body.first(n));
    ASSERT_FALSE(d.has_value()) << "prefix " << n;
    EXPECT_EQ(d.error(), n < 4 ? wire_error::need_more : wire_error::bad_length) << "prefix " << n;
  }
}

TEST(terminate, unknown_layer_is_rejected) {
  for (std::uint32_t layer = 3; layer <= 0xF; ++layer) {
    std::array<std::byte, 4> body{};
    put_be32(body.data(), layer << 28);
    EXPECT_FALSE(decode_terminate(body).has_value()) << "layer " << layer;
  }
}

TEST(terminate, trailing_bytes_after_the_flagged_headers_are_ignored) {
  std::vector<std::byte> body(4 + 7);
  put_be32(body.data(), 0x20070000u);  // LLP, no matching RTR, no headers
  const auto d = decode_terminate(body);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->ecode, term::llp_no_rtr);
  EXPECT_TRUE(d->ddp_header.empty());
}

// ------------------------------------------------------- RFC 7306 messages ----

TEST(atomic, request_round_trips_for_compare_swap_and_fetch_add) {
  for (atomic_kind kind : {atomic_kind::cmp_swap, atomic_kind::fetch_add}) {
    auto a = sample_atomic();
    a.kind = kind;
    const auto f = encode_atomic_request(a, 0x42, true);
    ASSERT_TRUE(check_fpdu_crc(f));
    EXPECT_EQ(get_be16(f.data()), 18 + 52);
    const auto h = parse_fpdu_header(f);
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, rdmap_op::atomic_request);
    EXPECT_EQ(h->qn, qn::atomic);
    EXPECT_EQ(h->msn, 0x42u);
    const auto d = decode_atomic_request(std::span(f).subspan(untagged_header_size));
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->kind, kind);
    EXPECT_EQ(d->request_id, a.request_id);
    EXPECT_EQ(d->stag, a.stag);
    EXPECT_EQ(d->to, a.to);
    EXPECT_EQ(d->add_swap, a.add_swap);
    EXPECT_EQ(d->add_swap_mask, a.add_swap_mask);
    EXPECT_EQ(d->compare, a.compare);
    EXPECT_EQ(d->compare_mask, a.compare_mask);
  }
}

TEST(atomic, atomic_opcode_sits_in_the_low_4_bits_of_the_first_word) {
  const auto f = encode_atomic_request(sample_atomic(), 1, false);
  EXPECT_EQ(to_hex(std::span(f).subspan(20, 12)),
            "00000002"
            "0badf00d"
            "00abcd01");
}

TEST(atomic, unknown_atomic_opcode_is_rejected) {
  auto f = encode_atomic_request(sample_atomic(), 1, false);
  for (std::uint8_t k : {1, 3, 4, 0xF}) {
    f[23] = std::byte(k);
    const auto d = decode_atomic_request(std::span(f).subspan(untagged_header_size));
    ASSERT_FALSE(d.has_value()) << int{k};
    EXPECT_EQ(d.error(), wire_error::bad_opcode);
  }
}

TEST(atomic, reserved_bits_of_the_opcode_word_are_ignored) {
  auto f = encode_atomic_request(sample_atomic(), 1, false);
  f[20] = std::byte{0xFF};
  const auto d = decode_atomic_request(std::span(f).subspan(untagged_header_size));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind, atomic_kind::cmp_swap);
}

TEST(atomic, response_round_trips) {
  const atomic_response r{0xFEEDFACEu, 0x8000000000000001ull};
  const auto f = encode_atomic_response(r, 7, true);
  ASSERT_TRUE(check_fpdu_crc(f));
  EXPECT_EQ(get_be16(f.data()), 18 + 12);
  const auto h = parse_fpdu_header(f);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, rdmap_op::atomic_response);
  EXPECT_EQ(h->qn, qn::atomic);
  const auto d = decode_atomic_response(std::span(f).subspan(untagged_header_size));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->request_id, r.request_id);
  EXPECT_EQ(d->original, r.original);
  EXPECT_EQ(to_hex(std::span(f).subspan(20, 12)),
            "feedface"
            "8000000000000001");
}

TEST(atomic, short_bodies_need_more) {
  const auto body = pattern(atomic_request_hdr);
  for (std::size_t n = 0; n < atomic_request_hdr; ++n)
    EXPECT_EQ(decode_atomic_request(std::span(body).first(n)).error(), wire_error::need_more);
  for (std::size_t n = 0; n < atomic_response_hdr; ++n)
    EXPECT_EQ(decode_atomic_response(std::span(body).first(n)).error(), wire_error::need_more);
}

TEST(immediate, value_round_trips_with_and_without_solicited_event) {
  for (bool se : {false, true}) {
    const std::uint64_t v = se ? 0xFEDCBA9876543210ull : 1;
    const auto f = encode_immediate(v, se, 5, true);
    ASSERT_TRUE(check_fpdu_crc(f));
    EXPECT_EQ(get_be16(f.data()), 18 + 8);
    const auto h = parse_fpdu_header(f);
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->opcode, se ? rdmap_op::immediate_se : rdmap_op::immediate);
    EXPECT_EQ(u8(f[3]) & 0x0Fu, se ? 0x9u : 0x8u);
    EXPECT_EQ(h->qn, qn::send);
    EXPECT_EQ(h->msn, 5u);
    EXPECT_TRUE(h->last);
    const auto d = decode_immediate(std::span(f).subspan(untagged_header_size));
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(*d, v);
  }
}

TEST(immediate, short_body_needs_more) {
  const auto body = pattern(8);
  for (std::size_t n = 0; n < immediate_hdr; ++n)
    EXPECT_EQ(decode_immediate(std::span(body).first(n)).error(), wire_error::need_more);
}

// ------------------------------------------------------------------ strings ----

TEST(wire_strings, every_wire_error_has_a_distinct_name) {
  std::set<std::string_view> names;
  for (int e = 0; e <= static_cast<int>(wire_error::bad_qn); ++e) {
    const auto s = to_string(static_cast<wire_error>(e));
    EXPECT_FALSE(s.empty());
    EXPECT_NE(s, "unknown wire error") << e;
    names.insert(s);
  }
  EXPECT_EQ(names.size(), static_cast<std::size_t>(wire_error::bad_qn) + 1);
}

TEST(wire_strings, every_rdmap_opcode_has_a_distinct_name) {
  std::set<std::string_view> names;
  for (int op = 0; op <= 0xB; ++op) {
    const auto s = to_string(static_cast<rdmap_op>(op));
    EXPECT_NE(s, "unknown") << op;
    names.insert(s);
  }
  EXPECT_EQ(names.size(), 12u);
}

}  // namespace
