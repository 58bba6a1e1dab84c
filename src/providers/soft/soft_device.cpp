// The soft provider: device, protection domain, memory registration, QP creation.
#include "providers/soft/soft_device.hpp"

#include "core/log.hpp"
#include "providers/soft/engine/soft_qp.hpp"
#include "providers/soft/net/tcp.hpp"

#include <cstdio>
#include <cstdlib>

namespace conveyor::soft {

namespace {
constexpr std::uint32_t max_wr = 16384;
constexpr std::uint32_t max_sge = 16;
constexpr std::uint32_t max_inline = 1024;
}  // namespace

soft_device::soft_device(std::string name, const device_options& opts) {
  opts_ = opts;
  attr_.name = std::move(name);
  attr_.provider = "soft";
  attr_.transport_type = transport::iwarp;
  attr_.max_qp = 4096;
  attr_.max_cqe = 1u << 22;
  attr_.max_qp_wr = max_wr;
  attr_.max_sge = max_sge;
  attr_.max_sge_rd = max_sge;
  attr_.max_inline_data = max_inline;
  attr_.max_mr = detail::key_table::capacity;
  attr_.max_mr_size = 1ull << 46;
  attr_.max_msg_size = 0x7FFFFFFFu;
  attr_.max_qp_rd_atom = 128;
  attr_.atomics = true;         // with a Conveyor peer (RFC 7306, negotiated)
  attr_.immediate_data = true;  // likewise
  attr_.send_with_invalidate = true;
  // One "port": TCP on every interface of the host.
  attr_.ports.push_back({.num = 1, .state = "active", .link_layer = "tcp", .mtu = 0,
                         .addresses = net::interface_addresses()});
  engine_ = std::make_unique<soft::engine>(opts.progress == progress_mode::thread, opts.engine_spin_us,
                                           opts.engine_park);
}

result<std::shared_ptr<detail::pd_impl>> soft_device::alloc_pd() {
  auto self = std::static_pointer_cast<soft_device>(shared_from_this());
  return std::make_shared<soft_pd>(std::move(self), next_pd_id());
}

result<std::shared_ptr<detail::cq_impl>> soft_device::create_cq(const cq_options& opts) {
  if (opts.depth > attr_.max_cqe)
    return make_error(errc::invalid_argument, "create_cq on " + attr_.name + ": depth " +
                                                  std::to_string(opts.depth) + " exceeds max_cqe " +
                                                  std::to_string(attr_.max_cqe));
  // Manual mode: poll/wait drive the engine. Thread mode: an application thread
  // that polls an empty CQ also progresses the engine when the engine thread is
  // not running (opportunistic; it never blocks on it), which removes a thread
  // wake-up from the latency path of busy-polling applications.
  auto r = detail::sw_cq::create(opts.depth, shared_from_this(), engine_.get(), opts_.spin_us,
                                 opts_.progress == progress_mode::manual);
  if (!r) return std::unexpected(r.error());
  return std::shared_ptr<detail::cq_impl>(std::move(*r));
}

result<std::shared_ptr<detail::mr_impl>> soft_pd::register_memory(std::span<std::byte> buf,
                                                                  access rights) {
  if (buf.empty() || buf.data() == nullptr)
    return make_error(errc::invalid_argument, "register_memory on " + dev_->attr().name +
                                                  ": empty buffer");
  if ((has(rights, access::remote_write) || has(rights, access::remote_atomic)) &&
      !has(rights, access::local_write))
    return make_error(errc::invalid_argument,
                      "register_memory on " + dev_->attr().name +
                          ": remote_write and remote_atomic require local_write (as in verbs)");
  auto key = dev_->keys().add(buf.data(), buf.size(), rights, id_);
  if (!key) return std::unexpected(key.error());
  auto self = std::static_pointer_cast<soft_pd>(shared_from_this());
  return std::make_shared<soft_mr>(std::move(self), buf, rights, *key);
}

result<std::shared_ptr<detail::qp_impl>> soft_pd::create_qp(const qp_init_attr& attr) {
  const auto& a = dev_->attr();
  const std::string where = "create_qp on " + a.name;
  if (!attr.send_cq || !attr.recv_cq || !*attr.send_cq || !*attr.recv_cq)
    return make_error(errc::invalid_argument, where + ": send_cq and recv_cq are required");
  auto* scq = dynamic_cast<detail::sw_cq*>(attr.send_cq->impl());
  auto* rcq = dynamic_cast<detail::sw_cq*>(attr.recv_cq->impl());
  if (!scq || !rcq) return make_error(errc::invalid_argument, where + ": CQ of another provider");
  const auto& c = attr.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > max_wr || c.max_recv_wr == 0 || c.max_recv_wr > max_wr)
    return make_error(errc::invalid_argument,
                      where + ": max_send_wr/max_recv_wr must be 1.." + std::to_string(max_wr));
  if (c.max_send_sge == 0 || c.max_send_sge > max_sge || c.max_recv_sge == 0 || c.max_recv_sge > max_sge)
    return make_error(errc::invalid_argument,
                      where + ": max_send_sge/max_recv_sge must be 1.." + std::to_string(max_sge));
  if (c.max_inline_data > max_inline)
    return make_error(errc::invalid_argument,
                      where + ": max_inline_data must be at most " + std::to_string(max_inline));
  auto self = std::static_pointer_cast<soft_pd>(shared_from_this());
  return std::shared_ptr<detail::qp_impl>(std::make_shared<soft_qp>(
      std::move(self), std::static_pointer_cast<detail::sw_cq>(attr.send_cq->shared_impl()),
      std::static_pointer_cast<detail::sw_cq>(attr.recv_cq->shared_impl()), attr,
      dev_->next_qpn()));
}

soft_mr::soft_mr(std::shared_ptr<soft_pd> pd, std::span<std::byte> buf, access rights,
                 std::uint32_t key)
    : pd_(std::move(pd)) {
  data_ = buf.data();
  size_ = buf.size();
  rights_ = rights;
  lkey_ = rkey_ = key;
}

void soft_mr::deregister() noexcept {
  if (live_.exchange(false)) pd_->dev().keys().remove(rkey_);
}

std::vector<device_info> list_devices() {
  return {device_info{"soft", "soft", transport::iwarp, true, ""}};
}

result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts) {
  device_options o = opts;
  // Documented overrides of the option struct (see docs/CONFIGURATION.md).
  if (const char* v = std::getenv("CONVEYOR_SPIN_US")) o.spin_us = static_cast<std::uint32_t>(std::atoi(v));
  if (const char* v = std::getenv("CONVEYOR_ENGINE_SPIN_US"))
    o.engine_spin_us = static_cast<std::uint32_t>(std::atoi(v));
  if (const char* v = std::getenv("CONVEYOR_ENGINE_PARK")) o.engine_park = std::atoi(v) != 0;
  auto dev = std::make_shared<soft_device>(std::string(name), o);
  if (!dev->eng().ok())
    return make_error(errc::resource_exhausted, "open " + std::string(name) + ": epoll/eventfd failed");
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info,
                     "opened device " + std::string(name) + " (provider soft, iWARP over TCP, progress " +
                         (o.progress == progress_mode::thread ? "thread" : "manual") + ", crc " +
                         (o.request_crc ? "requested" : "not requested") + ", wait spin " +
                         std::to_string(o.spin_us) + " us, engine spin " +
                         std::to_string(o.engine_spin_us) + " us, engine park " +
                         (o.engine_park ? "on" : "off") + ")");
  return std::shared_ptr<detail::device_impl>(std::move(dev));
}

}  // namespace conveyor::soft
