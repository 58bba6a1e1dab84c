// The shm provider's device, protection domain, memory region and progress
// engine. The engine polls the shared rings of the device's connected QPs: in
// thread mode a dedicated thread spins engine_spin_us after activity, then
// flags itself asleep in each segment and blocks in epoll on the QPs' Unix
// sockets (the peer rings a one-byte doorbell only while that flag is set); in
// manual mode CQ poll/wait drive it. Each step (a spin of the thread, or an
// application's poll) looks at the *hot* QPs (those that moved within
// engine_spin_us) and at the cold ones whose bit
// a peer set in the device's hint page (shm_segment.hpp, hint_page), so a step
// costs what the active QPs cost, not one look per connected QP. The few cold
// QPs that have no hint (no bit left, or a peer that could not map the page)
// are looked at a few a step in turn.
#pragma once

#include "providers/shm/net/unix_socket.hpp"
#include "providers/shm/shm_peer_maps.hpp"
#include "providers/shm/wire/segment.hpp"
#include "providers/swnic/sw_device.hpp"
#include "providers/swnic/sw_engine.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace conveyor::shm {

class shm_qp;

class engine final : public swnic::sw_engine {
 public:
  engine(bool own_thread, std::uint32_t spin_us, bool park);
  ~engine() override;

  // The device's hint page (-1: none, then QPs get no bit) and its bits, one
  // per QP for the QP's life: take_hint_bit answers no_hint when none is left.
  int hint_fd() const noexcept { return hint_fd_; }
  std::uint32_t take_hint_bit() noexcept;
  void give_hint_bit(std::uint32_t bit) noexcept;

  void attach(shm_qp* qp, int fd) noexcept;
  // Every attached QP fails what still uses `key` (shm_qp::fence_local_key).
  void fence_local_key(std::uint32_t key) noexcept;
  // On return the engine no longer touches qp.
  void detach(shm_qp* qp, int fd) noexcept;

  // Application threads polling a CQ of the device. In thread mode this also
  // parks the engine thread (it stays off the rings and costs no CPU) while an
  // application keeps polling, until app_window passes without a poll or
  // idle() says the application is about to sleep.
  void progress() noexcept override;
  // Manual mode: flags this side asleep in every segment (peers then ring its
  // doorbell) and looks at the rings once more. The flags stay set while any
  // thread sleeps in a wait (end_wait counts it out); a poll clears them only
  // when none does.
  bool prepare_wait() noexcept override;
  void end_wait() noexcept override;

 private:
  void run() override;
  int poll_all_locked() noexcept;  // ring work done
  // The hinted QPs, the hot ones, then cold_per_step unhinted cold ones in
  // turn; a cold QP that moves turns hot, a hot one idle for engine_spin_us
  // turns cold (asking its peer for a hint first). Ring work done.
  int poll_step_locked(std::int64_t now) noexcept;
  int take_hints_locked() noexcept;  // the QPs whose bits peers set: made hot, looked at
  void make_hot_locked(shm_qp* qp) noexcept;
  static constexpr std::size_t cold_per_step = 16;
  void sleep_flags_locked(bool on) noexcept;
  void socket_events_locked(int timeout_ms, std::unique_lock<std::mutex>* unlock,
                            bool drain) noexcept;

  const bool manual_;
  std::int64_t last_socket_check_ns_ = 0;  // under mu_
  bool asleep_ = false;                    // manual: sleep flags set (under mu_)
  std::uint32_t sleepers_ = 0;             // manual: threads between prepare_wait and end_wait
  std::mutex mu_;                          // live_, hot_ and every QP's engine-side state
  std::vector<shm_qp*> live_;
  std::vector<shm_qp*> hot_;
  std::vector<shm_qp*> unhinted_;  // live QPs no peer hints: the cold ones are looked at in turn
  std::size_t cold_cursor_ = 0;    // the next place in unhinted_ to look for a cold QP
  // The hint page (ours, written by peers: every bit only a reason to look).
  int hint_fd_ = -1;
  std::atomic<std::uint64_t>* hints_ = nullptr;
  std::vector<shm_qp*> by_hint_;  // bit -> the attached, hinted QP holding it (or null)
  std::vector<std::uint32_t> free_bits_;
  std::uint32_t next_bit_ = 0;  // bits [0, next_bit_) were handed out at some point
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

class shm_device final : public swnic::sw_device {
 public:
  shm_device(std::string name, const device_options& opts, bool cma, bool direct);
  ~shm_device() override;
  result<std::shared_ptr<detail::pd_impl>> alloc_pd() override;
  result<std::unique_ptr<detail::listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) override;
  result<std::unique_ptr<detail::listener_impl>> bind_ephemeral_listener(int backlog) override;
  // Binds a listening socket at `a` (`address` in shm's syntax; null and
  // empty: the kernel's autobind name, read back).
  result<std::unique_ptr<detail::listener_impl>> listen_at(const net::unix_address* a,
                                                           std::string address, int backlog);

  shm::engine& eng() noexcept { return *engine_owned_; }
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
  void key_revoked(std::uint32_t key) noexcept override { eng().fence_local_key(key); }
  bool lookup_direct(std::uint32_t key, std::uint32_t pd_id, map_answer& out) noexcept;
  // Direct mapping, mapping side: peers' files as this device's QPs map them.
  peer_mappings& peer_maps() noexcept { return peer_maps_; }

 private:
  result<void> revocation_page_locked();
  std::unique_ptr<shm::engine> engine_owned_;
  bool cma_;
  bool direct_;
  std::mutex direct_mu_;
  std::unordered_map<std::uint32_t, direct_region> regions_;  // allocated, by key
  int rev_fd_ = -1;  // the revocation page: revocation_words 8-byte words
  std::uint64_t rev_ino_ = 0;
  std::atomic<std::uint64_t>* rev_ = nullptr;
  std::uint64_t next_gen_ = 1;
  peer_mappings peer_maps_;
};

class shm_pd final : public swnic::sw_pd {
 public:
  shm_pd(std::shared_ptr<shm_device> dev, std::uint32_t id) : sw_pd(std::move(dev), id) {}
  result<std::shared_ptr<detail::mr_impl>> allocate_memory(std::size_t len, access rights) override;
  shm_device& dev() noexcept { return static_cast<shm_device&>(sw_pd::dev()); }

 protected:
  std::shared_ptr<detail::qp_impl> make_qp(swnic::qp_args&& a) override;
};

// A region allocated by shm_pd::allocate_memory: owns the memfd and its
// mapping (map_len bytes), published for direct mapping until deregistered.
class shm_mr final : public swnic::sw_mr {
 public:
  shm_mr(std::shared_ptr<shm_pd> pd, std::span<std::byte> buf, access rights, std::uint32_t key,
         int memfd, std::size_t map_len);
  ~shm_mr() override;
  void deregister() noexcept override;

 private:
  shm_device& dev() noexcept { return static_cast<shm_pd&>(pd()).dev(); }
  int memfd_;
  std::size_t map_len_;
};

std::vector<device_info> list_devices();
result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts);

}  // namespace conveyor::shm
