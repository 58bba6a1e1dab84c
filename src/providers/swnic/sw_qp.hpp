// The software providers' queue pair base: the send and receive queues
// (preallocated slots, SGE and inline arenas), posting with every check a
// work request gets before it is queued, the verbs state machine, receive-
// queue flushing and completion reporting. A provider derives, keeps its own
// SQ slots (a struct deriving from wqe_base) and implements the hooks: how a
// queued request reaches the peer (its wire or its rings), how the QP errors,
// disconnects and resets.
#pragma once

#include "core/impl.hpp"
#include "providers/swnic/key_table.hpp"
#include "providers/swnic/sw_cq.hpp"
#include "providers/swnic/sw_device.hpp"
#include "providers/swnic/sw_srq.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace conveyor::swnic {

// What posting records of a send work request; a provider's SQ slot derives
// from it and adds its transmit state.
struct wqe_base {
  std::uint64_t wr_id = 0;
  wr_opcode op = wr_opcode::send;
  bool signaled = false, fence = false, solicited = false, inl = false;
  std::uint32_t nsge = 0;
  std::uint64_t len = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0, imm = 0, inv = 0;
  std::uint64_t cmp_add = 0, swap = 0;
  wc_status status = wc_status::success;
  std::uint32_t byte_len = 0;  // what the completion reports on success
};

// What sw_pd::create_qp hands the provider's QP constructor, checked.
struct qp_args {
  std::shared_ptr<sw_pd> pd;
  std::shared_ptr<detail::sw_cq> scq, rcq;
  qp_init_attr attr;  // cap.max_recv_* are 0 with an SRQ
  std::uint32_t qpn;
  std::shared_ptr<sw_srq> srq;  // null: the QP has a receive queue of its own
};

class sw_qp;

// The checks every software provider's accept() makes on the QP it is given:
// a QP of `dev` (so of this provider), in INIT, private data within limits.
// `where` names the request ("accept from <peer>").
result<sw_qp*> accept_target(queue_pair& qp, const sw_device& dev, const std::string& where,
                             std::size_t private_data_len);

class sw_qp : public detail::qp_impl {
 public:
  std::uint32_t qp_num() const noexcept final { return qpn_; }
  qp_state state() const noexcept final { return state_.load(std::memory_order_acquire); }
  const qp_caps& caps() const noexcept final { return caps_; }
  status post_send(std::span<const send_wr> wrs, std::size_t* bad) noexcept final;
  status post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept final;
  result<void> modify(qp_state target) final;
  result<qp_connection_attr> connection() const final;
  qp_counters counters() const noexcept final;

  sw_pd& pd() noexcept { return *pd_; }
  // IRD/ORD this QP asks for in the handshake (clamped to the device's limit).
  std::uint32_t want_ird() const noexcept { return want_ird_; }
  std::uint32_t want_ord() const noexcept { return want_ord_; }

 protected:
  explicit sw_qp(qp_args&& a);

  // ---- hooks ----
  // post_send, under tx_mu_: the slot of SQ index idx. The base assigns every
  // wqe_base field; sq_accept_locked sets the provider's own (nothing is
  // cleared twice on the posting path).
  virtual wqe_base& sq_entry_locked(std::uint32_t idx) noexcept = 0;
  // The slot's wqe_base part is filled: the provider sets the rest; false if it
  // served the request at once (it then reported its completion and the slot
  // is not queued).
  virtual bool sq_accept_locked(std::uint32_t idx) noexcept = 0;
  // After a batch, under tx_mu_: move what was queued; true when the peer
  // should be told, which sq_doorbell() then does without the lock.
  virtual bool sq_transmit_locked() noexcept = 0;
  virtual void sq_doorbell() noexcept {}
  // modify(): to ERROR; before RESET/INIT the connection is torn down, then the
  // provider clears its own state under tx_mu_ and rq_mu_.
  virtual void to_error() noexcept = 0;
  virtual void teardown_for_reset() noexcept = 0;
  virtual void reset_locked() noexcept = 0;
  // counters(): what only this provider counts (the base fills bytes and
  // operations served).
  virtual void provider_counters(qp_counters&) const noexcept {}
  // flush_rq (rq_mu_ held) waits here for a copy into a claimed receive that
  // the provider's engine does without the lock, so that no receive buffer is
  // written after its flush completion.
  virtual void wait_rx_placement() const noexcept {}

  // ---- helpers ----
  // connect(): the QP is in INIT and the private data within limits.
  result<void> check_connect(const connect_options& opts) const;
  // The local SGEs of wr name live memory of this PD with the rights it needs.
  bool local_sges_ok(const send_wr& wr) noexcept;
  // Copies inline SGE s to `to` if a live region of this PD covers it.
  bool copy_inline(const sge& s, std::byte* to) noexcept;
  const sge* sq_sges(std::uint32_t idx) const noexcept {
    return sq_sge_.data() + std::size_t(idx) * caps_.max_send_sge;
  }
  // .data() + offset: with max_inline_data 0 the arena is empty (no element to index).
  const std::byte* sq_inline(std::uint32_t idx) const noexcept {
    return sq_inline_.data() + std::size_t(idx) * caps_.max_inline_data;
  }
  // Reports w's completion when it is signaled or failed (failed ones always
  // complete). A full CQ loses it and moves the QP to ERROR: false.
  bool push_send_wc(const wqe_base& w, std::uint32_t vendor = 0) noexcept;

  // ---- the receive side: "the next receive", from the QP's RQ or its SRQ ----
  // An inbound message (a SEND, or Immediate Data) claims its receive when its
  // first segment arrives: the head of the QP's RQ, or of its SRQ (no other
  // QP can take it then). The claim holds it, whatever arrives on other QPs,
  // until finish_recv or a flush. With one claimed already, claim_recv
  // returns that one. false: no receive posted. *len: the receive's bytes.
  // Engine only; takes rq_mu_ (and the SRQ's lock), raises the SRQ's limit
  // event after releasing them.
  bool claim_recv(std::uint64_t* len = nullptr) noexcept;
  // The claimed receive and its SGEs (rq_mu_ held; recv_claimed_locked()).
  bool recv_claimed_locked() const noexcept { return claimed_; }
  const rwqe& claimed_locked() const noexcept { return cur_; }
  const sge* claimed_sges_locked() const noexcept { return cur_sge_.data(); }
  // The message is placed: ends the claim and gives its wr_id for the
  // completion; false when a flush completed the receive meanwhile (takes rq_mu_).
  bool finish_recv(std::uint64_t& wr_id) noexcept;
  // Completes the claimed receive, if any, with st (rq_mu_ held).
  void complete_recv_error_locked(wc_status st) noexcept;
  // The claimed receive and, without an SRQ, every posted one complete with
  // wr_flush_err; an SRQ's receives stay for its other QPs (takes rq_mu_).
  void flush_rq() noexcept;

  std::shared_ptr<sw_pd> pd_;
  std::shared_ptr<detail::sw_cq> scq_, rcq_;
  const qp_caps caps_;
  const bool sig_all_;
  const std::uint32_t qpn_;
  const std::uint32_t want_ird_, want_ord_;
  std::atomic<qp_state> state_{qp_state::init};
  qp_connection_attr attr_;  // tx_mu_; peer_address is empty until connected

  // SQ (tx_mu_): slots [sq_head_, sq_tail_) are posted, [sq_head_, sq_next_)
  // handed to the transport, retired in order at sq_head_.
  mutable std::mutex tx_mu_;
  std::uint64_t sq_head_ = 0, sq_next_ = 0, sq_tail_ = 0;

  // counters both providers keep
  std::atomic<std::uint64_t> c_tx_bytes_{0}, c_rx_bytes_{0}, c_reads_{0}, c_writes_{0},
      c_atomics_{0};

  // RQ (rq_mu_): the QP's own, unless srq_ is set (rq_ is then empty)
  std::mutex rq_mu_;
  const std::shared_ptr<sw_srq> srq_;

 private:
  std::vector<rwqe> rq_;
  std::uint64_t rq_head_ = 0, rq_tail_ = 0;
  bool claimed_ = false;  // rq_mu_: cur_ holds a receive taken off the RQ or SRQ
  rwqe cur_{};
  std::vector<sge> cur_sge_;

  status validate_send(const send_wr& wr) const noexcept;
  std::uint32_t max_sge_rd_ = 0;  // the device's
  std::vector<sge> sq_sge_;
  std::vector<std::byte> sq_inline_;
  std::vector<sge> rq_sge_;  // own RQ: max_recv_sge per slot
};

}  // namespace conveyor::swnic
