// The shm QP's engine step (under the engine's lock): doorbells and hang-ups
// on the socket, the loop over the peer's requests, refusing a request.
#include "providers/shm/engine/shm_qp_internal.hpp"

#include "core/log.hpp"
#include "providers/shm/shm_device.hpp"
#include "providers/shm/shm_memfd.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace conveyor::shm {

using namespace qp_parts;

// ------------------------------------------------------------ engine side ----
int shm_qp::progress() noexcept {
  if (!connected_ || state() != qp_state::rts) return 0;
  int n = rx_responses();
  n += rx_requests();
  {
    std::lock_guard lk(tx_mu_);
    if (state() == qp_state::rts) {
      if (check_peer_error_locked()) ++n;
      const std::uint64_t t = req_out().tail.load(std::memory_order_seq_cst);
      if (t > tx_head_ || t < seen_tail_) {  // the peer claims what we never sent
        state_.store(qp_state::error, std::memory_order_seq_cst);
        flush_locked(wc_status::bad_resp_err);
        if (sock_ >= 0) net::hang_up(sock_);
        return n + 1;
      }
      if (t != seen_tail_) {
        seen_tail_ = t;
        ++n;
      }
      if (retire_locked()) ++n;
      if (tx_progress_locked()) ++n;
    }
  }
  if (n > 0 || dirty_.exchange(false, std::memory_order_relaxed)) notify_peer();
  return n;
}

bool shm_qp::on_socket(std::uint32_t events) noexcept {
  bool gone = (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0;
  if (!net::drain(sock_)) gone = true;
  if (!gone) return true;
  if (!peer_gone_.exchange(true) && state() == qp_state::rts) {
    progress();  // what the peer finished (or refused) before it went away
    if (state() == qp_state::rts) {
      if (detail::log_enabled(detail::log_level::info))
        detail::log_line(detail::log_level::info, dev_->attr().name + " QP " +
                                                      std::to_string(qpn_) + ": peer " +
                                                      attr_.peer_address + " went away");
      enter_error(wc_status::retry_exc_err);
    }
  }
  return false;
}

bool shm_qp::resp_space(std::uint32_t n) noexcept {
  // The peer's tail may only have consumed what we produced, and never fewer
  // than a ring's worth behind: anything else is a lie that fails the QP.
  const std::uint64_t t = resp_out().tail.load(std::memory_order_seq_cst);
  if (t > rsp_head_ || rsp_head_ - t > ring_slots) {
    rsp_bad_ = true;
    return false;
  }
  return ring_slots - (rsp_head_ - t) >= n;
}

void shm_qp::reset_rx() noexcept {
  rx_held_ = false;
  rx_req_ = msg_header{};
  rx_read_off_ = 0;
  rx_in_send_ = false;
  rx_send_total_ = rx_send_done_ = rx_send_id_ = 0;
  rx_send_flags_ = 0;
  rx_send_imm_ = 0;
}

void shm_qp::fail_request(wc_status remote, wc_status local) noexcept {
  ring_ctl& in = req_in();
  in.err_pos.store(rx_tail_, std::memory_order_relaxed);
  in.err_status.store(static_cast<std::uint32_t>(remote) + 1, std::memory_order_seq_cst);
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info, dev_->attr().name + " QP " + std::to_string(qpn_) +
                                                  ": refused request of " + attr_.peer_address +
                                                  " (" + std::string(to_string(remote)) + ")");
  if (local == wc_status::loc_len_err || local == wc_status::loc_prot_err) {
    // The receive being filled completes with the length error, or with the
    // protection error of a sink deregistered while it was posted (as on soft).
    std::lock_guard lk(rq_mu_);
    complete_recv_error_locked(local);
  }
  reset_rx();
  notify_peer();
  enter_error(wc_status::wr_flush_err);
}

int shm_qp::rx_requests() noexcept {
  ring_ctl& in = req_in();
  const std::uint64_t h = in.head.load(std::memory_order_seq_cst);
  if (h == rx_tail_) return 0;
  if (h - rx_tail_ > ring_slots) {
    fail_request(wc_status::rem_op_err, wc_status::fatal_err);
    return 1;
  }
  const int ring = ring_req(1 - seg_.side);
  int n = 0;
  while (rx_tail_ != h && n < max_rx_batch && state() == qp_state::rts) {
    const std::byte* s = seg_.slot(ring, rx_tail_);
    msg_header m;
    if (rx_held_) {
      m = rx_req_;  // resumed: the copy validated when it was first met
    } else {
      std::memcpy(&m, s, sizeof m);  // copied once: the peer may rewrite the slot
      if (m.len > slot_payload) {
        fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
        return n + 1;
      }
    }
    // A request that blocks has read what it needs of its payload before it
    // blocks (nothing: READ staging, atomics and map requests use none).
    const exec r = run_request(m, s + slot_header);
    if (r == exec::blocked) {
      if (rsp_bad_) {
        fail_request(wc_status::rem_op_err, wc_status::fatal_err);
        return n + 1;
      }
      rx_req_ = m;
      rx_held_ = true;
      break;
    }
    rx_held_ = false;
    rx_read_off_ = 0;
    ++n;
    if (r == exec::failed) break;
    ++rx_tail_;
    // The response first: the initiator completes a READ or atomic only when it
    // has both the response and the tail past the request.
    publish_resp_head();
    in.tail.store(rx_tail_, std::memory_order_seq_cst);
    c_rx_msgs_.fetch_add(1, std::memory_order_relaxed);
  }
  if (n > 0) publish_resp_head();
  return n;
}

shm_qp::exec shm_qp::run_request(const msg_header& m, const std::byte* payload) noexcept {
  switch (m.op) {
    case msg_op::send:
    case msg_op::send_cma:
      return rx_send(m, payload);
    case msg_op::write:
    case msg_op::write_cma:
      return rx_write(m, payload);
    case msg_op::immediate:
      return rx_immediate(m);
    case msg_op::read:
      return rx_read(m, payload);
    case msg_op::atomic:
      return rx_atomic(m);
    case msg_op::map_req:
      return rx_map(m);
    default:
      break;
  }
  fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
  return exec::failed;
}

}  // namespace conveyor::shm
