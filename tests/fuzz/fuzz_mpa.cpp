// libFuzzer target for MPA Request/Reply frames: mpa_pd_length and decode_mpa
// on arbitrary bytes, read both as a Request and as a Reply. Properties:
//  - decode_mpa agrees with mpa_pd_length (same error, or a frame of exactly
//    20 + PD_Length bytes; need_more below that, bad_length above);
//  - a decoded frame is consistent (no markers, v2 words iff rev 2 with H);
//  - encode_mpa(decode_mpa(x)) == x, byte for byte;
//  - a frame built from fuzz bytes with encode_mpa decodes back to itself;
//  - the large-FPDU flag 0x08 counts in a Reply only next to ext_ack without
//    ext_offer, so no echo of a Conveyor Request (Linux siw's Reply) enables it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_check.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace conveyor::wire;
using conveyor::fuzz::same_bytes;

void check_decoded(bytes frame, const mpa_frame& f, bool reply, std::uint16_t pd) {
  FUZZ_CHECK(frame.size() == mpa_header_size + pd);
  FUZZ_CHECK(f.reply == reply);
  FUZZ_CHECK(!f.markers());
  FUZZ_CHECK(f.revision <= 2);
  FUZZ_CHECK(f.flags == std::to_integer<std::uint8_t>(frame[16]));
  FUZZ_CHECK(f.v2.has_value() == (f.revision == 2 && f.enhanced()));
  FUZZ_CHECK(f.private_data.size() + (f.v2 ? 4u : 0u) == pd);
  if (f.v2) FUZZ_CHECK(f.v2->ird <= mpa_v2::mask && f.v2->ord <= mpa_v2::mask);
  FUZZ_CHECK(request_accepts_large_fpdus(f.flags) == ((f.flags & mpa_flag::large_fpdus) != 0));
  if (reply_accepts_large_fpdus(f.flags))
    FUZZ_CHECK((f.flags & mpa_flag::large_fpdus) && (f.flags & mpa_flag::ext_ack) &&
               !(f.flags & mpa_flag::ext_offer));
  if (f.flags & mpa_flag::ext_offer) FUZZ_CHECK(!reply_accepts_large_fpdus(f.flags));
  FUZZ_CHECK(same_bytes(encode_mpa(f), frame));
}

void check_as(bytes in, bool reply) {
  const auto pd = mpa_pd_length(in, reply);
  const auto f = decode_mpa(in, reply);
  if (in.size() < mpa_header_size) {
    FUZZ_CHECK(!pd && pd.error() == wire_error::need_more);
    FUZZ_CHECK(!f && f.error() == wire_error::need_more);
    return;
  }
  if (!pd) {
    FUZZ_CHECK(pd.error() == wire_error::bad_key || pd.error() == wire_error::bad_revision ||
               pd.error() == wire_error::pd_too_long);
    FUZZ_CHECK(!f && f.error() == pd.error());
    return;
  }
  FUZZ_CHECK(*pd <= mpa_max_private_data);
  const std::size_t want = mpa_header_size + *pd;
  if (in.size() < want) {
    FUZZ_CHECK(!f && f.error() == wire_error::need_more);
    return;
  }
  if (in.size() > want) {
    FUZZ_CHECK(!f && f.error() == wire_error::bad_length);
    // What a receiver does: read exactly PD_Length bytes, then decode those.
    const auto exact = decode_mpa(in.first(want), reply);
    if (exact) check_decoded(in.first(want), *exact, reply, *pd);
    return;
  }
  if (f) {
    check_decoded(in, *f, reply, *pd);
  } else {
    FUZZ_CHECK(f.error() == wire_error::markers || f.error() == wire_error::bad_v2);
  }
}

// Builds a frame from fuzz bytes, encodes it, and decodes it back.
void check_encoder(bytes in) {
  if (in.size() < 8) return;
  auto b = [&](std::size_t i) { return std::to_integer<std::uint8_t>(in[i]); };
  mpa_frame f;
  f.reply = b(0) & 1;
  f.flags = static_cast<std::uint8_t>(b(1) & ~mpa_flag::markers);
  f.revision = (b(0) & 2) ? 2 : 1;
  if (f.revision == 2 && (b(0) & 4)) {
    f.v2 = mpa_v2_words{static_cast<std::uint16_t>(get_be16(in.data() + 2) & mpa_v2::mask),
                        static_cast<std::uint16_t>(get_be16(in.data() + 4) & mpa_v2::mask),
                        (b(6) & 1) != 0,
                        (b(6) & 2) != 0,
                        (b(6) & 4) != 0,
                        (b(6) & 8) != 0};
  } else {
    // Without v2 words the H bit must be clear on a rev 2 frame, or the
    // decoder would take the first 4 private-data bytes as the words.
    if (f.revision == 2) f.flags &= static_cast<std::uint8_t>(~mpa_flag::enhanced);
  }
  f.private_data.assign(in.begin() + 8, in.end());
  const auto wire = encode_mpa(f);
  const std::size_t pd = f.private_data.size() + (f.v2 ? 4 : 0);
  if (pd > mpa_max_private_data) {
    FUZZ_CHECK(wire.empty());
    return;
  }
  FUZZ_CHECK(wire.size() == mpa_header_size + pd);
  const auto back = decode_mpa(wire, f.reply);
  FUZZ_CHECK(back.has_value());
  FUZZ_CHECK(back->flags == (f.v2 ? (f.flags | mpa_flag::enhanced) : f.flags));
  FUZZ_CHECK(back->revision == f.revision);
  FUZZ_CHECK(back->v2.has_value() == f.v2.has_value());
  if (f.v2) {
    FUZZ_CHECK(back->v2->ird == f.v2->ird && back->v2->ord == f.v2->ord &&
               back->v2->peer2peer == f.v2->peer2peer && back->v2->send_rtr == f.v2->send_rtr &&
               back->v2->write_rtr == f.v2->write_rtr && back->v2->read_rtr == f.v2->read_rtr);
  }
  FUZZ_CHECK(same_bytes(back->private_data, f.private_data));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const bytes in = conveyor::fuzz::as_bytes(data, size);
  check_as(in, false);
  check_as(in, true);
  check_encoder(in);
  return 0;
}
