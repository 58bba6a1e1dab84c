// The verbs provider's objects: Conveyor's objects mapped 1:1 onto rdma-core's.
//
//   device   -> ibv_context (+ a thread reading the device's async events)
//               verbs_device.cpp
//   pd / mr  -> ibv_pd / ibv_mr                               verbs_mr.cpp
//   cq       -> ibv_cq with a completion channel (fd/arm/wait) verbs_cq.cpp
//   srq      -> ibv_srq (post, limit, query)                  verbs_srq.cpp
//   qp       -> an RC ibv_qp created at create_qp and moved to INIT at once, so
//               receives can be posted before connecting, as in the Conveyor
//               API; posting and state                         verbs_qp.cpp
//   cm       -> librdmacm with that QP attached by number ("external QP"): on
//               IB/RoCE the provider moves it INIT->RTR->RTS from
//               rdma_init_qp_attr; on iWARP the kernel does at MPA completion
//               (listener, requests, connect, accept)          verbs_cm.cpp
//
// Each connection owns its own rdma_cm event channel. Once established, a
// detached watcher thread reads it (peer disconnect -> the QP goes to ERROR and
// flushes) and, after the QP is closed, destroys the cm_id. Destroying a cm_id
// can wait on the peer (IB CM DREQ/DREP); doing it on that detached thread keeps
// every user-visible call bounded. Internal to src/providers/verbs.
#pragma once

#include "core/impl.hpp"
#include "providers/verbs/verbs_transport.hpp"
#include "providers/verbs/verbs_util.hpp"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace conveyor::verbs {

class verbs_qp;
class verbs_srq;

// ------------------------------------------------------------------ device ----

class verbs_device final : public detail::device_impl {
 public:
  verbs_device(ibv_context* ctx, const device_options& opts);
  ~verbs_device() override;

  result<std::shared_ptr<detail::pd_impl>> alloc_pd() override;
  result<std::shared_ptr<detail::cq_impl>> create_cq(const cq_options& opts) override;
  result<std::unique_ptr<detail::listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) override;
  // The device's first IPv4 address and a free port.
  result<std::unique_ptr<detail::listener_impl>> bind_ephemeral_listener(int backlog) override;

  ibv_context* ctx() const noexcept { return ctx_; }
  const ibv_device_attr& dattr() const noexcept { return dattr_; }
  const std::string& ibdev() const noexcept { return ibdev_; }
  std::uint8_t port() const noexcept { return port_; }
  bool iwarp() const noexcept { return attr_.transport_type == transport::iwarp; }
  int gid_override() const noexcept { return gid_override_; }

  // QPs by number, to mark a QP in ERROR when its CQ reports an error
  // completion or overflows (error paths only; never on a successful poll).
  void add_qp(std::uint32_t qpn, verbs_qp* q) {
    std::lock_guard lk(qps_mu_);
    qps_[qpn] = q;
  }
  void remove_qp(std::uint32_t qpn) {
    std::lock_guard lk(qps_mu_);
    qps_.erase(qpn);
  }
  void qp_failed(std::uint32_t qpn) noexcept;
  void cq_failed(const void* cq) noexcept;
  // Moves to ERROR every QP of this device that is connected through `port`
  // (0: every QP, connected or not) and not in ERROR yet; returns one qp_error
  // event per such QP, those already in ERROR included, for the caller to
  // deliver outside the lock.
  // A QP already reported (one qp_error event per QP, ever) is failed but not
  // reported again.
  std::vector<device_event> fail_qps(std::uint8_t port, std::string_view cause) noexcept;
  std::string where() const { return "device " + ibdev_ + " port " + std::to_string(port_); }

  // A port as device_attr reports it: state, link layer, active MTU in bytes
  // and the GID table's non-zero entries (RoCE v2 GIDs embed the IP address).
  port_attr describe_port(std::uint8_t p) const;
  // One line for the log: device, transport, firmware, ports, capabilities.
  std::string describe() const;

 private:
  void async_loop();
  // The port-down grace period (device_options::verbs.port_down_grace): the port's
  // down time starts; QPs whose grace is 0 fail at once (their events are
  // returned); `pending`/`soonest` say how many wait and the smallest grace.
  std::vector<device_event> port_went_down(std::uint8_t port, clock_type::time_point now,
                                           std::size_t& pending,
                                           std::chrono::milliseconds& soonest) noexcept;
  // Fails the QPs on down ports whose grace period has passed.
  std::vector<device_event> expire_port_down(clock_type::time_point now) noexcept;
  // The port is back: QPs on it that the device failed meanwhile get their
  // qp_error event (the others keep their connection; `kept` counts them).
  std::vector<device_event> port_came_back(std::uint8_t port, std::chrono::milliseconds down_for,
                                           std::size_t& kept) noexcept;
  // fail_qps for the QPs `pick` selects, each with its own cause.
  std::vector<device_event> fail_selected(
      const std::function<std::optional<std::string>(const verbs_qp&)>& pick) noexcept;

  ibv_context* ctx_;
  ibv_device_attr dattr_{};
  std::string ibdev_;
  std::vector<ibv_port_attr> ports_;
  std::uint8_t port_ = 1;
  int gid_override_ = -1;
  std::atomic<bool> stop_{false};
  bool fatal_ = false;    // device_fatal was delivered (async thread only)
  std::string dev_path_;  // the uverbs node in sysfs: gone once the device is removed
  std::thread async_thread_;
  std::mutex qps_mu_;
  std::unordered_map<std::uint32_t, verbs_qp*> qps_;
  port_down_clock ports_down_;                         // (async thread only)
  std::optional<clock_type::time_point> next_expiry_;  // the next QP's grace ends (async thread)
};

// ---------------------------------------------------------------------- pd ----

class verbs_pd final : public detail::pd_impl {
 public:
  verbs_pd(std::shared_ptr<verbs_device> dev, ibv_pd* pd) : dev_(std::move(dev)), pd_(pd) {}
  ~verbs_pd() override { rdma_core().ibv_dealloc_pd(pd_); }
  result<std::shared_ptr<detail::mr_impl>> register_memory(std::span<std::byte> buf,
                                                           access rights) override;  // verbs_mr.cpp
  result<std::shared_ptr<detail::qp_impl>> create_qp(
      const qp_init_attr& attr) override;  // verbs_qp.cpp
  result<std::shared_ptr<detail::srq_impl>> create_srq(
      const srq_attr& attr) override;  // verbs_srq.cpp
  verbs_device& dev() noexcept { return *dev_; }
  ibv_pd* pd() const noexcept { return pd_; }

 private:
  std::shared_ptr<verbs_device> dev_;
  ibv_pd* pd_;
};

// --------------------------------------------------------------------- srq ----

class verbs_srq final : public detail::srq_impl {
 public:
  verbs_srq(std::shared_ptr<verbs_pd> pd, ibv_srq* srq, const srq_attr& granted);
  ~verbs_srq() override;

  // ibv_srq's handle: what identifies it in the device's async events.
  std::uint32_t srq_num() const noexcept override { return srq_->handle; }
  status post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept override;
  result<void> arm_limit(std::uint32_t limit) override;
  // max_wr and max_sge from ibv_query_srq, or as granted at creation where the
  // device cannot be asked (siw's user-space provider answers EOPNOTSUPP); the
  // limit as this provider armed it (0 once the limit event arrived: siw keeps
  // reporting the old value).
  result<srq_attr> query() const override;

  ibv_srq* ibv() const noexcept { return srq_; }
  verbs_pd& pd() const noexcept { return *pd_; }
  // The device reported the limit reached (async thread): the limit that was
  // armed (for the event's description), now disarmed.
  std::uint32_t limit_fired() noexcept { return limit_.exchange(0); }

 private:
  std::string where() const;
  std::shared_ptr<verbs_pd> pd_;
  ibv_srq* srq_;
  const std::uint32_t max_wr_, max_sge_;
  std::atomic<std::uint32_t> limit_;
};

// ---------------------------------------------------------------------- cq ----

class verbs_cq final : public detail::cq_impl {
 public:
  verbs_cq(std::shared_ptr<verbs_device> dev, ibv_comp_channel* ch, ibv_cq* cq,
           std::uint32_t depth);
  ~verbs_cq() override;
  std::uint32_t depth() const noexcept override { return depth_; }

  std::expected<std::size_t, errc> poll(std::span<work_completion> out) noexcept override;
  std::expected<std::size_t, errc> wait(std::span<work_completion> out,
                                        std::chrono::nanoseconds timeout) noexcept override;
  int fd() const noexcept override { return epfd_; }
  void arm() noexcept override;

  ibv_cq* cq() const noexcept { return cq_; }
  const verbs_device* device() const noexcept { return dev_.get(); }
  void mark_error() noexcept { errored_ = true; }

 private:
  std::expected<std::size_t, errc> poll_raw(std::span<work_completion> out) noexcept;
  void consume_events() noexcept;

  std::shared_ptr<verbs_device> dev_;
  ibv_comp_channel* ch_;
  ibv_cq* cq_;
  std::uint32_t depth_;
  std::mutex wait_mu_;
  unsigned unacked_ = 0;
  std::atomic<bool> errored_{false};
  int efd_ = -1, epfd_ = -1;
  std::mutex stash_mu_;
  work_completion stash_{};
  std::atomic<bool> has_stash_{false};
};

// ---------------------------------------------------------------------- qp ----

// A connection's rdma_cm state, shared by the QP and its watcher thread.
struct conn_state {
  std::mutex mu;
  rdma_cm_id* id = nullptr;          // cleared (under mu) by the watcher as it ends
  rdma_event_channel* ch = nullptr;  // likewise
  ibv_qp* qp = nullptr;              // cleared (under mu) before the QP is destroyed
  std::atomic<bool> closing{false};
  std::atomic<bool> peer_gone{false};
  std::string where;
};

class verbs_qp final : public detail::qp_impl {
 public:
  verbs_qp(std::shared_ptr<verbs_pd> pd, std::shared_ptr<detail::cq_impl> scq,
           std::shared_ptr<detail::cq_impl> rcq, ibv_qp* qp, const qp_init_attr& a,
           std::shared_ptr<verbs_srq> srq);
  ~verbs_qp() override;
  bool uses_cq(const void* cq) const noexcept { return scq_.get() == cq || rcq_.get() == cq; }

  std::uint32_t qp_num() const noexcept override { return qp_->qp_num; }
  qp_state state() const noexcept override;
  const qp_caps& caps() const noexcept override { return caps_; }
  std::string where() const;

  status post_send(std::span<const send_wr> wrs, std::size_t* bad) noexcept override;
  status post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept override;
  result<void> modify(qp_state target) override;
  result<void> to_init();
  result<qp_connection_attr> connection() const override;
  qp_counters counters() const noexcept override { return {}; }  // verbs keeps no per-QP counters
  void disconnect() noexcept override;

  // verbs_cm.cpp
  result<connection_info> connect(std::string_view address, const connect_options& opts) override;
  result<connection_info> accept_on(rdma_cm_id* id, rdma_event_channel* ch,
                                    const rdma_conn_param& req, const std::string& peer,
                                    std::span<const std::byte> pdata,
                                    std::chrono::milliseconds timeout);

  verbs_pd& pd() noexcept { return *pd_; }
  ibv_qp* ibv() const noexcept { return qp_; }
  void mark_error() noexcept { state_ = qp_state::error; }
  // Established (finish() ran): from then on peer_ and the port do not change,
  // so the device's event thread may read them.
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }
  // The port the connection runs on (rdma_cm resolved it); the device's port
  // before the QP is connected.
  std::uint8_t port() const noexcept {
    return connected() && conn_port_ != 0 ? conn_port_ : pd_->dev().port();
  }
  // Moves the QP to ERROR for a cause outside it (its port went down, the
  // device failed): every outstanding request completes with wr_flush_err.
  // (The caller logs it, with the event it delivers.)
  void fail() noexcept {
    state_ = qp_state::error;
    move_to_error(qp_);
  }
  // How long its port may stay down before it is failed (set once connected).
  std::chrono::milliseconds port_down_grace() const noexcept { return port_down_grace_; }
  // True the first time only: the QP's one qp_error event is being delivered.
  bool claim_error_report() noexcept { return !error_reported_.exchange(true); }

 private:
  status map_post_error(int rc) noexcept;
  // verbs_cm.cpp
  // What connect and accept hand rdma_cm: `wrapped` (wrap_private) must outlive it.
  rdma_conn_param conn_param(const std::vector<std::byte>& wrapped, std::uint32_t ird,
                             std::uint32_t ord) const noexcept;
  result<void> ib_rtr_rts(rdma_cm_id* id, std::uint32_t ird, std::uint32_t ord);
  void finish(rdma_cm_id* id, rdma_event_channel* ch, std::uint32_t ird, std::uint32_t ord);

  std::shared_ptr<verbs_pd> pd_;
  std::shared_ptr<detail::cq_impl> scq_, rcq_;
  std::shared_ptr<verbs_srq> srq_;  // kept while the QP lives (null: its own RQ)
  ibv_qp* qp_;
  qp_caps caps_;
  std::uint32_t want_ord_ = 16, want_ird_ = 16;
  verbs_transport_params transport_;
  std::chrono::milliseconds port_down_grace_{0};  // written before connected_ is set
  mutable std::atomic<qp_state> state_{qp_state::init};
  std::shared_ptr<conn_state> conn_;
  qp_connection_attr cattr_;
  std::string peer_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> error_reported_{false};
  std::uint8_t conn_port_ = 0;  // written before connected_ is set
};

}  // namespace conveyor::verbs
