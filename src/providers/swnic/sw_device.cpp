// The software devices' device, protection domain and memory region.
#include "providers/swnic/sw_device.hpp"

#include "core/log.hpp"
#include "providers/swnic/sw_engine.hpp"
#include "providers/swnic/sw_qp.hpp"
#include "providers/swnic/sw_srq.hpp"

#include <cstdlib>

namespace conveyor::swnic {

device_options with_env_overrides(device_options o) {
  // A malformed value is ignored with one warning naming the variable.
  if (auto v = detail::env_u32("CONVEYOR_SPIN_US")) o.spin_us = *v;
  if (auto v = detail::env_u32("CONVEYOR_ENGINE_SPIN_US")) o.software.engine_spin_us = *v;
  if (auto v = detail::env_u32("CONVEYOR_ENGINE_PARK")) o.software.engine_park = *v != 0;
  if (auto v = detail::env_u32("CONVEYOR_SOFT_LARGE_FPDUS")) o.software.large_fpdus = *v != 0;
  return o;
}

sw_device::sw_device(std::string name, std::string_view provider, transport t,
                     const device_options& opts)
    : events_(opts.on_event) {
  opts_ = opts;
  attr_.name = std::move(name);
  attr_.provider = std::string(provider);
  attr_.transport_type = t;
  attr_.max_qp = 4096;
  attr_.max_cqe = 1u << 22;
  attr_.max_qp_wr = max_wr;
  attr_.max_sge = max_sge;
  attr_.max_sge_rd = opts.software.max_sge_rd >= 1 && opts.software.max_sge_rd < max_sge
                         ? opts.software.max_sge_rd
                         : max_sge;
  attr_.max_inline_data = max_inline;
  attr_.max_mr = detail::key_table::capacity;
  attr_.max_mr_size = 1ull << 46;
  attr_.max_msg_size = 0x7FFFFFFFu;
  attr_.max_qp_rd_atom = max_rd_atom;
  attr_.atomics = true;                     // soft: with a Conveyor peer (RFC 7306, negotiated)
  attr_.atomic_cap = atomic_scope::global;  // remote_atomic.hpp: atomic_ref on the word
  attr_.immediate_data = true;              // likewise
  attr_.send_with_invalidate = true;
  attr_.max_srq = max_srq;
  attr_.max_srq_wr = max_wr;
  attr_.max_srq_sge = max_sge;
  attr_.post_recv_checks_lkeys = true;
  attr_.inline_checks_lkeys = true;           // sw_qp checks every SGE, inline or not
  attr_.deregister_stops_outstanding = true;  // the engine looks each region up as it uses it
  attr_.registration_pins_pages = false;      // the engine reaches memory through the mapping
}

std::uint32_t sw_device::add_srq() noexcept {
  if (srqs_.fetch_add(1) >= max_srq) {
    srqs_.fetch_sub(1);
    return 0;
  }
  return srq_num_.fetch_add(1);
}

bool sw_device::owns(const detail::sw_cq& cq) const noexcept {
  return cq.owner() == static_cast<const void*>(static_cast<const detail::device_impl*>(this));
}

result<std::shared_ptr<detail::cq_impl>> sw_device::create_cq(const cq_options& opts) {
  if (opts.depth > attr_.max_cqe)
    return make_error(errc::invalid_argument, "create_cq on " + attr_.name + ": depth " +
                                                  std::to_string(opts.depth) + " exceeds max_cqe " +
                                                  std::to_string(attr_.max_cqe));
  // Manual mode: poll/wait drive the engine. Thread mode: an application thread
  // that polls an empty CQ also progresses the engine when the engine thread is
  // not running (opportunistic; it never blocks on it), which removes a thread
  // wake-up from the latency path of busy-polling applications.
  auto r = detail::sw_cq::create(opts.depth, shared_from_this(), engine_, opts_.spin_us,
                                 opts_.progress == progress_mode::manual);
  if (!r) return std::unexpected(r.error());
  return std::shared_ptr<detail::cq_impl>(std::move(*r));
}

result<void> sw_pd::check_rights(const std::string& where, access rights) {
  if ((has(rights, access::remote_write) || has(rights, access::remote_atomic)) &&
      !has(rights, access::local_write))
    return make_error(errc::invalid_argument,
                      where + ": remote_write and remote_atomic require local_write (as in verbs)");
  return {};
}

result<std::shared_ptr<detail::mr_impl>> sw_pd::register_memory(std::span<std::byte> buf,
                                                                access rights) {
  const std::string where = "register_memory on " + dev_->attr().name;
  if (buf.empty() || buf.data() == nullptr)
    return make_error(errc::invalid_argument, where + ": empty buffer");
  if (auto ok = check_rights(where, rights); !ok) return std::unexpected(ok.error());
  auto key = dev_->keys().add(buf.data(), buf.size(), rights, id_);
  if (!key) return std::unexpected(key.error());
  auto self = std::static_pointer_cast<sw_pd>(shared_from_this());
  return std::make_shared<sw_mr>(std::move(self), buf, rights, *key);
}

result<std::shared_ptr<detail::qp_impl>> sw_pd::create_qp(const qp_init_attr& attr) {
  const std::string where = "create_qp on " + dev_->attr().name;
  if (!attr.send_cq || !attr.recv_cq || !*attr.send_cq || !*attr.recv_cq)
    return make_error(errc::invalid_argument, where + ": send_cq and recv_cq are required");
  auto scq = std::dynamic_pointer_cast<detail::sw_cq>(detail::handle_access::shared(*attr.send_cq));
  auto rcq = std::dynamic_pointer_cast<detail::sw_cq>(detail::handle_access::shared(*attr.recv_cq));
  if (!scq || !rcq) return make_error(errc::invalid_argument, where + ": CQ of another provider");
  if (!dev_->owns(*scq) || !dev_->owns(*rcq))
    return make_error(errc::invalid_argument, where + ": CQ of another device");
  std::shared_ptr<sw_srq> srq;
  if (attr.srq != nullptr) {
    if (!*attr.srq) return make_error(errc::invalid_argument, where + ": empty srq handle");
    srq = std::dynamic_pointer_cast<sw_srq>(detail::handle_access::shared(*attr.srq));
    if (!srq) return make_error(errc::invalid_argument, where + ": SRQ of another provider");
    if (&srq->pd() != this)
      return make_error(
          errc::invalid_argument,
          where + (&srq->pd().dev() != dev_.get()
                       ? ": SRQ " + std::to_string(srq->srq_num()) + " belongs to another device"
                       : ": SRQ " + std::to_string(srq->srq_num()) +
                             " belongs to another protection domain"));
  }
  qp_init_attr a = attr;
  if (srq) a.cap.max_recv_wr = a.cap.max_recv_sge = 0;  // no receive queue of its own
  const auto& c = a.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > max_wr ||
      (!srq && (c.max_recv_wr == 0 || c.max_recv_wr > max_wr)))
    return make_error(errc::invalid_argument,
                      where + ": max_send_wr/max_recv_wr must be 1.." + std::to_string(max_wr));
  if (c.max_send_sge == 0 || c.max_send_sge > max_sge ||
      (!srq && (c.max_recv_sge == 0 || c.max_recv_sge > max_sge)))
    return make_error(errc::invalid_argument,
                      where + ": max_send_sge/max_recv_sge must be 1.." + std::to_string(max_sge));
  if (c.max_inline_data > max_inline)
    return make_error(errc::invalid_argument,
                      where + ": max_inline_data must be at most " + std::to_string(max_inline));
  auto self = std::static_pointer_cast<sw_pd>(shared_from_this());
  return make_qp(
      {std::move(self), std::move(scq), std::move(rcq), a, dev_->next_qpn(), std::move(srq)});
}

result<std::shared_ptr<detail::srq_impl>> sw_pd::create_srq(const srq_attr& attr) {
  const std::string where = "create_srq on " + dev_->attr().name;
  if (attr.max_wr == 0 || attr.max_wr > max_wr)
    return make_error(errc::invalid_argument,
                      where + ": max_wr must be 1.." + std::to_string(max_wr));
  if (attr.max_sge == 0 || attr.max_sge > max_sge)
    return make_error(errc::invalid_argument,
                      where + ": max_sge must be 1.." + std::to_string(max_sge));
  if (attr.srq_limit > attr.max_wr)
    return make_error(errc::invalid_argument, where + ": srq_limit exceeds max_wr");
  const std::uint32_t num = dev_->add_srq();
  if (num == 0)
    return make_error(errc::resource_exhausted,
                      where + ": " + std::to_string(max_srq) + " SRQs exist already");
  auto self = std::static_pointer_cast<sw_pd>(shared_from_this());
  // From here the SRQ's destructor gives the place back.
  return std::shared_ptr<detail::srq_impl>(std::make_shared<sw_srq>(std::move(self), attr, num));
}

sw_mr::sw_mr(std::shared_ptr<sw_pd> pd, std::span<std::byte> buf, access rights, std::uint32_t key)
    : pd_(std::move(pd)) {
  data_ = buf.data();
  size_ = buf.size();
  rights_ = rights;
  lkey_ = rkey_ = key;
}

void sw_mr::deregister() noexcept {
  if (live_.exchange(false)) {
    pd_->dev().keys().remove(rkey_);
    pd_->dev().key_revoked(rkey_);
  }
}

}  // namespace conveyor::swnic
