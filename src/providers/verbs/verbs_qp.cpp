// The verbs provider's queue pairs: creation (what the device granted becomes
// caps()), state (asking the device while it is believed RTS), posting
// (Conveyor work requests converted in a stack array, no allocation) and the
// transitions the user may ask for. Connecting is in verbs_cm.cpp.
#include "providers/verbs/verbs_objects.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>

namespace conveyor::verbs {

verbs_qp::verbs_qp(std::shared_ptr<verbs_pd> pd, std::shared_ptr<detail::cq_impl> scq,
                   std::shared_ptr<detail::cq_impl> rcq, ibv_qp* qp, const qp_init_attr& a,
                   std::shared_ptr<verbs_srq> srq)
    : pd_(std::move(pd)),
      scq_(std::move(scq)),
      rcq_(std::move(rcq)),
      srq_(std::move(srq)),
      qp_(qp) {
  caps_ = a.cap;
  want_ord_ = a.max_rd_atomic;
  want_ird_ = a.max_dest_rd_atomic;
  transport_ = a.verbs_transport;
  qp_->qp_context = this;
  pd_->dev().add_qp(qp_->qp_num, this);
}

verbs_qp::~verbs_qp() {
  disconnect();
  if (conn_) {
    std::lock_guard lk(conn_->mu);
    conn_->qp = nullptr;
  }
  pd_->dev().remove_qp(qp_->qp_num);
  rdma_core().ibv_destroy_qp(qp_);
}

qp_state verbs_qp::state() const noexcept {
  if (conn_ && conn_->peer_gone.load(std::memory_order_relaxed)) return qp_state::error;
  auto s = state_.load(std::memory_order_relaxed);
  if (s == qp_state::rts) {
    // The device may have moved the QP to ERROR (a remote error, a Terminate).
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (rdma_core().ibv_query_qp(qp_, &a, IBV_QP_STATE, &ia) == 0 &&
        (a.qp_state == IBV_QPS_ERR || a.qp_state == IBV_QPS_SQE)) {
      state_.store(qp_state::error,
                   std::memory_order_relaxed);  // posts now refuse with qp_in_error
      return qp_state::error;
    }
  }
  return s;
}

std::string verbs_qp::where() const {
  std::string s = pd_->dev().where() + " QP " + std::to_string(qp_->qp_num);
  if (!peer_.empty()) s += " peer " + peer_;
  return s;
}

status verbs_qp::post_send(std::span<const send_wr> wrs, std::size_t* bad) noexcept {
  if (bad) *bad = 0;
  const auto st = (conn_ && conn_->peer_gone.load(std::memory_order_relaxed))
                      ? qp_state::error
                      : state_.load(std::memory_order_relaxed);
  if (st == qp_state::error) return errc::qp_in_error;
  if (st != qp_state::rts) return errc::invalid_state;
  const auto& da = pd_->dev().attr();
  constexpr std::size_t chunk = 16;
  ibv_send_wr w[chunk];
  std::size_t done = 0;
  while (done < wrs.size()) {
    std::size_t n = std::min(chunk, wrs.size() - done);
    // A request refused here ends the call, but the ones before it are
    // posted (and *bad names it), as ibv_post_send does for its own refusals.
    status refused = errc::ok;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& s = wrs[done + i];
      auto& v = w[i];
      v = ibv_send_wr{};
      v.wr_id = s.wr_id;
      v.next = (i + 1 < n) ? &w[i + 1] : nullptr;
      v.sg_list = const_cast<ibv_sge*>(reinterpret_cast<const ibv_sge*>(s.sg_list.data()));
      v.num_sge = static_cast<int>(s.sg_list.size());
      std::uint64_t total = 0;
      bool saturated = false;
      for (const auto& g : s.sg_list) {
        total += g.length;
        saturated |= g.length == 0xFFFFFFFFu;
      }
      // Longer than a message may be, or an SGE of 2^32 - 1 bytes (what
      // memory_region::slice gives for a longer slice: siw would otherwise take
      // it as a real length): refused here, as on every provider.
      if (s.sg_list.size() > caps_.max_send_sge || saturated ||
          (da.max_msg_size != 0 && total > da.max_msg_size)) {
        refused = errc::invalid_argument;
        n = i;
        break;
      }
      if (has(s.flags, send_flags::signaled)) v.send_flags |= IBV_SEND_SIGNALED;
      if (has(s.flags, send_flags::fence)) v.send_flags |= IBV_SEND_FENCE;
      if (has(s.flags, send_flags::solicited)) v.send_flags |= IBV_SEND_SOLICITED;
      if (has(s.flags, send_flags::inline_data)) {
        std::uint64_t len = 0;
        for (const auto& g : s.sg_list) len += g.length;
        if (len > caps_.max_inline_data) {
          refused = errc::invalid_argument;
          n = i;
          break;
        }
        v.send_flags |= IBV_SEND_INLINE;
      }
      bool ok = true;
      switch (s.opcode) {
        case wr_opcode::send:
          v.opcode = IBV_WR_SEND;
          break;
        case wr_opcode::send_with_imm:
          ok = da.immediate_data;
          v.opcode = IBV_WR_SEND_WITH_IMM;
          v.imm_data = htonl(s.imm_data);
          break;
        case wr_opcode::send_with_inv:
          ok = da.send_with_invalidate;
          v.opcode = IBV_WR_SEND_WITH_INV;
          v.invalidate_rkey = s.invalidate_rkey;
          break;
        case wr_opcode::rdma_write:
        case wr_opcode::rdma_write_with_imm:
        case wr_opcode::rdma_read:
          if (s.opcode == wr_opcode::rdma_write) v.opcode = IBV_WR_RDMA_WRITE;
          if (s.opcode == wr_opcode::rdma_write_with_imm) {
            ok = da.immediate_data;
            v.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            v.imm_data = htonl(s.imm_data);
          }
          if (s.opcode == wr_opcode::rdma_read) {
            // The device would read fewer bytes than asked (siw scatters into
            // the first SGE only), so refuse rather than report a short READ.
            if (s.sg_list.size() > da.max_sge_rd) ok = false;
            v.opcode = IBV_WR_RDMA_READ;
          }
          v.wr.rdma.remote_addr = s.remote_addr;
          v.wr.rdma.rkey = s.rkey;
          break;
        case wr_opcode::atomic_cmp_and_swp:
        case wr_opcode::atomic_fetch_and_add:
          ok = da.atomics;
          if (ok &&
              (s.sg_list.size() != 1 || s.sg_list[0].length != 8 || (s.remote_addr % 8) != 0)) {
            refused = errc::invalid_argument;
            break;
          }
          v.opcode = s.opcode == wr_opcode::atomic_cmp_and_swp ? IBV_WR_ATOMIC_CMP_AND_SWP
                                                               : IBV_WR_ATOMIC_FETCH_AND_ADD;
          v.wr.atomic.remote_addr = s.remote_addr;
          v.wr.atomic.rkey = s.rkey;
          v.wr.atomic.compare_add = s.compare_add;
          v.wr.atomic.swap = s.swap;
          break;
        default:
          ok = false;
      }
      if (refused == errc::ok && !ok)
        refused = s.opcode == wr_opcode::rdma_read ? errc::invalid_argument : errc::unsupported;
      if (refused != errc::ok) {
        n = i;
        break;
      }
    }
    if (n > 0) {
      w[n - 1].next = nullptr;
      ibv_send_wr* bad_wr = nullptr;
      int rc = ibv_post_send(qp_, w, &bad_wr);
      if (rc != 0) {
        if (bad) *bad = done + static_cast<std::size_t>(bad_wr ? bad_wr - w : 0);
        return map_post_error(rc);
      }
    }
    done += n;
    if (refused != errc::ok) {
      if (bad) *bad = done;
      return refused;
    }
  }
  return errc::ok;
}

status verbs_qp::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept {
  if (bad) *bad = 0;
  if (srq_) return errc::invalid_argument;  // its receives come from the SRQ
  const auto st = state_.load(std::memory_order_relaxed);
  if (st == qp_state::error || (conn_ && conn_->peer_gone.load(std::memory_order_relaxed)))
    return errc::qp_in_error;
  if (st == qp_state::reset) return errc::invalid_state;
  return post_recv_chunks(
      wrs, caps_.max_recv_sge, bad,
      [this](ibv_recv_wr* w, ibv_recv_wr** b) { return ibv_post_recv(qp_, w, b); },
      [this](int rc) { return map_post_error(rc); });
}

result<void> verbs_qp::modify(qp_state target) {
  const auto from = state();
  if (!detail::qp_transition_allowed(from, target) ||
      (target != qp_state::error && target != qp_state::reset && target != qp_state::init))
    return make_error(errc::invalid_state,
                      "modify " + where() + " from " + std::string(to_string(from)) + " to " +
                          std::string(to_string(target)) +
                          ": not allowed (the connection manager drives RTR/RTS)");
  if (target == qp_state::error) {
    move_to_error(qp_);
    state_ = qp_state::error;
    return {};
  }
  if (target == qp_state::reset) {
    if (conn_)
      return make_error(errc::invalid_state,
                        "modify " + where() + " to reset: the QP was connected; create a new QP");
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    if (int rc = rdma_core().ibv_modify_qp(qp_, &a, IBV_QP_STATE); rc != 0)
      return make_error(errc::io_error, "modify " + where() + " to reset: " + err_text(rc), rc);
    state_ = qp_state::reset;
    return {};
  }
  if (from == qp_state::init) return {};
  if (auto r = to_init(); !r) return r;
  return {};
}

result<void> verbs_qp::to_init() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.qp_access_flags = ibv_access(
      access::local_write | access::remote_write | access::remote_read | access::remote_atomic,
      pd_->dev().attr().atomics);
  int mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS;
  if (!pd_->dev().iwarp()) {
    a.pkey_index = 0;
    a.port_num = pd_->dev().port();
    mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  }
  if (int rc = rdma_core().ibv_modify_qp(qp_, &a, mask); rc != 0)
    return make_error(errc::io_error, "modify " + where() + " to INIT: " + err_text(rc), rc);
  state_ = qp_state::init;
  return {};
}

result<qp_connection_attr> verbs_qp::connection() const {
  if (!conn_)
    return make_error(errc::invalid_state, "connection of " + where() + ": not connected");
  return cattr_;
}

void verbs_qp::disconnect() noexcept {
  if (!conn_ || conn_->closing.exchange(true)) {
    if (!conn_ && state_ != qp_state::error && state_ != qp_state::reset) {
      move_to_error(qp_);
      state_ = qp_state::error;
    }
    return;
  }
  {
    std::lock_guard lk(conn_->mu);  // the watcher clears id under it
    if (auto* id = conn_->id; id != nullptr) rdma_core().rdma_disconnect(id);
  }
  move_to_error(qp_);
  state_ = qp_state::error;
}

status verbs_qp::map_post_error(int rc) noexcept {
  if (rc == ENOMEM || rc == -ENOMEM) return errc::again;  // (some providers return -errno)
  if (state() == qp_state::error) {
    state_ = qp_state::error;
    return errc::qp_in_error;
  }
  return errc::invalid_argument;
}

result<std::shared_ptr<detail::qp_impl>> verbs_pd::create_qp(const qp_init_attr& attr) {
  const std::string w = "create_qp on " + dev_->where();
  if (!attr.send_cq || !attr.recv_cq || !*attr.send_cq || !*attr.recv_cq)
    return make_error(errc::invalid_argument, w + ": send_cq and recv_cq are required");
  auto* scq = dynamic_cast<verbs_cq*>(detail::handle_access::impl(*attr.send_cq));
  auto* rcq = dynamic_cast<verbs_cq*>(detail::handle_access::impl(*attr.recv_cq));
  if (!scq || !rcq) return make_error(errc::invalid_argument, w + ": CQ of another provider");
  // A CQ of another device (another ibv context): its handle means nothing, or
  // another CQ, to this one's kernel objects.
  if (scq->device() != dev_.get() || rcq->device() != dev_.get())
    return make_error(errc::invalid_argument, w + ": CQ of another device");
  if (auto why = check_transport_params(attr.verbs_transport); !why.empty())
    return make_error(errc::invalid_argument, w + ": verbs_transport: " + why);
  std::shared_ptr<verbs_srq> srq;
  if (attr.srq != nullptr) {
    if (!*attr.srq) return make_error(errc::invalid_argument, w + ": empty srq handle");
    srq = std::dynamic_pointer_cast<verbs_srq>(detail::handle_access::shared(*attr.srq));
    if (!srq) return make_error(errc::invalid_argument, w + ": SRQ of another provider");
    if (&srq->pd() != this)  // the device would refuse it, or worse, accept it
      return make_error(errc::invalid_argument, w + (&srq->pd().dev() != dev_.get()
                                                         ? ": SRQ of another device"
                                                         : ": SRQ of another protection domain"));
  }
  qp_init_attr sized = attr;
  if (srq) sized.cap.max_recv_wr = sized.cap.max_recv_sge = 0;  // no receive queue of its own
  const auto& c = sized.cap;
  const auto& da = dev_->dattr();
  if (c.max_send_wr == 0 || c.max_send_wr > static_cast<std::uint32_t>(da.max_qp_wr) ||
      (!srq && (c.max_recv_wr == 0 || c.max_recv_wr > static_cast<std::uint32_t>(da.max_qp_wr))))
    return make_error(errc::invalid_argument,
                      w + ": max_send_wr/max_recv_wr must be 1.." + std::to_string(da.max_qp_wr));
  if (c.max_send_sge == 0 || c.max_send_sge > static_cast<std::uint32_t>(da.max_sge) ||
      (!srq && (c.max_recv_sge == 0 || c.max_recv_sge > static_cast<std::uint32_t>(da.max_sge))))
    return make_error(errc::invalid_argument,
                      w + ": max_send_sge/max_recv_sge must be 1.." + std::to_string(da.max_sge));
  ibv_qp_init_attr ia{};
  ia.send_cq = scq->cq();
  ia.recv_cq = rcq->cq();
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = attr.sq_sig_all ? 1 : 0;
  ia.cap.max_send_wr = c.max_send_wr;
  ia.cap.max_recv_wr = c.max_recv_wr;
  ia.cap.max_send_sge = c.max_send_sge;
  ia.cap.max_recv_sge = c.max_recv_sge;
  ia.cap.max_inline_data = c.max_inline_data;
  ia.srq = srq ? srq->ibv() : nullptr;
  ibv_qp* qp = rdma_core().ibv_create_qp(pd_, &ia);
  // Devices cap inline data differently (siw: a few hundred bytes less than
  // rxe) and say so only by refusing: retry with less inline data; the QP's
  // caps report what was granted, and longer inline posts are refused.
  for (std::uint32_t inl = c.max_inline_data / 2;
       qp == nullptr && errno == EINVAL && c.max_inline_data > 0; inl /= 2) {
    ia.cap.max_inline_data = inl;
    qp = rdma_core().ibv_create_qp(pd_, &ia);
    if (inl == 0) break;
  }
  if (qp == nullptr) {
    int e = errno;
    return make_error(e == ENOMEM ? errc::resource_exhausted : errc::invalid_argument,
                      w + ": ibv_create_qp (send_wr " + std::to_string(c.max_send_wr) +
                          ", recv_wr " + std::to_string(c.max_recv_wr) + ", inline " +
                          std::to_string(c.max_inline_data) + "): " + err_text(e),
                      e);
  }
  qp_init_attr a = sized;
  // What the device granted (it may round queue sizes up): qp.caps() reports it.
  // ibv_create_qp's answer is not enough: rxe rounds a queue up to a power of
  // two minus one (16 receives become 31) but answers with the size asked for,
  // so the queue took more than caps() said. ibv_query_qp reports the queues
  // as they are.
  a.cap.max_inline_data = std::min(ia.cap.max_inline_data, c.max_inline_data);
  a.cap.max_send_wr = ia.cap.max_send_wr;
  a.cap.max_recv_wr = ia.cap.max_recv_wr;
  {
    ibv_qp_attr qa{};
    ibv_qp_init_attr qia{};
    if (rdma_core().ibv_query_qp(qp, &qa, IBV_QP_CAP, &qia) == 0) {
      a.cap.max_send_wr = std::max(a.cap.max_send_wr, qa.cap.max_send_wr);
      a.cap.max_recv_wr = std::max(a.cap.max_recv_wr, qa.cap.max_recv_wr);
    }
  }
  a.cap.max_send_sge =
      std::min<std::uint32_t>(ia.cap.max_send_sge, static_cast<std::uint32_t>(da.max_sge));
  a.cap.max_recv_sge =
      std::min<std::uint32_t>(ia.cap.max_recv_sge, static_cast<std::uint32_t>(da.max_sge));
  if (srq) a.cap.max_recv_wr = a.cap.max_recv_sge = 0;
  auto self = std::static_pointer_cast<verbs_pd>(shared_from_this());
  auto q = std::make_shared<verbs_qp>(std::move(self), detail::handle_access::shared(*attr.send_cq),
                                      detail::handle_access::shared(*attr.recv_cq), qp, a,
                                      std::move(srq));
  if (auto r = q->to_init(); !r) return std::unexpected(r.error());
  return std::shared_ptr<detail::qp_impl>(std::move(q));
}

}  // namespace conveyor::verbs
