// libFuzzer target for the FPDU side of the wire codecs: parse_fpdu_header as a
// receiver walks a byte stream, check_fpdu_crc, finish_fpdu and every body
// decoder (Read Request, Terminate, atomics, immediate data), on arbitrary
// bytes. Besides "no crash, no UB", it checks properties:
//  - a parsed header is self-consistent (lengths, pad, tagged model, QN);
//  - need_more only ever means "the header is not all here yet";
//  - anything that parses re-encodes, through the encoders, to the same bytes
//    (modulo what the encoders normalise: reserved bits, pad, CRC, and the
//    fields a control message always sends with fixed values);
//  - finish_fpdu always produces a CRC that check_fpdu_crc accepts.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_check.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace conveyor::wire;
using conveyor::fuzz::same_bytes;

bool is_tagged_op(rdmap_op op) {
  return op == rdmap_op::write || op == rdmap_op::read_response;
}

std::uint32_t qn_for(rdmap_op op) {
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

void check_header_invariants(bytes in, const fpdu_header& h) {
  FUZZ_CHECK(h.ulpdu_len == get_be16(in.data()));
  FUZZ_CHECK(in.size() >= h.header_len);
  FUZZ_CHECK(h.header_len >= mpa_len_size + ddp::tagged_hdr);
  FUZZ_CHECK(h.header_len + h.payload_len == mpa_len_size + h.ulpdu_len);
  FUZZ_CHECK(h.pad == fpdu_pad(h.ulpdu_len));
  FUZZ_CHECK(h.total() == fpdu_size(h.ulpdu_len));
  FUZZ_CHECK(h.total() % 4 == 0);
  FUZZ_CHECK(h.tagged == is_tagged_op(h.opcode));
  FUZZ_CHECK(static_cast<std::uint8_t>(h.opcode) <= 0xB);
  if (h.tagged) {
    FUZZ_CHECK(h.header_len == tagged_header_size);
  } else {
    FUZZ_CHECK(h.header_len >= untagged_header_size);
    FUZZ_CHECK(h.qn == qn_for(h.opcode));
  }
  if (h.opcode != rdmap_op::write && h.opcode != rdmap_op::read_response &&
      h.opcode != rdmap_op::send && h.opcode != rdmap_op::send_inv &&
      h.opcode != rdmap_op::send_se && h.opcode != rdmap_op::send_se_inv) {
    FUZZ_CHECK(h.payload_len == 0);  // control messages carry no payload
  }
  // The header is complete here, so one byte less must ask for more.
  const auto shorter = parse_fpdu_header(in.first(h.header_len - 1));
  FUZZ_CHECK(!shorter && shorter.error() == wire_error::need_more);
}

// decode(encode(t)) == t, with M forced on when a DDP header is carried.
void check_terminate_round_trip(const terminate_msg& t, bool crc) {
  const auto f = encode_terminate(t, crc);
  if (crc) FUZZ_CHECK(check_fpdu_crc(f));
  const auto h = parse_fpdu_header(f);
  FUZZ_CHECK(h.has_value());
  FUZZ_CHECK(h->opcode == rdmap_op::terminate && h->qn == qn::terminate && h->msn == 1 &&
             h->mo == 0 && h->last);
  FUZZ_CHECK(h->total() == f.size());
  const auto back = decode_terminate(
      bytes(f).subspan(untagged_header_size, h->header_len - untagged_header_size));
  FUZZ_CHECK(back.has_value());
  FUZZ_CHECK(back->layer == t.layer && back->etype == (t.etype & 0xF) && back->ecode == t.ecode);
  FUZZ_CHECK(back->has_segment_length == (t.has_segment_length || !t.ddp_header.empty()));
  if (back->has_segment_length) FUZZ_CHECK(back->ddp_segment_length == t.ddp_segment_length);
  FUZZ_CHECK(same_bytes(back->ddp_header, t.ddp_header));
  FUZZ_CHECK(same_bytes(back->rdmap_header, t.rdmap_header));
}

void check_read_request_round_trip(const read_request& rr, std::uint32_t msn, bool crc) {
  const auto f = encode_read_request(rr, msn, crc);
  const auto h = parse_fpdu_header(f);
  FUZZ_CHECK(h.has_value() && h->opcode == rdmap_op::read_request && h->msn == msn);
  const auto back = decode_read_request(bytes(f).subspan(untagged_header_size));
  FUZZ_CHECK(back.has_value());
  FUZZ_CHECK(back->sink_stag == rr.sink_stag && back->sink_to == rr.sink_to &&
             back->size == rr.size && back->src_stag == rr.src_stag && back->src_to == rr.src_to);
}

// Re-encodes a whole, parsed FPDU from its decoded fields and compares it with
// the input after normalising what the encoders do not carry over.
void check_reencode(bytes fp, const fpdu_header& h, bool crc_ok) {
  std::vector<std::byte> norm(fp.begin(), fp.end());
  norm[2] &= std::byte{0xC3};  // reserved DDP control bits
  norm[3] &= std::byte{0xCF};  // reserved RDMAP control bits
  // Control messages always go out as the last segment, MO 0, RsvdULP 0.
  auto fixed_control_fields = [&] {
    norm[2] |= std::byte{ddp::last};
    put_be32(norm.data() + 4, 0);
    put_be32(norm.data() + 16, 0);
  };
  const bytes body = fp.subspan(untagged_header_size);
  std::vector<std::byte> re;
  switch (h.opcode) {
    case rdmap_op::write:
    case rdmap_op::read_response:
      re = encode_tagged(h.opcode, h.last, h.stag, h.to, fp.subspan(h.header_len, h.payload_len),
                         crc_ok);
      break;
    case rdmap_op::send:
    case rdmap_op::send_inv:
    case rdmap_op::send_se:
    case rdmap_op::send_se_inv:
      re = encode_untagged(h.opcode, h.last, h.qn, h.msn, h.mo, h.inv_stag,
                           fp.subspan(h.header_len, h.payload_len), crc_ok);
      break;
    case rdmap_op::read_request: {
      const auto rr = decode_read_request(body);
      FUZZ_CHECK(rr.has_value());
      fixed_control_fields();
      re = encode_read_request(*rr, h.msn, crc_ok);
      check_read_request_round_trip(*rr, h.msn, crc_ok);
      break;
    }
    case rdmap_op::immediate:
    case rdmap_op::immediate_se: {
      const auto v = decode_immediate(body);
      FUZZ_CHECK(v.has_value());
      fixed_control_fields();
      re = encode_immediate(*v, h.opcode == rdmap_op::immediate_se, h.msn, crc_ok);
      break;
    }
    case rdmap_op::atomic_request: {
      const auto a = decode_atomic_request(body);
      if (!a) {
        FUZZ_CHECK(a.error() == wire_error::bad_opcode);
        return;
      }
      fixed_control_fields();
      norm[20] = norm[21] = norm[22] = std::byte{0};  // reserved bits of the opcode word
      norm[23] &= std::byte{0x0F};
      re = encode_atomic_request(*a, h.msn, crc_ok);
      break;
    }
    case rdmap_op::atomic_response: {
      const auto a = decode_atomic_response(body);
      FUZZ_CHECK(a.has_value());
      fixed_control_fields();
      re = encode_atomic_response(*a, h.msn, crc_ok);
      break;
    }
    case rdmap_op::terminate: {
      // The decoder ignores trailing bytes and reserved control-word bits, so
      // compare meaning rather than bytes.
      const auto t = decode_terminate(body.first(h.header_len - untagged_header_size));
      if (t) check_terminate_round_trip(*t, crc_ok);
      return;
    }
  }
  finish_fpdu(norm, crc_ok);
  FUZZ_CHECK(same_bytes(re, norm));
}

void walk_stream(bytes in) {
  std::size_t off = 0;
  while (off < in.size()) {
    const bytes rest = in.subspan(off);
    const auto h = parse_fpdu_header(rest);
    if (!h) {
      if (h.error() == wire_error::need_more)
        FUZZ_CHECK(rest.size() < 4 || rest.size() < mpa_len_size + get_be16(rest.data()));
      return;
    }
    check_header_invariants(rest, *h);
    if (rest.size() < h->total()) return;  // wait for the rest of the FPDU
    const bytes fp = rest.first(h->total());
    const bool crc_ok = check_fpdu_crc(fp);
    check_reencode(fp, *h, crc_ok);
    off += h->total();
  }
}

void check_finish_fpdu(bytes in) {
  if (in.size() < mpa_len_size) return;
  const std::size_t n = fpdu_size(get_be16(in.data()));
  if (in.size() < n) return;
  std::vector<std::byte> f(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n));
  finish_fpdu(f, true);
  FUZZ_CHECK(check_fpdu_crc(f));
  finish_fpdu(f, false);
  FUZZ_CHECK(get_crc(f.data() + n - crc_size) == 0);
  for (std::size_t i = n - crc_size - fpdu_pad(get_be16(in.data())); i < n; ++i)
    FUZZ_CHECK(f[i] == std::byte{0});
}

void decode_raw_bodies(bytes in) {
  if (auto rr = decode_read_request(in)) check_read_request_round_trip(*rr, 1, true);
  if (auto t = decode_terminate(in)) check_terminate_round_trip(*t, false);
  if (auto a = decode_atomic_request(in)) {
    const auto f = encode_atomic_request(*a, 1, false);
    const auto back = decode_atomic_request(bytes(f).subspan(untagged_header_size));
    FUZZ_CHECK(back.has_value() && back->kind == a->kind && back->request_id == a->request_id &&
               back->stag == a->stag && back->to == a->to && back->add_swap == a->add_swap &&
               back->add_swap_mask == a->add_swap_mask && back->compare == a->compare &&
               back->compare_mask == a->compare_mask);
  }
  if (auto r = decode_atomic_response(in)) {
    const auto f = encode_atomic_response(*r, 1, false);
    const auto back = decode_atomic_response(bytes(f).subspan(untagged_header_size));
    FUZZ_CHECK(back.has_value() && back->request_id == r->request_id &&
               back->original == r->original);
  }
  if (auto v = decode_immediate(in)) {
    const auto f = encode_immediate(*v, false, 1, false);
    FUZZ_CHECK(decode_immediate(bytes(f).subspan(untagged_header_size)).value() == *v);
  }
  (void)check_fpdu_crc(in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const bytes in = conveyor::fuzz::as_bytes(data, size);
  walk_stream(in);
  check_finish_fpdu(in);
  decode_raw_bodies(in);
  // The bodies as they would sit behind an untagged header.
  if (size > untagged_header_size) decode_raw_bodies(in.subspan(untagged_header_size));
  return 0;
}
