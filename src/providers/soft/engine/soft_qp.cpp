// The soft provider's QP: construction, the posting hooks of sw_qp, errors and
// flushing, teardown and the start of a connection. The rest of the QP:
// soft_qp_tx.cpp (framing and transmission), soft_qp_rx.cpp (reading the
// socket, linger, protocol violations), soft_qp_place.cpp (the FPDU parser and
// placement), soft_qp_respond.cpp (READ/atomic responder, Terminate).
#include "providers/soft/engine/soft_qp_internal.hpp"

#include "core/log.hpp"
#include "providers/soft/soft_device.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace conveyor::soft {

using namespace qp_parts;

soft_qp::soft_qp(swnic::qp_args&& a)
    : sw_qp(std::move(a)), dev_(&static_cast<soft_pd&>(pd()).dev()) {
  sq_.resize(caps_.max_send_wr);
  arena_.reset(new std::byte[arena_size]);
  rxbuf_.reset(new std::byte[rxbuf_size]);
  marks_.reserve(max_iov);
  batch_keys_.reserve(max_batch_keys);
}

soft_qp::~soft_qp() {
  disconnect();
}

// ------------------------------------------------------------------ posting ----
swnic::wqe_base& soft_qp::sq_entry_locked(std::uint32_t idx) noexcept {
  return sq_[idx];
}

bool soft_qp::sq_accept_locked(std::uint32_t idx) noexcept {
  swqe& w = sq_[idx];
  w.st = wqe_st::queued;
  w.msn = 0;
  w.atomic_result = 0;
  w.src_revoked = false;
  return true;
}

bool soft_qp::sq_transmit_locked() noexcept {
  tx_progress_locked();
  return false;
}

// ------------------------------------------------------------ error & flush ----
void soft_qp::flush_locked(wc_status first, std::uint32_t vendor) noexcept {
  wait_placement();  // no buffer of a request is written after it completes
  bool first_used = false;
  for (std::uint64_t i = sq_head_; i < sq_tail_; ++i) {
    swqe& w = sq_[i % caps_.max_send_wr];
    if (w.st == wqe_st::done) continue;
    const bool in_flight = w.st != wqe_st::queued;
    wc_status st = w.src_revoked ? wc_status::loc_prot_err : wc_status::wr_flush_err;
    if (!first_used && in_flight && !w.src_revoked && first != wc_status::success &&
        first != wc_status::wr_flush_err) {
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
    complete_recv_error_locked(wc_status::loc_len_err);
    first = wc_status::wr_flush_err;
  }
  state_.store(qp_state::error);
  awaiting_rtr_ = false;  // an RTR that comes now finds the QP failed
  flush_locked(first, vendor);
  if (term_pending_)
    tx_progress_locked();  // sends the Terminate, then FIN
  else if (fd_ >= 0 && !term_sent_)
    ::shutdown(fd_, SHUT_WR);
}

void soft_qp::disconnect() noexcept {
  cancel_rtr_wait();
  if (state() == qp_state::rts && attached_.load()) {
    // Answer what the peer has already sent (e.g. the zero-length Read that
    // confirms its last SEND) before closing, as a NIC would have acknowledged
    // it on arrival; bounded: only bytes already here, non-blocking sends.
    rx_progress();
    std::lock_guard lk(tx_mu_);
    tx_progress_locked();
  }
  if (state() != qp_state::error && state() != qp_state::reset)
    enter_error(wc_status::wr_flush_err, 0);
  if (attached_.exchange(false)) dev_->eng().detach(this, fd_);
  // The engine may be detaching the socket itself (peer closed): let it finish
  // before the descriptor is closed and can be reused.
  dev_->eng().quiesce(this);
  close_socket();
}

void soft_qp::teardown_for_reset() noexcept {
  cancel_rtr_wait();
  if (fd_ >= 0) disconnect();
}

void soft_qp::cancel_rtr_wait() noexcept {
  std::shared_ptr<rtr_link> link;
  {
    std::lock_guard lk(tx_mu_);
    link = std::move(rtr_link_);
    awaiting_rtr_ = false;
  }
  if (!link) return;
  std::lock_guard lk(link->mu);  // waits for the reader to finish a step on this QP
  link->qp = nullptr;
}

void soft_qp::reset_locked() noexcept {
  awaiting_rtr_ = false;
  for (auto& m : tx_msn_) m = 1;
  for (auto& m : rx_msn_) m = 1;
  term_pending_ = term_sent_ = false;
}

void soft_qp::provider_counters(qp_counters& c) const noexcept {
  c.iwarp = iwarp_qp_counters{.tx_fpdus = c_tx_fpdus_.load(),
                              .rx_fpdus = c_rx_fpdus_.load(),
                              .tx_stream_bytes = c_tx_stream_.load(),
                              .rx_stream_bytes = c_rx_stream_.load(),
                              .tx_syscalls = c_tx_sys_.load(),
                              .rx_syscalls = c_rx_sys_.load(),
                              .terminates_sent = c_term_tx_.load(),
                              .terminates_received = c_term_rx_.load(),
                              .rx_direct_bytes = c_rx_direct_.load()};
}

void soft_qp::start(net::fd_guard fd, const conn_params& p, qp_connection_attr attr,
                    bool sent_read_rtr) {
  {
    std::lock_guard lk(tx_mu_);
    fd_ = fd.release();
    cp_ = p;
    if (p.crc && !stage_) stage_.reset(new std::byte[stage_size]);
    auto& iw = attr.iwarp.value();  // soft_cm fills the MPA facts, the socket the rest
    iw.mss = net::tcp_mss(fd_);
    max_fpdu_ = fpdu_limit(fd_);
    iw.max_fpdu = static_cast<std::uint32_t>(max_fpdu_);
    iw.large_fpdus = p.large_fpdus;
    attr_ = attr;
    state_.store(qp_state::rts);
    if (p.answer_read_rtr) {  // the RTR was Read Request MSN 1: answer it with a zero-length
                              // response
      rx_msn_[qn::read_request] = 2;
      irq_.push_back({response::read, 1, 0, 0, 0, 0, 0, 0, 0});
    }
    if (sent_read_rtr) {
      tx_msn_[qn::read_request] = 2;
      out_reads_.push_back({outstanding::confirm, 0, 0, 1, 0, 0, 0, 0});
      ++ord_used_;
    }
  }
  go_live();
}

void soft_qp::await_rtr(int fd, const conn_params& p, qp_connection_attr attr,
                        std::shared_ptr<rtr_link> link) {
  link->qp = this;  // not yet shared with the reader
  std::lock_guard lk(tx_mu_);
  cp_ = p;
  if (p.crc && !stage_) stage_.reset(new std::byte[stage_size]);
  auto& iw = attr.iwarp.value();
  iw.mss = net::tcp_mss(fd);
  max_fpdu_ = fpdu_limit(fd);
  iw.max_fpdu = static_cast<std::uint32_t>(max_fpdu_);
  iw.large_fpdus = p.large_fpdus;
  attr_ = attr;
  awaiting_rtr_ = true;
  rtr_link_ = std::move(link);
  // RTS with no socket yet: posts are accepted and queued (tx_progress_locked
  // sends nothing without one), as a NIC holds them until the connection is
  // established.
  state_.store(qp_state::rts);
}

bool soft_qp::resume_after_rtr(net::fd_guard fd) noexcept {
  {
    std::lock_guard lk(tx_mu_);
    if (!awaiting_rtr_ || state() != qp_state::rts) return false;
    awaiting_rtr_ = false;
    // rtr_link_ stays until cancel_rtr_wait: a teardown racing with this call
    // must find it and wait on its mutex (the reader holds it until go_live
    // below has returned); dropped here, the QP could be destroyed while go_live
    // still attached it to the engine.
    fd_ = fd.release();
    if (cp_.answer_read_rtr) {
      rx_msn_[qn::read_request] = 2;
      irq_.push_back({response::read, 1, 0, 0, 0, 0, 0, 0, 0});
    }
  }
  go_live();
  return true;
}

void soft_qp::fail_rtr(const std::string& why) noexcept {
  {
    std::lock_guard lk(tx_mu_);
    if (!awaiting_rtr_) return;
    awaiting_rtr_ = false;  // rtr_link_ stays, as in resume_after_rtr
  }
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info, dev_->attr().name + " QP " + std::to_string(qpn_) +
                                                  " accepted from " + attr_.peer_address +
                                                  " fails: " + why);
  enter_error(wc_status::wr_flush_err, 0);
}

void soft_qp::go_live() noexcept {
  if (detail::log_enabled(detail::log_level::info)) {
    const auto& iw = *attr_.iwarp;
    detail::log_line(detail::log_level::info,
                     dev_->attr().name + " QP " + std::to_string(qpn_) + " connected " +
                         attr_.local_address + " <-> " + attr_.peer_address + ": MPA rev " +
                         std::to_string(iw.mpa_revision) + ", IRD " + std::to_string(attr_.ird) +
                         ", ORD " + std::to_string(attr_.ord) + ", CRC " + (iw.crc ? "on" : "off") +
                         ", MSS " + std::to_string(iw.mss) + ", FPDU " +
                         std::to_string(iw.max_fpdu) + (iw.large_fpdus ? " (large)" : "") +
                         ", RTR " + iw.rtr + ", RFC 7306 " + (attr_.extensions ? "on" : "off"));
  }
  attached_.store(true);
  dev_->eng().attach(this, fd_);
  std::lock_guard lk(tx_mu_);
  tx_progress_locked();
}

}  // namespace conveyor::soft
