// The soft provider's progress engine: one epoll set per device holding every
// connected QP's socket. In thread mode a dedicated thread runs it (spinning for
// device_options::spin_us after activity, then blocking in epoll_wait, so an
// idle engine costs no CPU); in manual mode CQ poll/wait calls progress().
#pragma once

#include "core/sw_cq.hpp"

#include <sys/epoll.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace conveyor::soft {

class soft_qp;

class engine final : public detail::progress_source {
 public:
  engine(bool own_thread, std::uint32_t spin_us);
  ~engine() override;
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  bool ok() const noexcept { return epfd_ >= 0 && wake_ >= 0; }
  // Adds a connected QP's socket (EPOLLIN); the QP must detach() before it dies.
  void attach(soft_qp* qp, int fd) noexcept;
  // Removes the QP; on return the engine no longer touches it.
  void detach(soft_qp* qp, int fd) noexcept;
  // Asks for EPOLLOUT on fd (the QP has bytes the socket would not take).
  void want_write(soft_qp* qp, int fd, bool on) noexcept;

  void progress() noexcept override;
  int wait_fd() const noexcept override { return epfd_; }

 private:
  void run();
  int dispatch(int timeout_ms) noexcept;  // events handled
  void handle(const epoll_event* evs, int n) noexcept;

  int epfd_ = -1;
  int wake_ = -1;
  std::uint32_t spin_us_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;                 // live_ and current_
  std::condition_variable cv_;
  std::unordered_set<soft_qp*> live_;
  soft_qp* current_ = nullptr;
  std::atomic<std::thread::id> progress_thread_{};
  std::mutex progress_mu_;        // one progressing thread at a time (manual mode)
  std::thread thread_;
};

}  // namespace conveyor::soft
