// Unit tests for DDP/RDMAP header parsing (src/providers/soft/wire): every
// opcode's FPDU, truncations, versions, reserved bits, queue numbers and
// lengths that do not fit the message.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "byte_helpers.hpp"
#include "providers/soft/wire/wire.hpp"
#include "wire_samples.hpp"

namespace {

using namespace conveyor::wire;
using namespace conveyor::test;

// ------------------------------------------------------- FPDU header parsing ----

struct sample {
  std::string name;
  rdmap_op op;
  std::vector<std::byte> fpdu;
  bool crc;
};

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

}  // namespace
