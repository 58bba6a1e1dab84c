// The shm provider's QP: posting, writing requests into the shared rings,
// executing the peer's requests with key validation, responses, completions,
// errors and flushing.
#include "providers/shm/shm_qp.hpp"

#include "core/log.hpp"
#include "providers/swnic/opcodes.hpp"
#include "providers/swnic/remote_atomic.hpp"
#include "providers/shm/shm_device.hpp"
#include "providers/shm/shm_memfd.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace conveyor::shm {

using detail::key_check;
using swnic::is_atomic_op;
using swnic::is_send_op;
using swnic::is_write_op;
using swnic::wc_of;

namespace {
// Payloads at least this long go by cross-memory attach when the peer can:
// below it two memcpys through a slot beat a system call.
constexpr std::uint64_t cma_min = 32 * 1024;
constexpr int max_rx_batch = 64;
// Peer regions one QP keeps mapped (or remembers as unmappable) at most.
constexpr std::size_t max_peer_maps = 4096;

int ring_req(int side) {
  return side;
}
int ring_resp(int side) {
  return 2 + side;
}
}  // namespace

shm_qp::shm_qp(std::shared_ptr<shm_pd> pd, std::shared_ptr<detail::sw_cq> scq,
               std::shared_ptr<detail::sw_cq> rcq, const qp_init_attr& attr, std::uint32_t qpn)
    : sw_qp(pd, std::move(scq), std::move(rcq), attr, qpn), dev_(&pd->dev()) {
  sq_.resize(caps_.max_send_wr);
}

shm_qp::~shm_qp() {
  disconnect();
}

// ------------------------------------------------------------------ posting ----
swnic::wqe_base& shm_qp::sq_entry_locked(std::uint32_t idx) noexcept {
  sq_[idx] = swqe{};
  return sq_[idx];
}

bool shm_qp::sq_accept_locked(std::uint32_t idx) noexcept {
  swqe& w = sq_[idx];
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

// --------------------------------------------------------------- send side ----
std::uint64_t shm_qp::gather_locked(const swqe& w, std::uint32_t idx, std::uint64_t off,
                                    std::byte* dst, std::uint64_t len) noexcept {
  if (len == 0) return 0;
  if (w.inl) {
    std::memcpy(dst, sq_inline(idx) + off, len);
    return len;
  }
  const sge* s = sq_sges(idx);
  std::uint64_t done = 0;
  for (std::uint32_t k = 0; k < w.nsge && done < len; ++k) {
    if (off >= s[k].length) {
      off -= s[k].length;
      continue;
    }
    const std::uint64_t take = std::min<std::uint64_t>(s[k].length - off, len - done);
    std::memcpy(dst + done, reinterpret_cast<const void*>(s[k].addr + off), take);
    done += take;
    off = 0;
  }
  return done;
}

std::uint64_t shm_qp::req_free_locked() const noexcept {
  // The tail is the peer's word: whatever it says, never more than the ring
  // (a lying peer only overwrites requests it claims to have read).
  const std::uint64_t t = req_out().tail.load(std::memory_order_seq_cst);
  const std::uint64_t used = t > tx_head_ ? 0 : tx_head_ - t;
  return used >= ring_slots ? 0 : ring_slots - used;
}

bool shm_qp::transmit_locked(swqe& w, std::uint32_t idx) noexcept {
  std::uint64_t free_slots = req_free_locked();
  const int ring = ring_req(seg_.side);
  auto put = [&](const msg_header& m) -> std::byte* {
    std::byte* p = seg_.slot(ring, tx_head_);
    std::memcpy(p, &m, sizeof m);
    if (w.pos_begin == ~std::uint64_t(0)) w.pos_begin = tx_head_;
    ++tx_head_;
    --free_slots;
    c_tx_msgs_.fetch_add(1, std::memory_order_relaxed);
    return p + slot_header;
  };
  auto put_sges = [&](msg_header& m) {
    const sge* s = sq_sges(idx);
    iov_pair pairs[max_cma_sge];
    std::uint16_t n = 0;
    for (std::uint32_t k = 0; k < w.nsge; ++k) {
      if (s[k].length == 0) continue;
      pairs[n++] = {s[k].addr, s[k].length};
    }
    m.nsge = n;
    m.len = n * static_cast<std::uint32_t>(sizeof(iov_pair));
    std::byte* payload = put(m);
    std::memcpy(payload, pairs, m.len);
  };
  const std::uint64_t pos = sq_next_;

  if (is_send_op(w.op) || is_write_op(w.op)) {
    const bool send = is_send_op(w.op);
    if (!tx_imm_pending_) {
      if (w.cma) {
        if (free_slots == 0) return false;
        msg_header m{};
        m.op = send ? msg_op::send_cma : msg_op::write_cma;
        m.flags = msg_flag::first | msg_flag::last | msg_flag::cma;
        if (w.op == wr_opcode::send_with_imm) m.flags |= msg_flag::with_imm;
        if (w.op == wr_opcode::send_with_inv) m.flags |= msg_flag::with_inv;
        m.imm = w.op == wr_opcode::send_with_inv ? w.inv : w.imm;
        m.rkey = w.rkey;
        m.raddr = w.remote_addr;
        m.total = w.len;
        m.id = pos;
        put_sges(m);
        tx_off_ = w.len;
      } else {
        do {
          if (free_slots == 0) return false;
          const std::uint64_t chunk = std::min<std::uint64_t>(w.len - tx_off_, slot_payload);
          msg_header m{};
          m.op = send ? msg_op::send : msg_op::write;
          m.flags = static_cast<std::uint8_t>((tx_off_ == 0 ? msg_flag::first : 0) |
                                              (tx_off_ + chunk == w.len ? msg_flag::last : 0));
          if (w.op == wr_opcode::send_with_imm) m.flags |= msg_flag::with_imm;
          if (w.op == wr_opcode::send_with_inv) m.flags |= msg_flag::with_inv;
          m.imm = w.op == wr_opcode::send_with_inv ? w.inv : w.imm;
          m.len = static_cast<std::uint32_t>(chunk);
          m.rkey = w.rkey;
          m.raddr = w.remote_addr;
          m.total = w.len;
          m.off = tx_off_;
          m.id = pos;
          std::byte* payload = put(m);
          gather_locked(w, idx, tx_off_, payload, chunk);
          tx_off_ += chunk;
        } while (tx_off_ < w.len);
      }
      c_tx_bytes_.fetch_add(w.len, std::memory_order_relaxed);
      if (w.op == wr_opcode::rdma_write_with_imm) tx_imm_pending_ = true;
    }
    if (tx_imm_pending_) {
      if (free_slots == 0) return false;
      msg_header m{};
      m.op = msg_op::immediate;
      m.flags = msg_flag::first | msg_flag::last;
      m.imm = w.imm;
      m.total = w.len;
      m.id = pos;
      put(m);
      tx_imm_pending_ = false;
    }
  } else if (w.op == wr_opcode::rdma_read) {
    if (free_slots == 0) return false;
    msg_header m{};
    m.op = msg_op::read;
    m.flags = msg_flag::first | msg_flag::last | (w.cma ? msg_flag::cma : 0);
    m.rkey = w.rkey;
    m.raddr = w.remote_addr;
    m.total = w.len;
    m.id = pos;
    if (w.cma)
      put_sges(m);
    else
      put(m);
  } else {  // atomics
    if (free_slots == 0) return false;
    msg_header m{};
    m.op = msg_op::atomic;
    m.flags = static_cast<std::uint8_t>(
        msg_flag::first | msg_flag::last |
        (w.op == wr_opcode::atomic_fetch_and_add ? msg_flag::fetch_add : 0));
    m.rkey = w.rkey;
    m.raddr = w.remote_addr;
    m.total = 8;
    m.id = pos;
    m.cmp = w.cmp_add;
    m.swap = w.swap;
    put(m);
  }
  // The first one-sided request to a region also asks whether we may map it.
  if (direct_ok_ && free_slots > 0 &&
      (w.op == wr_opcode::rdma_read || w.op == wr_opcode::rdma_write || is_atomic_op(w.op)) &&
      pmaps_.size() < max_peer_maps && pmaps_.find(w.rkey) == pmaps_.end()) {
    msg_header m{};
    m.op = msg_op::map_req;
    m.flags = msg_flag::first | msg_flag::last;
    m.rkey = w.rkey;
    m.id = pos;
    put(m);
    pmaps_.emplace(w.rkey, peer_map{});
  }
  w.pos_end = tx_head_;
  return true;
}

bool shm_qp::tx_progress_locked() noexcept {
  const std::uint64_t before = tx_head_;
  while (sq_next_ < sq_tail_ && state() == qp_state::rts) {
    const std::uint32_t idx = static_cast<std::uint32_t>(sq_next_ % caps_.max_send_wr);
    swqe& w = sq_[idx];
    if (w.status != wc_status::success) {  // local protection error: never leaves
      w.done = true;
      state_.store(qp_state::error, std::memory_order_seq_cst);
      flush_locked(wc_status::wr_flush_err);
      if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);
      break;
    }
    if (tx_off_ == 0 && !tx_imm_pending_) w.pos_begin = ~std::uint64_t(0);
    if (!transmit_locked(w, idx)) break;
    tx_off_ = 0;
    ++sq_next_;
  }
  if (tx_head_ != before && seg_.hdr != nullptr) {
    req_out().head.store(tx_head_, std::memory_order_seq_cst);
    return true;
  }
  return false;
}

bool shm_qp::retire_locked() noexcept {
  if (seg_.hdr == nullptr) return false;
  const std::uint64_t t = req_out().tail.load(std::memory_order_seq_cst);
  if (t > tx_head_) return false;  // a lie about requests never sent: progress fails the QP
  bool any = false;
  while (sq_head_ < sq_next_) {
    swqe& w = sq_[sq_head_ % caps_.max_send_wr];
    if (!w.done) {
      if (t < w.pos_end) break;
      if (w.needs_resp && !w.resp_done) break;
      w.done = true;
    }
    push_send_wc(w);
    ++sq_head_;
    any = true;
  }
  return any;
}

bool shm_qp::check_peer_error_locked() noexcept {
  const std::uint32_t e = req_out().err_status.load(std::memory_order_seq_cst);
  if (e == 0) return false;
  const std::uint64_t pos = req_out().err_pos.load(std::memory_order_seq_cst);
  retire_locked();  // everything before the refused request was executed
  wc_status st = e - 1 <= static_cast<std::uint32_t>(wc_status::fatal_err)
                     ? static_cast<wc_status>(e - 1)
                     : wc_status::rem_op_err;
  for (std::uint64_t i = sq_head_; i < sq_next_; ++i) {
    swqe& w = sq_[i % caps_.max_send_wr];
    if (!w.done && w.pos_begin <= pos && pos < w.pos_end) {
      w.done = true;
      w.status = st;
      break;
    }
  }
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info,
                     dev_->attr().name + " QP " + std::to_string(qpn_) + ": peer " +
                         attr_.peer_address + " refused a request: " + std::string(to_string(st)));
  state_.store(qp_state::error, std::memory_order_seq_cst);
  flush_locked(wc_status::wr_flush_err);
  if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);
  return true;
}

void shm_qp::flush_locked(wc_status first) noexcept {
  bool first_used = false;
  for (std::uint64_t i = sq_head_; i < sq_tail_; ++i) {
    swqe& w = sq_[i % caps_.max_send_wr];
    if (w.done) continue;
    const bool in_flight = i < sq_next_;
    wc_status st = wc_status::wr_flush_err;
    if (!first_used && in_flight && first != wc_status::success &&
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
  flush_rq();
}

void shm_qp::enter_error(wc_status first) noexcept {
  std::lock_guard lk(tx_mu_);
  const bool was_error = state() == qp_state::error;
  state_.store(qp_state::error, std::memory_order_seq_cst);
  flush_locked(was_error ? wc_status::wr_flush_err : first);
  if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);  // the peer sees the connection end
}

void shm_qp::notify_peer() noexcept {
  if (seg_.hdr == nullptr || sock_ < 0) return;
  // Dekker with the sleeper (set_sleeping, then re-reading the rings): every
  // ring index, error word and sleep flag is accessed seq_cst, so either the
  // sleeper sees what we published or we see its flag.
  auto& f = seg_.sleeping(1 - seg_.side);
  if (f.load(std::memory_order_seq_cst) != 0 && f.exchange(0, std::memory_order_seq_cst) != 0) {
    const char b = 1;
    [[maybe_unused]] auto r = ::send(sock_, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    c_bells_.fetch_add(1, std::memory_order_relaxed);
  }
}

void shm_qp::set_sleeping(bool on) noexcept {
  if (seg_.hdr == nullptr) return;
  seg_.sleeping(seg_.side).store(on ? 1 : 0, std::memory_order_seq_cst);
}

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
        if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);
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
  char buf[64];
  for (;;) {
    const ssize_t r = ::recv(sock_, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      if (r < static_cast<ssize_t>(sizeof buf)) break;
      continue;
    }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone = true;
    break;
  }
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
  if (local == wc_status::loc_len_err) {
    // The receive being filled completes with the length error.
    std::lock_guard lk(rq_mu_);
    if (rq_head_ < rq_tail_) {
      work_completion wc;
      wc.wr_id = rq_[rq_head_ % caps_.max_recv_wr].wr_id;
      wc.status = wc_status::loc_len_err;
      wc.opcode = wc_opcode::recv;
      wc.qp_num = qpn_;
      rcq_->push(wc);
      ++rq_head_;
    }
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
    resp_out().head.store(rsp_head_, std::memory_order_seq_cst);
    in.tail.store(rx_tail_, std::memory_order_seq_cst);
    c_rx_msgs_.fetch_add(1, std::memory_order_relaxed);
  }
  if (n > 0) resp_out().head.store(rsp_head_, std::memory_order_seq_cst);
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

namespace {
// Copies the SGE pairs of a CMA descriptor out of the slot and checks them.
bool read_pairs(const msg_header& m, const std::byte* payload, iovec* out, std::uint64_t total) {
  if (m.nsge > max_cma_sge || m.len != m.nsge * sizeof(iov_pair)) return false;
  iov_pair pairs[max_cma_sge];
  std::memcpy(pairs, payload, m.len);
  std::uint64_t sum = 0;
  for (std::uint16_t i = 0; i < m.nsge; ++i) {
    if (pairs[i].len > total) return false;
    sum += pairs[i].len;
    out[i] = {reinterpret_cast<void*>(pairs[i].addr), static_cast<std::size_t>(pairs[i].len)};
  }
  return sum == total;
}
}  // namespace

bool shm_qp::scatter_local(const sge* sges, std::uint32_t nsge, std::uint64_t off,
                           const std::byte* src, std::uint64_t len, access need) noexcept {
  std::uint64_t done = 0;
  for (std::uint32_t k = 0; k < nsge && done < len; ++k) {
    if (off >= sges[k].length) {
      off -= sges[k].length;
      continue;
    }
    const std::uint64_t take = std::min<std::uint64_t>(sges[k].length - off, len - done);
    detail::key_table::guard g;
    std::byte* p = nullptr;
    if (dev_->keys().acquire(sges[k].lkey, pd_->id(), sges[k].addr + off, take, need, g, &p) !=
        key_check::ok)
      return false;
    std::memcpy(p, src + done, take);
    done += take;
    off = 0;
  }
  return done == len;
}

void shm_qp::complete_recv(const rwqe& r, wc_status st, wc_opcode op, std::uint64_t len, bool imm,
                           std::uint32_t imm_data, bool inv, std::uint32_t inv_key) noexcept {
  work_completion wc;
  wc.wr_id = r.wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = static_cast<std::uint32_t>(len);
  wc.with_imm = imm;
  wc.imm_data = imm_data;
  wc.with_inv = inv;
  wc.invalidated_rkey = inv_key;
  wc.qp_num = qpn_;
  if (!rcq_->push(wc)) enter_error(wc_status::wr_flush_err);
}

bool shm_qp::take_recv(rwqe& out, sge* sges) noexcept {
  std::lock_guard lk(rq_mu_);
  if (rq_head_ == rq_tail_) return false;
  const std::uint32_t idx = static_cast<std::uint32_t>(rq_head_ % caps_.max_recv_wr);
  out = rq_[idx];
  std::copy_n(rq_sges(idx), out.nsge, sges);
  return true;
}

shm_qp::exec shm_qp::rx_send(const msg_header& m, const std::byte* payload) noexcept {
  constexpr std::uint8_t msg_kind = msg_flag::with_imm | msg_flag::with_inv;
  if (m.flags & msg_flag::first) {
    if (rx_in_send_ || !take_recv(rx_recv_, rx_recv_sge_)) {
      fail_request(wc_status::rnr_retry_exc_err, wc_status::success);
      return exec::failed;
    }
    if (m.total > rx_recv_.len) {
      fail_request(wc_status::rem_inv_req_err, wc_status::loc_len_err);
      return exec::failed;
    }
    // A descriptor-served SEND is one slot; a staged one starts at offset 0.
    if ((m.op == msg_op::send_cma && !(m.flags & msg_flag::last)) ||
        (m.op == msg_op::send && m.off != 0)) {
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
    // The message as its first slot describes it (checked against the posted
    // receive just above): every later slot must agree, and the completion
    // reports this total, not what a later slot claims.
    rx_in_send_ = true;
    rx_send_total_ = m.total;
    rx_send_done_ = 0;
    rx_send_id_ = m.id;
    rx_send_flags_ = m.flags & msg_kind;
    rx_send_imm_ = m.imm;
  } else if (!rx_in_send_ || m.op != msg_op::send || m.total != rx_send_total_ ||
             m.id != rx_send_id_ || (m.flags & msg_kind) != rx_send_flags_ ||
             m.imm != rx_send_imm_) {
    fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
    return exec::failed;
  }
  if (m.op == msg_op::send) {
    // Slots arrive in order and stay inside the message (hence inside the receive).
    if (m.off != rx_send_done_ || m.len > rx_send_total_ - rx_send_done_ ||
        ((m.flags & msg_flag::last) && rx_send_done_ + m.len != rx_send_total_)) {
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
  }
  if (m.op == msg_op::send_cma) {
    if (!cma_rx_) {
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
    iovec remote[max_cma_sge];
    if (!read_pairs(m, payload, remote, m.total)) {
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
    iovec local[16];
    detail::key_table::guard guards[16];
    std::uint64_t left = m.total;
    int nl = 0;
    for (std::uint32_t k = 0; k < rx_recv_.nsge && left > 0; ++k) {
      const sge& s = rx_recv_sge_[k];
      const std::uint64_t take = std::min<std::uint64_t>(s.length, left);
      if (take == 0) continue;
      std::byte* p = nullptr;
      if (dev_->keys().acquire(s.lkey, pd_->id(), s.addr, take, access::local_write, guards[nl],
                               &p) != key_check::ok) {
        fail_request(wc_status::rem_op_err, wc_status::loc_prot_err);
        return exec::failed;
      }
      local[nl++] = {p, static_cast<std::size_t>(take)};
      left -= take;
    }
    const ssize_t got =
        m.total == 0 ? 0 : ::process_vm_readv(peer_pid_, local, nl, remote, m.nsge, 0);
    if (got != static_cast<ssize_t>(m.total)) {
      fail_request(wc_status::rem_op_err, wc_status::success);
      return exec::failed;
    }
  } else {
    if (m.off > rx_recv_.len || m.len > rx_recv_.len - m.off) {
      fail_request(wc_status::rem_inv_req_err, wc_status::loc_len_err);
      return exec::failed;
    }
    if (!scatter_local(rx_recv_sge_, rx_recv_.nsge, m.off, payload, m.len, access::local_write)) {
      fail_request(wc_status::rem_op_err, wc_status::loc_prot_err);
      return exec::failed;
    }
  }
  c_rx_bytes_.fetch_add(m.op == msg_op::send_cma ? m.total : m.len, std::memory_order_relaxed);
  rx_send_done_ += m.op == msg_op::send_cma ? m.total : m.len;
  if (!(m.flags & msg_flag::last)) return exec::done;
  rx_in_send_ = false;
  {
    std::lock_guard lk(rq_mu_);
    if (rq_head_ == rq_tail_) return exec::done;  // flushed meanwhile
    ++rq_head_;
  }
  const bool inv = m.flags & msg_flag::with_inv;
  if (inv) {
    // Only a key of this QP's protection domain whose region grants some
    // remote right is invalidated; anything else fails the request and the QP
    // (the peer gets one guess per connection), with soft's statuses: a
    // protection refusal (other PD, local only) is rem_access_err at the
    // initiator, an unknown key rem_inv_req_err.
    const key_check kc = dev_->keys().invalidate_remote(m.imm, pd_->id());
    if (kc != key_check::ok) {
      complete_recv(rx_recv_, wc_status::rem_inv_req_err, wc_opcode::recv, m.total, false, 0, false,
                    0);
      fail_request(
          kc == key_check::invalid_key ? wc_status::rem_inv_req_err : wc_status::rem_access_err,
          wc_status::success);
      return exec::failed;
    }
  }
  // m's flags and immediate equal the first slot's (checked above); the
  // length is the first slot's total, which the posted receive holds.
  complete_recv(rx_recv_, wc_status::success, wc_opcode::recv, rx_send_total_,
                (m.flags & msg_flag::with_imm) != 0, (m.flags & msg_flag::with_imm) ? m.imm : 0,
                inv, inv ? m.imm : 0);
  return exec::done;
}

shm_qp::exec shm_qp::rx_immediate(const msg_header& m) noexcept {
  rwqe r;
  sge s[16];
  // The WRITE's length, reported as byte_len: no message is longer than 2^31 - 1.
  if (m.total > 0x7FFFFFFFull) {
    fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
    return exec::failed;
  }
  if (!take_recv(r, s)) {
    fail_request(wc_status::rnr_retry_exc_err, wc_status::success);
    return exec::failed;
  }
  {
    std::lock_guard lk(rq_mu_);
    if (rq_head_ == rq_tail_) return exec::done;
    ++rq_head_;
  }
  complete_recv(r, wc_status::success, wc_opcode::recv_rdma_with_imm, m.total, true, m.imm, false,
                0);
  return exec::done;
}

shm_qp::exec shm_qp::rx_write(const msg_header& m, const std::byte* payload) noexcept {
  if (m.total == 0) {
    if (m.len != 0) {
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
    if (m.flags & msg_flag::last) c_writes_.fetch_add(1, std::memory_order_relaxed);
    return exec::done;
  }
  detail::key_table::guard g;
  std::byte* p = nullptr;
  if (dev_->keys().acquire(m.rkey, pd_->id(), m.raddr, m.total, access::remote_write, g, &p) !=
      key_check::ok) {
    fail_request(wc_status::rem_access_err, wc_status::success);
    return exec::failed;
  }
  if (m.op == msg_op::write) {
    if (m.off > m.total || m.len > m.total - m.off) {
      g.release();
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
    std::memcpy(p + m.off, payload, m.len);
    c_rx_bytes_.fetch_add(m.len, std::memory_order_relaxed);
  } else {
    iovec remote[max_cma_sge];
    if (!cma_rx_ || !read_pairs(m, payload, remote, m.total)) {
      g.release();
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
    iovec local{p, static_cast<std::size_t>(m.total)};
    const ssize_t got = ::process_vm_readv(peer_pid_, &local, 1, remote, m.nsge, 0);
    if (got != static_cast<ssize_t>(m.total)) {
      g.release();
      fail_request(wc_status::rem_op_err, wc_status::success);
      return exec::failed;
    }
    c_rx_bytes_.fetch_add(m.total, std::memory_order_relaxed);
  }
  if (m.flags & msg_flag::last) c_writes_.fetch_add(1, std::memory_order_relaxed);
  return exec::done;
}

shm_qp::exec shm_qp::rx_read(const msg_header& m, const std::byte* payload) noexcept {
  detail::key_table::guard g;
  std::byte* p = nullptr;
  if (m.total > 0 && dev_->keys().acquire(m.rkey, pd_->id(), m.raddr, m.total, access::remote_read,
                                          g, &p) != key_check::ok) {
    fail_request(wc_status::rem_access_err, wc_status::success);
    return exec::failed;
  }
  if (m.flags & msg_flag::cma) {
    iovec remote[max_cma_sge];
    if (!cma_rx_ || !read_pairs(m, payload, remote, m.total)) {
      g.release();
      fail_request(wc_status::rem_inv_req_err, wc_status::fatal_err);
      return exec::failed;
    }
    if (m.total > 0) {
      iovec local{p, static_cast<std::size_t>(m.total)};
      const ssize_t put = ::process_vm_writev(peer_pid_, &local, 1, remote, m.nsge, 0);
      if (put != static_cast<ssize_t>(m.total)) {
        g.release();
        fail_request(wc_status::rem_op_err, wc_status::success);
        return exec::failed;
      }
    }
    c_tx_bytes_.fetch_add(m.total, std::memory_order_relaxed);
    c_reads_.fetch_add(1, std::memory_order_relaxed);
    return exec::done;
  }
  // Staged: stream the bytes through our response ring, as much as fits now.
  const int ring = ring_resp(seg_.side);
  do {
    if (!resp_space(1)) {
      resp_out().head.store(rsp_head_, std::memory_order_seq_cst);
      dirty_.store(true, std::memory_order_relaxed);
      return exec::blocked;
    }
    const std::uint64_t chunk = std::min<std::uint64_t>(m.total - rx_read_off_, slot_payload);
    msg_header r{};
    r.op = msg_op::read_resp;
    r.flags = rx_read_off_ + chunk == m.total ? msg_flag::last : 0;
    r.len = static_cast<std::uint32_t>(chunk);
    r.total = m.total;
    r.off = rx_read_off_;
    r.id = m.id;
    std::byte* s = seg_.slot(ring, rsp_head_);
    std::memcpy(s, &r, sizeof r);
    if (chunk) std::memcpy(s + slot_header, p + rx_read_off_, chunk);
    ++rsp_head_;
    rx_read_off_ += chunk;
  } while (rx_read_off_ < m.total);
  c_tx_bytes_.fetch_add(m.total, std::memory_order_relaxed);
  c_reads_.fetch_add(1, std::memory_order_relaxed);
  return exec::done;
}

shm_qp::exec shm_qp::rx_atomic(const msg_header& m) noexcept {
  if (!resp_space(1)) return exec::blocked;
  detail::key_table::guard g;
  std::byte* p = nullptr;
  const key_check kc =
      dev_->keys().acquire(m.rkey, pd_->id(), m.raddr, 8, access::remote_atomic, g, &p);
  if (kc != key_check::ok || (m.raddr & 7) != 0) {
    fail_request(wc_status::rem_access_err, wc_status::success);
    return exec::failed;
  }
  // Atomic against every other accessor of the region: this engine, the owner's
  // threads, direct-mapped peers and any process mapping the same memory.
  const std::uint64_t orig =
      detail::remote_atomic(p, (m.flags & msg_flag::fetch_add) != 0, m.cmp, m.swap);
  g.release();
  msg_header r{};
  r.op = msg_op::atomic_resp;
  r.flags = msg_flag::last;
  r.id = m.id;
  r.cmp = orig;
  std::memcpy(seg_.slot(ring_resp(seg_.side), rsp_head_), &r, sizeof r);
  ++rsp_head_;
  c_atomics_.fetch_add(1, std::memory_order_relaxed);
  return exec::done;
}

shm_qp::exec shm_qp::rx_map(const msg_header& m) noexcept {
  if (!resp_space(1)) return exec::blocked;
  map_answer a;
  dev_->lookup_direct(m.rkey, pd_->id(), a);  // a.ok = 0 when not mappable
  msg_header r{};
  r.op = msg_op::map_resp;
  r.flags = msg_flag::last;
  r.len = sizeof a;
  r.rkey = m.rkey;
  r.id = m.id;
  std::byte* s = seg_.slot(ring_resp(seg_.side), rsp_head_);
  std::memcpy(s, &r, sizeof r);
  std::memcpy(s + slot_header, &a, sizeof a);
  ++rsp_head_;
  return exec::done;
}

// ------------------------------------------------------------ direct mapping ----
std::byte* shm_qp::map_peer_memfd(int fd, std::uint64_t ino, std::size_t len, int prot,
                                  bool populate) noexcept {
  if (pidfd_ < 0) {
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, peer_pid_, 0));
    if (pidfd_ < 0) return nullptr;
  }
  // The same permission as cross-memory attach (PTRACE_MODE_ATTACH).
  const int f = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd_, fd, 0));
  if (f < 0) return nullptr;
  // Only the file the peer named, sealed against shrinking and growing, and
  // large enough: then no access inside [0, len) can fault.
  const bool good = sealed_memfd_ok(f, len, false, ino);
  // Populated at once (the pages exist: the owner populated them), so the
  // data path takes no page-table faults.
  void* p = good ? ::mmap(nullptr, len, prot, MAP_SHARED | (populate ? MAP_POPULATE : 0), f, 0)
                 : MAP_FAILED;
  ::close(f);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

void shm_qp::on_map_answer_locked(std::uint32_t rkey, const std::byte* payload) noexcept {
  map_answer a;
  std::memcpy(&a, payload, sizeof a);  // copied once: the peer may rewrite the slot
  auto it = pmaps_.find(rkey);
  if (it == pmaps_.end() || it->second.state != peer_map::st::pending) return;
  peer_map& pm = it->second;
  pm.state = peer_map::st::none;
  if (a.ok != 1 || a.word >= revocation_words || a.gen == 0 || a.len == 0 || a.len > a.map_len ||
      a.map_len > dev_->attr().max_mr_size || a.base + a.len < a.base)
    return;
  if (peer_rev_ == nullptr) {
    std::byte* r =
        map_peer_memfd(a.rev_fd, a.rev_ino, std::size_t(revocation_words) * 8, PROT_READ, false);
    if (r == nullptr) {
      direct_ok_ = false;  // no permission after all: stop asking
      if (detail::log_enabled(detail::log_level::info))
        detail::log_line(detail::log_level::info,
                         dev_->attr().name + " QP " + std::to_string(qpn_) +
                             ": cannot map the revocation page of " + attr_.peer_address + " (" +
                             std::strerror(errno) + "); direct mapping off for this connection");
      return;
    }
    peer_rev_ = reinterpret_cast<const std::atomic<std::uint64_t>*>(r);
    peer_rev_ino_ = a.rev_ino;
  } else if (a.rev_ino != peer_rev_ino_) {
    return;
  }
  const access rights = static_cast<access>(a.rights);
  // A key without remote_write/remote_atomic is mapped read-only.
  const bool writable = has(rights, access::remote_write) || has(rights, access::remote_atomic);
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  std::byte* p = map_peer_memfd(a.fd, a.ino, a.map_len, prot, true);
  if (p == nullptr) return;
  if (peer_rev_[a.word].load(std::memory_order_seq_cst) != a.gen) {  // revoked meanwhile
    ::munmap(p, a.map_len);
    pmaps_.erase(it);
    return;
  }
  pm.state = peer_map::st::mapped;
  pm.ptr = p;
  pm.map_len = a.map_len;
  pm.base = a.base;
  pm.len = a.len;
  pm.gen = a.gen;
  pm.rights = rights;
  pm.word = a.word;
}

bool shm_qp::try_direct_locked(swqe& w, std::uint32_t idx) noexcept {
  const bool atomic = is_atomic_op(w.op);
  if (!(w.op == wr_opcode::rdma_read || w.op == wr_opcode::rdma_write || atomic)) return false;
  if (w.len == 0) return false;  // zero-length requests keep the engine's semantics
  auto it = pmaps_.find(w.rkey);
  if (it == pmaps_.end() || it->second.state != peer_map::st::mapped) return false;
  peer_map& pm = it->second;
  // Revoked (deregistered, or the slot reused): forget the mapping; the request
  // goes to the peer's engine, which refuses the dead key.
  if (peer_rev_[pm.word].load(std::memory_order_seq_cst) != pm.gen) {
    ::munmap(pm.ptr, pm.map_len);
    pmaps_.erase(it);
    return false;
  }
  const access need = w.op == wr_opcode::rdma_read    ? access::remote_read
                      : w.op == wr_opcode::rdma_write ? access::remote_write
                                                      : access::remote_atomic;
  const std::uint64_t len = atomic ? 8 : w.len;
  // Out of bounds or without the right: the engine refuses it (rem_access_err).
  if (!has(pm.rights, need) || w.remote_addr < pm.base || w.remote_addr - pm.base > pm.len ||
      len > pm.len - (w.remote_addr - pm.base))
    return false;
  std::byte* p = pm.ptr + (w.remote_addr - pm.base);
  const sge* sg = sq_sges(idx);
  if (w.op == wr_opcode::rdma_write) {
    gather_locked(w, idx, 0, p, w.len);
    c_tx_bytes_.fetch_add(w.len, std::memory_order_relaxed);
  } else if (w.op == wr_opcode::rdma_read) {
    std::uint64_t off = 0;
    for (std::uint32_t k = 0; k < w.nsge; ++k) {
      if (sg[k].length) std::memcpy(reinterpret_cast<void*>(sg[k].addr), p + off, sg[k].length);
      off += sg[k].length;
    }
    c_rx_bytes_.fetch_add(w.len, std::memory_order_relaxed);
  } else {
    // On the shared pages: atomic against the peer's engine, its owner and
    // every other process mapping them.
    const std::uint64_t orig =
        detail::remote_atomic(p, w.op == wr_opcode::atomic_fetch_and_add, w.cmp_add, w.swap);
    std::memcpy(reinterpret_cast<void*>(sg[0].addr), &orig, 8);
  }
  c_direct_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void shm_qp::unmap_peer_locked() noexcept {
  for (auto& [key, pm] : pmaps_)
    if (pm.state == peer_map::st::mapped) ::munmap(pm.ptr, pm.map_len);
  pmaps_.clear();
  if (peer_rev_ != nullptr) {
    ::munmap(const_cast<std::atomic<std::uint64_t>*>(peer_rev_), std::size_t(revocation_words) * 8);
    peer_rev_ = nullptr;
  }
  if (pidfd_ >= 0) {
    ::close(pidfd_);
    pidfd_ = -1;
  }
}

int shm_qp::rx_responses() noexcept {
  ring_ctl& in = resp_in();
  const std::uint64_t h = in.head.load(std::memory_order_seq_cst);
  if (h == rsp_tail_) return 0;
  std::lock_guard lk(tx_mu_);
  if (state() != qp_state::rts) return 0;
  bool bad = h - rsp_tail_ > ring_slots;
  bool local_err = false;
  const int ring = ring_resp(1 - seg_.side);
  int n = 0;
  while (!bad && rsp_tail_ != h) {
    const std::byte* s = seg_.slot(ring, rsp_tail_);
    msg_header m;
    std::memcpy(&m, s, sizeof m);
    if (m.op == msg_op::map_resp) {
      if (m.len != sizeof(map_answer)) {
        bad = true;
        break;
      }
      on_map_answer_locked(m.rkey, s + slot_header);
      ++rsp_tail_;
      ++n;
      continue;
    }
    if (m.id < sq_head_ || m.id >= sq_next_ || m.len > slot_payload) {
      bad = true;
      break;
    }
    const std::uint32_t idx = static_cast<std::uint32_t>(m.id % caps_.max_send_wr);
    swqe& w = sq_[idx];
    const sge* sg = sq_sges(idx);
    if (w.done || !w.needs_resp || w.resp_done) {
      bad = true;
      break;
    }
    if (m.op == msg_op::read_resp && w.op == wr_opcode::rdma_read) {
      if (m.off > w.len || m.len > w.len - m.off) {
        bad = true;
        break;
      }
      if (!scatter_local(sg, w.nsge, m.off, s + slot_header, m.len, access::local_write)) {
        w.done = true;
        w.status = wc_status::loc_prot_err;
        local_err = true;
        break;
      }
      c_rx_bytes_.fetch_add(m.len, std::memory_order_relaxed);
      if (m.flags & msg_flag::last) {
        w.resp_done = true;
        w.byte_len = static_cast<std::uint32_t>(w.len);
      }
    } else if (m.op == msg_op::atomic_resp && is_atomic_op(w.op)) {
      std::byte v[8];
      std::memcpy(v, &m.cmp, 8);
      if (!scatter_local(sg, 1, 0, v, 8, access::local_write)) {
        w.done = true;
        w.status = wc_status::loc_prot_err;
        local_err = true;
        break;
      }
      w.resp_done = true;
      w.byte_len = 8;
    } else {
      bad = true;
      break;
    }
    ++rsp_tail_;
    ++n;
  }
  in.tail.store(rsp_tail_, std::memory_order_seq_cst);
  if (bad || local_err) {
    retire_locked();
    state_.store(qp_state::error, std::memory_order_seq_cst);
    flush_locked(bad ? wc_status::bad_resp_err : wc_status::wr_flush_err);
    if (sock_ >= 0) ::shutdown(sock_, SHUT_RDWR);
    ++n;
  }
  return n;
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
  release_peer_attach(std::exchange(attach_pid_, 0));
  connected_ = false;
}

void shm_qp::reset_locked() noexcept {
  tx_head_ = seen_tail_ = rx_tail_ = rsp_tail_ = rsp_head_ = 0;
  reset_rx();
  rsp_bad_ = false;
  peer_gone_ = false;
}

qp_counters shm_qp::counters() const noexcept {
  qp_counters c;
  c.tx_bytes = c_tx_bytes_.load();
  c.rx_bytes = c_rx_bytes_.load();
  c.tx_fpdus = c_tx_msgs_.load();
  c.rx_fpdus = c_rx_msgs_.load();
  c.tx_syscalls = c_bells_.load();
  c.reads_served = c_reads_.load();
  c.writes_placed = c_writes_.load();
  c.atomics_served = c_atomics_.load();
  c.direct_ops = c_direct_.load();
  return c;
}

void shm_qp::start(conn_setup&& s) {
  {
    std::lock_guard lk(tx_mu_);
    sock_ = s.sock;
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
    attr_.direct_mapping = direct_ok_;
    tx_head_ = seen_tail_ = rx_tail_ = rsp_tail_ = rsp_head_ = 0;
    connected_ = true;
    state_.store(qp_state::rts, std::memory_order_seq_cst);
  }
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info,
                     dev_->attr().name + " QP " + std::to_string(qpn_) + " connected " +
                         attr_.local_address + " <-> " + attr_.peer_address + " (shm, " +
                         std::to_string(ring_slots) + " x " + std::to_string(slot_size) +
                         "-byte slots per ring, bulk data path " + attr_.data_path +
                         ", serving the peer by " + (cma_rx_ ? "cma" : "staging") +
                         ", direct mapping of the peer's allocated regions " +
                         (direct_ok_ ? "on" : "off") + ")");
  attached_.store(true);
  dev_->eng().attach(this, sock_);
}

}  // namespace conveyor::shm
