#include "providers/soft/engine/engine.hpp"

#include "providers/soft/engine/soft_qp.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace conveyor::soft {

engine::engine(bool own_thread, std::uint32_t spin_us, bool park) : sw_engine(spin_us, park) {
  if (own_thread) start_thread("cv-soft-engine");
}

engine::~engine() {
  stop_thread();
}

void engine::attach(soft_qp* qp, int fd) noexcept {
  {
    std::lock_guard lk(mu_);
    live_.insert(qp);
  }
  watch_fd(EPOLL_CTL_ADD, fd, qp, EPOLLIN | EPOLLRDHUP);
}

void engine::set_interest(soft_qp* qp, int fd, bool read, bool write) noexcept {
  watch_fd(EPOLL_CTL_MOD, fd, qp, (read ? EPOLLIN | EPOLLRDHUP : 0u) | (write ? EPOLLOUT : 0u));
}

void engine::watch(soft_qp* qp, int fd) noexcept {
  watch_fd(EPOLL_CTL_ADD, fd, qp, EPOLLIN);
}

void engine::quiesce(soft_qp* qp) noexcept {
  std::unique_lock lk(mu_);
  if (progress_thread_ == std::this_thread::get_id()) return;
  cv_.wait(lk, [&] { return current_ != qp; });
}

void engine::detach(soft_qp* qp, int fd) noexcept {
  std::unique_lock lk(mu_);
  if (!live_.erase(qp)) return;
  if (hot_ == qp) {
    hot_ = nullptr;
    hot_streak_ = 0;
  }
  if (fd >= 0) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  if (progress_thread_ == std::this_thread::get_id()) return;  // detaching itself
  cv_.wait(lk, [&] { return current_ != qp; });
}

int engine::dispatch(int timeout_ms) noexcept {
  epoll_event evs[64];
  const int n = ::epoll_wait(epfd_, evs, 64, timeout_ms);
  if (n > 0) handle(evs, n);
  return n;
}

void engine::handle(const epoll_event* evs, int n) noexcept {
  for (int i = 0; i < n; ++i) {
    auto* qp = static_cast<soft_qp*>(evs[i].data.ptr);
    if (qp == nullptr) {
      drain_wake();
      continue;
    }
    {
      std::lock_guard lk(mu_);
      if (!live_.contains(qp)) continue;
      current_ = qp;
      if (evs[i].events & EPOLLIN) {
        hot_streak_ = hot_ == qp ? hot_streak_ + 1 : 1;
        hot_ = qp;
      }
    }
    qp->on_events(evs[i].events);
    {
      std::lock_guard lk(mu_);
      current_ = nullptr;
    }
    cv_.notify_all();
  }
}

int engine::poll_once() noexcept {
  if (++steps_ % hot_epoll_every != 0) {
    soft_qp* qp;
    {
      std::lock_guard lk(mu_);
      qp = hot_streak_ >= hot_streak_min ? hot_ : nullptr;
      if (qp != nullptr) current_ = qp;
    }
    if (qp != nullptr) {
      // A stale readiness costs one EAGAIN; a QP that stops receiving stays
      // hot until epoll reports another QP's arrival, which ends its streak.
      const bool got = qp->poll_inbound();
      {
        std::lock_guard lk(mu_);
        current_ = nullptr;
      }
      cv_.notify_all();
      return got ? 1 : 0;
    }
  }
  return dispatch(0);
}

void engine::progress() noexcept {
  note_app_poll();
  std::unique_lock pl(progress_mu_, std::try_to_lock);
  if (!pl.owns_lock()) return;
  progress_thread_ = std::this_thread::get_id();
  poll_once();
  progress_thread_.store(std::thread::id{});
}

void engine::run() {
  using clk = std::chrono::steady_clock;
  auto last_activity = clk::now();
  const auto spin = std::chrono::microseconds(spin_us_);
  while (!stopping()) {
    // An application thread is polling and progressing the sockets itself: stay
    // off epoll so arrivals do not wake this thread too (on 2 cores that wake-up
    // preempts the poller). idle() or the window running out brings it back.
    if (park_while_app_polls()) continue;
    const bool spinning = clk::now() - last_activity < spin;
    // Wait for readiness without the progress lock, then dispatch under it: an
    // application thread polling a CQ may be progressing the same sockets.
    if (!spinning) {
      epoll_event evs[64];
      const int n = ::epoll_wait(epfd_, evs, 64, 1000);
      if (n <= 0) continue;
      // An application poller may have handled these meanwhile; a stale
      // readiness costs one EAGAIN, never a wrong result.
      std::lock_guard pl(progress_mu_);
      progress_thread_ = std::this_thread::get_id();
      handle(evs, n);
      progress_thread_.store(std::thread::id{});
      last_activity = clk::now();
      continue;
    }
    bool moved;
    {
      std::lock_guard pl(progress_mu_);
      progress_thread_ = std::this_thread::get_id();
      moved = poll_once() > 0;
      progress_thread_.store(std::thread::id{});
    }
    if (moved) {
      last_activity = clk::now();
      continue;
    }
    // Nothing arrived: offer the CPU before looking again. Alone on a core the
    // yield returns at once; on a core shared with the application it feeds
    // (the peer's client, or our own application's poller) it lets that run
    // instead of spinning out the whole window while it waits: a shared-core
    // 8 B READ round trip went from 120 to 22-26 us (p50).
    std::this_thread::yield();
  }
}

}  // namespace conveyor::soft
