// The soft QP's responder (engine only): inbound READ and atomic requests,
// checked against IRD and the key table, queued for the send side; Terminates
// from the peer.
#include "providers/soft/engine/soft_qp_internal.hpp"

#include "core/log.hpp"
#include "providers/soft/soft_device.hpp"
#include "providers/swnic/remote_atomic.hpp"

#include <algorithm>
#include <cstring>

namespace conveyor::soft {

using namespace qp_parts;

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
      fail_with_terminate({term_layer::rdmap,
                           term::rdmap_remote_prot,
                           rdmap_code(kc),
                           {},
                           std::vector<std::byte>(rh, rh + read_request_hdr),
                           0,
                           false},
                          wc_status::success);
      return;
    }
  }
  c_reads_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(tx_mu_);
  irq_.push_back(
      {response::read, rr.sink_stag, rr.sink_to, rr.size, 0, rr.src_stag, rr.src_to, 0, 0});
  tx_kicked_ = true;
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
    fail_with_terminate({term_layer::rdmap,
                         term::rdmap_remote_prot,
                         kc == key_check::ok ? term::rdmap_base_bounds : rdmap_code(kc),
                         {},
                         {},
                         0,
                         false},
                        wc_status::success);
    return;
  }
  const std::uint64_t orig =
      detail::remote_atomic(p, a.kind == atomic_kind::fetch_add,
                            a.kind == atomic_kind::fetch_add ? a.add_swap : a.compare, a.add_swap);
  g.release();
  c_atomics_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(tx_mu_);
  irq_.push_back({response::atomic, 0, 0, 0, 0, 0, 0, a.request_id, orig});
  tx_kicked_ = true;
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
          w.rkey == get_be32(t.ddp_header.data() + 2)) {
        culprit = i;
        break;
      }
      if (!tagged && t.ddp_header.size() >= ddp::untagged_hdr) {
        const std::uint32_t q = get_be32(t.ddp_header.data() + 6);
        const std::uint32_t m = get_be32(t.ddp_header.data() + 10);
        if (q == qn::send && is_send_op(w.op) && w.msn == m) {
          culprit = i;
          break;
        }
      }
    }
  }
  if (culprit == sq_tail_ && t.rdmap_header.size() >= read_request_hdr) {
    const std::uint32_t src = get_be32(t.rdmap_header.data() + 16);
    for (std::uint64_t i = sq_head_; i < sq_next_; ++i) {
      const swqe& w = sq_[i % caps_.max_send_wr];
      if (w.st != wqe_st::done && w.op == wr_opcode::rdma_read && w.rkey == src) {
        culprit = i;
        break;
      }
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

}  // namespace conveyor::soft
