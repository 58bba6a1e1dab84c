// device.hpp — the Gloo device: the providers this process opened (soft, shm,
// verbs), the address it advertises and its host identity; makes contexts.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <conveyor/conveyor.hpp>

#include "conveyor_gloo/transport.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

class Device final : public ::gloo::transport::Device, public std::enable_shared_from_this<Device> {
 public:
  struct provider {
    std::string kind;  // soft, shm, verbs
    conveyor::device dev;
    conveyor::protection_domain pd;
  };

  explicit Device(const attr& a);

  std::string str() const override { return str_; }
  const std::string& getPCIBusID() const override { return pci_; }
  std::shared_ptr<::gloo::transport::Context> createContext(int rank, int size) override;

  provider* find(const std::string& kind) {
    for (auto& p : providers_)
      if (p.kind == kind) return &p;
    return nullptr;
  }
  const std::string& forced_base() const { return forced_base_; }
  const std::string& ip() const { return ip_; }
  const std::uint8_t* host_id() const { return host_id_; }
  // How long a thread waiting for an unbound buffer's operation looks for its
  // completion before sleeping (CONVEYOR_GLOO_WAIT_SPIN_US).
  std::chrono::microseconds wait_spin() const { return wait_spin_; }
  // Whether that waiting thread takes completions from the queue itself
  // (CONVEYOR_GLOO_WAIT_POLL: 1 always, 0 never, unset: when a context's
  // ranks on this host do not outnumber cpus()) or only looks for its own.
  int wait_poll() const { return wait_poll_; }
  // The CPUs this process may run on (sched_getaffinity).
  int cpus() const { return cpus_; }

 private:
  std::string forced_, forced_base_, ip_, ip_from_, str_, pci_;
  std::uint8_t host_id_[24];
  std::chrono::microseconds wait_spin_{50};
  int wait_poll_ = -1;  // -1: auto
  int cpus_ = 1;
  std::vector<provider> providers_;
};

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
