// The skeleton every software provider's progress engine shares: an epoll set
// with a wake-up eventfd, an optional thread of its own (named, so tools can
// tell the "NIC" from the application), and parking: while an application
// thread keeps polling a CQ of the device (and so runs the engine itself) the
// engine thread stays off its descriptors and costs no wake-ups, until
// app_window passes without a poll or idle() says the poller is about to
// sleep. A provider derives, implements run() (its loop) and progress() (one
// step for a polling application), and calls start_thread()/stop_thread().
#pragma once

#include "providers/swnic/sw_cq.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace conveyor::swnic {

class sw_engine : public detail::progress_source {
 public:
  ~sw_engine() override;
  sw_engine(const sw_engine&) = delete;
  sw_engine& operator=(const sw_engine&) = delete;

  bool ok() const noexcept { return epfd_ >= 0 && wake_ >= 0; }
  void idle() noexcept override;
  int wait_fd() const noexcept override { return epfd_; }
  static constexpr std::chrono::microseconds app_window{1000};

  static std::int64_t now_ns() noexcept;

 protected:
  // spin_us: how long the thread busy-polls after activity; park: whether it
  // parks while an application polls (device_options::software.engine_park).
  sw_engine(std::uint32_t spin_us, bool park);
  // Starts run() on a thread named `name`; call at the end of the derived
  // constructor. stop_thread() joins it; call first in the derived destructor.
  void start_thread(const char* name);
  void stop_thread() noexcept;
  virtual void run() = 0;
  bool threaded() const noexcept { return thread_.joinable(); }
  bool stopping() const noexcept { return stop_.load(std::memory_order_relaxed); }

  // progress(): an application thread polls now (parks the engine thread).
  // now: the caller's clock reading, or 0 to read the clock here if needed.
  void note_app_poll(std::int64_t now = 0) noexcept {
    if (park_ && threaded())
      app_poll_ns_.store(now != 0 ? now : now_ns(), std::memory_order_relaxed);
  }
  // run(): if an application polled within app_window, park until the window
  // passes or idle() wakes us, and return true (the loop goes round again).
  bool park_while_app_polls() noexcept;
  // epoll_ctl on epfd_ with the QP (or other object) as the event's data.ptr.
  void watch_fd(int op, int fd, void* owner, std::uint32_t events) noexcept;
  void kick() noexcept;        // wakes a thread blocked on epfd_ or parked
  void drain_wake() noexcept;  // consumes kick()s

  int epfd_ = -1;  // the provider adds its descriptors (data.ptr != nullptr)
  int wake_ = -1;  // in epfd_ with data.ptr == nullptr
  const std::uint32_t spin_us_;

 private:
  const bool park_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> app_poll_ns_{0};  // last application progress (0: none)
  std::atomic<bool> parked_{false};
  std::thread thread_;
};

}  // namespace conveyor::swnic
