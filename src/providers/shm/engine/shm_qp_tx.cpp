// The shm QP's send side (tx_mu_): gathering requests into this side's request
// ring (staged or as cross-memory-attach descriptors), retiring them as the
// peer's tail passes, the peer's refusals, and consuming the responses to our
// READs and atomics.
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
      if (sock_ >= 0) net::hang_up(sock_);
      break;
    }
    // A request to a region mapped since the stream began (docs/SHM.md, direct
    // mapping): held until everything in flight has completed, then served
    // here. Completions stay in posting order, and a stream that never lets
    // the send queue empty still moves to the direct path.
    if (tx_off_ == 0 && !tx_imm_pending_ && direct_map_locked(w) != nullptr) {
      if (sq_head_ < sq_next_) break;
      if (try_direct_locked(w, idx)) {
        w.done = true;
        push_send_wc(w);
        ++sq_next_;
        ++sq_head_;
        continue;
      }
    }
    const bool needs_ord = w.op == wr_opcode::rdma_read || is_atomic_op(w.op);
    if (tx_off_ == 0 && !tx_imm_pending_) {
      // ORD: the READs/atomics outstanding at the peer at once, as negotiated.
      if (needs_ord && ord_used_ >= attr_.ord) break;
      w.pos_begin = ~std::uint64_t(0);
    }
    if (!transmit_locked(w, idx)) break;
    if (needs_ord) ++ord_used_;
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
      // A READ the peer's engine wrote straight into our buffer (cma) has no
      // response message: its payload is received once executed.
      if (w.op == wr_opcode::rdma_read && w.cma)
        c_rx_bytes_.fetch_add(w.len, std::memory_order_relaxed);
    }
    if ((w.op == wr_opcode::rdma_read || is_atomic_op(w.op)) && ord_used_ > 0) --ord_used_;
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
  if (sock_ >= 0) net::hang_up(sock_);
  return true;
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
    if (sock_ >= 0) net::hang_up(sock_);
    ++n;
  }
  return n;
}

}  // namespace conveyor::shm
