// Wire codecs for iWARP: MPA (RFC 5044 + RFC 6581), DDP (RFC 5041), RDMAP
// (RFC 5040) and the RFC 7306 extensions. Pure functions over byte spans: no
// sockets, no state, no allocation except where a std::vector is returned.
// Every multi-byte field is big-endian on the wire except the MPA CRC, which is
// the little-endian form of the CRC32c value (what Linux siw sends).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <expected>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/byte_order.hpp"

namespace conveyor::wire {

using bytes = std::span<const std::byte>;
using mut_bytes = std::span<std::byte>;

// ---------------------------------------------------------------- helpers ----
using detail::get_be16;
using detail::get_be32;
using detail::get_be64;
using detail::put_be16;
using detail::put_be32;
using detail::put_be64;

// ----------------------------------------------------------------- CRC32c ----
// CRC32c (Castagnoli), reflected, init 0xFFFFFFFF, final xor 0xFFFFFFFF.
// crc32c_update continues a running (non-finalised) value; start with
// crc32c_init and finish with crc32c_final.
inline constexpr std::uint32_t crc32c_init = 0xFFFFFFFFu;
std::uint32_t crc32c_update(std::uint32_t running, const void* data, std::size_t len) noexcept;
inline std::uint32_t crc32c_final(std::uint32_t running) noexcept {
  return ~running;
}
inline std::uint32_t crc32c(bytes data) noexcept {
  return crc32c_final(crc32c_update(crc32c_init, data.data(), data.size()));
}
// The 4 trailer bytes for a CRC value (little-endian, as Linux siw).
inline void put_crc(std::byte* p, std::uint32_t crc) noexcept {
  p[0] = std::byte(crc);
  p[1] = std::byte(crc >> 8);
  p[2] = std::byte(crc >> 16);
  p[3] = std::byte(crc >> 24);
}
inline std::uint32_t get_crc(const std::byte* p) noexcept {
  return std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8) | (std::uint32_t(p[2]) << 16) |
         (std::uint32_t(p[3]) << 24);
}

// ------------------------------------------------------------------- errors ----
enum class wire_error : std::uint8_t {
  need_more,          // not an error: more bytes are needed
  bad_key,            // MPA key is not "MPA ID Req Frame"/"MPA ID Rep Frame"
  bad_revision,       // MPA revision not 1 or 2
  markers,            // the peer asked for markers (refused)
  pd_too_long,        // private data longer than 256 bytes
  bad_v2,             // enhanced mode without the IRD/ORD words
  bad_ddp_version,    // DV != 1
  bad_rdmap_version,  // RV != 1
  bad_opcode,         // unknown RDMAP opcode
  bad_length,         // ULPDU length inconsistent with the header
  bad_qn,             // untagged queue number invalid for the opcode
};
std::string_view to_string(wire_error e) noexcept;

// ---------------------------------------------------------------------- MPA ----
inline constexpr std::size_t mpa_header_size = 20;
inline constexpr std::size_t mpa_max_private_data = 256;  // Linux limit, v2 words included
inline constexpr std::string_view mpa_req_key = "MPA ID Req Frame";
inline constexpr std::string_view mpa_rep_key = "MPA ID Rep Frame";

namespace mpa_flag {
inline constexpr std::uint8_t markers = 0x80;
inline constexpr std::uint8_t crc = 0x40;
inline constexpr std::uint8_t reject = 0x20;
inline constexpr std::uint8_t enhanced = 0x10;  // RFC 6581
// Conveyor's RFC 7306 negotiation in the reserved nibble: the initiator offers
// with ext_offer; a Conveyor responder answers with ext_ack and *without*
// ext_offer, so a peer that echoes the request's flag byte (Linux siw does) is
// never mistaken for one that understood the offer.
inline constexpr std::uint8_t ext_offer = 0x04;
inline constexpr std::uint8_t ext_ack = 0x02;
// Linux siw's MPA_RR_FLAG_GSO_EXP, with siw's meaning: the sender of this frame
// accepts FPDUs larger than the TCP MSS (up to the 16-bit ULPDU_Length), so its
// peer may size FPDUs to a GSO segment. In a Request it speaks for the
// initiator; in a Reply for the responder, and there it counts only next to
// ext_ack without ext_offer (see reply_accepts_large_fpdus).
inline constexpr std::uint8_t large_fpdus = 0x08;
}  // namespace mpa_flag

// RFC 6581 IRD/ORD words (the first 4 bytes of v2 private data).
namespace mpa_v2 {
inline constexpr std::uint16_t peer2peer = 0x8000;  // A (IRD word)
inline constexpr std::uint16_t send_rtr = 0x4000;   // B (IRD word)
inline constexpr std::uint16_t write_rtr = 0x8000;  // C (ORD word)
inline constexpr std::uint16_t read_rtr = 0x4000;   // D (ORD word)
inline constexpr std::uint16_t mask = 0x3FFF;
}  // namespace mpa_v2

struct mpa_v2_words {
  std::uint16_t ird = 0;  // 14-bit count
  std::uint16_t ord = 0;
  bool peer2peer = false;
  bool send_rtr = false;
  bool write_rtr = false;
  bool read_rtr = false;
};

struct mpa_frame {
  bool reply = false;
  std::uint8_t flags = 0;  // raw flag byte
  std::uint8_t revision = 2;
  std::optional<mpa_v2_words> v2;       // present iff rev 2 and H set
  std::vector<std::byte> private_data;  // the ULP's part (v2 words stripped)

  bool markers() const noexcept { return flags & mpa_flag::markers; }
  bool crc() const noexcept { return flags & mpa_flag::crc; }
  bool rejected() const noexcept { return flags & mpa_flag::reject; }
  bool enhanced() const noexcept { return flags & mpa_flag::enhanced; }
};

// Whether the initiator that sent this Request accepts FPDUs larger than the MSS.
constexpr bool request_accepts_large_fpdus(std::uint8_t request_flags) noexcept {
  return (request_flags & mpa_flag::large_fpdus) != 0;
}
// Whether the responder that sent this Reply (to a Request that offered
// ext_offer) accepts FPDUs larger than the MSS. Linux siw builds its Reply from
// the Request's flag byte (siw_cm.c, siw_proc_mpareq), so a Reply to a Request
// with 0x08 carries 0x08 whether or not siw means it: the bit counts only from
// a responder that proves it read the Request (ext_ack without ext_offer).
constexpr bool reply_accepts_large_fpdus(std::uint8_t reply_flags) noexcept {
  return (reply_flags & mpa_flag::large_fpdus) != 0 && (reply_flags & mpa_flag::ext_ack) != 0 &&
         (reply_flags & mpa_flag::ext_offer) == 0;
}

// Encodes a request or reply; v2 words are written when frame.v2 is set (and H
// is then set in the flags). Returns empty if private data is too long.
std::vector<std::byte> encode_mpa(const mpa_frame& frame);
// From the 20-byte header: total private-data length to read next.
std::expected<std::uint16_t, wire_error> mpa_pd_length(bytes header20, bool expect_reply);
// Decodes a whole frame (header + private data, nothing more).
std::expected<mpa_frame, wire_error> decode_mpa(bytes frame, bool expect_reply);

// --------------------------------------------------------------- DDP/RDMAP ----
namespace ddp {
inline constexpr std::uint8_t tagged = 0x80;
inline constexpr std::uint8_t last = 0x40;
inline constexpr std::uint8_t version = 0x01;
inline constexpr std::uint8_t rdmap_version = 0x40;  // RV=1 in the top two bits
inline constexpr std::size_t tagged_hdr = 14;
inline constexpr std::size_t untagged_hdr = 18;
}  // namespace ddp

enum class rdmap_op : std::uint8_t {
  write = 0x0,
  read_request = 0x1,
  read_response = 0x2,
  send = 0x3,
  send_inv = 0x4,
  send_se = 0x5,
  send_se_inv = 0x6,
  terminate = 0x7,
  immediate = 0x8,       // RFC 7306
  immediate_se = 0x9,    // RFC 7306
  atomic_request = 0xA,  // RFC 7306
  atomic_response = 0xB,
};
std::string_view to_string(rdmap_op op) noexcept;

// Untagged queue numbers.
namespace qn {
inline constexpr std::uint32_t send = 0;
inline constexpr std::uint32_t read_request = 1;
inline constexpr std::uint32_t terminate = 2;
inline constexpr std::uint32_t atomic = 3;  // RFC 7306 atomic request/response
}  // namespace qn

// RDMA Write and Read Response use the tagged model; everything else is untagged.
constexpr bool is_tagged(rdmap_op op) noexcept {
  return op == rdmap_op::write || op == rdmap_op::read_response;
}
// The untagged queue an opcode travels on (Send variants and Immediate Data: 0).
constexpr std::uint32_t queue_of(rdmap_op op) noexcept {
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

inline constexpr std::size_t read_request_hdr = 28;
inline constexpr std::size_t atomic_request_hdr = 52;
inline constexpr std::size_t atomic_response_hdr = 12;
inline constexpr std::size_t immediate_hdr = 8;
inline constexpr std::size_t mpa_len_size = 2;
inline constexpr std::size_t crc_size = 4;
inline constexpr std::size_t max_ulpdu = 65535;

// Pad bytes after 2 + ulpdu_len so that the FPDU is a multiple of 4.
constexpr std::size_t fpdu_pad(std::size_t ulpdu_len) noexcept {
  return (-(2 + ulpdu_len)) & 3u;
}
// Whole FPDU size on the wire for a ULPDU length.
constexpr std::size_t fpdu_size(std::size_t ulpdu_len) noexcept {
  return mpa_len_size + ulpdu_len + fpdu_pad(ulpdu_len) + crc_size;
}

struct read_request {
  std::uint32_t sink_stag = 0;
  std::uint64_t sink_to = 0;
  std::uint32_t size = 0;
  std::uint32_t src_stag = 0;
  std::uint64_t src_to = 0;
};

enum class atomic_kind : std::uint8_t { fetch_add = 0, cmp_swap = 2 };
struct atomic_request {
  atomic_kind kind = atomic_kind::fetch_add;
  std::uint32_t request_id = 0;
  std::uint32_t stag = 0;
  std::uint64_t to = 0;
  std::uint64_t add_swap = 0;
  std::uint64_t add_swap_mask = ~0ull;
  std::uint64_t compare = 0;
  std::uint64_t compare_mask = ~0ull;
};
struct atomic_response {
  std::uint32_t request_id = 0;
  std::uint64_t original = 0;
};

// Terminate control word fields.
enum class term_layer : std::uint8_t { rdmap = 0, ddp = 1, llp = 2 };
namespace term {
// RDMAP error types and codes
inline constexpr std::uint8_t rdmap_local_catastrophic = 0, rdmap_remote_prot = 1,
                              rdmap_remote_op = 2;
inline constexpr std::uint8_t rdmap_inv_stag = 0x00, rdmap_base_bounds = 0x01, rdmap_access = 0x02,
                              rdmap_stag_not_assoc = 0x03, rdmap_to_wrap = 0x04,
                              rdmap_bad_version = 0x05, rdmap_unexpected_op = 0x06,
                              rdmap_catastrophic_stream = 0x07, rdmap_catastrophic_global = 0x08,
                              rdmap_cannot_invalidate = 0x09, rdmap_unspecified = 0xFF;
// DDP error types and codes
inline constexpr std::uint8_t ddp_local_catastrophic = 0, ddp_tagged = 1, ddp_untagged = 2;
inline constexpr std::uint8_t ddp_t_inv_stag = 0, ddp_t_base_bounds = 1, ddp_t_stag_not_assoc = 2,
                              ddp_t_to_wrap = 3, ddp_t_bad_version = 4;
inline constexpr std::uint8_t ddp_u_inv_qn = 1, ddp_u_no_buffer = 2, ddp_u_msn_range = 3,
                              ddp_u_inv_mo = 4, ddp_u_too_long = 5, ddp_u_bad_version = 6;
// LLP (MPA) codes, error type 0
inline constexpr std::uint8_t llp_conn_lost = 1, llp_crc = 2, llp_marker = 3, llp_bad_req = 4,
                              llp_local_catastrophic = 5, llp_insufficient_ird = 6, llp_no_rtr = 7;
}  // namespace term

struct terminate_msg {
  term_layer layer = term_layer::rdmap;
  std::uint8_t etype = 0;
  std::uint8_t ecode = 0;
  // The offending DDP header (14 or 18 bytes from the DDP control byte) and,
  // for a Read Request, its 28-byte RDMAP header. Empty when not included.
  std::vector<std::byte> ddp_header;
  std::vector<std::byte> rdmap_header;
  std::uint16_t ddp_segment_length = 0;  // valid if has_segment_length
  bool has_segment_length = false;

  std::uint32_t control_word() const noexcept {
    return (std::uint32_t(layer) << 28) | (std::uint32_t(etype & 0xF) << 24) |
           (std::uint32_t(ecode) << 16) | (has_segment_length ? 0x8000u : 0u) |
           (!ddp_header.empty() ? 0x4000u : 0u) | (!rdmap_header.empty() ? 0x2000u : 0u);
  }
};

// A parsed FPDU header: everything before the payload.
struct fpdu_header {
  std::uint16_t ulpdu_len = 0;  // from the MPA length field
  bool tagged = false;
  bool last = false;
  rdmap_op opcode = rdmap_op::write;
  // tagged
  std::uint32_t stag = 0;
  std::uint64_t to = 0;
  // untagged
  std::uint32_t inv_stag = 0;  // RsvdULP: Send-with-Invalidate STag
  std::uint32_t qn = 0;
  std::uint32_t msn = 0;
  std::uint32_t mo = 0;
  // header bytes from the start of the FPDU (2 + DDP + RDMAP header); payload follows
  std::size_t header_len = 0;
  std::size_t payload_len = 0;
  std::size_t pad = 0;

  std::size_t total() const noexcept { return mpa_len_size + ulpdu_len + pad + crc_size; }
};

// Parses the header at the start of an FPDU. Returns need_more if `in` is too
// short to hold the whole header (terminate/atomic/read-request headers are
// counted as header, so for those the payload is empty).
std::expected<fpdu_header, wire_error> parse_fpdu_header(bytes in) noexcept;

// Header writers. Each writes 2 (MPA length) + DDP + RDMAP header bytes into out
// and returns the count; `payload_len` is the payload that follows.
std::size_t write_tagged_header(std::byte* out, rdmap_op op, bool last, std::uint32_t stag,
                                std::uint64_t to, std::size_t payload_len) noexcept;
std::size_t write_untagged_header(std::byte* out, rdmap_op op, bool last, std::uint32_t qn,
                                  std::uint32_t msn, std::uint32_t mo, std::uint32_t inv_stag,
                                  std::size_t extra_hdr, std::size_t payload_len) noexcept;
inline constexpr std::size_t tagged_header_size = mpa_len_size + ddp::tagged_hdr;      // 16
inline constexpr std::size_t untagged_header_size = mpa_len_size + ddp::untagged_hdr;  // 20

// Whole control FPDUs written into caller memory (no allocation; `out` must hold
// control_fpdu_max bytes). Each returns the FPDU's size; CRC is zero when !crc.
inline constexpr std::size_t control_fpdu_max = 80;
std::size_t write_read_request(std::byte* out, const read_request& rr, std::uint32_t msn,
                               bool crc) noexcept;
std::size_t write_atomic_request(std::byte* out, const atomic_request& a, std::uint32_t msn,
                                 bool crc) noexcept;
std::size_t write_atomic_response(std::byte* out, const atomic_response& a, std::uint32_t msn,
                                  bool crc) noexcept;
std::size_t write_immediate(std::byte* out, std::uint64_t value, bool solicited, std::uint32_t msn,
                            bool crc) noexcept;

// Whole control FPDUs (header + pad + CRC placeholder/CRC).
std::vector<std::byte> encode_read_request(const read_request& rr, std::uint32_t msn, bool crc);
std::vector<std::byte> encode_terminate(const terminate_msg& t, bool crc);
std::vector<std::byte> encode_atomic_request(const atomic_request& a, std::uint32_t msn, bool crc);
std::vector<std::byte> encode_atomic_response(const atomic_response& a, std::uint32_t msn,
                                              bool crc);
std::vector<std::byte> encode_immediate(std::uint64_t value, bool solicited, std::uint32_t msn,
                                        bool crc);
// A whole FPDU of a tagged message with payload (for tests and small messages).
std::vector<std::byte> encode_tagged(rdmap_op op, bool last, std::uint32_t stag, std::uint64_t to,
                                     bytes payload, bool crc);
std::vector<std::byte> encode_untagged(rdmap_op op, bool last, std::uint32_t qn, std::uint32_t msn,
                                       std::uint32_t mo, std::uint32_t inv_stag, bytes payload,
                                       bool crc);

// Fills pad and trailer of a complete FPDU in place (fpdu points at the length
// field, the buffer holds fpdu_size(ulpdu) bytes); CRC is zero when !crc.
void finish_fpdu(mut_bytes fpdu, bool crc) noexcept;
// Verifies the trailer CRC of a complete FPDU.
bool check_fpdu_crc(bytes fpdu) noexcept;

// Bodies after the untagged header (ULPDU offset 18).
std::expected<read_request, wire_error> decode_read_request(bytes body) noexcept;
std::expected<terminate_msg, wire_error> decode_terminate(bytes body);
std::expected<atomic_request, wire_error> decode_atomic_request(bytes body) noexcept;
std::expected<atomic_response, wire_error> decode_atomic_response(bytes body) noexcept;
std::expected<std::uint64_t, wire_error> decode_immediate(bytes body) noexcept;

}  // namespace conveyor::wire
