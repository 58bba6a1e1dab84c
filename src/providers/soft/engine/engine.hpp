// The soft provider's progress engine: one epoll set per device holding every
// connected QP's socket. In thread mode a dedicated thread runs it: it polls the
// sockets without sleeping for device_options::software.engine_spin_us after activity,
// then blocks in epoll_wait, so an idle engine costs no CPU; while an
// application thread keeps polling a CQ it parks instead (engine_park). In
// manual mode CQ poll/wait calls progress().
#pragma once

#include "providers/swnic/sw_engine.hpp"

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace conveyor::soft {

class soft_qp;

class engine final : public swnic::sw_engine {
 public:
  engine(bool own_thread, std::uint32_t spin_us, bool park);
  ~engine() override;
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Adds a connected QP's socket (EPOLLIN); the QP must detach() before it dies.
  void attach(soft_qp* qp, int fd) noexcept;
  // Removes the QP; on return the engine no longer touches it.
  void detach(soft_qp* qp, int fd) noexcept;
  // Returns once no thread is handling an event of `qp` (e.g. detaching it).
  void quiesce(soft_qp* qp) noexcept;
  // Asks for EPOLLOUT on fd (the QP has bytes the socket would not take).
  void want_write(soft_qp* qp, int fd, bool on) noexcept { set_interest(qp, fd, true, on); }
  // The socket's events: EPOLLIN/EPOLLRDHUP when `read`, EPOLLOUT when `write`
  // (EPOLLHUP and EPOLLERR always). A QP that stopped reading drops `read`.
  void set_interest(soft_qp* qp, int fd, bool read, bool write) noexcept;
  // Adds another descriptor of an attached QP (its linger timer): its
  // readiness comes to the QP's on_events like the socket's. Closing the
  // descriptor removes it.
  void watch(soft_qp* qp, int fd) noexcept;

  // Called by application threads polling a CQ of this device. In thread mode
  // it also tells the engine thread that an application is progressing the
  // sockets, so the engine thread parks (stays off epoll, costs no wake-ups)
  // until no poll has happened for app_window or idle() is called.
  void progress() noexcept override;

 private:
  void run() override;
  int dispatch(int timeout_ms) noexcept;  // events handled
  void handle(const epoll_event* evs, int n) noexcept;
  // One non-blocking progress step of a spinning thread (under progress_mu_):
  // while inbound traffic keeps arriving on one QP, read that QP's socket
  // directly (one recv instead of epoll_wait + recv on the latency path), and
  // ask epoll every hot_epoll_every-th step so other QPs and EPOLLOUT still
  // get served. Returns > 0 when something was handled.
  int poll_once() noexcept;
  static constexpr std::uint32_t hot_streak_min = 4;   // arrivals in a row on one QP
  static constexpr std::uint32_t hot_epoll_every = 8;  // steps

  std::mutex mu_;  // live_ and current_
  std::condition_variable cv_;
  std::unordered_set<soft_qp*> live_;
  soft_qp* current_ = nullptr;
  // The QP of the last inbound events and how many arrivals in a row were its
  // (mu_ for writes; read by the progressing thread).
  soft_qp* hot_ = nullptr;
  std::uint32_t hot_streak_ = 0;
  std::uint32_t steps_ = 0;  // poll_once calls (progress_mu_)
  std::atomic<std::thread::id> progress_thread_{};
  std::mutex progress_mu_;  // one progressing thread at a time (manual mode)
};

}  // namespace conveyor::soft
