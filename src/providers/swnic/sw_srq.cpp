// The software shared receive queue (sw_srq.hpp).
#include "providers/swnic/sw_srq.hpp"

#include "providers/swnic/sw_device.hpp"

#include <algorithm>

namespace conveyor::swnic {

using detail::key_check;

status check_recv(const recv_wr& wr, std::uint32_t sge_limit, sw_pd& pd,
                  std::uint64_t& total) noexcept {
  if (wr.sg_list.size() > sge_limit) return errc::invalid_argument;
  total = 0;
  for (const auto& s : wr.sg_list) {
    total += s.length;
    if (s.length == 0) continue;
    detail::key_table::guard g;
    std::byte* p = nullptr;
    if (pd.dev().keys().acquire(s.lkey, pd.id(), s.addr, s.length, access::local_write, g, &p) !=
        key_check::ok)
      return errc::invalid_argument;
  }
  return errc::ok;
}

sw_srq::sw_srq(std::shared_ptr<sw_pd> pd, const srq_attr& a, std::uint32_t num)
    : pd_(std::move(pd)), num_(num), max_wr_(a.max_wr), max_sge_(a.max_sge), limit_(a.srq_limit) {
  ring_.resize(max_wr_);
  sge_.resize(std::size_t(max_wr_) * max_sge_);
}

sw_srq::~sw_srq() {
  pd_->dev().srq_gone();
}

status sw_srq::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept {
  std::lock_guard lk(mu_);
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const recv_wr& wr = wrs[i];
    std::uint64_t total = 0;
    const status rc =
        tail_ - head_ >= max_wr_ ? errc::again : check_recv(wr, max_sge_, *pd_, total);
    if (rc != errc::ok) {
      if (bad) *bad = i;
      return rc;
    }
    const std::size_t idx = tail_ % max_wr_;
    ring_[idx] = rwqe{wr.wr_id, static_cast<std::uint32_t>(wr.sg_list.size()), total};
    std::copy(wr.sg_list.begin(), wr.sg_list.end(), sge_.data() + idx * max_sge_);
    ++tail_;
  }
  return errc::ok;
}

bool sw_srq::take(rwqe& out, sge* sges, std::uint32_t& fired) noexcept {
  fired = 0;
  std::lock_guard lk(mu_);
  if (head_ == tail_) return false;
  const std::size_t idx = head_ % max_wr_;
  out = ring_[idx];
  std::copy_n(sge_.data() + idx * max_sge_, out.nsge, sges);
  ++head_;
  if (limit_ != 0 && tail_ - head_ < limit_) {
    fired = limit_;
    limit_ = 0;
  }
  return true;
}

void sw_srq::raise_limit_event(std::uint32_t limit) noexcept {
  sw_device& d = pd_->dev();
  try {
    d.post_event({.type = device_event_type::srq_limit_reached,
                  .srq_num = num_,
                  .description = "device " + d.attr().name + " SRQ " + std::to_string(num_) +
                                 ": limit " + std::to_string(limit) +
                                 " reached (fewer receives posted; the limit is disarmed)"});
  } catch (...) {  // the description could not be allocated: nothing to deliver
  }
}

result<void> sw_srq::arm_limit(std::uint32_t limit) {
  if (limit > max_wr_)
    return make_error(errc::invalid_argument, "arm_limit on " + pd_->dev().attr().name + " SRQ " +
                                                  std::to_string(num_) + ": limit " +
                                                  std::to_string(limit) + " exceeds max_wr " +
                                                  std::to_string(max_wr_));
  std::lock_guard lk(mu_);
  limit_ = limit;
  return {};
}

result<srq_attr> sw_srq::query() const {
  std::lock_guard lk(mu_);
  return srq_attr{max_wr_, max_sge_, limit_};
}

}  // namespace conveyor::swnic
