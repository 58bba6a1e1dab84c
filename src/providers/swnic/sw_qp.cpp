// The software QP base: posting, the state machine, receive-queue flushing.
#include "providers/swnic/sw_qp.hpp"

#include "providers/swnic/opcodes.hpp"

#include <algorithm>
#include <cstring>

namespace conveyor::swnic {

using detail::key_check;

sw_qp::sw_qp(qp_args&& a)
    : pd_(std::move(a.pd)),
      scq_(std::move(a.scq)),
      rcq_(std::move(a.rcq)),
      caps_(a.attr.cap),
      sig_all_(a.attr.sq_sig_all),
      qpn_(a.qpn),
      want_ird_(std::clamp<std::uint32_t>(a.attr.max_dest_rd_atomic, 1, max_rd_atom)),
      want_ord_(std::clamp<std::uint32_t>(a.attr.max_rd_atomic, 1, max_rd_atom)),
      srq_(std::move(a.srq)) {
  max_sge_rd_ = pd_->dev().attr().max_sge_rd;
  sq_sge_.resize(std::size_t(caps_.max_send_wr) * caps_.max_send_sge);
  sq_inline_.resize(std::size_t(caps_.max_send_wr) * caps_.max_inline_data);
  rq_.resize(caps_.max_recv_wr);
  rq_sge_.resize(std::size_t(caps_.max_recv_wr) * caps_.max_recv_sge);
  cur_sge_.resize(srq_ ? srq_->max_sge() : caps_.max_recv_sge);
}

result<sw_qp*> accept_target(queue_pair& qp, const sw_device& dev, const std::string& where,
                             std::size_t private_data_len) {
  auto* sq = dynamic_cast<sw_qp*>(detail::handle_access::impl(qp));
  if (sq == nullptr || &sq->pd().dev() != &dev)
    return make_error(
        errc::invalid_argument,
        where + (sq == nullptr ? ": QP of another provider" : ": QP belongs to another device"));
  if (sq->state() != qp_state::init)
    return make_error(errc::invalid_state, where + ": QP " + std::to_string(sq->qp_num()) + " is " +
                                               std::string(to_string(sq->state())) + ", not INIT");
  if (private_data_len > max_private_data)
    return make_error(errc::invalid_argument, "accept: private data longer than " +
                                                  std::to_string(max_private_data) + " bytes");
  return sq;
}

// ------------------------------------------------------------------ posting ----
status sw_qp::validate_send(const send_wr& wr) const noexcept {
  if (wr.sg_list.size() > caps_.max_send_sge) return errc::invalid_argument;
  if (wr.opcode == wr_opcode::rdma_read && wr.sg_list.size() > max_sge_rd_)
    return errc::invalid_argument;
  std::uint64_t total = 0;
  for (const auto& s : wr.sg_list) total += s.length;
  if (total > 0x7FFFFFFFull) return errc::invalid_argument;
  // Immediate data and atomics only where the connection has them (soft: RFC
  // 7306 negotiated in the handshake; shm: always).
  if ((wr.opcode == wr_opcode::send_with_imm || wr.opcode == wr_opcode::rdma_write_with_imm ||
       is_atomic_op(wr.opcode)) &&
      !attr_.extensions)
    return errc::unsupported;
  if (is_atomic_op(wr.opcode) &&
      (wr.sg_list.size() != 1 || wr.sg_list[0].length != 8 || (wr.remote_addr & 7) != 0))
    return errc::invalid_argument;
  if (has(wr.flags, send_flags::inline_data) &&
      (total > caps_.max_inline_data || writes_local(wr.opcode)))
    return errc::invalid_argument;
  return errc::ok;
}

bool sw_qp::copy_inline(const sge& s, std::byte* to) noexcept {
  // Copied now, from memory that a live region of this PD covers, and under
  // that region's key: a stale or forged SGE (an address that is no longer,
  // or never was, registered) is a protection error, never a read of
  // whatever is there now.
  detail::key_table::guard g;
  std::byte* p = nullptr;
  if (pd_->dev().keys().acquire(s.lkey, pd_->id(), s.addr, s.length, access::none, g, &p) !=
      key_check::ok)
    return false;
  std::memcpy(to, p, s.length);
  return true;
}

bool sw_qp::local_sges_ok(const send_wr& wr) noexcept {
  const access need = writes_local(wr.opcode) ? access::local_write : access::none;
  for (const auto& s : wr.sg_list) {
    if (s.length == 0) continue;
    detail::key_table::guard g;
    std::byte* p = nullptr;
    if (pd_->dev().keys().acquire(s.lkey, pd_->id(), s.addr, s.length, need, g, &p) !=
        key_check::ok)
      return false;
  }
  return true;
}

status sw_qp::post_send(std::span<const send_wr> wrs, std::size_t* bad) noexcept {
  const qp_state st = state();
  if (st != qp_state::rts) {
    if (bad) *bad = 0;
    return st == qp_state::error ? errc::qp_in_error : errc::invalid_state;
  }
  status rc = errc::ok;
  bool ring;
  {
    std::lock_guard lk(tx_mu_);
    std::size_t i = 0;
    for (; i < wrs.size(); ++i) {
      const send_wr& wr = wrs[i];
      if (state() != qp_state::rts) {
        rc = errc::qp_in_error;
        break;
      }
      if (sq_tail_ - sq_head_ >= caps_.max_send_wr) {
        rc = errc::again;
        break;
      }
      rc = validate_send(wr);
      if (rc != errc::ok) break;
      const std::uint32_t idx = static_cast<std::uint32_t>(sq_tail_ % caps_.max_send_wr);
      wqe_base& w = sq_entry_locked(idx);
      w.wr_id = wr.wr_id;
      w.op = wr.opcode;
      w.signaled = sig_all_ || has(wr.flags, send_flags::signaled);
      w.fence = has(wr.flags, send_flags::fence);
      w.solicited = has(wr.flags, send_flags::solicited);
      w.inl = has(wr.flags, send_flags::inline_data);
      w.nsge = static_cast<std::uint32_t>(wr.sg_list.size());
      w.remote_addr = wr.remote_addr;
      w.rkey = wr.rkey;
      w.imm = wr.imm_data;
      w.inv = wr.invalidate_rkey;
      w.cmp_add = wr.compare_add;
      w.swap = wr.swap;
      // As in verbs, a bad lkey or range is not a posting error: the request
      // completes with loc_prot_err when it reaches the transport, and the QP fails.
      // Inline data is checked the same way, as it is copied.
      w.status = w.inl || local_sges_ok(wr) ? wc_status::success : wc_status::loc_prot_err;
      std::uint64_t total = 0;
      sge* dst = sq_sge_.data() + std::size_t(idx) * caps_.max_send_sge;
      std::byte* inl = sq_inline_.data() + std::size_t(idx) * caps_.max_inline_data;
      for (std::uint32_t k = 0; k < w.nsge; ++k) {
        const sge& s = wr.sg_list[k];
        if (w.inl) {
          if (s.length && w.status == wc_status::success && !copy_inline(s, inl + total))
            w.status = wc_status::loc_prot_err;
        } else {
          dst[k] = s;
        }
        total += s.length;
      }
      w.len = total;
      w.byte_len = w.op == wr_opcode::rdma_read ? static_cast<std::uint32_t>(total)
                   : is_atomic_op(w.op)         ? 8u
                                                : 0u;
      if (sq_accept_locked(idx)) ++sq_tail_;
    }
    if (bad && rc != errc::ok) *bad = i;
    ring = sq_transmit_locked();  // one doorbell for the batch
  }
  if (ring) sq_doorbell();
  return rc;
}

status sw_qp::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept {
  const qp_state st = state();
  if (srq_ || st == qp_state::error || st == qp_state::reset) {
    if (bad) *bad = 0;
    return srq_                    ? errc::invalid_argument  // post to the SRQ
           : st == qp_state::error ? errc::qp_in_error
                                   : errc::invalid_state;
  }
  std::lock_guard lk(rq_mu_);
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const recv_wr& wr = wrs[i];
    std::uint64_t total = 0;
    // A claimed receive still holds its place in the queue.
    const status rc = rq_tail_ - rq_head_ + (claimed_ ? 1 : 0) >= caps_.max_recv_wr
                          ? errc::again
                          : check_recv(wr, caps_.max_recv_sge, *pd_, total);
    if (rc != errc::ok) {
      if (bad) *bad = i;
      return rc;
    }
    const std::uint32_t idx = static_cast<std::uint32_t>(rq_tail_ % caps_.max_recv_wr);
    rq_[idx] = rwqe{wr.wr_id, static_cast<std::uint32_t>(wr.sg_list.size()), total};
    std::copy(wr.sg_list.begin(), wr.sg_list.end(),
              rq_sge_.data() + std::size_t(idx) * caps_.max_recv_sge);
    ++rq_tail_;
  }
  return errc::ok;
}

// ------------------------------------------------------------ the next receive ----
bool sw_qp::claim_recv(std::uint64_t* len) noexcept {
  std::uint32_t fired = 0;
  {
    std::lock_guard lk(rq_mu_);
    if (!claimed_) {
      // A QP in ERROR takes nothing more: its flush (which set the state
      // before taking rq_mu_) would not see it, and an SRQ receive would be lost.
      if (state() == qp_state::error) return false;
      if (srq_) {
        if (!srq_->take(cur_, cur_sge_.data(), fired)) return false;
      } else {
        if (rq_head_ == rq_tail_) return false;
        const std::uint32_t idx = static_cast<std::uint32_t>(rq_head_ % caps_.max_recv_wr);
        cur_ = rq_[idx];
        std::copy_n(rq_sge_.data() + std::size_t(idx) * caps_.max_recv_sge, cur_.nsge,
                    cur_sge_.data());
        ++rq_head_;
      }
      claimed_ = true;
    }
    if (len) *len = cur_.len;
  }
  if (fired != 0) srq_->raise_limit_event(fired);  // no lock held
  return true;
}

bool sw_qp::finish_recv(std::uint64_t& wr_id) noexcept {
  std::lock_guard lk(rq_mu_);
  if (!claimed_) return false;
  wr_id = cur_.wr_id;
  claimed_ = false;
  return true;
}

// ------------------------------------------------------------- completions ----
bool sw_qp::push_send_wc(const wqe_base& w, std::uint32_t vendor) noexcept {
  if (!w.signaled && w.status == wc_status::success) return true;
  work_completion wc;
  wc.wr_id = w.wr_id;
  wc.status = w.status;
  wc.opcode = wc_of(w.op);
  wc.byte_len = w.status == wc_status::success ? w.byte_len : 0;
  wc.qp_num = qpn_;
  wc.vendor_err = w.status == wc_status::success ? 0 : vendor;
  if (scq_->push(wc)) return true;
  state_.store(qp_state::error, std::memory_order_seq_cst);
  return false;
}

void sw_qp::complete_recv_error_locked(wc_status st) noexcept {
  if (!claimed_) return;
  work_completion wc;
  wc.wr_id = cur_.wr_id;
  wc.status = st;
  wc.opcode = wc_opcode::recv;
  wc.qp_num = qpn_;
  rcq_->push(wc);
  claimed_ = false;
}

void sw_qp::flush_rq() noexcept {
  std::lock_guard lk(rq_mu_);
  wait_rx_placement();
  complete_recv_error_locked(wc_status::wr_flush_err);  // it was the head
  if (srq_) return;  // verbs: the SRQ's receives are not this QP's to flush
  work_completion wc;
  wc.status = wc_status::wr_flush_err;
  wc.opcode = wc_opcode::recv;
  wc.qp_num = qpn_;
  for (; rq_head_ < rq_tail_; ++rq_head_) {
    wc.wr_id = rq_[rq_head_ % caps_.max_recv_wr].wr_id;
    rcq_->push(wc);
  }
}

// ----------------------------------------------------------- state machine ----
result<void> sw_qp::modify(qp_state target) {
  const qp_state cur = state();
  if (!detail::qp_transition_allowed(cur, target) || target == qp_state::rtr ||
      (target == qp_state::rts && cur != qp_state::rts))
    return make_error(errc::invalid_state, "QP " + std::to_string(qpn_) + ": cannot modify " +
                                               std::string(to_string(cur)) + " -> " +
                                               std::string(to_string(target)) +
                                               " (RTR/RTS are reached by connecting)");
  if (target == qp_state::error) {
    to_error();
    return {};
  }
  if (target == qp_state::reset || target == qp_state::init) {
    teardown_for_reset();
    std::lock_guard lk(tx_mu_);
    std::lock_guard rl(rq_mu_);
    sq_head_ = sq_next_ = sq_tail_ = 0;
    rq_head_ = rq_tail_ = 0;
    claimed_ = false;
    attr_ = {};
    reset_locked();
    state_.store(target);
  }
  return {};
}

result<void> sw_qp::check_connect(const connect_options& opts) const {
  if (state() != qp_state::init)
    return make_error(errc::invalid_state, "connect QP " + std::to_string(qpn_) + ": state is " +
                                               std::string(to_string(state())) + ", not INIT");
  if (opts.private_data.size() > max_private_data)
    return make_error(errc::invalid_argument, "connect: private data longer than " +
                                                  std::to_string(max_private_data) + " bytes");
  return {};
}

qp_counters sw_qp::counters() const noexcept {
  qp_counters c;
  c.tx_bytes = c_tx_bytes_.load();
  c.rx_bytes = c_rx_bytes_.load();
  c.reads_served = c_reads_.load();
  c.writes_placed = c_writes_.load();
  c.atomics_served = c_atomics_.load();
  provider_counters(c);
  return c;
}

result<qp_connection_attr> sw_qp::connection() const {
  std::lock_guard lk(tx_mu_);
  if (attr_.peer_address.empty())
    return make_error(errc::invalid_state, "QP " + std::to_string(qpn_) + " is not connected");
  return attr_;
}

}  // namespace conveyor::swnic
