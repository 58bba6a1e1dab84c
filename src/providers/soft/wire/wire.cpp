// Wire codecs for MPA/DDP/RDMAP; see wire.hpp. Pure functions.
#include "wire.hpp"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace conveyor::wire {

std::uint32_t crc32c_update(std::uint32_t running, const void* data, std::size_t len) noexcept {
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (len > 0) {
    const int chunk = static_cast<int>(std::min<std::size_t>(len, INT_MAX & ~63));
    running = crc32_iscsi(p, chunk, running);
    p += chunk;
    len -= static_cast<std::size_t>(chunk);
  }
  return running;
}

std::string_view to_string(wire_error e) noexcept {
  switch (e) {
    case wire_error::need_more:
      return "need more bytes";
    case wire_error::bad_key:
      return "bad MPA key";
    case wire_error::bad_revision:
      return "unsupported MPA revision";
    case wire_error::markers:
      return "MPA markers requested (not supported)";
    case wire_error::pd_too_long:
      return "MPA private data longer than 256 bytes";
    case wire_error::bad_v2:
      return "MPA v2 enhanced frame without IRD/ORD words";
    case wire_error::bad_ddp_version:
      return "DDP version is not 1";
    case wire_error::bad_rdmap_version:
      return "RDMAP version is not 1";
    case wire_error::bad_opcode:
      return "unknown RDMAP opcode";
    case wire_error::bad_length:
      return "ULPDU length does not match the header";
    case wire_error::bad_qn:
      return "invalid DDP queue number for the opcode";
  }
  return "unknown wire error";
}

std::string_view to_string(rdmap_op op) noexcept {
  switch (op) {
    case rdmap_op::write:
      return "RDMA Write";
    case rdmap_op::read_request:
      return "RDMA Read Request";
    case rdmap_op::read_response:
      return "RDMA Read Response";
    case rdmap_op::send:
      return "Send";
    case rdmap_op::send_inv:
      return "Send with Invalidate";
    case rdmap_op::send_se:
      return "Send with SE";
    case rdmap_op::send_se_inv:
      return "Send with SE and Invalidate";
    case rdmap_op::terminate:
      return "Terminate";
    case rdmap_op::immediate:
      return "Immediate Data";
    case rdmap_op::immediate_se:
      return "Immediate Data with SE";
    case rdmap_op::atomic_request:
      return "Atomic Request";
    case rdmap_op::atomic_response:
      return "Atomic Response";
  }
  return "unknown";
}

// ----------------------------------------------------------------------- MPA ----
std::vector<std::byte> encode_mpa(const mpa_frame& f) {
  const std::size_t v2len = f.v2 ? 4 : 0;
  const std::size_t pd = v2len + f.private_data.size();
  if (pd > mpa_max_private_data) return {};
  if (f.v2 && f.revision != 2) return {};  // the IRD/ORD words exist only in revision 2
  std::vector<std::byte> out(mpa_header_size + pd);
  const auto key = f.reply ? mpa_rep_key : mpa_req_key;
  std::memcpy(out.data(), key.data(), 16);
  std::uint8_t flags = f.flags;
  if (f.v2) flags |= mpa_flag::enhanced;
  out[16] = std::byte(flags);
  out[17] = std::byte(f.revision);
  put_be16(out.data() + 18, static_cast<std::uint16_t>(pd));
  if (f.v2) {
    std::uint16_t ird = f.v2->ird & mpa_v2::mask;
    std::uint16_t ord = f.v2->ord & mpa_v2::mask;
    if (f.v2->peer2peer) ird |= mpa_v2::peer2peer;
    if (f.v2->send_rtr) ird |= mpa_v2::send_rtr;
    if (f.v2->write_rtr) ord |= mpa_v2::write_rtr;
    if (f.v2->read_rtr) ord |= mpa_v2::read_rtr;
    put_be16(out.data() + 20, ird);
    put_be16(out.data() + 22, ord);
  }
  if (!f.private_data.empty())
    std::memcpy(out.data() + mpa_header_size + v2len, f.private_data.data(), f.private_data.size());
  return out;
}

std::expected<std::uint16_t, wire_error> mpa_pd_length(bytes h, bool expect_reply) {
  if (h.size() < mpa_header_size) return std::unexpected(wire_error::need_more);
  const auto key = expect_reply ? mpa_rep_key : mpa_req_key;
  if (std::memcmp(h.data(), key.data(), 16) != 0) return std::unexpected(wire_error::bad_key);
  const auto rev = std::to_integer<std::uint8_t>(h[17]);
  if (rev > 2) return std::unexpected(wire_error::bad_revision);
  const std::uint16_t pd = get_be16(h.data() + 18);
  if (pd > mpa_max_private_data) return std::unexpected(wire_error::pd_too_long);
  return pd;
}

std::expected<mpa_frame, wire_error> decode_mpa(bytes in, bool expect_reply) {
  auto pd = mpa_pd_length(in, expect_reply);
  if (!pd) return std::unexpected(pd.error());
  if (in.size() < mpa_header_size + *pd) return std::unexpected(wire_error::need_more);
  if (in.size() > mpa_header_size + *pd) return std::unexpected(wire_error::bad_length);
  mpa_frame f;
  f.reply = expect_reply;
  f.flags = std::to_integer<std::uint8_t>(in[16]);
  f.revision = std::to_integer<std::uint8_t>(in[17]);
  if (f.markers()) return std::unexpected(wire_error::markers);
  std::size_t off = mpa_header_size;
  if (f.revision == 2 && f.enhanced()) {
    if (*pd < 4) return std::unexpected(wire_error::bad_v2);
    const std::uint16_t ird = get_be16(in.data() + 20);
    const std::uint16_t ord = get_be16(in.data() + 22);
    mpa_v2_words w;
    w.ird = ird & mpa_v2::mask;
    w.ord = ord & mpa_v2::mask;
    w.peer2peer = ird & mpa_v2::peer2peer;
    w.send_rtr = ird & mpa_v2::send_rtr;
    w.write_rtr = ord & mpa_v2::write_rtr;
    w.read_rtr = ord & mpa_v2::read_rtr;
    f.v2 = w;
    off += 4;
  }
  f.private_data.assign(in.begin() + static_cast<std::ptrdiff_t>(off), in.end());
  return f;
}

// ----------------------------------------------------------------- DDP/RDMAP ----
std::expected<fpdu_header, wire_error> parse_fpdu_header(bytes in) noexcept {
  if (in.size() < 4) return std::unexpected(wire_error::need_more);
  fpdu_header h;
  h.ulpdu_len = get_be16(in.data());
  const auto c0 = std::to_integer<std::uint8_t>(in[2]);
  const auto c1 = std::to_integer<std::uint8_t>(in[3]);
  if ((c0 & 0x03) != ddp::version) return std::unexpected(wire_error::bad_ddp_version);
  if ((c1 & 0xC0) != ddp::rdmap_version) return std::unexpected(wire_error::bad_rdmap_version);
  h.tagged = c0 & ddp::tagged;
  h.last = c0 & ddp::last;
  const std::uint8_t op = c1 & 0x0F;
  if (op > 0xB) return std::unexpected(wire_error::bad_opcode);
  h.opcode = static_cast<rdmap_op>(op);
  if (is_tagged(h.opcode) != h.tagged) return std::unexpected(wire_error::bad_opcode);
  std::size_t ddp_len = h.tagged ? ddp::tagged_hdr : ddp::untagged_hdr;
  std::size_t extra = 0;
  switch (h.opcode) {
    case rdmap_op::read_request:
      extra = read_request_hdr;
      break;
    case rdmap_op::atomic_request:
      extra = atomic_request_hdr;
      break;
    case rdmap_op::atomic_response:
      extra = atomic_response_hdr;
      break;
    case rdmap_op::immediate:
    case rdmap_op::immediate_se:
      extra = immediate_hdr;
      break;
    case rdmap_op::terminate:
      extra = h.ulpdu_len > ddp_len ? h.ulpdu_len - ddp_len : 0;
      break;
    default:
      break;
  }
  if (h.ulpdu_len < ddp_len + extra) return std::unexpected(wire_error::bad_length);
  // Control messages carry no payload beyond their fixed header.
  if (extra != 0 && h.opcode != rdmap_op::terminate && h.ulpdu_len != ddp_len + extra)
    return std::unexpected(wire_error::bad_length);
  if (h.opcode == rdmap_op::terminate && extra < 4) return std::unexpected(wire_error::bad_length);
  h.header_len = mpa_len_size + ddp_len + extra;
  h.payload_len = h.ulpdu_len - ddp_len - extra;
  h.pad = fpdu_pad(h.ulpdu_len);
  if (in.size() < h.header_len) return std::unexpected(wire_error::need_more);
  const std::byte* d = in.data() + 2;
  if (h.tagged) {
    h.stag = get_be32(d + 2);
    h.to = get_be64(d + 6);
  } else {
    h.inv_stag = get_be32(d + 2);
    h.qn = get_be32(d + 6);
    h.msn = get_be32(d + 10);
    h.mo = get_be32(d + 14);
    if (h.qn != queue_of(h.opcode)) return std::unexpected(wire_error::bad_qn);
  }
  return h;
}

std::size_t write_tagged_header(std::byte* out, rdmap_op op, bool last, std::uint32_t stag,
                                std::uint64_t to, std::size_t payload_len) noexcept {
  put_be16(out, static_cast<std::uint16_t>(ddp::tagged_hdr + payload_len));
  out[2] = std::byte(ddp::tagged | (last ? ddp::last : 0) | ddp::version);
  out[3] = std::byte(ddp::rdmap_version | static_cast<std::uint8_t>(op));
  put_be32(out + 4, stag);
  put_be64(out + 8, to);
  return tagged_header_size;
}

std::size_t write_untagged_header(std::byte* out, rdmap_op op, bool last, std::uint32_t q,
                                  std::uint32_t msn, std::uint32_t mo, std::uint32_t inv_stag,
                                  std::size_t extra_hdr, std::size_t payload_len) noexcept {
  put_be16(out, static_cast<std::uint16_t>(ddp::untagged_hdr + extra_hdr + payload_len));
  out[2] = std::byte((last ? ddp::last : 0) | ddp::version);
  out[3] = std::byte(ddp::rdmap_version | static_cast<std::uint8_t>(op));
  put_be32(out + 4, inv_stag);
  put_be32(out + 8, q);
  put_be32(out + 12, msn);
  put_be32(out + 16, mo);
  return untagged_header_size;
}

void finish_fpdu(mut_bytes fpdu, bool crc) noexcept {
  const std::size_t ulpdu = get_be16(fpdu.data());
  const std::size_t body = mpa_len_size + ulpdu;
  const std::size_t pad = fpdu_pad(ulpdu);
  std::memset(fpdu.data() + body, 0, pad);
  const std::uint32_t c = crc ? crc32c(fpdu.first(body + pad)) : 0;
  put_crc(fpdu.data() + body + pad, c);
}

bool check_fpdu_crc(bytes fpdu) noexcept {
  if (fpdu.size() < mpa_len_size + crc_size) return false;
  const std::size_t ulpdu = get_be16(fpdu.data());
  const std::size_t body = mpa_len_size + ulpdu + fpdu_pad(ulpdu);
  if (fpdu.size() < body + crc_size) return false;
  return crc32c(fpdu.first(body)) == get_crc(fpdu.data() + body);
}

namespace {
std::vector<std::byte> make_fpdu(std::size_t ulpdu_len) {
  return std::vector<std::byte>(fpdu_size(ulpdu_len));
}
}  // namespace

std::size_t write_read_request(std::byte* out, const read_request& rr, std::uint32_t msn,
                               bool crc) noexcept {
  const std::size_t n = fpdu_size(ddp::untagged_hdr + read_request_hdr);
  write_untagged_header(out, rdmap_op::read_request, true, qn::read_request, msn, 0, 0,
                        read_request_hdr, 0);
  std::byte* p = out + untagged_header_size;
  put_be32(p, rr.sink_stag);
  put_be64(p + 4, rr.sink_to);
  put_be32(p + 12, rr.size);
  put_be32(p + 16, rr.src_stag);
  put_be64(p + 20, rr.src_to);
  finish_fpdu(mut_bytes(out, n), crc);
  return n;
}

std::vector<std::byte> encode_read_request(const read_request& rr, std::uint32_t msn, bool crc) {
  std::vector<std::byte> out(control_fpdu_max);
  out.resize(write_read_request(out.data(), rr, msn, crc));
  return out;
}

std::vector<std::byte> encode_terminate(const terminate_msg& t, bool crc) {
  const bool seglen = t.has_segment_length || !t.ddp_header.empty();
  const std::size_t extra = 4 + (seglen ? 2 : 0) + t.ddp_header.size() + t.rdmap_header.size();
  auto out = make_fpdu(ddp::untagged_hdr + extra);
  write_untagged_header(out.data(), rdmap_op::terminate, true, qn::terminate, 1, 0, 0, extra, 0);
  std::byte* p = out.data() + untagged_header_size;
  terminate_msg copy_flags = t;
  copy_flags.has_segment_length = seglen;
  put_be32(p, copy_flags.control_word());
  p += 4;
  if (seglen) {
    put_be16(p, t.ddp_segment_length);
    p += 2;
  }
  if (!t.ddp_header.empty()) {
    std::memcpy(p, t.ddp_header.data(), t.ddp_header.size());
    p += t.ddp_header.size();
  }
  if (!t.rdmap_header.empty()) std::memcpy(p, t.rdmap_header.data(), t.rdmap_header.size());
  finish_fpdu(out, crc);
  return out;
}

std::size_t write_atomic_request(std::byte* out, const atomic_request& a, std::uint32_t msn,
                                 bool crc) noexcept {
  const std::size_t n = fpdu_size(ddp::untagged_hdr + atomic_request_hdr);
  write_untagged_header(out, rdmap_op::atomic_request, true, qn::atomic, msn, 0, 0,
                        atomic_request_hdr, 0);
  std::byte* p = out + untagged_header_size;
  put_be32(p, static_cast<std::uint32_t>(a.kind) & 0xF);
  put_be32(p + 4, a.request_id);
  put_be32(p + 8, a.stag);
  put_be64(p + 12, a.to);
  put_be64(p + 20, a.add_swap);
  put_be64(p + 28, a.add_swap_mask);
  put_be64(p + 36, a.compare);
  put_be64(p + 44, a.compare_mask);
  finish_fpdu(mut_bytes(out, n), crc);
  return n;
}

std::size_t write_atomic_response(std::byte* out, const atomic_response& a, std::uint32_t msn,
                                  bool crc) noexcept {
  const std::size_t n = fpdu_size(ddp::untagged_hdr + atomic_response_hdr);
  write_untagged_header(out, rdmap_op::atomic_response, true, qn::atomic, msn, 0, 0,
                        atomic_response_hdr, 0);
  put_be32(out + untagged_header_size, a.request_id);
  put_be64(out + untagged_header_size + 4, a.original);
  finish_fpdu(mut_bytes(out, n), crc);
  return n;
}

std::size_t write_immediate(std::byte* out, std::uint64_t value, bool solicited, std::uint32_t msn,
                            bool crc) noexcept {
  const std::size_t n = fpdu_size(ddp::untagged_hdr + immediate_hdr);
  write_untagged_header(out, solicited ? rdmap_op::immediate_se : rdmap_op::immediate, true,
                        qn::send, msn, 0, 0, immediate_hdr, 0);
  put_be64(out + untagged_header_size, value);
  finish_fpdu(mut_bytes(out, n), crc);
  return n;
}

namespace {
template <class F>
std::vector<std::byte> control_vector(F&& write) {
  std::vector<std::byte> out(control_fpdu_max);
  out.resize(write(out.data()));
  return out;
}
}  // namespace

std::vector<std::byte> encode_atomic_request(const atomic_request& a, std::uint32_t msn, bool crc) {
  return control_vector([&](std::byte* o) { return write_atomic_request(o, a, msn, crc); });
}

std::vector<std::byte> encode_atomic_response(const atomic_response& a, std::uint32_t msn,
                                              bool crc) {
  return control_vector([&](std::byte* o) { return write_atomic_response(o, a, msn, crc); });
}

std::vector<std::byte> encode_immediate(std::uint64_t value, bool solicited, std::uint32_t msn,
                                        bool crc) {
  return control_vector(
      [&](std::byte* o) { return write_immediate(o, value, solicited, msn, crc); });
}

std::vector<std::byte> encode_tagged(rdmap_op op, bool last, std::uint32_t stag, std::uint64_t to,
                                     bytes payload, bool crc) {
  auto out = make_fpdu(ddp::tagged_hdr + payload.size());
  write_tagged_header(out.data(), op, last, stag, to, payload.size());
  if (!payload.empty())
    std::memcpy(out.data() + tagged_header_size, payload.data(), payload.size());
  finish_fpdu(out, crc);
  return out;
}

std::vector<std::byte> encode_untagged(rdmap_op op, bool last, std::uint32_t q, std::uint32_t msn,
                                       std::uint32_t mo, std::uint32_t inv_stag, bytes payload,
                                       bool crc) {
  auto out = make_fpdu(ddp::untagged_hdr + payload.size());
  write_untagged_header(out.data(), op, last, q, msn, mo, inv_stag, 0, payload.size());
  if (!payload.empty())
    std::memcpy(out.data() + untagged_header_size, payload.data(), payload.size());
  finish_fpdu(out, crc);
  return out;
}

std::expected<read_request, wire_error> decode_read_request(bytes b) noexcept {
  if (b.size() < read_request_hdr) return std::unexpected(wire_error::need_more);
  read_request rr;
  rr.sink_stag = get_be32(b.data());
  rr.sink_to = get_be64(b.data() + 4);
  rr.size = get_be32(b.data() + 12);
  rr.src_stag = get_be32(b.data() + 16);
  rr.src_to = get_be64(b.data() + 20);
  return rr;
}

std::expected<terminate_msg, wire_error> decode_terminate(bytes b) {
  if (b.size() < 4) return std::unexpected(wire_error::need_more);
  const std::uint32_t cw = get_be32(b.data());
  terminate_msg t;
  t.layer = static_cast<term_layer>(cw >> 28);
  t.etype = static_cast<std::uint8_t>((cw >> 24) & 0xF);
  t.ecode = static_cast<std::uint8_t>((cw >> 16) & 0xFF);
  if (static_cast<std::uint8_t>(t.layer) > 2) return std::unexpected(wire_error::bad_length);
  std::size_t off = 4;
  t.has_segment_length = cw & 0x8000;
  const bool has_ddp = cw & 0x4000;
  const bool has_rdmap = cw & 0x2000;
  if (t.has_segment_length || has_ddp) {
    if (b.size() < off + 2) return std::unexpected(wire_error::bad_length);
    t.ddp_segment_length = get_be16(b.data() + off);
    off += 2;
  }
  if (has_ddp) {
    if (b.size() < off + 1) return std::unexpected(wire_error::bad_length);
    const bool tagged = std::to_integer<std::uint8_t>(b[off]) & ddp::tagged;
    const std::size_t n = tagged ? ddp::tagged_hdr : ddp::untagged_hdr;
    if (b.size() < off + n) return std::unexpected(wire_error::bad_length);
    t.ddp_header.assign(b.begin() + static_cast<std::ptrdiff_t>(off),
                        b.begin() + static_cast<std::ptrdiff_t>(off + n));
    off += n;
  }
  if (has_rdmap) {
    if (b.size() < off + read_request_hdr) return std::unexpected(wire_error::bad_length);
    t.rdmap_header.assign(b.begin() + static_cast<std::ptrdiff_t>(off),
                          b.begin() + static_cast<std::ptrdiff_t>(off + read_request_hdr));
  }
  return t;
}

std::expected<atomic_request, wire_error> decode_atomic_request(bytes b) noexcept {
  if (b.size() < atomic_request_hdr) return std::unexpected(wire_error::need_more);
  atomic_request a;
  const std::uint32_t k = get_be32(b.data()) & 0xF;
  if (k != 0 && k != 2) return std::unexpected(wire_error::bad_opcode);
  a.kind = static_cast<atomic_kind>(k);
  a.request_id = get_be32(b.data() + 4);
  a.stag = get_be32(b.data() + 8);
  a.to = get_be64(b.data() + 12);
  a.add_swap = get_be64(b.data() + 20);
  a.add_swap_mask = get_be64(b.data() + 28);
  a.compare = get_be64(b.data() + 36);
  a.compare_mask = get_be64(b.data() + 44);
  return a;
}

std::expected<atomic_response, wire_error> decode_atomic_response(bytes b) noexcept {
  if (b.size() < atomic_response_hdr) return std::unexpected(wire_error::need_more);
  return atomic_response{get_be32(b.data()), get_be64(b.data() + 4)};
}

std::expected<std::uint64_t, wire_error> decode_immediate(bytes b) noexcept {
  if (b.size() < immediate_hdr) return std::unexpected(wire_error::need_more);
  return get_be64(b.data());
}

}  // namespace conveyor::wire
