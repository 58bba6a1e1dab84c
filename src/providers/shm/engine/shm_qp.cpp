// The shm provider's QP: construction, the posting hooks of sw_qp, errors and
// flushing, doorbells, teardown and the start of a connection. The rest:
// shm_qp_tx.cpp (writing requests into the rings, retiring them, consuming
// responses), shm_qp_engine.cpp (the engine's step: sockets, the request
// loop), shm_qp_exec.cpp (executing each request of the peer), shm_qp_direct.cpp
// (direct mapping of the peer's allocated regions).
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
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>
#include <utility>

namespace conveyor::shm {

using namespace qp_parts;

shm_qp::shm_qp(swnic::qp_args&& a)
    : sw_qp(std::move(a)),
      dev_(&static_cast<shm_pd&>(pd()).dev()),
      hint_bit_(dev_->eng().take_hint_bit()) {
  sq_.resize(caps_.max_send_wr);
}

shm_qp::~shm_qp() {
  disconnect();
  dev_->eng().give_hint_bit(hint_bit_);
}

// ------------------------------------------------------------------ posting ----
swnic::wqe_base& shm_qp::sq_entry_locked(std::uint32_t idx) noexcept {
  return sq_[idx];
}

bool shm_qp::sq_accept_locked(std::uint32_t idx) noexcept {
  swqe& w = sq_[idx];
  w.resp_done = w.done = false;
  w.pos_begin = w.pos_end = 0;
  w.cma = cma_tx_ && !w.inl && w.len >= cma_min && !is_atomic_op(w.op);
  w.needs_resp = is_atomic_op(w.op) || (w.op == wr_opcode::rdma_read && !w.cma);
  // Direct mapping: with nothing outstanding (completions stay in posting
  // order) a mapped peer region is served right here, the SQ slot unused.
  if (!pmaps_.empty() && sq_head_ == sq_tail_ && w.status == wc_status::success &&
      try_direct_locked(w, idx)) {
    w.done = true;
    push_send_wc(w);
    return false;
  }
  return true;
}

// ------------------------------------------------- deregistration fence ----
// A work request that names `key` in its local SGEs and has not completed:
// one not (wholly) in the ring yet never leaves (its status is the protection
// error, so tx_progress_locked fails it and the QP when it comes to it, and no
// byte of the dead region is gathered); one the peer serves by cross-memory
// attach (its READ sink, its SEND/WRITE source, by address) fails now with the
// QP, and flush_locked fences the peer first, so nothing touches the region
// once its deregistration returned. Staged requests in flight need nothing:
// their bytes were copied into the ring, and our engine places their responses
// only through the key table.
void shm_qp::fence_local_key(std::uint32_t key) noexcept {
  bool fail_now = false;
  {
    std::lock_guard lk(tx_mu_);
    if (state() != qp_state::rts) return;
    for (std::uint64_t i = sq_head_; i < sq_tail_; ++i) {
      const std::uint32_t idx = static_cast<std::uint32_t>(i % caps_.max_send_wr);
      swqe& w = sq_[idx];
      if (w.done || w.inl || w.status != wc_status::success) continue;
      const sge* s = sq_sges(idx);
      bool names = false;
      for (std::uint32_t k = 0; k < w.nsge && !names; ++k) names = s[k].lkey == key;
      if (!names) continue;
      const bool sent = i < sq_next_;
      if (sent && !w.cma) continue;
      w.status = wc_status::loc_prot_err;
      fail_now = fail_now || sent;
    }
  }
  if (fail_now) enter_error(wc_status::wr_flush_err);
}

// Before any request the peer may still be serving by cross-memory attach
// completes without its tail having passed it: we raise our fence and wait
// for an access of the peer already under way (shm_segment.hpp, cma_fence).
// Bounded: a peer that dies inside one, or never leaves it, is given up on
// after fence_wait (a peer with the ptrace permission CMA needs is trusted
// with all of our memory anyway: docs/SHM.md, "Ptrace scope").
void shm_qp::fence_peer_locked() noexcept {
  if (seg_.hdr == nullptr || !cma_tx_) return;
  bool any = false;
  for (std::uint64_t i = sq_head_; i < sq_next_ && !any; ++i) {
    const swqe& w = sq_[i % caps_.max_send_wr];
    any = w.cma && !w.done;
  }
  if (!any) return;
  seg_.cma_fence(seg_.side).store(1, std::memory_order_seq_cst);
  auto& busy = seg_.cma_busy(1 - seg_.side);
  const std::uint64_t b = busy.load(std::memory_order_seq_cst);
  if ((b & 1) == 0) return;
  constexpr auto fence_wait = std::chrono::seconds(5);
  const auto until = std::chrono::steady_clock::now() + fence_wait;
  while (busy.load(std::memory_order_seq_cst) == b) {
    if (peer_gone_.load() || (::kill(peer_pid_, 0) != 0 && errno == ESRCH)) return;
    if (std::chrono::steady_clock::now() >= until) {
      detail::log_line(detail::log_level::warn,
                       dev_->attr().name + " QP " + std::to_string(qpn_) + ": peer " +
                           attr_.peer_address +
                           " stayed inside a cross-memory access for 5 s after our fence");
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void shm_qp::flush_locked(wc_status first) noexcept {
  fence_peer_locked();
  bool first_used = false;
  for (std::uint64_t i = sq_head_; i < sq_tail_; ++i) {
    swqe& w = sq_[i % caps_.max_send_wr];
    if (w.done) continue;
    const bool in_flight = i < sq_next_;
    // A READ whose sink was deregistered in flight (fence_cma_sink_locked)
    // keeps its protection error.
    wc_status st = in_flight && w.status != wc_status::success ? w.status : wc_status::wr_flush_err;
    if (!first_used && in_flight && st == wc_status::wr_flush_err && first != wc_status::success &&
        first != wc_status::wr_flush_err) {
      st = first;
      first_used = true;
    }
    w.done = true;
    w.status = st;
  }
  sq_next_ = sq_tail_;
  while (sq_head_ < sq_tail_) {
    push_send_wc(sq_[sq_head_ % caps_.max_send_wr]);
    ++sq_head_;
  }
  tx_off_ = 0;
  tx_imm_pending_ = false;
  ord_used_ = 0;
  flush_rq();
}

void shm_qp::enter_error(wc_status first) noexcept {
  std::lock_guard lk(tx_mu_);
  const bool was_error = state() == qp_state::error;
  state_.store(qp_state::error, std::memory_order_seq_cst);
  flush_locked(was_error ? wc_status::wr_flush_err : first);
  if (sock_ >= 0) net::hang_up(sock_);  // the peer sees the connection end
}

void shm_qp::notify_peer() noexcept {
  if (seg_.hdr == nullptr || sock_ < 0) return;
  // Dekker with the sleeper (set_sleeping, then re-reading the rings): every
  // ring index, error word and sleep flag is accessed seq_cst, so either the
  // sleeper sees what we published or we see its flag.
  auto& f = seg_.sleeping(1 - seg_.side);
  if (f.load(std::memory_order_seq_cst) != 0 && f.exchange(0, std::memory_order_seq_cst) != 0) {
    net::ring(sock_);
    c_bells_.fetch_add(1, std::memory_order_relaxed);
  }
  // The same with the peer's cold flag and its hint bit (no system call).
  if (peer_hint_word_ != nullptr) {
    auto& c = seg_.cold(1 - seg_.side);
    if (c.load(std::memory_order_seq_cst) != 0 && c.exchange(0, std::memory_order_seq_cst) != 0) {
      peer_hint_word_->fetch_or(peer_hint_mask_, std::memory_order_seq_cst);
      c_hints_.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void shm_qp::set_sleeping(bool on) noexcept {
  if (seg_.hdr == nullptr) return;
  seg_.sleeping(seg_.side).store(on ? 1 : 0, std::memory_order_seq_cst);
}

void shm_qp::set_cold(bool on) noexcept {
  if (seg_.hdr == nullptr || !hinted_) return;
  seg_.cold(seg_.side).store(on ? 1 : 0, std::memory_order_seq_cst);
}

// ------------------------------------------------------------ teardown ----
void shm_qp::disconnect() noexcept {
  if (state() == qp_state::rts) enter_error(wc_status::wr_flush_err);
  if (attached_.exchange(false)) dev_->eng().detach(this, sock_);
  std::lock_guard lk(tx_mu_);
  unmap_peer_locked();
  direct_ok_ = false;
  if (sock_ >= 0) {
    ::close(sock_);
    sock_ = -1;
  }
  if (seg_.hdr != nullptr) {
    ::munmap(seg_.base, seg_size);
    seg_ = seg_view{};
  }
  hinted_ = false;
  peer_hint_word_ = nullptr;
  peer_hint_mask_ = 0;
  peer_hint_map_.reset();
  release_peer_attach(std::exchange(attach_pid_, 0));
  connected_ = false;
}

void shm_qp::reset_locked() noexcept {
  tx_head_ = seen_tail_ = rx_tail_ = rsp_tail_ = rsp_head_ = rsp_shown_ = 0;
  reset_rx();
  irq_ends_.clear();
  rsp_bad_ = false;
  peer_gone_ = false;
}

void shm_qp::provider_counters(qp_counters& c) const noexcept {
  c.tx_bytes += c_direct_tx_.load();
  c.rx_bytes += c_direct_rx_.load();
  c.shm = shm_qp_counters{.tx_slots = c_tx_msgs_.load(),
                          .rx_slots = c_rx_msgs_.load(),
                          .doorbells = c_bells_.load(),
                          .direct_ops = c_direct_.load(),
                          .hints = c_hints_.load()};
}

void shm_qp::start(conn_setup&& s) {
  {
    std::lock_guard lk(tx_mu_);
    sock_ = s.sock;
    seg_ = seg_view{};  // nothing of the rings mapped through this mapping yet
    seg_.hdr = static_cast<seg_header*>(s.map);
    seg_.base = static_cast<std::byte*>(s.map);
    seg_.side = s.side;
    peer_pid_ = s.peer_pid;
    attach_pid_ = s.attach_pid;
    cma_tx_ = s.cma_tx;
    cma_rx_ = s.cma_rx;
    // Direct mapping takes the peer's memfds with pidfd_getfd: the permission
    // our cross-memory-attach probe of the peer just proved.
    direct_ok_ = cma_rx_ && dev_->direct_enabled();
    attr_ = std::move(s.attr);
    attr_.shm.value().direct_mapping = direct_ok_;
    hinted_ = s.hinted && hint_bit_ != no_hint;
    if (s.peer_hints && s.peer_hint_bit < hint_bits) {
      peer_hint_map_ = std::move(s.peer_hints);
      peer_hint_word_ = reinterpret_cast<std::atomic<std::uint64_t>*>(peer_hint_map_->data()) +
                        s.peer_hint_bit / 64;
      peer_hint_mask_ = std::uint64_t(1) << (s.peer_hint_bit % 64);
    }
    tx_head_ = seen_tail_ = rx_tail_ = rsp_tail_ = rsp_head_ = rsp_shown_ = 0;
    connected_ = true;
    state_.store(qp_state::rts, std::memory_order_seq_cst);
  }
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info,
                     dev_->attr().name + " QP " + std::to_string(qpn_) + " connected " +
                         attr_.local_address + " <-> " + attr_.peer_address + " (shm, " +
                         std::to_string(ring_slots) + " x " + std::to_string(slot_size) +
                         "-byte slots per ring, bulk data path " + attr_.shm->data_path +
                         ", serving the peer by " + (cma_rx_ ? "cma" : "staging") +
                         ", direct mapping of the peer's allocated regions " +
                         (direct_ok_ ? "on" : "off") + ")");
  attached_.store(true);
  dev_->eng().attach(this, sock_);
}

}  // namespace conveyor::shm
