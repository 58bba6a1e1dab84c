// The soft provider's device and protection domain: the software device of
// providers/swnic with the soft engine, TCP listeners and soft QPs.
#pragma once

#include "providers/soft/engine/engine.hpp"
#include "providers/swnic/handshake_pump.hpp"
#include "providers/swnic/sw_device.hpp"

#include <memory>
#include <mutex>

namespace conveyor::soft {

class soft_device final : public swnic::sw_device {
 public:
  soft_device(std::string name, const device_options& opts);
  result<std::shared_ptr<detail::pd_impl>> alloc_pd() override;
  result<std::unique_ptr<detail::listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) override;
  // Loopback and a free port: "127.0.0.1:<port>".
  result<std::unique_ptr<detail::listener_impl>> bind_ephemeral_listener(int backlog) override {
    return bind_listener("127.0.0.1:0", backlog);
  }
  soft::engine& eng() noexcept { return *engine_owned_; }
  // Reads the last step of every accepted connection of this device (the
  // initiator's RTR, soft_cm.cpp), so accept() never waits for a peer; its
  // thread starts with the first such accept. Bounded as a listener's
  // handshakes are: device_options::software.max_pending_handshakes at a time, each
  // within handshake_timeout_ms.
  result<detail::handshake_pump*> rtr_pump();
  ~soft_device() override;

 private:
  std::unique_ptr<soft::engine> engine_owned_;
  std::mutex rtr_mu_;
  std::unique_ptr<detail::handshake_pump> rtr_pump_;  // last: stops before the engine goes
};

class soft_pd final : public swnic::sw_pd {
 public:
  soft_pd(std::shared_ptr<soft_device> dev, std::uint32_t id) : sw_pd(std::move(dev), id) {}
  soft_device& dev() noexcept { return static_cast<soft_device&>(sw_pd::dev()); }

 protected:
  std::shared_ptr<detail::qp_impl> make_qp(swnic::qp_args&& a) override;
};

}  // namespace conveyor::soft
