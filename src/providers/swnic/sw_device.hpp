// The software devices' common objects: a device with its key table, limits
// and software CQs; a protection domain that registers memory in that table
// and creates QPs after the checks every software provider makes; and the
// memory region whose destruction revokes its key. `soft` and `shm` derive
// from these and add only what differs (the engine, shm's direct mapping).
#pragma once

#include "core/impl.hpp"
#include "providers/swnic/key_table.hpp"
#include "providers/swnic/sw_cq.hpp"
#include "providers/swnic/sw_events.hpp"

#include <atomic>
#include <memory>
#include <string>

namespace conveyor::swnic {

class sw_engine;
struct qp_args;

// Limits every software device shares (device_attr reports them).
inline constexpr std::uint32_t max_wr = 16384;
inline constexpr std::uint32_t max_sge = 16;
inline constexpr std::uint32_t max_inline = 1024;
inline constexpr std::uint32_t max_rd_atom = 128;
inline constexpr std::uint32_t max_srq = 1024;

// device_options after the documented environment overrides
// (docs/CONFIGURATION.md): CONVEYOR_SPIN_US, CONVEYOR_ENGINE_SPIN_US,
// CONVEYOR_ENGINE_PARK.
device_options with_env_overrides(device_options o);

class sw_device : public detail::device_impl {
 public:
  result<std::shared_ptr<detail::cq_impl>> create_cq(const cq_options& opts) final;

  detail::key_table& keys() noexcept { return keys_; }
  std::uint32_t next_qpn() noexcept { return qpn_.fetch_add(1); }
  std::uint32_t next_pd_id() noexcept { return pd_id_.fetch_add(1); }
  // Whether `cq` is a CQ of this device (a QP may use no other).
  bool owns(const detail::sw_cq& cq) const noexcept;
  // Hands e to device_options::on_event on the device's event thread (and
  // logs it); the caller must hold no queue lock (sw_events.hpp).
  void post_event(device_event e) noexcept { events_.post(std::move(e)); }
  // An SRQ number, or 0 when max_srq SRQs exist; srq_gone() returns the place.
  std::uint32_t add_srq() noexcept;
  void srq_gone() noexcept { srqs_.fetch_sub(1); }
  // A region's key was just revoked (sw_mr::deregister): a provider whose
  // peers reach local memory by address fences them here, before the
  // deregistration returns.
  virtual void key_revoked(std::uint32_t /*key*/) noexcept {}

 protected:
  // Fills the attributes every software device has; the provider adds its port.
  sw_device(std::string name, std::string_view provider, transport t, const device_options& opts);
  // The engine that CQ poll/wait progress (set by the provider's constructor).
  sw_engine* engine_ = nullptr;

 private:
  detail::key_table keys_;
  std::atomic<std::uint32_t> qpn_{1};
  std::atomic<std::uint32_t> pd_id_{1};
  std::atomic<std::uint32_t> srqs_{0};
  std::atomic<std::uint32_t> srq_num_{1};
  event_delivery events_;
};

class sw_pd : public detail::pd_impl {
 public:
  sw_pd(std::shared_ptr<sw_device> dev, std::uint32_t id) : dev_(std::move(dev)), id_(id) {}
  result<std::shared_ptr<detail::mr_impl>> register_memory(std::span<std::byte> buf,
                                                           access rights) override;
  result<std::shared_ptr<detail::qp_impl>> create_qp(const qp_init_attr& attr) final;
  result<std::shared_ptr<detail::srq_impl>> create_srq(const srq_attr& attr) final;
  sw_device& dev() noexcept { return *dev_; }
  std::uint32_t id() const noexcept { return id_; }

  // Rights as verbs allows them: remote write and remote atomic need local write.
  static result<void> check_rights(const std::string& where, access rights);

 protected:
  // Called by create_qp once the CQs and capabilities passed every check.
  virtual std::shared_ptr<detail::qp_impl> make_qp(qp_args&& a) = 0;

 private:
  std::shared_ptr<sw_device> dev_;
  std::uint32_t id_;
};

class sw_mr : public detail::mr_impl {
 public:
  sw_mr(std::shared_ptr<sw_pd> pd, std::span<std::byte> buf, access rights, std::uint32_t key);
  ~sw_mr() override { sw_mr::deregister(); }
  void deregister() noexcept override;

 protected:
  bool live() const noexcept { return live_.load(); }
  sw_pd& pd() noexcept { return *pd_; }

 private:
  std::shared_ptr<sw_pd> pd_;
  std::atomic<bool> live_{true};
};

}  // namespace conveyor::swnic
