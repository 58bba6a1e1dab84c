// The shm provider's device, protection domain, memory region and progress
// engine. The engine polls the shared rings of every connected QP of the
// device: in thread mode a dedicated thread spins engine_spin_us after
// activity, then flags itself asleep in each segment and blocks in epoll on
// the QPs' Unix sockets (the peer rings a one-byte doorbell only while that
// flag is set); in manual mode CQ poll/wait drive it.
#pragma once

#include "core/impl.hpp"
#include "core/key_table.hpp"
#include "core/sw_cq.hpp"
#include "providers/shm/shm_segment.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace conveyor::shm {

class shm_qp;

class engine final : public detail::progress_source {
 public:
  engine(bool own_thread, std::uint32_t spin_us);
  ~engine() override;
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  bool ok() const noexcept { return epfd_ >= 0 && wake_ >= 0; }
  void attach(shm_qp* qp, int fd) noexcept;
  // On return the engine no longer touches qp.
  void detach(shm_qp* qp, int fd) noexcept;

  // Application threads polling a CQ of the device. In thread mode this also
  // parks the engine thread (it stays off the rings and costs no CPU) while an
  // application keeps polling, until app_window passes without a poll or
  // idle() says the application is about to sleep.
  void progress() noexcept override;
  void idle() noexcept override;
  int wait_fd() const noexcept override { return epfd_; }
  static constexpr std::chrono::microseconds app_window{1000};

 private:
  void run();
  int poll_all_locked() noexcept;  // ring work done
  void sleep_flags_locked(bool on) noexcept;
  void socket_events_locked(int timeout_ms, std::unique_lock<std::mutex>* unlock,
                            bool drain) noexcept;

  int epfd_ = -1;
  int wake_ = -1;
  const bool manual_;
  std::uint32_t spin_us_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> app_poll_ns_{0};  // last application progress (0: none)
  std::atomic<bool> parked_{false};
  std::int64_t last_socket_check_ns_ = 0;  // under mu_
  std::mutex mu_;                          // live_ and every QP's engine-side state
  std::vector<shm_qp*> live_;
  std::thread thread_;
};

// A region allocated through shm_pd::allocate_memory, as a peer may map it.
struct direct_region {
  int fd = -1;  // the sealed memfd (owned by the shm_mr)
  std::uint64_t ino = 0;
  std::uint64_t base = 0, len = 0, map_len = 0;
  access rights = access::none;
  std::uint32_t pd_id = 0;
  std::uint64_t gen = 0;
};

class shm_device final : public detail::device_impl {
 public:
  shm_device(std::string name, const device_options& opts, bool cma, bool direct);
  ~shm_device() override;
  result<std::shared_ptr<detail::pd_impl>> alloc_pd() override;
  result<std::shared_ptr<detail::cq_impl>> create_cq(const cq_options& opts) override;
  result<std::unique_ptr<detail::listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) override;

  detail::key_table& keys() noexcept { return keys_; }
  shm::engine& eng() noexcept { return *engine_; }
  std::uint32_t next_qpn() noexcept { return qpn_.fetch_add(1); }
  std::uint32_t next_pd_id() noexcept { return pd_id_.fetch_add(1); }
  // Cross-memory attach allowed by configuration (CONVEYOR_SHM_CMA=off forces staging).
  bool cma_enabled() const noexcept { return cma_; }
  // Peers may map allocated regions (CONVEYOR_SHM_DIRECT=off: they may not, and
  // this device does not map its peers' regions either).
  bool direct_enabled() const noexcept { return direct_; }

  // Direct mapping, owner side: publish an allocated region under `key` (its
  // revocation word then holds a fresh generation); revoke clears the word
  // first, so a peer's next access fails. lookup fills the answer to map_req.
  result<void> publish_direct(std::uint32_t key, direct_region r);
  void revoke_direct(std::uint32_t key) noexcept;
  bool lookup_direct(std::uint32_t key, std::uint32_t pd_id, map_answer& out) noexcept;

 private:
  result<void> revocation_page_locked();
  detail::key_table keys_;
  std::unique_ptr<shm::engine> engine_;
  std::atomic<std::uint32_t> qpn_{1};
  std::atomic<std::uint32_t> pd_id_{1};
  bool cma_;
  bool direct_;
  std::mutex direct_mu_;
  std::unordered_map<std::uint32_t, direct_region> regions_;  // allocated, by key
  int rev_fd_ = -1;  // the revocation page: revocation_words 8-byte words
  std::uint64_t rev_ino_ = 0;
  std::atomic<std::uint64_t>* rev_ = nullptr;
  std::uint64_t next_gen_ = 1;
};

class shm_pd final : public detail::pd_impl {
 public:
  shm_pd(std::shared_ptr<shm_device> dev, std::uint32_t id) : dev_(std::move(dev)), id_(id) {}
  result<std::shared_ptr<detail::mr_impl>> register_memory(std::span<std::byte> buf,
                                                           access rights) override;
  result<std::shared_ptr<detail::mr_impl>> allocate_memory(std::size_t len, access rights) override;
  result<std::shared_ptr<detail::qp_impl>> create_qp(const qp_init_attr& attr) override;
  shm_device& dev() noexcept { return *dev_; }
  std::uint32_t id() const noexcept { return id_; }

 private:
  std::shared_ptr<shm_device> dev_;
  std::uint32_t id_;
};

class shm_mr final : public detail::mr_impl {
 public:
  shm_mr(std::shared_ptr<shm_pd> pd, std::span<std::byte> buf, access rights, std::uint32_t key);
  // An allocated region: owns the memfd and its mapping (map_len bytes).
  shm_mr(std::shared_ptr<shm_pd> pd, std::span<std::byte> buf, access rights, std::uint32_t key,
         int memfd, std::size_t map_len);
  ~shm_mr() override;
  void deregister() noexcept override;

 private:
  std::shared_ptr<shm_pd> pd_;
  std::atomic<bool> live_{true};
  int memfd_ = -1;
  std::size_t map_len_ = 0;
};

std::vector<device_info> list_devices();
result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts);

}  // namespace conveyor::shm
