// The soft provider's device and protection domain: the software device of
// providers/swnic with the soft engine, TCP listeners and soft QPs.
#pragma once

#include "providers/soft/engine/engine.hpp"
#include "providers/swnic/sw_device.hpp"

#include <memory>

namespace conveyor::soft {

class soft_device final : public swnic::sw_device {
 public:
  soft_device(std::string name, const device_options& opts);
  result<std::shared_ptr<detail::pd_impl>> alloc_pd() override;
  result<std::unique_ptr<detail::listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) override;
  soft::engine& eng() noexcept { return *engine_owned_; }

 private:
  std::unique_ptr<soft::engine> engine_owned_;
};

class soft_pd final : public swnic::sw_pd {
 public:
  soft_pd(std::shared_ptr<soft_device> dev, std::uint32_t id) : sw_pd(std::move(dev), id) {}
  soft_device& dev() noexcept { return static_cast<soft_device&>(sw_pd::dev()); }

 protected:
  std::shared_ptr<detail::qp_impl> make_qp(swnic::qp_args&& a) override;
};

}  // namespace conveyor::soft
