// Unit tests for the RDMAP control message bodies (src/providers/soft/wire):
// Read Request, Terminate, RFC 7306 atomics and immediate data, and the codec's
// error and opcode names.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "byte_helpers.hpp"
#include "providers/soft/wire/wire.hpp"
#include "wire_samples.hpp"

namespace {

using namespace conveyor::wire;
using namespace conveyor::test;

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
