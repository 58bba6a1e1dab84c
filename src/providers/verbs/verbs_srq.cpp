// The verbs provider's shared receive queues: ibv_create_srq,
// ibv_post_srq_recv (Conveyor receives converted in a stack array, no
// allocation), ibv_modify_srq (IBV_SRQ_LIMIT) and ibv_query_srq. The limit
// event arrives through the device's async thread (verbs_device.cpp).
#include "providers/verbs/verbs_objects.hpp"

#include <algorithm>
#include <cerrno>

namespace conveyor::verbs {

verbs_srq::verbs_srq(std::shared_ptr<verbs_pd> pd, ibv_srq* srq, const srq_attr& granted)
    : pd_(std::move(pd)), srq_(srq), max_sge_(granted.max_sge), limit_(granted.srq_limit) {
  srq_->srq_context = this;
}

verbs_srq::~verbs_srq() {
  ibv_destroy_srq(srq_);
}

std::string verbs_srq::where() const {
  return pd_->dev().where() + " SRQ " + std::to_string(srq_->handle);
}

status verbs_srq::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept {
  if (bad) *bad = 0;
  constexpr std::size_t chunk = 16;
  ibv_recv_wr w[chunk];
  std::size_t done = 0;
  while (done < wrs.size()) {
    std::size_t n = std::min(chunk, wrs.size() - done);
    bool refused = false;  // the requests before a refused one are posted
    for (std::size_t i = 0; i < n; ++i) {
      const auto& r = wrs[done + i];
      if (r.sg_list.size() > max_sge_) {
        refused = true;
        n = i;
        break;
      }
      w[i] = ibv_recv_wr{};
      w[i].wr_id = r.wr_id;
      w[i].next = (i + 1 < n) ? &w[i + 1] : nullptr;
      w[i].sg_list = const_cast<ibv_sge*>(reinterpret_cast<const ibv_sge*>(r.sg_list.data()));
      w[i].num_sge = static_cast<int>(r.sg_list.size());
    }
    if (n > 0) {
      w[n - 1].next = nullptr;
      ibv_recv_wr* bad_wr = nullptr;
      if (int rc = ibv_post_srq_recv(srq_, w, &bad_wr); rc != 0) {
        if (bad) *bad = done + static_cast<std::size_t>(bad_wr ? bad_wr - w : 0);
        // Full: ENOMEM (rxe, siw; some providers return -errno).
        return rc == ENOMEM || rc == -ENOMEM ? errc::again : errc::invalid_argument;
      }
    }
    done += n;
    if (refused) {
      if (bad) *bad = done;
      return errc::invalid_argument;
    }
  }
  return errc::ok;
}

result<void> verbs_srq::arm_limit(std::uint32_t limit) {
  ibv_srq_attr a{};
  a.srq_limit = limit;
  // Armed before the device may fire it, so the event finds the limit it reports.
  const std::uint32_t before = limit_.exchange(limit);
  if (int rc = ibv_modify_srq(srq_, &a, IBV_SRQ_LIMIT); rc != 0) {
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
  if (int rc = ibv_query_srq(srq_, &a); rc != 0)
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
  ibv_srq* srq = ibv_create_srq(pd_, &ia);
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
  if (ibv_srq_attr qa{}; ibv_query_srq(srq, &qa) == 0) {
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
