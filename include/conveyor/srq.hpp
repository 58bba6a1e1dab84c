// conveyor/srq.hpp — shared receive queues (verbs SRQ): one pool of receives
// that several QPs of a protection domain draw from.
//
//   auto srq = pd.create_srq({.max_wr = 1024, .max_sge = 1}).value();
//   auto a = pd.create_qp({.send_cq = &cq, .recv_cq = &cq, .srq = &srq}).value();
//   auto b = pd.create_qp({.send_cq = &cq, .recv_cq = &cq, .srq = &srq}).value();
//   srq.post_recv(buf.as_sge(), /*wr_id=*/1);  // serves a SEND on a or on b
//   srq.arm_limit(64);                          // one srq_limit_reached event below 64
//
// A SEND (or WRITE with immediate data) arriving on a QP created with
// qp_init_attr::srq consumes the receive at the head of the SRQ, whichever QP
// it arrives on; each receive is consumed exactly once, and its completion
// goes to that QP's recv_cq with the QP's number in qp_num. Such a QP refuses
// its own queue_pair::post_recv (errc::invalid_argument, as verbs' EINVAL).
// When a QP goes to ERROR it flushes only the receive it had already started
// to fill (a message in progress); the SRQ's other receives stay posted and
// serve the other QPs (verbs semantics).
//
// The limit (verbs' IBV_SRQ_LIMIT): once armed with a limit L > 0, the first
// receive taken that leaves fewer than L posted raises one
// device_event_type::srq_limit_reached through device_options::on_event (on
// the device's event thread, never inside a post or poll) and disarms the
// limit (query() then reports 0) until arm_limit is called again. Arming when
// fewer than L are already posted fires at the next receive taken.
//
// The SRQ keeps its protection domain (and device) alive; a QP keeps its SRQ
// alive. An SRQ of another protection domain or device is refused by
// create_qp (errc::invalid_argument). Support: device_attr::max_srq (0: none).
//
// Thread safety: post_recv may be called from several threads at once, also
// while QPs draw from the queue; arm_limit and query likewise.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "conveyor/error.hpp"
#include "conveyor/export.hpp"
#include "conveyor/mr.hpp"
#include "conveyor/qp.hpp"

namespace conveyor {

namespace detail {
struct handle_access;
class srq_impl;
}  // namespace detail

// What pd.create_srq is asked for (and, from query(), what it has).
struct srq_attr {
  // Receives posted at once, at most (device_attr::max_srq_wr). verbs devices
  // may round it up: query() reports the queue as it is.
  std::uint32_t max_wr = 256;
  std::uint32_t max_sge = 4;  // SGEs per receive (device_attr::max_srq_sge)
  // Armed limit (see above); 0: disarmed. At creation, arms it at once.
  std::uint32_t srq_limit = 0;
};

class CONVEYOR_API shared_receive_queue {
 public:
  shared_receive_queue() = default;
  explicit shared_receive_queue(std::shared_ptr<detail::srq_impl> impl) noexcept;
  shared_receive_queue(shared_receive_queue&&) noexcept = default;
  shared_receive_queue& operator=(shared_receive_queue&&) noexcept = default;
  shared_receive_queue(const shared_receive_queue&) = delete;
  shared_receive_queue& operator=(const shared_receive_queue&) = delete;
  ~shared_receive_queue();  // QPs attached to it keep it until they go

  explicit operator bool() const noexcept { return impl_ != nullptr; }
  // Identifies the SRQ in device_event::srq_num (unique per device).
  std::uint32_t srq_num() const noexcept;

  // Posts receives, as queue_pair::post_recv does for a QP's own queue. On
  // failure, *bad (if given) is the index of the first request not posted.
  // Returns: ok; again (max_wr receives are posted); invalid_argument (more
  // SGEs than max_sge, or an lkey that is not a live local_write region of the
  // SRQ's protection domain, or an SGE outside its region).
  // Never blocks, allocates or throws.
  status post_recv(std::span<const recv_wr> wrs, std::size_t* bad = nullptr) noexcept;
  status post_recv(const sge& local, std::uint64_t wr_id) noexcept;

  // Arms the limit (0 disarms it). invalid_argument: limit above max_wr.
  result<void> arm_limit(std::uint32_t limit);
  // max_wr, max_sge and the armed limit (0 once the event fired).
  result<srq_attr> query() const;

 private:
  friend struct detail::handle_access;  // the library reaches the implementation
  std::shared_ptr<detail::srq_impl> impl_;
};

}  // namespace conveyor
