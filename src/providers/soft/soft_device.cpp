// The soft provider: device, protection domain, QP creation.
#include "providers/soft/soft_device.hpp"

#include "core/log.hpp"
#include "providers/soft/engine/soft_qp.hpp"
#include "providers/soft/net/tcp.hpp"

namespace conveyor::soft {

soft_device::soft_device(std::string name, const device_options& opts)
    : sw_device(std::move(name), "soft", transport::iwarp, opts) {
  // One "port": TCP on every interface of the host.
  attr_.runs_mpa = true;  // soft_cm.cpp: MPA request, reply and RTR are ours
  attr_.ports.push_back({.num = 1,
                         .state = "active",
                         .link_layer = "tcp",
                         .mtu = 0,
                         .addresses = net::interface_addresses()});
  engine_owned_ =
      std::make_unique<soft::engine>(opts.progress == progress_mode::thread,
                                     opts.software.engine_spin_us, opts.software.engine_park);
  engine_ = engine_owned_.get();
}

result<std::shared_ptr<detail::pd_impl>> soft_device::alloc_pd() {
  auto self = std::static_pointer_cast<soft_device>(shared_from_this());
  return std::make_shared<soft_pd>(std::move(self), next_pd_id());
}

std::shared_ptr<detail::qp_impl> soft_pd::make_qp(swnic::qp_args&& a) {
  return std::make_shared<soft_qp>(std::move(a));
}

std::vector<device_info> list_devices() {
  return {device_info{"soft", "soft", transport::iwarp, true, ""}};
}

result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts) {
  const device_options o = swnic::with_env_overrides(opts);
  auto dev = std::make_shared<soft_device>(std::string(name), o);
  if (!dev->eng().ok())
    return make_error(errc::resource_exhausted,
                      "open " + std::string(name) + ": epoll/eventfd failed");
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info,
                     "opened device " + std::string(name) +
                         " (provider soft, iWARP over TCP, progress " +
                         (o.progress == progress_mode::thread ? "thread" : "manual") + ", crc " +
                         (o.software.request_crc ? "requested" : "not requested") + ", wait spin " +
                         std::to_string(o.spin_us) + " us, engine spin " +
                         std::to_string(o.software.engine_spin_us) + " us, engine park " +
                         (o.software.engine_park ? "on" : "off") + ")");
  return std::shared_ptr<detail::device_impl>(std::move(dev));
}

}  // namespace conveyor::soft
