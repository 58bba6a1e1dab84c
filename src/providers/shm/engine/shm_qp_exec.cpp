// The shm QP as a target (engine only): executing each request of the peer,
// SEND into posted receives, WRITE, READ, atomics and map requests, with every
// remote key checked against this device's key table before a byte moves.
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
#include "providers/swnic/remote_atomic.hpp"

namespace conveyor::shm {

using namespace qp_parts;

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
  // Claimed (from the RQ or the SRQ) for the whole message: a multi-slot SEND
  // keeps it while other QPs of the SRQ take theirs.
  if (!claim_recv()) return false;
  std::lock_guard lk(rq_mu_);
  if (!recv_claimed_locked()) return false;  // flushed meanwhile
  out = claimed_locked();
  std::copy_n(claimed_sges_locked(), out.nsge, sges);
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
        m.total == 0 ? 0 : peer_cma(false, local, static_cast<unsigned>(nl), remote, m.nsge);
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
  if (std::uint64_t id; !finish_recv(id)) return exec::done;  // flushed meanwhile
  const bool inv = m.flags & msg_flag::with_inv;
  if (inv) {
    // Only a key of this QP's protection domain registered with
    // access::remote_invalidate is invalidated; anything else fails the
    // request and the QP (the peer gets one guess per connection), with soft's
    // statuses: a protection refusal (other PD, not invalidatable) is
    // rem_access_err at the initiator, an unknown key rem_inv_req_err.
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
  if (std::uint64_t id; !finish_recv(id)) return exec::done;  // flushed meanwhile
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
    const ssize_t got = peer_cma(false, &local, 1, remote, m.nsge);
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

// The peer's fence (shm_segment.hpp, cma_fence) is read after our busy count
// turned odd: a peer that fenced either sees us inside this access and waits
// for it, or we see its fence and touch nothing (-1, and the request fails).
ssize_t shm_qp::peer_cma(bool into_peer, const iovec* local, unsigned nl, const iovec* remote,
                         unsigned nr) noexcept {
  auto& busy = seg_.cma_busy(seg_.side);
  busy.fetch_add(1, std::memory_order_seq_cst);
  ssize_t r = -1;
  // The system calls themselves, not libc's wrappers: this copy is the
  // NIC's DMA, which a race detector cannot order (the causality runs through
  // the peer process). ThreadSanitizer intercepts the wrappers and checks
  // every 8 bytes of the range; each check that finds the application's
  // earlier access reports a race (suppressed, tests/gloo/tsan.supp, but only
  // after the report is built), so one 1.2 MB placement took the engine
  // thread 30 s and gloo.algorithms.shm.4 timed out under TSan.
  if (seg_.cma_fence(1 - seg_.side).load(std::memory_order_seq_cst) == 0)
    r = ::syscall(into_peer ? SYS_process_vm_writev : SYS_process_vm_readv, peer_pid_, local,
                  static_cast<unsigned long>(nl), remote, static_cast<unsigned long>(nr), 0UL);
  busy.fetch_add(1, std::memory_order_seq_cst);
  return r;
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
      const ssize_t put = peer_cma(true, &local, 1, remote, m.nsge);
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
  // IRD bounds the responses the peer leaves unconsumed (checked once, before
  // the first slot: a READ resumed after a full ring was already admitted).
  if (rx_read_off_ == 0 && irq_full()) {
    g.release();
    fail_request(wc_status::rem_op_err, wc_status::success);  // the peer ignored our IRD
    return exec::failed;
  }
  const int ring = ring_resp(seg_.side);
  do {
    if (!resp_space(1)) {
      publish_resp_head();
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
  irq_ends_.push_back(rsp_head_);
  c_tx_bytes_.fetch_add(m.total, std::memory_order_relaxed);
  c_reads_.fetch_add(1, std::memory_order_relaxed);
  return exec::done;
}

bool shm_qp::irq_full() noexcept {
  // The tail is the peer's word: a lie only lets it hold more responses than
  // IRD up to the ring's capacity, which bounds them anyway.
  const std::uint64_t t = resp_out().tail.load(std::memory_order_seq_cst);
  while (!irq_ends_.empty() && irq_ends_.front() <= t) irq_ends_.pop_front();
  return irq_ends_.size() >= attr_.ird;
}

shm_qp::exec shm_qp::rx_atomic(const msg_header& m) noexcept {
  if (!resp_space(1)) return exec::blocked;
  if (irq_full()) {
    fail_request(wc_status::rem_op_err, wc_status::success);  // the peer ignored our IRD
    return exec::failed;
  }
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
  irq_ends_.push_back(rsp_head_);
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

}  // namespace conveyor::shm
