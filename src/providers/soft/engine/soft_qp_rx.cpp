// The soft QP's receive loop (engine only): reading the socket into staging,
// the phases of one FPDU, linger after ERROR, protocol violations.
#include "providers/soft/engine/soft_qp_internal.hpp"

#include "core/log.hpp"
#include "providers/soft/soft_device.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace conveyor::soft {

using namespace qp_parts;

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
  rx_release();
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
  const std::uint64_t before = c_rx_stream_.load(std::memory_order_relaxed);
  on_events(EPOLLIN);
  return c_rx_stream_.load(std::memory_order_relaxed) != before || rx_eof_.load();
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
  send_kicked();
  const ssize_t n = ::recv(fd_, rxbuf_.get() + rx_end_, room, MSG_DONTWAIT);
  c_rx_sys_.fetch_add(1, std::memory_order_relaxed);
  if (n > 0) {
    if (static_cast<std::size_t>(n) < room) rx_drained_ = true;
    rx_end_ += static_cast<std::size_t>(n);
    c_rx_stream_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);
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

void soft_qp::send_kicked() noexcept {
  if (!tx_kicked_) return;
  tx_kicked_ = false;
  std::lock_guard lk(tx_mu_);
  tx_progress_locked();
}

void soft_qp::rx_progress() noexcept {
  std::lock_guard lk(rx_mu_);
  if (fd_ < 0 || !attached_.load() || rx_eof_.load()) return;
  struct at_end {
    soft_qp* q;
    ~at_end() { q->send_kicked(); }
  } flush{this};
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
      case rx_phase::header:
        go = rx_header();
        break;
      case rx_phase::payload:
        go = rx_payload();
        break;
      case rx_phase::trailer:
        go = rx_trailer();
        break;
    }
    if (!go) {
      if (state() == qp_state::error) stop_reading_locked();
      return;
    }
  }
}

int soft_qp::plan_payload(std::uint64_t off, std::uint64_t len, iovec* out) noexcept {
  // Destination of payload bytes [off, off+len) of the current FPDU.
  switch (h_.opcode) {
    case rdmap_op::write: {
      // Validated again for every step, and held (rx_guards_) until the bytes
      // are in: a deregistration waits for this step and no longer.
      std::byte* p = nullptr;
      if (dev_->keys().acquire(h_.stag, pd_->id(), h_.to + off, len, access::remote_write,
                               rx_guards_[0], &p) != key_check::ok)
        return place_flushed;
      rx_nguards_ = 1;
      out[0] = {p, len};
      return 1;
    }
    case rdmap_op::read_response: {
      std::lock_guard lk(tx_mu_);
      if (out_reads_.empty()) return place_flushed;  // flushed meanwhile
      const outstanding& o = out_reads_.front();
      const int n =
          plan_local(sq_sges(o.wqe), sq_[o.wqe].nsge, (h_.to - o.sink_to) + off, len, out);
      if (n > 0) begin_placement();  // under tx_mu_: a flush waits for the copy
      return n;
    }
    default: {  // send: the receive its first segment claimed
      std::lock_guard lk(rq_mu_);
      if (!recv_claimed_locked()) return place_flushed;  // flushed meanwhile
      const int n =
          plan_local(claimed_sges_locked(), claimed_locked().nsge, rx_msg_off_ + off, len, out);
      if (n > 0) begin_placement();  // under rq_mu_: a flush waits for the copy
      return n;
    }
  }
}

int soft_qp::plan_local(const sge* s, std::uint32_t nsge, std::uint64_t moff, std::uint64_t len,
                        iovec* out) noexcept {
  // The lkeys were checked when the request was posted; they are checked again
  // for every step, because the application may deregister a sink while its
  // request is outstanding: the bytes must then go nowhere, not into memory
  // that is no longer the region (freed, reused, unmapped).
  int n = 0;
  for (std::uint32_t k = 0; k < nsge && len > 0 && n < max_place_iov; ++k) {
    if (moff >= s[k].length) {
      moff -= s[k].length;
      continue;
    }
    const std::uint64_t take = std::min<std::uint64_t>(s[k].length - moff, len);
    std::byte* p = nullptr;
    if (dev_->keys().acquire(s[k].lkey, pd_->id(), s[k].addr + moff, take, access::local_write,
                             rx_guards_[n], &p) != key_check::ok) {
      rx_nguards_ = n;
      rx_release();
      return place_revoked;
    }
    out[n++] = {p, take};
    len -= take;
    moff = 0;
  }
  rx_nguards_ = n;
  if (len != 0) {
    rx_release();
    return place_flushed;
  }
  return n;
}

void soft_qp::local_sink_revoked() noexcept {
  if (h_.opcode == rdmap_op::read_response) {
    std::lock_guard lk(tx_mu_);
    if (!out_reads_.empty()) {
      const outstanding& o = out_reads_.front();
      // The response proves that the peer placed everything sent before the READ.
      confirm_before_locked(o.sq_pos);
      if (o.kind == outstanding::user_read)
        complete_send_locked(sq_[o.wqe], wc_status::loc_prot_err);
    }
  } else {
    std::lock_guard lk(rq_mu_);
    complete_recv_error_locked(wc_status::loc_prot_err);
  }
  // The peer's request is named by the DDP header: its SEND (or, for a READ
  // response, nothing of its own) fails with rem_op_err.
  protocol_violation(term_layer::rdmap, term::rdmap_local_catastrophic, term::rdmap_unspecified,
                     wc_status::wr_flush_err);
}

void soft_qp::begin_placement() noexcept {
  placer_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  placing_.store(true, std::memory_order_seq_cst);
}

void soft_qp::rx_release() noexcept {
  for (int i = 0; i < rx_nguards_; ++i) rx_guards_[i].release();
  rx_nguards_ = 0;
  if (placing_.load(std::memory_order_relaxed)) placing_.store(false, std::memory_order_seq_cst);
}

void soft_qp::wait_placement() const noexcept {
  // The copy is one bounded non-blocking step; the placing thread takes no
  // lock until it ends it. The engine thread flushing its own QP has ended
  // its step first (rx_payload releases before it fails the QP).
  while (placing_.load(std::memory_order_seq_cst) &&
         placer_.load(std::memory_order_relaxed) != std::this_thread::get_id())
    std::this_thread::yield();
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

}  // namespace conveyor::soft
