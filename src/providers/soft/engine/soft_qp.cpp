// The soft provider's QP: posting, FPDU framing and transmission, the receive
// parser, placement with key validation, completions, Terminate and flushing.
#include "providers/soft/engine/soft_qp.hpp"

#include "core/log.hpp"
#include "providers/swnic/opcodes.hpp"
#include "providers/swnic/remote_atomic.hpp"
#include "providers/soft/soft_device.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace conveyor::soft {

using namespace wire;
using detail::key_check;
using swnic::is_atomic_op;
using swnic::is_send_op;
using swnic::is_write_op;
using swnic::wc_of;

namespace {
constexpr std::size_t rxbuf_size = 256 * 1024;
constexpr std::size_t small_inline_copy = 64;  // payload up to this is copied next to its header
constexpr std::size_t max_batch_bytes = 8u << 20;
constexpr std::size_t header_lookahead = 128;  // read-ahead after bulk payload
constexpr std::size_t max_fpdu_size = 65536;   // ULPDU_Length is 16 bits
constexpr std::uint64_t mss_check_interval = 1u << 20;

// What the initiator sees for a Terminate (layer, type, code).
wc_status status_of_terminate(const terminate_msg& t) {
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
}  // namespace

soft_qp::soft_qp(std::shared_ptr<soft_pd> pd, std::shared_ptr<detail::sw_cq> scq,
                 std::shared_ptr<detail::sw_cq> rcq, const qp_init_attr& attr, std::uint32_t qpn)
    : sw_qp(pd, std::move(scq), std::move(rcq), attr, qpn), dev_(&pd->dev()) {
  sq_.resize(caps_.max_send_wr);
  arena_.reset(new std::byte[arena_size]);
  rxbuf_.reset(new std::byte[rxbuf_size]);
  marks_.reserve(max_iov);
  batch_keys_.reserve(max_batch_keys);
}

soft_qp::~soft_qp() { disconnect(); }

// ------------------------------------------------------------------ posting ----
swnic::wqe_base& soft_qp::sq_entry_locked(std::uint32_t idx) noexcept {
  sq_[idx] = swqe{};
  return sq_[idx];
}

// Immediate data and atomics are RFC 7306: only when the handshake negotiated it.
status soft_qp::check_send(const send_wr& wr) const noexcept {
  if ((wr.opcode == wr_opcode::send_with_imm || wr.opcode == wr_opcode::rdma_write_with_imm ||
       is_atomic_op(wr.opcode)) && !cp_.ext)
    return errc::unsupported;
  return errc::ok;
}

bool soft_qp::sq_transmit_locked() noexcept {
  tx_progress_locked();
  return false;
}

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
  if (tagged) write_tagged_header(h, op, last, stag, to, plen);
  else write_untagged_header(h, op, last, q, msn, mo, inv, 0, plen);
  std::uint32_t crc = cp_.crc ? crc32c_update(crc32c_init, h, hdr) : 0;
  std::size_t used = hdr;
  auto push_arena = [&](std::byte* p, std::size_t n) {
    if (niov_ > 0 && static_cast<std::byte*>(iov_[niov_ - 1].iov_base) + iov_[niov_ - 1].iov_len == p)
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
  batch_bytes_ += hdr + plen + fpdu_pad(hdr - 2 + plen) + crc_size;
  c_tx_fpdus_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void soft_qp::refresh_fpdu_size_locked(std::uint64_t pending) noexcept {
  // Only for payloads that need several FPDUs, and at most once per MiB framed:
  // one getsockopt, never on the small-message path.
  if (pending <= max_fpdu_ || tx_framed_ < mss_check_at_ || fd_ < 0) return;
  mss_check_at_ = tx_framed_ + mss_check_interval;
  max_fpdu_ = std::min<std::size_t>(net::tcp_mss(fd_), max_fpdu_size) & ~std::size_t(7);
}

bool soft_qp::frame_sq_locked(std::uint32_t idx) noexcept {
  swqe& w = sq_[idx];
  if (is_write_op(w.op) || is_send_op(w.op)) refresh_fpdu_size_locked(w.len - cur_off_);
  const std::size_t max_t = (max_fpdu_ - tagged_header_size - crc_size) & ~std::size_t(3);
  const std::size_t max_u = (max_fpdu_ - untagged_header_size - crc_size) & ~std::size_t(3);
  iovec pv[32];
  std::byte ctl[control_fpdu_max];
  auto imm_fpdu = [&](bool for_send) -> bool {
    const std::uint64_t v = (for_send ? (1ull << 63) : 0) |
                            ((w.len & 0x7FFFFFFFull) << 32) | w.imm;
    const std::size_t n = write_immediate(ctl, v, w.solicited, tx_msn_[qn::send], cp_.crc);
    if (!add_control_locked(std::span(ctl, n))) return false;
    ++tx_msn_[qn::send];
    return true;
  };
  if (is_write_op(w.op)) {
    if (!cur_imm_sent_) {
      do {
        const std::uint64_t chunk = std::min<std::uint64_t>(w.len - cur_off_, max_t);
        const std::size_t n = gather_sq(w, idx, cur_off_, chunk, pv, 32);
        const bool last = cur_off_ + chunk == w.len;
        if (!add_data_fpdu_locked(true, rdmap_op::write, last, w.rkey, w.remote_addr + cur_off_, 0,
                                  0, 0, 0, std::span(pv, n), chunk))
          return false;
        cur_off_ += chunk;
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
      const std::size_t n = gather_sq(w, idx, cur_off_, chunk, pv, 32);
      const bool last = cur_off_ + chunk == w.len;
      if (!add_data_fpdu_locked(false, op, last, 0, 0, qn::send, w.msn,
                                static_cast<std::uint32_t>(cur_off_), inv ? w.inv : 0,
                                std::span(pv, n), chunk))
        return false;
      cur_off_ += chunk;
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
    out_reads_.push_back({outstanding::user_read, idx, 0, rr.sink_stag, rr.sink_to, w.len, 0, sq_next_});
    need_confirm_ = false;  // this response confirms everything before it
    ++ord_used_;
  } else {  // atomics
    atomic_request a;
    a.kind = w.op == wr_opcode::atomic_fetch_and_add ? atomic_kind::fetch_add : atomic_kind::cmp_swap;
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
  do {
    const std::uint64_t chunk = std::min<std::uint64_t>(r.len - r.sent, max_t);
    iovec v{};
    std::size_t nv = 0;
    if (chunk > 0) {
      detail::key_table::guard g;
      std::byte* p = nullptr;
      if (dev_->keys().acquire(r.src_stag, pd_->id(), r.src_to + r.sent, chunk, access::remote_read,
                               g, &p) != key_check::ok) {
        // Revoked while being served: the peer gets a Terminate instead of the rest.
        terminate_msg t{term_layer::rdmap, term::rdmap_remote_prot, term::rdmap_inv_stag, {}, {}, 0, false};
        term_bytes_ = encode_terminate(t, cp_.crc);
        term_pending_ = true;
        return false;
      }
      if (batch_keys_.size() >= max_batch_keys) return false;
      v = {p, chunk};
      nv = 1;
      batch_keys_.push_back({r.src_stag, r.src_to + r.sent, chunk, 0});
    }
    const bool last = r.sent + chunk == r.len;
    if (!add_data_fpdu_locked(true, rdmap_op::read_response, last, r.sink_stag, r.sink_to + r.sent,
                              0, 0, 0, 0, std::span(&v, nv), chunk)) {
      if (nv) batch_keys_.pop_back();
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
  arena_used_ = 0;
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
  c_tx_bytes_.fetch_add(n, std::memory_order_relaxed);
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
      if (w.op == wr_opcode::rdma_read || is_atomic_op(w.op)) w.st = wqe_st::awaiting;
      else w.st = w.signaled ? wqe_st::unconfirmed : wqe_st::done;
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
      if (dev_->keys().acquire(bk.key, pd_->id(), bk.addr, bk.len, access::remote_read, g, &p) !=
          key_check::ok) {
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

// ------------------------------------------------------------ receive side ----
void soft_qp::on_events(std::uint32_t events) noexcept {
  if (events & EPOLLOUT) {
    std::lock_guard lk(tx_mu_);
    tx_progress_locked();
  }
  if (rx_stopped_.load())
    linger_step(events);
  else if (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP | EPOLLERR))
    rx_progress();
  // Called by the progressing thread itself, so detach does not wait.
  if (rx_eof_.load() && attached_.exchange(false)) {
    dev_->eng().detach(this, fd_);
    // Detached here, so no other thread uses the descriptor any more.
    if (rx_stopped_.load()) close_socket();
  }
}

void soft_qp::stop_reading_locked() noexcept {
  if (rx_stopped_.load()) return;
  rx_beg_ = rx_end_ = 0;
  rx_guard_.release();
  if (!rx_eof_.load()) {
    linger_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (linger_fd_ < 0) {
      rx_eof_.store(true);  // no timer: close at once
    } else {
      itimerspec its{};
      const auto ns = std::chrono::nanoseconds(linger_time).count();
      its.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
      its.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
      ::timerfd_settime(linger_fd_, 0, &its, nullptr);
      if (attached_.load()) dev_->eng().watch(this, linger_fd_);
    }
  }
  rx_stopped_.store(true);
  std::lock_guard lk(tx_mu_);
  if (attached_.load() && fd_ >= 0) dev_->eng().set_interest(this, fd_, false, want_write_);
}

void soft_qp::linger_step(std::uint32_t events) noexcept {
  std::lock_guard lk(rx_mu_);
  bool done = (events & (EPOLLHUP | EPOLLERR)) != 0;  // the peer hung up: nothing left to wait for
  std::uint64_t expirations = 0;
  if (linger_fd_ >= 0 && ::read(linger_fd_, &expirations, sizeof expirations) ==
                             static_cast<ssize_t>(sizeof expirations))
    done = true;  // linger_time is over
  if (done) rx_eof_.store(true);
}

void soft_qp::close_socket() noexcept {
  std::lock_guard rl(rx_mu_);
  std::lock_guard lk(tx_mu_);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (linger_fd_ >= 0) {
    ::close(linger_fd_);
    linger_fd_ = -1;
  }
}

bool soft_qp::poll_inbound() noexcept {
  const std::uint64_t before = c_rx_bytes_.load(std::memory_order_relaxed);
  on_events(EPOLLIN);
  return c_rx_bytes_.load(std::memory_order_relaxed) != before || rx_eof_.load();
}

bool soft_qp::rx_fill(std::size_t want) noexcept {
  // After a short read the socket is (almost certainly) empty: skip the EAGAIN
  // system call; level-triggered epoll calls us again when more arrives.
  if (rx_drained_) return false;
  if (++rx_reads_ > 64) return false;  // let other QPs run; epoll brings us back
  if (rx_beg_ == rx_end_) rx_beg_ = rx_end_ = 0;
  if (rx_end_ + want > rxbuf_size || rx_beg_ > rxbuf_size / 2) {
    std::memmove(rxbuf_.get(), rxbuf_.get() + rx_beg_, rx_end_ - rx_beg_);
    rx_end_ -= rx_beg_;
    rx_beg_ = 0;
  }
  std::size_t room = rxbuf_size - rx_end_;
  if (rx_last_big_) room = std::min(room, std::max(want, header_lookahead));
  const ssize_t n = ::recv(fd_, rxbuf_.get() + rx_end_, room, MSG_DONTWAIT);
  c_rx_sys_.fetch_add(1, std::memory_order_relaxed);
  if (n > 0) {
    if (static_cast<std::size_t>(n) < room) rx_drained_ = true;
    rx_end_ += static_cast<std::size_t>(n);
    c_rx_bytes_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  // EOF or a hard error: the connection is gone. The socket leaves the engine
  // in on_events, outside rx_mu_ (disconnect() runs this path too, on a thread
  // that must not wait for the engine while holding rx_mu_).
  enter_error(wc_status::retry_exc_err, 0);
  rx_eof_.store(true);
  return false;
}

void soft_qp::rx_progress() noexcept {
  std::lock_guard lk(rx_mu_);
  if (fd_ < 0 || !attached_.load() || rx_eof_.load()) return;
  rx_drained_ = false;
  // No step budget: parsing what is buffered is bounded by the buffer, and
  // socket reads per call are capped in rx_fill (fairness between QPs); a cap
  // that left buffered bytes unparsed would stall, since epoll reports only
  // bytes still in the socket.
  rx_reads_ = 0;
  for (;;) {
    if (state() == qp_state::error) {
      // Nothing more is read (a peer cannot feed us junk after our Terminate);
      // the socket closes after the linger.
      stop_reading_locked();
      return;
    }
    bool go = false;
    switch (rx_phase_) {
      case rx_phase::header: go = rx_header(); break;
      case rx_phase::payload: go = rx_payload(); break;
      case rx_phase::trailer: go = rx_trailer(); break;
    }
    if (!go) {
      if (state() == qp_state::error) stop_reading_locked();
      return;
    }
  }
}

int soft_qp::plan_payload(std::uint64_t off, std::uint64_t len, iovec* out, int max) noexcept {
  // Destination of payload bytes [off, off+len) of the current FPDU.
  switch (h_.opcode) {
    case rdmap_op::write: {
      // Validated again for every step, and held (rx_guard_) until the bytes
      // are in: a deregistration waits for this step and no longer.
      std::byte* p = nullptr;
      if (dev_->keys().acquire(h_.stag, pd_->id(), h_.to + off, len, access::remote_write,
                               rx_guard_, &p) != key_check::ok)
        return -1;
      out[0] = {p, len};
      return 1;
    }
    case rdmap_op::read_response: {
      std::lock_guard lk(tx_mu_);
      if (out_reads_.empty()) return -1;  // flushed meanwhile
      const outstanding& o = out_reads_.front();
      const swqe& w = sq_[o.wqe];
      std::uint64_t moff = (h_.to - o.sink_to) + off;
      const sge* s = sq_sges(o.wqe);
      int n = 0;
      for (std::uint32_t k = 0; k < w.nsge && len > 0 && n < max; ++k) {
        if (moff >= s[k].length) { moff -= s[k].length; continue; }
        const std::uint64_t take = std::min<std::uint64_t>(s[k].length - moff, len);
        out[n++] = {reinterpret_cast<void*>(s[k].addr + moff), take};
        len -= take;
        moff = 0;
      }
      return len == 0 ? n : -1;
    }
    default: {  // send: the receive at the head of the RQ
      std::lock_guard lk(rq_mu_);
      if (rq_head_ == rq_tail_) return -1;
      const auto idx = static_cast<std::uint32_t>(rq_head_ % caps_.max_recv_wr);
      const sge* s = rq_sges(idx);
      std::uint64_t moff = rx_msg_off_ + off;
      int n = 0;
      for (std::uint32_t k = 0; k < rq_[idx].nsge && len > 0 && n < max; ++k) {
        if (moff >= s[k].length) { moff -= s[k].length; continue; }
        const std::uint64_t take = std::min<std::uint64_t>(s[k].length - moff, len);
        out[n++] = {reinterpret_cast<void*>(s[k].addr + moff), take};
        len -= take;
        moff = 0;
      }
      return len == 0 ? n : -1;
    }
  }
}

void soft_qp::protocol_violation(term_layer layer, std::uint8_t etype, std::uint8_t ecode,
                                 wc_status local_status) noexcept {
  terminate_msg t{layer, etype, ecode, {}, {}, 0, false};
  // Include the offending DDP header (from the DDP control byte) when we have it.
  if (h_.header_len >= tagged_header_size) {
    std::byte hdr[ddp::untagged_hdr];
    const std::size_t n = h_.tagged ? ddp::tagged_hdr : ddp::untagged_hdr;
    hdr[0] = std::byte((h_.tagged ? ddp::tagged : 0) | (h_.last ? ddp::last : 0) | ddp::version);
    hdr[1] = std::byte(ddp::rdmap_version | static_cast<std::uint8_t>(h_.opcode));
    if (h_.tagged) {
      put_be32(hdr + 2, h_.stag);
      put_be64(hdr + 6, h_.to);
    } else {
      put_be32(hdr + 2, h_.inv_stag);
      put_be32(hdr + 6, h_.qn);
      put_be32(hdr + 10, h_.msn);
      put_be32(hdr + 14, h_.mo);
    }
    t.ddp_header.assign(hdr, hdr + n);
    t.has_segment_length = true;
    t.ddp_segment_length = h_.ulpdu_len;
  }
  fail_with_terminate(t, local_status);
}

void soft_qp::fail_with_terminate(const terminate_msg& t, wc_status local_status) noexcept {
  {
    std::lock_guard lk(tx_mu_);
    if (!term_sent_) {
      term_bytes_ = encode_terminate(t, cp_.crc);
      term_pending_ = true;
    }
  }
  enter_error(local_status, t.control_word());
}

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
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_bad_version, wc_status::fatal_err);
        break;
      case wire_error::bad_rdmap_version:
        protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_bad_version, wc_status::fatal_err);
        break;
      case wire_error::bad_qn:
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_inv_qn, wc_status::fatal_err);
        break;
      default:
        protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op, wc_status::fatal_err);
        break;
    }
    return false;
  }
  h_ = *ph;
  const std::byte* body = b + untagged_header_size;
  if ((h_.opcode == rdmap_op::immediate || h_.opcode == rdmap_op::immediate_se ||
       h_.opcode == rdmap_op::atomic_request || h_.opcode == rdmap_op::atomic_response) && !cp_.ext) {
    protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op, wc_status::fatal_err);
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
          protocol_violation(term_layer::ddp, term::ddp_tagged,
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
      std::unique_lock lk(rq_mu_);
      if (rq_head_ == rq_tail_) {
        lk.unlock();
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_no_buffer, wc_status::success);
        return false;
      }
      const swnic::rwqe& r = rq_[rq_head_ % caps_.max_recv_wr];
      if (rx_msg_off_ + h_.payload_len > r.len) {
        lk.unlock();
        // Our receive completes with loc_len_err; the sender sees a Terminate.
        protocol_violation(term_layer::ddp, term::ddp_untagged, term::ddp_u_too_long, wc_status::loc_len_err);
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
        protocol_violation(term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op, wc_status::fatal_err);
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
      if (t) handle_terminate(*t);
      else enter_error(wc_status::rem_op_err, 0);
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
        fail_with_terminate({term_layer::rdmap, term::rdmap_remote_op, term::rdmap_unexpected_op,
                             {}, {}, 0, false}, wc_status::bad_resp_err);
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
  rx_last_big_ = h_.payload_len >= 4096;
  rx_phase_ = h_.payload_len > 0 ? rx_phase::payload : rx_phase::trailer;
  return true;
}

bool soft_qp::rx_payload() noexcept {
  iovec v[36];
  while (rx_done_ < h_.payload_len) {
    const std::uint64_t remaining = h_.payload_len - rx_done_;
    const std::size_t buffered = rx_end_ - rx_beg_;
    if (buffered > 0) {
      const std::uint64_t n = std::min<std::uint64_t>(buffered, remaining);
      const int k = plan_payload(rx_done_, n, v, 32);
      if (k < 0) {
        if (state() != qp_state::error)
          protocol_violation(term_layer::ddp, term::ddp_tagged, term::ddp_t_inv_stag, wc_status::success);
        return false;
      }
      const std::byte* src = rxbuf_.get() + rx_beg_;
      for (int i = 0; i < k; ++i) {
        std::memcpy(v[i].iov_base, src, v[i].iov_len);
        src += v[i].iov_len;
      }
      rx_guard_.release();
      if (cp_.crc) rx_crc_ = crc32c_update(rx_crc_, rxbuf_.get() + rx_beg_, n);
      rx_beg_ += n;
      rx_done_ += n;
      continue;
    }
    if (remaining < 1024) {
      if (!rx_fill(remaining + 8)) return false;
      continue;
    }
    // Bulk: straight into the destination, then the trailer, then a look-ahead.
    const int k = plan_payload(rx_done_, remaining, v, 32);
    if (k < 0) {
      if (state() != qp_state::error)
        protocol_violation(term_layer::ddp, term::ddp_tagged, term::ddp_t_inv_stag, wc_status::success);
      return false;
    }
    const std::size_t tl = h_.pad + crc_size;
    v[k] = {rx_trailer_, tl};
    rx_beg_ = rx_end_ = 0;
    v[k + 1] = {rxbuf_.get(), header_lookahead};
    if (rx_drained_ || ++rx_reads_ > 64) {
      rx_guard_.release();
      return false;
    }
    const ssize_t n = ::readv(fd_, v, k + 2);
    rx_guard_.release();
    c_rx_sys_.fetch_add(1, std::memory_order_relaxed);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
      enter_error(wc_status::retry_exc_err, 0);
      rx_eof_.store(true);
      return false;
    }
    c_rx_bytes_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
    std::size_t got = static_cast<std::size_t>(n);
    if (got < remaining + tl + header_lookahead) rx_drained_ = true;
    for (int i = 0; i < k && got > 0; ++i) {
      const std::size_t t = std::min(got, v[i].iov_len);
      if (cp_.crc) rx_crc_ = crc32c_update(rx_crc_, v[i].iov_base, t);
      rx_done_ += t;
      got -= t;
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
        term_bytes_ = encode_terminate({term_layer::ddp, term::ddp_tagged, term::ddp_t_base_bounds,
                                        {}, {}, 0, false}, cp_.crc);
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
      tx_progress_locked();
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
        std::lock_guard lk(rq_mu_);
        if (rq_head_ == rq_tail_) return false;
        const swnic::rwqe& r = rq_[rq_head_ % caps_.max_recv_wr];
        wc.wr_id = r.wr_id;
        ++rq_head_;
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
      bool have_recv = false;
      {
        std::lock_guard lk(rq_mu_);
        if (rq_head_ != rq_tail_) {
          wc.wr_id = rq_[rq_head_ % caps_.max_recv_wr].wr_id;
          ++rq_head_;
          have_recv = true;
        }
      }
      if (!have_recv) {  // Immediate Data with no receive posted
        fail_with_terminate({term_layer::ddp, term::ddp_untagged, term::ddp_u_no_buffer, {}, {}, 0, false},
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
      std::memcpy(reinterpret_cast<void*>(s.addr), &rx_ctl_value_, 8);
      w.byte_len = 8;
      complete_send_locked(w, wc_status::success);
      retire_locked();
      tx_progress_locked();
      return true;
    }
    default:
      return true;
  }
}

namespace {
std::uint8_t rdmap_code(key_check kc) {
  return kc == key_check::out_of_bounds ? term::rdmap_base_bounds
         : kc == key_check::no_access   ? term::rdmap_access
         : kc == key_check::wrong_pd    ? term::rdmap_stag_not_assoc
                                        : term::rdmap_inv_stag;
}
}  // namespace

void soft_qp::handle_read_request(const read_request& rr) noexcept {
  bool full;
  {
    std::lock_guard lk(tx_mu_);
    full = irq_.size() >= cp_.ird;
  }
  if (full) {  // the peer ignored our IRD
    fail_with_terminate({term_layer::rdmap, term::rdmap_remote_op, term::rdmap_catastrophic_stream,
                         {}, {}, 0, false}, wc_status::success);
    return;
  }
  if (rr.size > 0) {
    detail::key_table::guard g;
    std::byte* p = nullptr;
    const key_check kc = dev_->keys().acquire(rr.src_stag, pd_->id(), rr.src_to, rr.size,
                                              access::remote_read, g, &p);
    if (kc != key_check::ok) {
      std::byte rh[read_request_hdr];
      put_be32(rh, rr.sink_stag);
      put_be64(rh + 4, rr.sink_to);
      put_be32(rh + 12, rr.size);
      put_be32(rh + 16, rr.src_stag);
      put_be64(rh + 20, rr.src_to);
      fail_with_terminate({term_layer::rdmap, term::rdmap_remote_prot, rdmap_code(kc), {},
                           std::vector<std::byte>(rh, rh + read_request_hdr), 0, false},
                          wc_status::success);
      return;
    }
  }
  c_reads_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(tx_mu_);
  irq_.push_back({response::read, rr.sink_stag, rr.sink_to, rr.size, 0, rr.src_stag, rr.src_to, 0, 0});
  tx_progress_locked();
}

void soft_qp::handle_atomic_request(const atomic_request& a) noexcept {
  bool full;
  {
    std::lock_guard lk(tx_mu_);
    full = irq_.size() >= cp_.ird;
  }
  if (full) {  // RFC 7306: atomics share the IRD with READs; refused before executing
    fail_with_terminate({term_layer::rdmap,
                         term::rdmap_remote_op,
                         term::rdmap_catastrophic_stream,
                         {},
                         {},
                         0,
                         false},
                        wc_status::success);
    return;
  }
  detail::key_table::guard g;
  std::byte* p = nullptr;
  const key_check kc =
      dev_->keys().acquire(a.stag, pd_->id(), a.to, 8, access::remote_atomic, g, &p);
  if (kc != key_check::ok || (a.to & 7) != 0) {
    fail_with_terminate({term_layer::rdmap, term::rdmap_remote_prot,
                         kc == key_check::ok ? term::rdmap_base_bounds : rdmap_code(kc), {}, {}, 0,
                         false}, wc_status::success);
    return;
  }
  const std::uint64_t orig = detail::remote_atomic(p, a.kind == atomic_kind::fetch_add,
                                                   a.kind == atomic_kind::fetch_add ? a.add_swap
                                                                                    : a.compare,
                                                   a.add_swap);
  g.release();
  c_atomics_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(tx_mu_);
  irq_.push_back({response::atomic, 0, 0, 0, 0, 0, 0, a.request_id, orig});
  tx_progress_locked();
}

void soft_qp::handle_terminate(const terminate_msg& t) noexcept {
  const wc_status st = status_of_terminate(t);
  std::lock_guard lk(tx_mu_);
  // Find the request the Terminate names: by STag for tagged, by QN/MSN otherwise.
  std::uint64_t culprit = sq_tail_;
  if (t.ddp_header.size() >= 2) {
    const bool tagged = std::to_integer<std::uint8_t>(t.ddp_header[0]) & ddp::tagged;
    for (std::uint64_t i = sq_head_; i < sq_next_; ++i) {
      const swqe& w = sq_[i % caps_.max_send_wr];
      if (w.st == wqe_st::done) continue;
      if (tagged && t.ddp_header.size() >= ddp::tagged_hdr && is_write_op(w.op) &&
          w.rkey == get_be32(t.ddp_header.data() + 2)) { culprit = i; break; }
      if (!tagged && t.ddp_header.size() >= ddp::untagged_hdr) {
        const std::uint32_t q = get_be32(t.ddp_header.data() + 6);
        const std::uint32_t m = get_be32(t.ddp_header.data() + 10);
        if (q == qn::send && is_send_op(w.op) && w.msn == m) { culprit = i; break; }
      }
    }
  }
  if (culprit == sq_tail_ && t.rdmap_header.size() >= read_request_hdr) {
    const std::uint32_t src = get_be32(t.rdmap_header.data() + 16);
    for (std::uint64_t i = sq_head_; i < sq_next_; ++i) {
      const swqe& w = sq_[i % caps_.max_send_wr];
      if (w.st != wqe_st::done && w.op == wr_opcode::rdma_read && w.rkey == src) { culprit = i; break; }
    }
  }
  if (culprit != sq_tail_) {
    // Everything before the culprit was placed by the peer (it processes in order).
    for (std::uint64_t i = sq_head_; i < culprit; ++i) {
      swqe& w = sq_[i % caps_.max_send_wr];
      if (w.st == wqe_st::unconfirmed) complete_send_locked(w, wc_status::success);
    }
    swqe& c = sq_[culprit % caps_.max_send_wr];
    complete_send_locked(c, st);
    retire_locked();
  }
  state_.store(qp_state::error);
  flush_locked(culprit == sq_tail_ ? st : wc_status::wr_flush_err, t.control_word());
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);  // the peer closes after its Terminate
}

// ------------------------------------------------------------ error & flush ----
void soft_qp::flush_locked(wc_status first, std::uint32_t vendor) noexcept {
  bool first_used = false;
  for (std::uint64_t i = sq_head_; i < sq_tail_; ++i) {
    swqe& w = sq_[i % caps_.max_send_wr];
    if (w.st == wqe_st::done) continue;
    const bool in_flight = w.st != wqe_st::queued;
    wc_status st = wc_status::wr_flush_err;
    if (!first_used && in_flight && first != wc_status::success && first != wc_status::wr_flush_err) {
      st = first;
      first_used = true;
    }
    complete_send_locked(w, st);
  }
  sq_next_ = sq_tail_;
  out_reads_.clear();
  out_atomics_.clear();
  ord_used_ = 0;
  need_confirm_ = false;
  irq_.clear();
  irq_framing_ = 0;
  // Retire everything with completions (errors always complete).
  for (; sq_head_ < sq_tail_; ++sq_head_) push_send_wc(sq_[sq_head_ % caps_.max_send_wr], vendor);
  cur_off_ = 0;
  cur_imm_sent_ = false;
  flush_rq();
}

void soft_qp::enter_error(wc_status first, std::uint32_t vendor) noexcept {
  std::lock_guard lk(tx_mu_);
  // A receive that overflowed its buffer completes with loc_len_err.
  if (first == wc_status::loc_len_err) {
    std::lock_guard rl(rq_mu_);
    if (rq_head_ < rq_tail_) complete_recv_error_rq_locked(wc_status::loc_len_err);
    first = wc_status::wr_flush_err;
  }
  state_.store(qp_state::error);
  flush_locked(first, vendor);
  if (term_pending_) tx_progress_locked();  // sends the Terminate, then FIN
  else if (fd_ >= 0 && !term_sent_) ::shutdown(fd_, SHUT_WR);
}

void soft_qp::disconnect() noexcept {
  if (state() == qp_state::rts && attached_.load()) {
    // Answer what the peer has already sent (e.g. the zero-length Read that
    // confirms its last SEND) before closing, as a NIC would have acknowledged
    // it on arrival; bounded: only bytes already here, non-blocking sends.
    rx_progress();
    std::lock_guard lk(tx_mu_);
    tx_progress_locked();
  }
  if (state() != qp_state::error && state() != qp_state::reset) enter_error(wc_status::wr_flush_err, 0);
  if (attached_.exchange(false)) dev_->eng().detach(this, fd_);
  // The engine may be detaching the socket itself (peer closed): let it finish
  // before the descriptor is closed and can be reused.
  dev_->eng().quiesce(this);
  close_socket();
}

void soft_qp::teardown_for_reset() noexcept {
  if (fd_ >= 0) disconnect();
}

void soft_qp::reset_locked() noexcept {
  for (auto& m : tx_msn_) m = 1;
  for (auto& m : rx_msn_) m = 1;
  term_pending_ = term_sent_ = false;
}

qp_counters soft_qp::counters() const noexcept {
  qp_counters c;
  c.tx_bytes = c_tx_bytes_.load();
  c.rx_bytes = c_rx_bytes_.load();
  c.tx_fpdus = c_tx_fpdus_.load();
  c.rx_fpdus = c_rx_fpdus_.load();
  c.tx_syscalls = c_tx_sys_.load();
  c.rx_syscalls = c_rx_sys_.load();
  c.reads_served = c_reads_.load();
  c.writes_placed = c_writes_.load();
  c.atomics_served = c_atomics_.load();
  c.terminates_sent = c_term_tx_.load();
  c.terminates_received = c_term_rx_.load();
  return c;
}

void soft_qp::start(net::fd_guard fd, const conn_params& p, qp_connection_attr attr,
                    bool sent_read_rtr) {
  {
    std::lock_guard lk(tx_mu_);
    fd_ = fd.release();
    cp_ = p;
    attr.mss = net::tcp_mss(fd_);
    max_fpdu_ = std::min<std::size_t>(attr.mss, max_fpdu_size) & ~std::size_t(7);
    attr.max_fpdu = static_cast<std::uint32_t>(max_fpdu_);
    attr_ = attr;
    state_.store(qp_state::rts);
    if (p.answer_read_rtr) {  // the RTR was Read Request MSN 1: answer it with a zero-length response
      rx_msn_[qn::read_request] = 2;
      irq_.push_back({response::read, 1, 0, 0, 0, 0, 0, 0, 0});
    }
    if (sent_read_rtr) {
      tx_msn_[qn::read_request] = 2;
      out_reads_.push_back({outstanding::confirm, 0, 0, 1, 0, 0, 0, 0});
      ++ord_used_;
    }
  }
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info,
                     dev_->attr().name + " QP " + std::to_string(qpn_) + " connected " +
                         attr_.local_address + " <-> " + attr_.peer_address + ": MPA rev " +
                         std::to_string(attr_.mpa_revision) + ", IRD " + std::to_string(attr_.ird) +
                         ", ORD " + std::to_string(attr_.ord) + ", CRC " + (attr_.crc ? "on" : "off") +
                         ", MSS " + std::to_string(attr_.mss) + ", FPDU " +
                         std::to_string(attr_.max_fpdu) + ", RTR " + attr_.rtr + ", RFC 7306 " +
                         (attr_.extensions ? "on" : "off"));
  attached_.store(true);
  dev_->eng().attach(this, fd_);
  std::lock_guard lk(tx_mu_);
  tx_progress_locked();
}

}  // namespace conveyor::soft
