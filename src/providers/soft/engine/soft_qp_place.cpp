// The soft QP's FPDU parser and placement (engine only): header validation,
// tagged placement with a key check per step, untagged messages into posted
// receives, trailers and CRC, message completion.
#include "providers/soft/engine/soft_qp_internal.hpp"

#include "core/log.hpp"
#include "providers/soft/soft_device.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace conveyor::soft {

using namespace qp_parts;

bool soft_qp::rx_header() noexcept {
  const std::byte* b = rxbuf_.get() + rx_beg_;
  auto avail = [&] { return rx_end_ - rx_beg_; };
  std::expected<fpdu_header, wire_error> ph = std::unexpected(wire_error::need_more);
  for (;;) {
    b = rxbuf_.get() + rx_beg_;
    ph = parse_fpdu_header(std::span(b, avail()));
    if (ph || ph.error() != wire_error::need_more) break;
    if (!rx_fill(80)) return false;
  }
  if (!ph) {
    h_ = {};
    switch (ph.error()) {
      case wire_error::bad_ddp_version:
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_bad_version,
                           wc_status::fatal_err);
        break;
      case wire_error::bad_rdmap_version:
        protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_bad_version,
                           wc_status::fatal_err);
        break;
      case wire_error::bad_qn:
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_inv_qn,
                           wc_status::fatal_err);
        break;
      default:
        protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op,
                           wc_status::fatal_err);
        break;
    }
    return false;
  }
  h_ = *ph;
  const std::byte* body = b + untagged_header_size;
  if ((h_.opcode == rdmap_op::immediate || h_.opcode == rdmap_op::immediate_se ||
       h_.opcode == rdmap_op::atomic_request || h_.opcode == rdmap_op::atomic_response) &&
      !cp_.ext) {
    protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op,
                       wc_status::fatal_err);
    return false;
  }
  // Untagged sequencing: QN/MSN/MO.
  if (!h_.tagged) {
    const std::uint32_t q = h_.qn;
    const std::uint64_t mo_expect = q == qn::send ? rx_msg_off_ : 0;
    if (q != qn::terminate && (h_.msn != rx_msn_[q] || h_.mo != mo_expect)) {
      protocol_violation(term_layer::ddp, term::ddp_untagged,
                         h_.msn != rx_msn_[q] ? term::ddp_u_msn_range : term::ddp_u_inv_mo,
                         wc_status::fatal_err);
      return false;
    }
  }
  switch (h_.opcode) {
    case rdmap_op::write:
      if (h_.payload_len > 0) {
        detail::key_table::guard g;
        std::byte* p = nullptr;
        const key_check kc = dev_->keys().acquire(h_.stag, pd_->id(), h_.to, h_.payload_len,
                                                  access::remote_write, g, &p);
        if (kc != key_check::ok) {
          protocol_violation(
              term_layer::ddp, term::ddp_tagged,
              kc == key_check::out_of_bounds ? term::ddp_t_base_bounds : term::ddp_t_inv_stag,
              wc_status::success);
          return false;
        }
      }
      break;
    case rdmap_op::read_response: {
      bool bad;
      {
        std::lock_guard lk(tx_mu_);
        bad = out_reads_.empty() || h_.stag != out_reads_.front().sink_stag ||
              h_.to != out_reads_.front().sink_to + out_reads_.front().got ||
              out_reads_.front().got + h_.payload_len > out_reads_.front().len;
      }
      if (bad) {
        // After a local flush (modify to ERROR) late responses are expected: drop them.
        if (state() != qp_state::error)
          protocol_violation(term_layer::ddp, term::ddp_tagged, term::ddp_t_base_bounds,
                             wc_status::bad_resp_err);
        return false;
      }
      break;
    }
    case rdmap_op::send:
    case rdmap_op::send_inv:
    case rdmap_op::send_se:
    case rdmap_op::send_se_inv: {
      // The first segment claims the receive (from the RQ or the SRQ); the
      // later ones find it claimed, whatever other QPs took meanwhile.
      std::uint64_t room = 0;
      if (!claim_recv(&room)) {
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_no_buffer,
                           wc_status::success);
        return false;
      }
      if (rx_msg_off_ + h_.payload_len > room) {
        // Our receive completes with loc_len_err; the sender sees a Terminate.
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_too_long,
                           wc_status::loc_len_err);
        return false;
      }
      break;
    }
    case rdmap_op::read_request: {
      auto rr = decode_read_request(std::span(body, read_request_hdr));
      rx_beg_ += h_.header_len;
      if (cp_.crc) rx_crc_ = crc32c_update(crc32c_init, b, h_.header_len);
      ++rx_msn_[qn::read_request];
      rx_phase_ = rx_phase::trailer;
      rx_trailer_got_ = 0;
      handle_read_request(*rr);
      return state() != qp_state::error;
    }
    case rdmap_op::atomic_request: {
      auto a = decode_atomic_request(std::span(body, atomic_request_hdr));
      if (!a) {
        protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op,
                           wc_status::fatal_err);
        return false;
      }
      if (cp_.crc) rx_crc_ = crc32c_update(crc32c_init, b, h_.header_len);
      rx_beg_ += h_.header_len;
      ++rx_msn_[qn::atomic];
      rx_phase_ = rx_phase::trailer;
      rx_trailer_got_ = 0;
      handle_atomic_request(*a);
      return state() != qp_state::error;
    }
    case rdmap_op::terminate: {
      auto t = decode_terminate(std::span(body, h_.header_len - untagged_header_size));
      rx_beg_ += h_.header_len;
      c_term_rx_.fetch_add(1, std::memory_order_relaxed);
      if (t)
        handle_terminate(*t);
      else
        enter_error(wc_status::rem_op_err, 0);
      return false;
    }
    case rdmap_op::immediate:
    case rdmap_op::immediate_se:
      rx_ctl_value_ = get_be64(body);
      break;
    case rdmap_op::atomic_response: {
      auto ar = decode_atomic_response(std::span(body, atomic_response_hdr));
      rx_ctl_value_ = ar->original;
      rx_ctl_id_ = ar->request_id;
      bool match;
      {
        std::lock_guard lk(tx_mu_);
        match = !out_atomics_.empty() && out_atomics_.front().id == rx_ctl_id_;
      }
      if (!match) {
        fail_with_terminate(
            {term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op, {}, {}, 0, false},
            wc_status::bad_resp_err);
        return false;
      }
      break;
    }
    default:
      break;
  }
  if (cp_.crc) rx_crc_ = crc32c_update(crc32c_init, b, h_.header_len);
  rx_beg_ += h_.header_len;
  rx_done_ = 0;
  rx_trailer_got_ = 0;
  // Bulk payloads keep the next header read small; a short FPDU ends that,
  // unless it carries no payload or is the tail of a message whose earlier
  // FPDU was bulk (64 KiB is one full FPDU and a 76-byte one on loopback).
  const bool bulk = h_.payload_len >= direct_payload_min;
  const bool tail_of_bulk = rx_bulk_open_;
  rx_bulk_open_ = bulk && !h_.last;
  if (bulk) {
    rx_last_big_ = true;
    rx_ctl_run_ = 0;
  } else if (h_.payload_len == 0 || tail_of_bulk) {
    if (++rx_ctl_run_ > bulk_ctl_run) rx_last_big_ = false;
  } else {
    rx_last_big_ = false;
  }
  rx_phase_ = h_.payload_len > 0 ? rx_phase::payload : rx_phase::trailer;
  return true;
}

void soft_qp::placement_refused(int why) noexcept {
  if (state() == qp_state::error) return;  // flushed meanwhile: nothing to report
  if (why == place_revoked)
    local_sink_revoked();
  else
    protocol_violation(term_layer::ddp, term::ddp_tagged, term::ddp_t_inv_stag, wc_status::success);
}

bool soft_qp::rx_payload() noexcept {
  iovec v[max_place_iov + 4];
  while (rx_done_ < h_.payload_len) {
    const std::uint64_t remaining = h_.payload_len - rx_done_;
    const std::size_t buffered = rx_end_ - rx_beg_;
    if (buffered > 0) {
      const std::uint64_t n = std::min<std::uint64_t>(buffered, remaining);
      const int k = plan_payload(rx_done_, n, v);
      if (k < 0) {
        placement_refused(k);
        return false;
      }
      const std::byte* src = rxbuf_.get() + rx_beg_;
      for (int i = 0; i < k; ++i) {
        std::memcpy(v[i].iov_base, src, v[i].iov_len);
        src += v[i].iov_len;
      }
      rx_release();
      if (cp_.crc) rx_crc_ = crc32c_update(rx_crc_, rxbuf_.get() + rx_beg_, n);
      rx_beg_ += n;
      rx_done_ += n;
      continue;
    }
    if (remaining < 1024 || h_.payload_len < direct_payload_min) {
      if (!rx_fill(remaining + 8)) return false;
      continue;
    }
    // Bulk: straight into the destination, then the trailer, then a look-ahead.
    const int k = plan_payload(rx_done_, remaining, v);
    if (k < 0) {
      placement_refused(k);
      return false;
    }
    const std::size_t tl = h_.pad + crc_size;
    v[k] = {rx_trailer_, tl};
    rx_beg_ = rx_end_ = 0;
    v[k + 1] = {rxbuf_.get(), header_lookahead};
    if (rx_drained_ || ++rx_reads_ > 64) {
      rx_release();
      return false;
    }
    send_kicked();
    const ssize_t n = ::readv(fd_, v, k + 2);
    rx_release();
    c_rx_sys_.fetch_add(1, std::memory_order_relaxed);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
      enter_error(wc_status::retry_exc_err, 0);
      rx_eof_.store(true);
      return false;
    }
    c_rx_stream_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    std::size_t got = static_cast<std::size_t>(n);
    if (got < remaining + tl + header_lookahead) rx_drained_ = true;
    for (int i = 0; i < k && got > 0; ++i) {
      const std::size_t t = std::min(got, v[i].iov_len);
      if (cp_.crc) rx_crc_ = crc32c_update(rx_crc_, v[i].iov_base, t);
      rx_done_ += t;
      got -= t;
      c_rx_direct_.fetch_add(t, std::memory_order_relaxed);
    }
    const std::size_t t = std::min(got, tl);
    rx_trailer_got_ = t;
    got -= t;
    rx_end_ = got;  // look-ahead bytes
  }
  rx_phase_ = rx_phase::trailer;
  return true;
}

bool soft_qp::rx_trailer() noexcept {
  const std::size_t tl = h_.pad + crc_size;
  while (rx_trailer_got_ < tl) {
    const std::size_t buffered = rx_end_ - rx_beg_;
    if (buffered == 0) {
      if (!rx_fill(tl - rx_trailer_got_ + 64)) return false;
      continue;
    }
    const std::size_t t = std::min(buffered, tl - rx_trailer_got_);
    std::memcpy(rx_trailer_ + rx_trailer_got_, rxbuf_.get() + rx_beg_, t);
    rx_trailer_got_ += t;
    rx_beg_ += t;
  }
  if (cp_.crc) {
    std::uint32_t c = rx_crc_;
    if (h_.pad) c = crc32c_update(c, rx_trailer_, h_.pad);
    if (crc32c_final(c) != get_crc(rx_trailer_ + h_.pad)) {
      protocol_violation(term_layer::llp, 0, term::llp_crc, wc_status::fatal_err);
      return false;
    }
  }
  c_rx_fpdus_.fetch_add(1, std::memory_order_relaxed);
  switch (h_.opcode) {  // payload bytes: what SENDs, WRITEs and READ responses carried
    case rdmap_op::write:
    case rdmap_op::read_response:
    case rdmap_op::send:
    case rdmap_op::send_inv:
    case rdmap_op::send_se:
    case rdmap_op::send_se_inv:
      c_rx_bytes_.fetch_add(h_.payload_len, std::memory_order_relaxed);
      break;
    default:
      break;
  }
  rx_phase_ = rx_phase::header;
  return rx_message_done();
}

bool soft_qp::rx_message_done() noexcept {
  switch (h_.opcode) {
    case rdmap_op::write:
      if (h_.last) c_writes_.fetch_add(1, std::memory_order_relaxed);
      return true;
    case rdmap_op::read_response: {
      std::lock_guard lk(tx_mu_);
      if (out_reads_.empty()) return false;  // flushed meanwhile
      outstanding& o = out_reads_.front();
      o.got += h_.payload_len;
      if (!h_.last) return true;
      if (o.got != o.len) {  // a short response: the peer broke the protocol
        term_bytes_ = encode_terminate(
            {term_layer::ddp, term::ddp_tagged, term::ddp_t_base_bounds, {}, {}, 0, false},
            cp_.crc);
        term_pending_ = true;
        state_.store(qp_state::error);
        flush_locked(wc_status::bad_resp_err, 0);
        tx_progress_locked();
        return false;
      }
      confirm_before_locked(o.sq_pos);
      if (o.kind == outstanding::user_read) {
        swqe& w = sq_[o.wqe];
        w.byte_len = static_cast<std::uint32_t>(o.len);
        complete_send_locked(w, wc_status::success);
      }
      out_reads_.pop_front();
      --ord_used_;
      retire_locked();
      tx_kicked_ = true;
      return true;
    }
    case rdmap_op::send:
    case rdmap_op::send_inv:
    case rdmap_op::send_se:
    case rdmap_op::send_se_inv: {
      rx_msg_off_ += h_.payload_len;
      if (!h_.last) return true;
      work_completion wc;
      {
        // A flush (modify to ERROR on another thread) may have completed the
        // receive being filled since its header was checked.
        if (!finish_recv(wc.wr_id)) return false;
      }
      wc.opcode = wc_opcode::recv;
      wc.byte_len = static_cast<std::uint32_t>(rx_msg_off_);
      wc.qp_num = qpn_;
      if (rx_has_pending_imm_) {
        wc.with_imm = true;
        wc.imm_data = static_cast<std::uint32_t>(rx_pending_imm_);
        rx_has_pending_imm_ = false;
      }
      if (h_.opcode == rdmap_op::send_inv || h_.opcode == rdmap_op::send_se_inv) {
        // RFC 5040 6.10: only a key of this QP's protection domain whose region
        // the peer could have been given (some remote right) is invalidated.
        // Anything else costs the peer the connection: one guess, not a sweep.
        const key_check kc = dev_->keys().invalidate_remote(h_.inv_stag, pd_->id());
        if (kc != key_check::ok) {
          wc.status = wc_status::rem_inv_req_err;
          rx_msg_off_ = 0;
          rcq_->push(wc);
          protocol_violation(
              term_layer::rdmap,
              kc == key_check::invalid_key ? term::rdmap_remote_op : term::rdmap_remote_prot,
              term::rdmap_cannot_invalidate, wc_status::success);
          return false;
        }
        wc.with_inv = true;
        wc.invalidated_rkey = h_.inv_stag;
      }
      rx_msg_off_ = 0;
      ++rx_msn_[qn::send];
      if (!rcq_->push(wc)) enter_error(wc_status::wr_flush_err, 0);
      return true;
    }
    case rdmap_op::immediate:
    case rdmap_op::immediate_se: {
      // Bit 63: applies to the next Send; bits 62..32: the Write's length.
      ++rx_msn_[qn::send];
      const std::uint64_t v = rx_ctl_value_;
      if (v >> 63) {
        rx_pending_imm_ = v & 0xFFFFFFFFu;
        rx_has_pending_imm_ = true;
        return true;
      }
      work_completion wc;
      // One segment: claimed and finished at once (false only if none is posted;
      // a flush racing it leaves the QP in ERROR, where the Terminate is moot).
      if (!claim_recv() || !finish_recv(wc.wr_id)) {  // Immediate Data with no receive posted
        fail_with_terminate(
            {term_layer::ddp, term::ddp_untagged, term::ddp_u_no_buffer, {}, {}, 0, false},
            wc_status::success);
        return false;
      }
      wc.opcode = wc_opcode::recv_rdma_with_imm;
      wc.with_imm = true;
      wc.imm_data = static_cast<std::uint32_t>(v);
      wc.byte_len = static_cast<std::uint32_t>((v >> 32) & 0x7FFFFFFFu);
      wc.qp_num = qpn_;
      if (!rcq_->push(wc)) enter_error(wc_status::wr_flush_err, 0);
      return true;
    }
    case rdmap_op::atomic_response: {
      ++rx_msn_[qn::atomic];
      std::lock_guard lk(tx_mu_);
      if (out_atomics_.empty()) return false;  // flushed meanwhile
      outstanding o = out_atomics_.front();
      out_atomics_.pop_front();
      --ord_used_;
      confirm_before_locked(o.sq_pos);
      swqe& w = sq_[o.wqe];
      const sge& s = sq_sges(o.wqe)[0];
      // The result's region may have been deregistered since the post.
      detail::key_table::guard g;
      std::byte* p = nullptr;
      if (dev_->keys().acquire(s.lkey, pd_->id(), s.addr, 8, access::local_write, g, &p) !=
          key_check::ok) {
        complete_send_locked(w, wc_status::loc_prot_err);
        term_bytes_ = encode_terminate({term_layer::rdmap,
                                        term::rdmap_local_catastrophic,
                                        term::rdmap_unspecified,
                                        {},
                                        {},
                                        0,
                                        false},
                                       cp_.crc);
        term_pending_ = true;
        state_.store(qp_state::error);
        flush_locked(wc_status::wr_flush_err, 0);
        tx_progress_locked();
        return false;
      }
      std::memcpy(p, &rx_ctl_value_, 8);
      g.release();
      w.byte_len = 8;
      complete_send_locked(w, wc_status::success);
      retire_locked();
      tx_kicked_ = true;
      return true;
    }
    default:
      return true;
  }
}

}  // namespace conveyor::soft
