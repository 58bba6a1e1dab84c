// What the soft QP's source files share (soft_qp.cpp, soft_qp_tx.cpp,
// soft_qp_rx.cpp, soft_qp_place.cpp, soft_qp_respond.cpp); never included
// elsewhere.
#pragma once

#include "providers/soft/engine/soft_qp.hpp"
#include "providers/swnic/opcodes.hpp"

#include <cstddef>
#include <cstdint>

namespace conveyor::soft::qp_parts {

using namespace wire;
using detail::key_check;
using swnic::is_atomic_op;
using swnic::is_send_op;
using swnic::is_write_op;
using swnic::wc_of;

inline constexpr std::size_t rxbuf_size = 256 * 1024;
inline constexpr std::size_t small_inline_copy =
    64;  // payload up to this is copied next to its header
// At most this much is framed (CRC included) before it is handed to sendmsg:
// framing 8 MiB first left the socket and the receiver idle meanwhile (1 MiB
// WRITE 5.3 -> 8.6 GB/s on loopback when this went from 8 MiB to 1 MiB).
inline constexpr std::size_t max_batch_bytes = 1u << 20;
inline constexpr std::size_t header_lookahead = 128;  // read-ahead after bulk payload
// FPDUs with at least this much payload are read straight into their
// destination, one readv each (a loopback MSS makes 64 KiB FPDUs). Smaller ones
// (an MTU of 1500 makes 1.4 KiB FPDUs) are read many at a time into the staging
// buffer and copied: a system call per 1.4 KiB cost five times the CPU per GB
// of a TCP stream.
inline constexpr std::size_t direct_payload_min = 16 * 1024;
// Control FPDUs (and bulk messages' short tails) after a bulk payload before
// headers are read in large batches again.
inline constexpr std::uint32_t bulk_ctl_run = 4;
inline constexpr std::size_t max_fpdu_size = 65536;  // ULPDU_Length is 16 bits
inline constexpr std::uint64_t mss_check_interval = 1u << 20;

// What the initiator sees for a Terminate (layer, type, code).
inline wc_status status_of_terminate(const terminate_msg& t) {
  if (t.layer == term_layer::rdmap) {
    if (t.etype == term::rdmap_remote_prot) return wc_status::rem_access_err;
    if (t.ecode == term::rdmap_cannot_invalidate) return wc_status::rem_inv_req_err;
    if (t.ecode == term::rdmap_unexpected_op) return wc_status::rem_inv_req_err;
    return wc_status::rem_op_err;
  }
  if (t.layer == term_layer::ddp) {
    if (t.etype == term::ddp_tagged) return wc_status::rem_access_err;
    if (t.etype == term::ddp_untagged) {
      if (t.ecode == term::ddp_u_no_buffer) return wc_status::rnr_retry_exc_err;
      if (t.ecode == term::ddp_u_too_long) return wc_status::rem_inv_req_err;
      return wc_status::rem_op_err;
    }
    return wc_status::rem_op_err;
  }
  return wc_status::retry_exc_err;
}

}  // namespace conveyor::soft::qp_parts
