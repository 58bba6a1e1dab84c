// Provider interface: the abstract *_impl classes behind the public handles.
// A provider implements these; the public types in include/conveyor forward to
// them with one indirect call. Nothing here is installed.
#pragma once

#include <conveyor/cm.hpp>
#include <conveyor/cq.hpp>
#include <conveyor/device.hpp>
#include <conveyor/error.hpp>
#include <conveyor/mr.hpp>
#include <conveyor/pd.hpp>
#include <conveyor/qp.hpp>
#include <conveyor/srq.hpp>

#include <chrono>
#include <memory>
#include <span>
#include <string>

namespace conveyor::detail {

class pd_impl;
class cq_impl;
class qp_impl;
class srq_impl;

class device_impl : public std::enable_shared_from_this<device_impl> {
 public:
  virtual ~device_impl() = default;
  const device_attr& attr() const noexcept { return attr_; }
  const device_options& options() const noexcept { return opts_; }
  virtual result<std::shared_ptr<pd_impl>> alloc_pd() = 0;
  virtual result<std::shared_ptr<cq_impl>> create_cq(const cq_options& opts) = 0;
  virtual result<std::unique_ptr<listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) = 0;
  // listener::bind(dev): an ephemeral address in the provider's own syntax.
  virtual result<std::unique_ptr<listener_impl>> bind_ephemeral_listener(int backlog) = 0;

 protected:
  device_attr attr_;
  device_options opts_;
};

class pd_impl : public std::enable_shared_from_this<pd_impl> {
 public:
  virtual ~pd_impl() = default;
  virtual result<std::shared_ptr<mr_impl>> register_memory(std::span<std::byte> buf,
                                                           access rights) = 0;
  // Memory owned by the region. The default maps anonymous pages and registers
  // them (owned_memory.cpp); shm overrides it with peer-mappable memfd memory.
  virtual result<std::shared_ptr<mr_impl>> allocate_memory(std::size_t len, access rights);
  virtual result<std::shared_ptr<qp_impl>> create_qp(const qp_init_attr& attr) = 0;
  virtual result<std::shared_ptr<srq_impl>> create_srq(const srq_attr& attr) = 0;
};

class mr_impl {
 public:
  virtual ~mr_impl() = default;
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::uint32_t lkey() const noexcept { return lkey_; }
  std::uint32_t rkey() const noexcept { return rkey_; }
  access rights() const noexcept { return rights_; }
  virtual void deregister() noexcept = 0;

 protected:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::uint32_t lkey_ = 0, rkey_ = 0;
  access rights_ = access::none;
};

class cq_impl {
 public:
  virtual ~cq_impl() = default;
  virtual std::uint32_t depth() const noexcept = 0;
  virtual std::expected<std::size_t, errc> poll(std::span<work_completion> out) noexcept = 0;
  virtual std::expected<std::size_t, errc> wait(std::span<work_completion> out,
                                                std::chrono::nanoseconds timeout) noexcept = 0;
  virtual int fd() const noexcept = 0;
  virtual void arm() noexcept = 0;
};

class qp_impl {
 public:
  virtual ~qp_impl() = default;
  virtual std::uint32_t qp_num() const noexcept = 0;
  virtual qp_state state() const noexcept = 0;
  virtual const qp_caps& caps() const noexcept = 0;
  virtual status post_send(std::span<const send_wr> wrs, std::size_t* bad) noexcept = 0;
  virtual status post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept = 0;
  virtual result<void> modify(qp_state target) = 0;
  virtual result<qp_connection_attr> connection() const = 0;
  virtual qp_counters counters() const noexcept = 0;
  virtual void disconnect() noexcept = 0;
  virtual result<connection_info> connect(std::string_view address,
                                          const connect_options& opts) = 0;
};

class srq_impl {
 public:
  virtual ~srq_impl() = default;
  virtual std::uint32_t srq_num() const noexcept = 0;
  virtual status post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept = 0;
  virtual result<void> arm_limit(std::uint32_t limit) = 0;
  virtual result<srq_attr> query() const = 0;
};

class conn_request_impl {
 public:
  virtual ~conn_request_impl() = default;
  virtual std::span<const std::byte> private_data() const noexcept = 0;
  virtual std::string peer_address() const = 0;
  virtual result<connection_info> accept(queue_pair& qp, std::span<const std::byte> pd) = 0;
  virtual result<void> reject(std::span<const std::byte> reason) = 0;
};

class listener_impl {
 public:
  virtual ~listener_impl() = default;
  virtual std::string address() const = 0;
  virtual std::uint16_t port() const noexcept = 0;
  virtual result<std::unique_ptr<conn_request_impl>> accept(std::chrono::milliseconds timeout) = 0;
};

// How the library reaches the implementation behind a public handle (the
// handles make this their friend; nothing public exposes it).
struct handle_access {
  static cq_impl* impl(const completion_queue& c) noexcept { return c.impl_.get(); }
  static const std::shared_ptr<cq_impl>& shared(const completion_queue& c) noexcept {
    return c.impl_;
  }
  static qp_impl* impl(const queue_pair& q) noexcept { return q.impl_.get(); }
  static const std::shared_ptr<srq_impl>& shared(const shared_receive_queue& s) noexcept {
    return s.impl_;
  }
  static const std::shared_ptr<device_impl>& shared(const device& d) noexcept { return d.impl_; }
  static const std::shared_ptr<pd_impl>& shared(const protection_domain& p) noexcept {
    return p.impl_;
  }
};

// The verbs QP state machine: which transitions modify() may request.
bool qp_transition_allowed(qp_state from, qp_state to) noexcept;

// Provider registry.
struct provider_entry {
  std::string_view name;
  std::vector<device_info> (*list)();
  result<std::shared_ptr<device_impl>> (*open)(std::string_view name, const device_options&);
};
std::span<const provider_entry> providers() noexcept;

}  // namespace conveyor::detail
