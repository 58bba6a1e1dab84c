// The software providers' shared receive queue (soft and shm alike): a locked
// ring of receive requests with its own SGE arena, lkeys checked at post time
// as a QP's own receive queue does, and the limit event of verbs'
// IBV_SRQ_LIMIT. A QP attached to it takes its head when an inbound message
// needs a receive (sw_qp::claim_recv); from then on that receive is the QP's
// alone. The lock order is the QP's rq_mu_, then this queue's lock; the limit
// event is raised after both are released.
#pragma once

#include "core/impl.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace conveyor::swnic {

class sw_pd;

// A posted receive (its SGEs live in the queue's arena beside it).
struct rwqe {
  std::uint64_t wr_id;
  std::uint32_t nsge;
  std::uint64_t len;
};

// The checks every posted receive gets, for a QP's queue and an SRQ alike: at
// most sge_limit SGEs, each naming live local_write memory of `pd` (zero-length
// SGEs are not checked). ok, or invalid_argument; `total` is the bytes.
status check_recv(const recv_wr& wr, std::uint32_t sge_limit, sw_pd& pd,
                  std::uint64_t& total) noexcept;

class sw_srq final : public detail::srq_impl {
 public:
  sw_srq(std::shared_ptr<sw_pd> pd, const srq_attr& a, std::uint32_t num);
  ~sw_srq() override;

  std::uint32_t srq_num() const noexcept override { return num_; }
  status post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept override;
  result<void> arm_limit(std::uint32_t limit) override;
  result<srq_attr> query() const override;

  sw_pd& pd() noexcept { return *pd_; }
  std::uint32_t max_sge() const noexcept { return max_sge_; }

  // Takes the head receive for a message that arrived on a QP: the request into
  // `out`, its SGEs into `sges` (room for max_sge()). false: none posted.
  // `fired`: the armed limit when this take left fewer receives posted than it
  // (the limit is disarmed now), else 0; the caller passes it to
  // raise_limit_event once it holds no lock.
  bool take(rwqe& out, sge* sges, std::uint32_t& fired) noexcept;
  // Queues the srq_limit_reached event to the device's event thread.
  void raise_limit_event(std::uint32_t limit) noexcept;

 private:
  std::shared_ptr<sw_pd> pd_;
  const std::uint32_t num_, max_wr_, max_sge_;
  mutable std::mutex mu_;
  std::vector<rwqe> ring_;  // mu_: [head_, tail_) are posted
  std::vector<sge> sge_;
  std::uint64_t head_ = 0, tail_ = 0;
  std::uint32_t limit_ = 0;  // mu_: 0 when disarmed
};

}  // namespace conveyor::swnic
