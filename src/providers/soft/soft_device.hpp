// The soft provider's device, protection domain and memory region objects.
#pragma once

#include "core/impl.hpp"
#include "core/key_table.hpp"
#include "core/sw_cq.hpp"
#include "providers/soft/engine/engine.hpp"

#include <atomic>
#include <memory>

namespace conveyor::soft {

class soft_device final : public detail::device_impl {
 public:
  soft_device(std::string name, const device_options& opts);
  result<std::shared_ptr<detail::pd_impl>> alloc_pd() override;
  result<std::shared_ptr<detail::cq_impl>> create_cq(const cq_options& opts) override;
  result<std::unique_ptr<detail::listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) override;

  detail::key_table& keys() noexcept { return keys_; }
  soft::engine& eng() noexcept { return *engine_; }
  std::uint32_t next_qpn() noexcept { return qpn_.fetch_add(1) ; }
  std::uint32_t next_pd_id() noexcept { return pd_id_.fetch_add(1); }

 private:
  detail::key_table keys_;
  std::unique_ptr<soft::engine> engine_;
  std::atomic<std::uint32_t> qpn_{1};
  std::atomic<std::uint32_t> pd_id_{1};
};

class soft_pd final : public detail::pd_impl {
 public:
  soft_pd(std::shared_ptr<soft_device> dev, std::uint32_t id) : dev_(std::move(dev)), id_(id) {}
  result<std::shared_ptr<detail::mr_impl>> register_memory(std::span<std::byte> buf,
                                                           access rights) override;
  result<std::shared_ptr<detail::qp_impl>> create_qp(const qp_init_attr& attr) override;
  soft_device& dev() noexcept { return *dev_; }
  std::uint32_t id() const noexcept { return id_; }

 private:
  std::shared_ptr<soft_device> dev_;
  std::uint32_t id_;
};

class soft_mr final : public detail::mr_impl {
 public:
  soft_mr(std::shared_ptr<soft_pd> pd, std::span<std::byte> buf, access rights, std::uint32_t key);
  ~soft_mr() override { deregister(); }
  void deregister() noexcept override;

 private:
  std::shared_ptr<soft_pd> pd_;
  std::atomic<bool> live_{true};
};

}  // namespace conveyor::soft
