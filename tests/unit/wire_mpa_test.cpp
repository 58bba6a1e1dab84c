// Unit tests for MPA Request/Reply frames (RFC 5044) with the RFC 6581 v2
// IRD/ORD words: encode/decode round trips, the streaming contract
// (mpa_pd_length then decode_mpa) and every refusal.
#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "byte_helpers.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace conveyor::wire;
using conveyor::test::from_string;
using conveyor::test::pattern;
using conveyor::test::to_hex;
using conveyor::test::u8;

// A raw frame with exactly the given header fields (no validation).
std::vector<std::byte> raw_frame(std::string_view key, std::uint8_t flags, std::uint8_t rev,
                                 std::uint16_t pd_len, std::size_t pd_bytes_present) {
  std::vector<std::byte> f(mpa_header_size + pd_bytes_present);
  for (std::size_t i = 0; i < 16; ++i) f[i] = std::byte(static_cast<unsigned char>(key[i]));
  f[16] = std::byte(flags);
  f[17] = std::byte(rev);
  put_be16(f.data() + 18, pd_len);
  for (std::size_t i = 0; i < pd_bytes_present; ++i) f[20 + i] = std::byte(i * 7 + 1);
  return f;
}

mpa_frame v2_request() {
  mpa_frame f;
  f.reply = false;
  f.flags = mpa_flag::crc;
  f.revision = 2;
  f.v2 = mpa_v2_words{16, 8, true, false, true, true};
  f.private_data = from_string("hello");
  return f;
}

TEST(mpa, request_v2_round_trip_strips_the_ird_ord_words) {
  const auto in = v2_request();
  const auto wire = encode_mpa(in);
  ASSERT_EQ(wire.size(), 20u + 4u + 5u);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(wire.data()), 16), "MPA ID Req Frame");
  EXPECT_EQ(u8(wire[16]), mpa_flag::crc | mpa_flag::enhanced);
  EXPECT_EQ(u8(wire[17]), 2u);
  EXPECT_EQ(get_be16(wire.data() + 18), 9u);  // PD_Length includes the v2 words
  const auto out = decode_mpa(wire, false);
  ASSERT_TRUE(out.has_value()) << to_string(out.error());
  EXPECT_FALSE(out->reply);
  EXPECT_EQ(out->revision, 2u);
  EXPECT_TRUE(out->crc());
  EXPECT_TRUE(out->enhanced());
  EXPECT_FALSE(out->markers());
  EXPECT_FALSE(out->rejected());
  ASSERT_TRUE(out->v2.has_value());
  EXPECT_EQ(out->v2->ird, 16u);
  EXPECT_EQ(out->v2->ord, 8u);
  EXPECT_TRUE(out->v2->peer2peer);
  EXPECT_FALSE(out->v2->send_rtr);
  EXPECT_TRUE(out->v2->write_rtr);
  EXPECT_TRUE(out->v2->read_rtr);
  EXPECT_EQ(to_hex(out->private_data), to_hex(in.private_data));
}

TEST(mpa, reply_v2_round_trip_uses_the_reply_key) {
  mpa_frame in;
  in.reply = true;
  in.revision = 2;
  in.v2 = mpa_v2_words{128, 128, true, false, true, false};
  const auto wire = encode_mpa(in);
  ASSERT_EQ(wire.size(), 24u);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(wire.data()), 16), "MPA ID Rep Frame");
  EXPECT_EQ(to_hex(std::span(wire).subspan(16)),
            "10"
            "02"
            "0004"
            "8080"
            "8080");
  const auto out = decode_mpa(wire, true);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->reply);
  ASSERT_TRUE(out->v2.has_value());
  EXPECT_EQ(out->v2->ird, 128u);
  EXPECT_EQ(out->v2->ord, 128u);
  EXPECT_TRUE(out->v2->peer2peer);
  EXPECT_TRUE(out->v2->write_rtr);
  EXPECT_FALSE(out->v2->read_rtr);
  EXPECT_TRUE(out->private_data.empty());
}

TEST(mpa, v2_words_are_big_endian_ird_then_ord) {
  mpa_frame f;
  f.v2 = mpa_v2_words{0x0123, 0x0456, false, false, false, false};
  const auto wire = encode_mpa(f);
  EXPECT_EQ(to_hex(std::span(wire).subspan(20, 4)),
            "0123"
            "0456");
}

TEST(mpa, each_rtr_and_p2p_bit_lands_on_its_own_word_and_bit) {
  struct bit_case {
    const char* name;
    mpa_v2_words words;
    const char* hex;
  };
  const bit_case cases[] = {
      {"A peer2peer on IRD bit 15", {0, 0, true, false, false, false}, "80000000"},
      {"B send RTR on IRD bit 14", {0, 0, false, true, false, false}, "40000000"},
      {"C write RTR on ORD bit 15", {0, 0, false, false, true, false}, "00008000"},
      {"D read RTR on ORD bit 14", {0, 0, false, false, false, true}, "00004000"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    mpa_frame f;
    f.v2 = c.words;
    const auto wire = encode_mpa(f);
    EXPECT_EQ(to_hex(std::span(wire).subspan(20, 4)), c.hex);
    const auto out = decode_mpa(wire, false);
    ASSERT_TRUE(out.has_value());
    ASSERT_TRUE(out->v2.has_value());
    EXPECT_EQ(out->v2->peer2peer, c.words.peer2peer);
    EXPECT_EQ(out->v2->send_rtr, c.words.send_rtr);
    EXPECT_EQ(out->v2->write_rtr, c.words.write_rtr);
    EXPECT_EQ(out->v2->read_rtr, c.words.read_rtr);
    EXPECT_EQ(out->v2->ird, 0u);
    EXPECT_EQ(out->v2->ord, 0u);
  }
}

TEST(mpa, ird_ord_are_14_bit_counts_that_never_leak_into_the_flag_bits) {
  mpa_frame f;
  f.v2 = mpa_v2_words{0xFFFF, 0xFFFF, false, false, false, false};
  const auto wire = encode_mpa(f);
  EXPECT_EQ(to_hex(std::span(wire).subspan(20, 4)),
            "3fff"
            "3fff");
  const auto out = decode_mpa(wire, false);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->v2->ird, 0x3FFFu);
  EXPECT_EQ(out->v2->ord, 0x3FFFu);
  EXPECT_FALSE(out->v2->peer2peer || out->v2->send_rtr || out->v2->write_rtr || out->v2->read_rtr);
}

TEST(mpa, encoder_sets_the_enhanced_flag_whenever_v2_words_are_present) {
  mpa_frame f;
  f.flags = 0;
  f.v2 = mpa_v2_words{};
  const auto wire = encode_mpa(f);
  EXPECT_EQ(u8(wire[16]) & mpa_flag::enhanced, mpa_flag::enhanced);
}

TEST(mpa, rev2_frame_without_h_has_no_v2_words) {
  mpa_frame in;
  in.reply = true;
  in.revision = 2;
  in.flags = mpa_flag::crc;
  in.private_data = pattern(10);
  const auto wire = encode_mpa(in);
  EXPECT_EQ(get_be16(wire.data() + 18), 10u);
  const auto out = decode_mpa(wire, true);
  ASSERT_TRUE(out.has_value());
  EXPECT_FALSE(out->v2.has_value());
  EXPECT_EQ(to_hex(out->private_data), to_hex(in.private_data));
}

TEST(mpa, rev1_frame_round_trips_without_v2_words) {
  mpa_frame in;
  in.revision = 1;
  in.flags = mpa_flag::crc;
  in.private_data = from_string("abcd1234");
  const auto wire = encode_mpa(in);
  EXPECT_EQ(u8(wire[16]), mpa_flag::crc);
  EXPECT_EQ(u8(wire[17]), 1u);
  const auto out = decode_mpa(wire, false);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->revision, 1u);
  EXPECT_FALSE(out->v2.has_value());
  EXPECT_EQ(to_hex(out->private_data), to_hex(in.private_data));
}

TEST(mpa, h_bit_on_a_rev1_frame_does_not_strip_private_data) {
  // H is reserved in RFC 5044: a rev 1 peer may set it by accident.
  const auto wire = raw_frame(mpa_req_key, mpa_flag::enhanced, 1, 6, 6);
  const auto out = decode_mpa(wire, false);
  ASSERT_TRUE(out.has_value());
  EXPECT_FALSE(out->v2.has_value());
  EXPECT_EQ(out->private_data.size(), 6u);
}

TEST(mpa, rev1_frame_with_empty_private_data) {
  const auto wire = raw_frame(mpa_rep_key, 0, 1, 0, 0);
  const auto out = decode_mpa(wire, true);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->private_data.empty());
  EXPECT_EQ(to_hex(encode_mpa(*out)), to_hex(wire));
}

TEST(mpa, reject_reply_carries_its_private_data) {
  mpa_frame in;
  in.reply = true;
  in.revision = 2;
  in.flags = mpa_flag::reject;
  in.private_data = from_string("go away");
  const auto wire = encode_mpa(in);
  EXPECT_EQ(u8(wire[16]), mpa_flag::reject);
  const auto out = decode_mpa(wire, true);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->rejected());
  EXPECT_EQ(to_hex(out->private_data), to_hex(in.private_data));
}

TEST(mpa, request_asking_for_markers_is_refused) {
  auto f = v2_request();
  f.flags |= mpa_flag::markers;
  const auto out = decode_mpa(encode_mpa(f), false);
  ASSERT_FALSE(out.has_value());
  EXPECT_EQ(out.error(), wire_error::markers);
}

TEST(mpa, reply_with_markers_is_refused) {
  const auto wire = raw_frame(mpa_rep_key, mpa_flag::markers | mpa_flag::crc, 1, 0, 0);
  const auto out = decode_mpa(wire, true);
  ASSERT_FALSE(out.has_value());
  EXPECT_EQ(out.error(), wire_error::markers);
}

TEST(mpa, encoder_refuses_private_data_over_256_bytes) {
  mpa_frame f;
  f.revision = 1;
  f.private_data = pattern(256);
  EXPECT_EQ(encode_mpa(f).size(), 20u + 256u);
  f.private_data = pattern(257);
  EXPECT_TRUE(encode_mpa(f).empty());
}

TEST(mpa, encoder_counts_the_v2_words_against_the_256_byte_limit) {
  mpa_frame f;
  f.v2 = mpa_v2_words{};
  f.private_data = pattern(252);
  const auto ok = encode_mpa(f);
  ASSERT_EQ(ok.size(), 20u + 256u);
  EXPECT_EQ(get_be16(ok.data() + 18), 256u);
  f.private_data = pattern(253);
  EXPECT_TRUE(encode_mpa(f).empty());
}

TEST(mpa, pd_length_over_256_in_the_header_is_refused) {
  for (std::uint16_t pd : {257, 512, 0xFFFF}) {
    const auto wire = raw_frame(mpa_req_key, 0, 2, pd, 0);
    const auto len = mpa_pd_length(wire, false);
    ASSERT_FALSE(len.has_value()) << pd;
    EXPECT_EQ(len.error(), wire_error::pd_too_long) << pd;
  }
  const auto full = raw_frame(mpa_req_key, 0, 2, 257, 257);
  const auto out = decode_mpa(full, false);
  ASSERT_FALSE(out.has_value());
  EXPECT_EQ(out.error(), wire_error::pd_too_long);
}

TEST(mpa, pd_length_is_read_from_the_header) {
  for (std::uint16_t pd : {0, 1, 4, 100, 255, 256}) {
    const auto wire = raw_frame(mpa_rep_key, mpa_flag::crc, 1, pd, pd);
    const auto len = mpa_pd_length(std::span(wire).first(mpa_header_size), true);
    ASSERT_TRUE(len.has_value()) << pd;
    EXPECT_EQ(*len, pd);
    // Bytes past the header do not change the answer.
    EXPECT_EQ(mpa_pd_length(wire, true).value(), pd);
  }
  mpa_frame v2;
  v2.v2 = mpa_v2_words{};
  v2.private_data = pattern(7);
  EXPECT_EQ(mpa_pd_length(encode_mpa(v2), false).value(), 11u);
}

TEST(mpa, pd_length_needs_the_whole_20_byte_header) {
  const auto wire = encode_mpa(v2_request());
  for (std::size_t n = 0; n < mpa_header_size; ++n) {
    const auto len = mpa_pd_length(std::span(wire).first(n), false);
    ASSERT_FALSE(len.has_value()) << n;
    EXPECT_EQ(len.error(), wire_error::need_more) << n;
  }
}

TEST(mpa, decode_needs_the_whole_private_data) {
  const auto wire = encode_mpa(v2_request());
  for (std::size_t n = 0; n < wire.size(); ++n) {
    const auto out = decode_mpa(std::span(wire).first(n), false);
    ASSERT_FALSE(out.has_value()) << n;
    EXPECT_EQ(out.error(), wire_error::need_more) << n;
  }
}

TEST(mpa, decode_rejects_bytes_after_the_private_data) {
  auto wire = encode_mpa(v2_request());
  wire.push_back(std::byte{0});
  const auto out = decode_mpa(wire, false);
  ASSERT_FALSE(out.has_value());
  EXPECT_EQ(out.error(), wire_error::bad_length);
}

TEST(mpa, request_key_where_a_reply_is_expected_is_bad_key) {
  const auto req = encode_mpa(v2_request());
  EXPECT_EQ(mpa_pd_length(req, true).error(), wire_error::bad_key);
  EXPECT_EQ(decode_mpa(req, true).error(), wire_error::bad_key);
  auto rep_frame = v2_request();
  rep_frame.reply = true;
  const auto rep = encode_mpa(rep_frame);
  EXPECT_EQ(mpa_pd_length(rep, false).error(), wire_error::bad_key);
  EXPECT_EQ(decode_mpa(rep, false).error(), wire_error::bad_key);
}

TEST(mpa, any_corrupted_key_byte_is_bad_key) {
  const auto good = encode_mpa(v2_request());
  for (std::size_t i = 0; i < 16; ++i) {
    auto bad = good;
    bad[i] ^= std::byte{0x20};  // e.g. case flip
    EXPECT_EQ(mpa_pd_length(bad, false).error(), wire_error::bad_key) << i;
    EXPECT_EQ(decode_mpa(bad, false).error(), wire_error::bad_key) << i;
  }
}

TEST(mpa, revision_above_2_is_refused) {
  for (std::uint8_t rev : {3, 4, 0x80, 0xFF}) {
    const auto wire = raw_frame(mpa_req_key, 0, rev, 0, 0);
    EXPECT_EQ(mpa_pd_length(wire, false).error(), wire_error::bad_revision) << int{rev};
    EXPECT_EQ(decode_mpa(wire, false).error(), wire_error::bad_revision) << int{rev};
  }
}

TEST(mpa, enhanced_rev2_frame_without_room_for_the_words_is_bad_v2) {
  for (std::uint16_t pd = 0; pd < 4; ++pd) {
    const auto wire = raw_frame(mpa_req_key, mpa_flag::enhanced, 2, pd, pd);
    const auto out = decode_mpa(wire, false);
    ASSERT_FALSE(out.has_value()) << pd;
    EXPECT_EQ(out.error(), wire_error::bad_v2) << pd;
  }
}

TEST(mpa, reserved_nibble_flags_survive_a_round_trip) {
  for (std::uint8_t extra :
       {mpa_flag::ext_offer, mpa_flag::ext_ack, std::uint8_t{0x08}, std::uint8_t{0x01}}) {
    auto in = v2_request();
    in.flags = mpa_flag::crc | extra;
    const auto wire = encode_mpa(in);
    const auto out = decode_mpa(wire, false);
    ASSERT_TRUE(out.has_value());
    EXPECT_EQ(out->flags, mpa_flag::crc | mpa_flag::enhanced | extra);
    EXPECT_EQ(to_hex(encode_mpa(*out)), to_hex(wire));
  }
}

// The large-FPDU negotiation on the wire: Conveyor's Request is C|H|0x04|0x08
// (0x5C), a Conveyor Reply that accepts is C|H|0x02|0x08 (0x5A). Linux siw
// builds its Reply from the Request's flag byte (siw_cm.c, siw_proc_mpareq),
// so its Reply to that Request is 0x5C again: 0x08 with ext_offer is an echo
// and does not count.
TEST(mpa, large_fpdu_flag_is_0x08_and_a_reply_counts_only_next_to_ext_ack) {
  EXPECT_EQ(mpa_flag::large_fpdus, 0x08);
  auto req = v2_request();
  req.flags = mpa_flag::crc | mpa_flag::ext_offer | mpa_flag::large_fpdus;
  const auto wire = encode_mpa(req);
  EXPECT_EQ(to_hex(std::span(wire).subspan(16, 4)),
            "5c"
            "02"
            "0009");
  const auto in = decode_mpa(wire, false);
  ASSERT_TRUE(in.has_value());
  EXPECT_TRUE(request_accepts_large_fpdus(in->flags));
  EXPECT_FALSE(request_accepts_large_fpdus(mpa_flag::crc | mpa_flag::enhanced | 0x04));

  mpa_frame rep;
  rep.reply = true;
  rep.revision = 2;
  rep.flags = mpa_flag::crc | mpa_flag::ext_ack | mpa_flag::large_fpdus;
  rep.v2 = mpa_v2_words{8, 8, true, false, true, false};
  const auto rw = encode_mpa(rep);
  EXPECT_EQ(to_hex(std::span(rw).subspan(16, 4)),
            "5a"
            "02"
            "0004");
  const auto out = decode_mpa(rw, true);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(reply_accepts_large_fpdus(out->flags));

  // siw's echo of our Request: 0x08 and ext_offer, no ext_ack.
  EXPECT_FALSE(reply_accepts_large_fpdus(0x5C));
  // ext_ack and ext_offer together: an echo of a Request that had both.
  EXPECT_FALSE(reply_accepts_large_fpdus(0x5E));
  // A Conveyor responder with large FPDUs off: ext_ack alone.
  EXPECT_FALSE(reply_accepts_large_fpdus(0x52));
  // A Reply with 0x08 but no proof it read our Request (a peer that sets
  // reserved bits, or siw with try_gso answering a Request without ext_offer).
  EXPECT_FALSE(reply_accepts_large_fpdus(0x18));
  EXPECT_TRUE(reply_accepts_large_fpdus(0x1A));
}

TEST(mpa, decoded_frames_re_encode_to_identical_bytes) {
  std::vector<std::vector<std::byte>> frames;
  frames.push_back(encode_mpa(v2_request()));
  frames.push_back(raw_frame(mpa_req_key, mpa_flag::enhanced | mpa_flag::crc, 2, 4, 4));
  frames.push_back(raw_frame(mpa_rep_key, mpa_flag::reject, 1, 3, 3));
  frames.push_back(raw_frame(mpa_rep_key, mpa_flag::enhanced | 0x0F, 2, 256, 256));
  for (const auto& wire : frames) {
    const bool reply =
        std::string_view(reinterpret_cast<const char*>(wire.data()), 16) == mpa_rep_key;
    const auto out = decode_mpa(wire, reply);
    ASSERT_TRUE(out.has_value()) << to_hex(wire);
    EXPECT_EQ(to_hex(encode_mpa(*out)), to_hex(wire));
  }
}

}  // namespace
