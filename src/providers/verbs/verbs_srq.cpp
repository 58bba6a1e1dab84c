// The verbs provider's shared receive queues: ibv_create_srq,
// ibv_post_srq_recv (Conveyor receives converted in a stack array, no
// allocation), ibv_modify_srq (IBV_SRQ_LIMIT) and ibv_query_srq. The limit
// event arrives through the device's async thread (verbs_device.cpp).
#include "providers/verbs/verbs_objects.hpp"

#include <algorithm>
#include <cerrno>

namespace conveyor::verbs {

verbs_srq::verbs_srq(std::shared_ptr<verbs_pd> pd, ibv_srq* srq, const srq_attr& granted)
    : pd_(std::move(pd)),
      srq_(srq),
      max_wr_(granted.max_wr),
      max_sge_(granted.max_sge),
      limit_(granted.srq_limit) {
  srq_->srq_context = this;
}

verbs_srq::~verbs_srq() {
  rdma_core().ibv_destroy_srq(srq_);
}

std::string verbs_srq::where() const {
  return pd_->dev().where() + " SRQ " + std::to_string(srq_->handle);
}

status verbs_srq::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept {
  return post_recv_chunks(
      wrs, max_sge_, bad,
      [this](ibv_recv_wr* w, ibv_recv_wr** b) { return ibv_post_srq_recv(srq_, w, b); },
      // Full: ENOMEM (rxe, siw; some providers return -errno).
      [](int rc) -> status {
        return rc == ENOMEM || rc == -ENOMEM ? errc::again : errc::invalid_argument;
      });
}

result<void> verbs_srq::arm_limit(std::uint32_t limit) {
  ibv_srq_attr a{};
  a.srq_limit = limit;
  // Armed before the device may fire it, so the event finds the limit it reports.
  const std::uint32_t before = limit_.exchange(limit);
  if (int rc = rdma_core().ibv_modify_srq(srq_, &a, IBV_SRQ_LIMIT); rc != 0) {
    limit_.store(before);
    return make_error(rc == EINVAL ? errc::invalid_argument : errc::io_error,
                      "arm_limit " + std::to_string(limit) + " on " + where() +
                          ": ibv_modify_srq: " + err_text(rc),
                      rc);
  }
  return {};
}

result<srq_attr> verbs_srq::query() const {
  ibv_srq_attr a{};
  const int rc = rdma_core().ibv_query_srq(srq_, &a);
  // siw's provider does not implement the query: what creation granted stands.
  if (rc == EOPNOTSUPP || rc == ENOSYS) return srq_attr{max_wr_, max_sge_, limit_.load()};
  if (rc != 0)
    return make_error(errc::io_error, "query " + where() + ": ibv_query_srq: " + err_text(rc), rc);
  return srq_attr{a.max_wr, a.max_sge, limit_.load()};
}

result<std::shared_ptr<detail::srq_impl>> verbs_pd::create_srq(const srq_attr& attr) {
  const std::string w = "create_srq on " + dev_->where();
  const auto& da = dev_->attr();
  if (da.max_srq == 0)
    return make_error(errc::unsupported, w + ": the device has no shared receive queues");
  if (attr.max_wr == 0 || attr.max_wr > da.max_srq_wr)
    return make_error(errc::invalid_argument,
                      w + ": max_wr must be 1.." + std::to_string(da.max_srq_wr));
  if (attr.max_sge == 0 || attr.max_sge > da.max_srq_sge)
    return make_error(errc::invalid_argument,
                      w + ": max_sge must be 1.." + std::to_string(da.max_srq_sge));
  if (attr.srq_limit > attr.max_wr)
    return make_error(errc::invalid_argument, w + ": srq_limit exceeds max_wr");
  ibv_srq_init_attr ia{};
  ia.attr.max_wr = attr.max_wr;
  ia.attr.max_sge = attr.max_sge;
  ibv_srq* srq = rdma_core().ibv_create_srq(pd_, &ia);
  if (srq == nullptr) {
    const int e = errno;
    return make_error(e == ENOMEM ? errc::resource_exhausted : errc::invalid_argument,
                      w + ": ibv_create_srq (max_wr " + std::to_string(attr.max_wr) + ", max_sge " +
                          std::to_string(attr.max_sge) + "): " + err_text(e),
                      e);
  }
  // Devices round the queue up (rxe to a power of two minus one, with a
  // minimum): the SRQ reports what it has.
  srq_attr granted{std::max(attr.max_wr, ia.attr.max_wr), std::max(attr.max_sge, ia.attr.max_sge),
                   0};
  if (ibv_srq_attr qa{}; rdma_core().ibv_query_srq(srq, &qa) == 0) {
    granted.max_wr = std::max(granted.max_wr, qa.max_wr);
    granted.max_sge = std::max(granted.max_sge, qa.max_sge);
  }
  auto self = std::static_pointer_cast<verbs_pd>(shared_from_this());
  auto s = std::make_shared<verbs_srq>(std::move(self), srq, granted);
  // Armed by ibv_modify_srq, as devices ignore the limit ibv_create_srq is given.
  if (attr.srq_limit != 0)
    if (auto r = s->arm_limit(attr.srq_limit); !r) return std::unexpected(r.error());
  return std::shared_ptr<detail::srq_impl>(std::move(s));
}

}  // namespace conveyor::verbs
