// The soft QP's send side (under tx_mu_): framing SQ requests, READ and atomic
// responses and Terminates into FPDUs, one sendmsg per batch, placement
// confirmation and retirement of completed requests.
#include "providers/soft/engine/soft_qp_internal.hpp"

#include "providers/soft/soft_device.hpp"
#include "providers/swnic/dma_copy.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace conveyor::soft {

using namespace qp_parts;

// --------------------------------------------------------------- send side ----
std::size_t soft_qp::gather_sq(const swqe& w, std::uint32_t idx, std::uint64_t off,
                               std::uint64_t len, iovec* out, int max) noexcept {
  if (len == 0) return 0;
  if (w.inl) {
    out[0] = {const_cast<std::byte*>(sq_inline(idx) + off), len};
    return 1;
  }
  const sge* s = sq_sges(idx);
  std::size_t n = 0;
  for (std::uint32_t k = 0; k < w.nsge && len > 0 && n < std::size_t(max); ++k) {
    if (off >= s[k].length) {
      off -= s[k].length;
      continue;
    }
    const std::uint64_t take = std::min<std::uint64_t>(s[k].length - off, len);
    out[n++] = {reinterpret_cast<void*>(s[k].addr + off), take};
    len -= take;
    off = 0;
  }
  return n;
}

bool soft_qp::sq_sources_live_locked(const swqe& w, std::uint32_t idx) noexcept {
  if (w.inl || !(is_send_op(w.op) || is_write_op(w.op))) return true;
  const sge* s = sq_sges(idx);
  for (std::uint32_t k = 0; k < w.nsge; ++k) {
    if (s[k].length == 0) continue;
    detail::key_table::guard g;
    std::byte* p = nullptr;
    if (dev_->keys().acquire(s[k].lkey, pd_->id(), s[k].addr, s[k].length, access::none, g, &p) !=
        key_check::ok)
      return false;
  }
  return true;
}

bool soft_qp::frame_sq_chunk_locked(swqe& w, std::uint32_t idx, std::uint64_t chunk, bool tagged,
                                    rdmap_op op, bool last, std::uint32_t inv) noexcept {
  iovec pv[32];
  const std::size_t n = gather_sq(w, idx, cur_off_, chunk, pv, 32);
  const bool copied = chunk <= small_inline_copy;
  if (!w.inl && !copied && batch_keys_.size() + n > max_batch_keys) return false;
  // Each piece's key, checked now and held while add_data_fpdu_locked copies
  // or sums it: a deregistration waits for that, and one that came first
  // stops the message here (the stream cannot go on mid-message).
  detail::key_table::guard guards[32];
  std::uint32_t keys[32];
  if (!w.inl) {
    const sge* s = sq_sges(idx);
    std::uint64_t off = cur_off_;
    std::size_t piece = 0;
    for (std::uint32_t k = 0; k < w.nsge && piece < n; ++k) {
      if (off >= s[k].length) {
        off -= s[k].length;
        continue;
      }
      std::byte* p = nullptr;
      if (dev_->keys().acquire(s[k].lkey, pd_->id(), s[k].addr + off, pv[piece].iov_len,
                               access::none, guards[piece], &p) != key_check::ok) {
        w.src_revoked = true;
        if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);  // the engine sees the hang-up and flushes
        return false;
      }
      keys[piece++] = s[k].lkey;
      off = 0;
    }
  }
  if (!add_data_fpdu_locked(tagged, op, last, tagged ? w.rkey : 0,
                            tagged ? w.remote_addr + cur_off_ : 0, tagged ? 0 : qn::send,
                            tagged ? 0 : w.msn, tagged ? 0 : static_cast<std::uint32_t>(cur_off_),
                            inv, std::span(pv, n), chunk))
    return false;
  if (!w.inl && !copied) {
    for (std::size_t k = 0; k < n; ++k) {
      const auto addr = reinterpret_cast<std::uint64_t>(pv[k].iov_base);
      if (!batch_keys_.empty()) {
        batch_key& b = batch_keys_.back();
        if (b.sq_idx == idx && b.key == keys[k] && b.addr + b.len == addr) {
          b.len += pv[k].iov_len;
          b.end = batch_bytes_;
          continue;
        }
      }
      batch_keys_.push_back({keys[k], addr, pv[k].iov_len, batch_bytes_, idx});
    }
  }
  cur_off_ += chunk;
  return true;
}

bool soft_qp::add_control_locked(std::span<const std::byte> fpdu) noexcept {
  if (arena_used_ + fpdu.size() > arena_size || niov_ + 1 >= max_iov) return false;
  std::byte* p = arena_.get() + arena_used_;
  std::memcpy(p, fpdu.data(), fpdu.size());
  arena_used_ += fpdu.size();
  if (niov_ > 0 && static_cast<std::byte*>(iov_[niov_ - 1].iov_base) + iov_[niov_ - 1].iov_len == p)
    iov_[niov_ - 1].iov_len += fpdu.size();
  else
    iov_[niov_++] = {p, fpdu.size()};
  batch_bytes_ += fpdu.size();
  c_tx_fpdus_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool soft_qp::add_data_fpdu_locked(bool tagged, rdmap_op op, bool last, std::uint32_t stag,
                                   std::uint64_t to, std::uint32_t q, std::uint32_t msn,
                                   std::uint32_t mo, std::uint32_t inv,
                                   std::span<const iovec> payload, std::size_t plen) noexcept {
  const std::size_t hdr = tagged ? tagged_header_size : untagged_header_size;
  const bool copy = plen <= small_inline_copy;
  const std::size_t need_arena = hdr + (copy ? plen : 0) + 3 + crc_size;
  if (arena_used_ + need_arena > arena_size || niov_ + int(payload.size()) + 3 >= max_iov)
    return false;
  std::byte* h = arena_.get() + arena_used_;
  if (tagged)
    write_tagged_header(h, op, last, stag, to, plen);
  else
    write_untagged_header(h, op, last, q, msn, mo, inv, 0, plen);
  std::uint32_t crc = cp_.crc ? crc32c_update(crc32c_init, h, hdr) : 0;
  std::size_t used = hdr;
  auto push_arena = [&](std::byte* p, std::size_t n) {
    if (niov_ > 0 &&
        static_cast<std::byte*>(iov_[niov_ - 1].iov_base) + iov_[niov_ - 1].iov_len == p)
      iov_[niov_ - 1].iov_len += n;
    else
      iov_[niov_++] = {p, n};
  };
  if (copy) {
    for (const auto& v : payload) {
      std::memcpy(h + used, v.iov_base, v.iov_len);
      used += v.iov_len;
    }
    if (cp_.crc && plen) crc = crc32c_update(crc, h + hdr, plen);
    const std::size_t pad = fpdu_pad(hdr - 2 + plen);
    std::memset(h + used, 0, pad);
    if (cp_.crc && pad) crc = crc32c_update(crc, h + used, pad);
    used += pad;
    put_crc(h + used, cp_.crc ? crc32c_final(crc) : 0);
    used += crc_size;
    push_arena(h, used);
  } else {
    push_arena(h, hdr);
    for (const auto& v : payload) {
      iov_[niov_++] = v;
      if (cp_.crc) crc = crc32c_update(crc, v.iov_base, v.iov_len);
    }
    std::byte* t = h + hdr;
    const std::size_t pad = fpdu_pad(hdr - 2 + plen);
    std::memset(t, 0, pad);
    if (cp_.crc && pad) crc = crc32c_update(crc, t, pad);
    put_crc(t + pad, cp_.crc ? crc32c_final(crc) : 0);
    used = hdr + pad + crc_size;
    push_arena(t, pad + crc_size);
  }
  arena_used_ += used;
  tx_framed_ += plen;
  c_tx_bytes_.fetch_add(plen, std::memory_order_relaxed);  // SEND, WRITE, READ response payload
  batch_bytes_ += hdr + plen + fpdu_pad(hdr - 2 + plen) + crc_size;
  c_tx_fpdus_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::size_t soft_qp::fpdu_limit(int fd) const noexcept {
  // With a peer that accepts them (MPA flag 0x08 both ways), FPDUs are sized to
  // what TCP hands the device at once (a 64 KiB GSO segment), not to one
  // segment on the wire: at an MSS of 1460 a MiB was 720 FPDUs, each with its
  // header, CRC and per-FPDU work on both sides, and the receiver read them
  // through its staging buffer instead of straight into the region.
  if (cp_.large_fpdus) return max_fpdu_size & ~std::size_t(7);
  return std::min<std::size_t>(net::tcp_mss(fd), max_fpdu_size) & ~std::size_t(7);
}

void soft_qp::refresh_fpdu_size_locked(std::uint64_t pending) noexcept {
  // Only for payloads that need several FPDUs, and at most once per MiB framed:
  // one getsockopt, never on the small-message path. Large FPDUs do not
  // follow the MSS.
  if (cp_.large_fpdus || pending <= max_fpdu_ || tx_framed_ < mss_check_at_ || fd_ < 0) return;
  mss_check_at_ = tx_framed_ + mss_check_interval;
  max_fpdu_ = fpdu_limit(fd_);
}

bool soft_qp::frame_sq_locked(std::uint32_t idx) noexcept {
  swqe& w = sq_[idx];
  if (is_write_op(w.op) || is_send_op(w.op)) refresh_fpdu_size_locked(w.len - cur_off_);
  const std::size_t max_t = (max_fpdu_ - tagged_header_size - crc_size) & ~std::size_t(3);
  const std::size_t max_u = (max_fpdu_ - untagged_header_size - crc_size) & ~std::size_t(3);
  std::byte ctl[control_fpdu_max];
  auto imm_fpdu = [&](bool for_send) -> bool {
    const std::uint64_t v = (for_send ? (1ull << 63) : 0) | ((w.len & 0x7FFFFFFFull) << 32) | w.imm;
    const std::size_t n = write_immediate(ctl, v, w.solicited, tx_msn_[qn::send], cp_.crc);
    if (!add_control_locked(std::span(ctl, n))) return false;
    ++tx_msn_[qn::send];
    return true;
  };
  if (is_write_op(w.op)) {
    if (!cur_imm_sent_) {
      do {
        const std::uint64_t chunk = std::min<std::uint64_t>(w.len - cur_off_, max_t);
        if (!frame_sq_chunk_locked(w, idx, chunk, true, rdmap_op::write, cur_off_ + chunk == w.len,
                                   0))
          return false;
      } while (cur_off_ < w.len);
      cur_imm_sent_ = true;  // write part done
    }
    if (w.op == wr_opcode::rdma_write_with_imm && !imm_fpdu(false)) return false;
  } else if (is_send_op(w.op)) {
    if (w.op == wr_opcode::send_with_imm && !cur_imm_sent_) {
      if (!imm_fpdu(true)) return false;
      cur_imm_sent_ = true;
    }
    const bool inv = w.op == wr_opcode::send_with_inv;
    const rdmap_op op = w.solicited ? (inv ? rdmap_op::send_se_inv : rdmap_op::send_se)
                                    : (inv ? rdmap_op::send_inv : rdmap_op::send);
    w.msn = tx_msn_[qn::send];
    do {
      const std::uint64_t chunk = std::min<std::uint64_t>(w.len - cur_off_, max_u);
      if (!frame_sq_chunk_locked(w, idx, chunk, false, op, cur_off_ + chunk == w.len,
                                 inv ? w.inv : 0))
        return false;
    } while (cur_off_ < w.len);
    ++tx_msn_[qn::send];
  } else if (w.op == wr_opcode::rdma_read) {
    const sge* s = sq_sges(idx);
    read_request rr;
    rr.sink_stag = w.nsge ? s[0].lkey : 1;
    rr.sink_to = w.nsge ? s[0].addr : 0;
    rr.size = static_cast<std::uint32_t>(w.len);
    rr.src_stag = w.rkey;
    rr.src_to = w.remote_addr;
    const std::size_t n = write_read_request(ctl, rr, tx_msn_[qn::read_request], cp_.crc);
    if (!add_control_locked(std::span(ctl, n))) return false;
    w.msn = tx_msn_[qn::read_request]++;
    out_reads_.push_back(
        {outstanding::user_read, idx, 0, rr.sink_stag, rr.sink_to, w.len, 0, sq_next_});
    need_confirm_ = false;  // this response confirms everything before it
    ++ord_used_;
  } else {  // atomics
    atomic_request a;
    a.kind =
        w.op == wr_opcode::atomic_fetch_and_add ? atomic_kind::fetch_add : atomic_kind::cmp_swap;
    a.request_id = atomic_req_id_;
    a.stag = w.rkey;
    a.to = w.remote_addr;
    if (a.kind == atomic_kind::fetch_add) {
      a.add_swap = w.cmp_add;
    } else {
      a.add_swap = w.swap;
      a.compare = w.cmp_add;
    }
    const std::size_t n = write_atomic_request(ctl, a, tx_msn_[qn::atomic], cp_.crc);
    if (!add_control_locked(std::span(ctl, n))) return false;
    w.msn = tx_msn_[qn::atomic]++;
    out_atomics_.push_back({outstanding::atomic, idx, atomic_req_id_++, 0, 0, 8, 0, sq_next_});
    need_confirm_ = false;
    ++ord_used_;
  }
  if ((is_send_op(w.op) || is_write_op(w.op)) && w.signaled) need_confirm_ = true;
  return true;
}

bool soft_qp::frame_response_locked(response& r) noexcept {
  if (r.kind == response::atomic) {
    std::byte ctl[control_fpdu_max];
    const std::size_t n =
        write_atomic_response(ctl, {r.request_id, r.original}, tx_msn_[qn::atomic], cp_.crc);
    if (!add_control_locked(std::span(ctl, n))) return false;
    ++tx_msn_[qn::atomic];
    return true;
  }
  refresh_fpdu_size_locked(r.len - r.sent);
  const std::size_t max_t = (max_fpdu_ - tagged_header_size - crc_size) & ~std::size_t(3);
  static_assert(stage_size >= max_batch_bytes, "the stage holds a whole batch");
  do {
    const std::uint64_t chunk = std::min<std::uint64_t>(r.len - r.sent, max_t);
    iovec v{};
    std::size_t nv = 0;
    bool staged = false;
    if (chunk > 0) {
      detail::key_table::guard g;
      std::byte* p = nullptr;
      if (dev_->keys().acquire(r.src_stag, pd_->id(), r.src_to + r.sent, chunk, access::remote_read,
                               g, &p) != key_check::ok) {
        // Revoked while being served: the peer gets a Terminate instead of the rest.
        terminate_msg t{
            term_layer::rdmap, term::rdmap_remote_prot, term::rdmap_inv_stag, {}, {}, 0, false};
        term_bytes_ = encode_terminate(t, cp_.crc);
        term_pending_ = true;
        return false;
      }
      if (batch_keys_.size() >= max_batch_keys) return false;
      // With CRC, sum a copy and send that copy: the region's owner may rewrite
      // it meanwhile (RDMA allows it; the reader gets whichever bytes), and a
      // CRC over the region followed by sendmsg's own copy of it sent FPDUs
      // whose CRC did not match their bytes, which the reader must treat as
      // corruption (LLP CRC Terminate, the connection lost). A NIC sums what
      // it reads into its own buffer, as here. Small payloads are copied
      // next to their header anyway (add_data_fpdu_locked).
      staged = cp_.crc && chunk > small_inline_copy;
      if (staged) {
        if (!stage_ || stage_used_ + chunk > stage_size) return false;
        std::byte* s = stage_.get() + stage_used_;
        detail::dma_copy(s, p, chunk);
        stage_used_ += chunk;
        p = s;
      }
      v = {p, chunk};
      nv = 1;
      batch_keys_.push_back({r.src_stag, r.src_to + r.sent, chunk, 0});
    }
    const bool last = r.sent + chunk == r.len;
    if (!add_data_fpdu_locked(true, rdmap_op::read_response, last, r.sink_stag, r.sink_to + r.sent,
                              0, 0, 0, 0, std::span(&v, nv), chunk)) {
      if (nv) batch_keys_.pop_back();
      if (staged) stage_used_ -= chunk;
      return false;
    }
    if (nv) batch_keys_.back().end = batch_bytes_;
    r.sent += chunk;
  } while (r.sent < r.len);
  return true;
}

bool soft_qp::build_batch_locked() noexcept {
  niov_ = iov_pos_ = 0;
  batch_bytes_ = batch_sent_ = 0;
  arena_used_ = stage_used_ = 0;
  marks_.clear();
  batch_keys_.clear();
  const bool in_error = state() == qp_state::error;
  while (niov_ < max_iov - 8 && arena_used_ + 256 < arena_size && batch_bytes_ < max_batch_bytes) {
    if (term_pending_) {
      if (add_control_locked(term_bytes_)) {
        marks_.push_back({batch_bytes_, mark::term, 0});
        term_pending_ = false;
      }
      break;  // nothing follows a Terminate
    }
    if (in_error) break;
    const bool sq_mid = cur_off_ > 0 || cur_imm_sent_;
    if (!sq_mid && irq_framing_ < irq_.size()) {
      if (!frame_response_locked(irq_[irq_framing_])) break;
      marks_.push_back({batch_bytes_, mark::resp, 0});
      ++irq_framing_;
      continue;
    }
    if (sq_next_ < sq_tail_) {
      const auto idx = static_cast<std::uint32_t>(sq_next_ % caps_.max_send_wr);
      const swqe& w = sq_[idx];
      const bool needs_ord = w.op == wr_opcode::rdma_read || is_atomic_op(w.op);
      if (!sq_mid && needs_ord && ord_used_ >= cp_.ord) break;
      if (!sq_mid && w.fence && (ord_used_ > 0 || need_confirm_)) break;
      // A source deregistered since the post (not a byte of it framed yet)
      // fails like one that was never registered.
      if (!sq_mid && w.status == wc_status::success && !sq_sources_live_locked(w, idx))
        sq_[idx].status = wc_status::loc_prot_err;
      if (!sq_mid && w.status != wc_status::success) {  // local protection error
        sq_[idx].st = wqe_st::done;
        ++sq_next_;
        state_.store(qp_state::error);
        flush_locked(wc_status::wr_flush_err, 0);
        if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
        break;
      }
      if (!frame_sq_locked(idx)) break;
      marks_.push_back({batch_bytes_, mark::sq, idx});
      ++sq_next_;
      cur_off_ = 0;
      cur_imm_sent_ = false;
      continue;
    }
    if (need_confirm_ && ord_used_ < cp_.ord) {
      // A zero-length Read: its response proves every earlier message was placed.
      // STags 1, never 0: hardware peers reject STag 0 even with no payload.
      std::byte ctl[control_fpdu_max];
      const std::size_t n =
          write_read_request(ctl, {1, 0, 0, 1, 0}, tx_msn_[qn::read_request], cp_.crc);
      if (!add_control_locked(std::span(ctl, n))) break;
      ++tx_msn_[qn::read_request];
      out_reads_.push_back({outstanding::confirm, 0, confirm_next_, 1, 0, 0, 0, sq_next_});
      ++confirm_next_;
      ++ord_used_;
      need_confirm_ = false;
      continue;
    }
    break;
  }
  return niov_ > 0;
}

void soft_qp::after_send_locked(std::size_t n) noexcept {
  batch_sent_ += n;
  c_tx_stream_.fetch_add(n, std::memory_order_relaxed);
  while (n > 0 && iov_pos_ < niov_) {
    iovec& v = iov_[iov_pos_];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++iov_pos_;
    } else {
      v.iov_base = static_cast<std::byte*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
  std::size_t m = 0;
  for (; m < marks_.size() && marks_[m].end <= batch_sent_; ++m) {
    const mark& mk = marks_[m];
    if (mk.kind == mark::sq) {
      swqe& w = sq_[mk.idx];
      if (w.op == wr_opcode::rdma_read || is_atomic_op(w.op))
        w.st = wqe_st::awaiting;
      else
        w.st = w.signaled ? wqe_st::unconfirmed : wqe_st::done;
    } else if (mk.kind == mark::resp) {
      if (!irq_.empty()) {  // a flush may have dropped the queue already
        irq_.pop_front();
        if (irq_framing_ > 0) --irq_framing_;
      }
    } else {
      term_sent_ = true;
      c_term_tx_.fetch_add(1, std::memory_order_relaxed);
      ::shutdown(fd_, SHUT_WR);
    }
  }
  if (m) marks_.erase(marks_.begin(), marks_.begin() + static_cast<std::ptrdiff_t>(m));
  retire_locked();
}

void soft_qp::tx_progress_locked() noexcept {
  if (fd_ < 0 || term_sent_) return;
  for (;;) {
    if (iov_pos_ >= niov_ && !build_batch_locked()) break;
    // Re-validate the keys of read responses still in the batch (revocation)
    // and hold every one across sendmsg: a deregistration waits for the bytes
    // to be copied into the socket, so freed memory never reaches the wire.
    detail::key_table::guard guards[max_batch_keys];
    std::size_t ng = 0;
    bool revoked = false;
    for (const auto& bk : batch_keys_) {
      if (bk.end <= batch_sent_) continue;
      std::byte* p;
      detail::key_table::guard g;
      const access need = bk.sq_idx == batch_key::no_sq ? access::remote_read : access::none;
      if (dev_->keys().acquire(bk.key, pd_->id(), bk.addr, bk.len, need, g, &p) != key_check::ok) {
        if (bk.sq_idx != batch_key::no_sq) sq_[bk.sq_idx].src_revoked = true;
        revoked = true;
        break;
      }
      guards[ng++] = std::move(g);
    }
    if (revoked) {  // mid-FPDU: the stream cannot continue
      ::shutdown(fd_, SHUT_RDWR);
      break;
    }
    msghdr mh{};
    mh.msg_iov = iov_ + iov_pos_;
    mh.msg_iovlen = static_cast<std::size_t>(niov_ - iov_pos_);
    const ssize_t n = ::sendmsg(fd_, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    c_tx_sys_.fetch_add(1, std::memory_order_relaxed);
    for (std::size_t k = 0; k < ng; ++k) guards[k].release();
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!want_write_) {
          want_write_ = true;
          if (attached_.load()) dev_->eng().set_interest(this, fd_, !rx_stopped_.load(), true);
        }
        return;
      }
      ::shutdown(fd_, SHUT_RDWR);  // the engine sees the hang-up and flushes
      return;
    }
    after_send_locked(static_cast<std::size_t>(n));
  }
  if (want_write_) {
    want_write_ = false;
    if (attached_.load()) dev_->eng().set_interest(this, fd_, !rx_stopped_.load(), false);
  }
}

void soft_qp::confirm_before_locked(std::uint64_t sq_pos) noexcept {
  for (std::uint64_t i = sq_head_; i < sq_pos && i < sq_next_; ++i) {
    swqe& w = sq_[i % caps_.max_send_wr];
    if (w.st == wqe_st::unconfirmed) {
      w.byte_len = static_cast<std::uint32_t>(w.len);
      complete_send_locked(w, wc_status::success);
    }
  }
}

void soft_qp::complete_send_locked(swqe& w, wc_status st) noexcept {
  w.status = st;
  w.st = wqe_st::done;
}

void soft_qp::retire_locked() noexcept {
  while (sq_head_ < sq_next_ || (sq_head_ < sq_tail_ && state() == qp_state::error)) {
    swqe& w = sq_[sq_head_ % caps_.max_send_wr];
    if (w.st != wqe_st::done) break;
    push_send_wc(w);
    ++sq_head_;
  }
}

}  // namespace conveyor::soft
