#include "providers/soft/engine/engine.hpp"

#include "providers/soft/engine/soft_qp.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>

namespace conveyor::soft {

engine::engine(bool own_thread, std::uint32_t spin_us, bool park) : spin_us_(spin_us), park_(park) {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ >= 0 && wake_ >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_, &ev);
  }
  if (own_thread && ok()) {
    thread_ = std::thread([this] { run(); });
    // Named so tools can tell the provider's engine (the "NIC") from the
    // application's threads in /proc/PID/task/*/comm (conveyor kv bench --server-pid).
    ::pthread_setname_np(thread_.native_handle(), "cv-soft-engine");
  }
}

engine::~engine() {
  stop_.store(true);
  if (wake_ >= 0) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (epfd_ >= 0) ::close(epfd_);
  if (wake_ >= 0) ::close(wake_);
}

void engine::attach(soft_qp* qp, int fd) noexcept {
  {
    std::lock_guard lk(mu_);
    live_.insert(qp);
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = qp;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
}

void engine::set_interest(soft_qp* qp, int fd, bool read, bool write) noexcept {
  epoll_event ev{};
  ev.events = (read ? EPOLLIN | EPOLLRDHUP : 0u) | (write ? EPOLLOUT : 0u);
  ev.data.ptr = qp;
  ::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
}

void engine::watch(soft_qp* qp, int fd) noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = qp;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
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
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_, &v, sizeof v);
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

namespace {
std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void engine::idle() noexcept {
  app_poll_ns_.store(0);
  if (parked_.load()) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_, &one, sizeof one);
  }
}

void engine::progress() noexcept {
  if (park_ && thread_.joinable()) app_poll_ns_.store(now_ns(), std::memory_order_relaxed);
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
  const std::int64_t window = std::chrono::nanoseconds(app_window).count();
  while (!stop_.load(std::memory_order_relaxed)) {
    // An application thread is polling and progressing the sockets itself: stay
    // off epoll so arrivals do not wake this thread too (on 2 cores that wake-up
    // preempts the poller). idle() or the window running out brings it back.
    std::int64_t last = app_poll_ns_.load();
    if (last != 0 && now_ns() - last < window) {
      parked_.store(true);
      last = app_poll_ns_.load();  // re-check after publishing parked_ (idle() race)
      const std::int64_t left = last == 0 ? 0 : window - (now_ns() - last);
      if (left > 0) {
        pollfd p{wake_, POLLIN, 0};
        timespec ts{0, static_cast<long>(left)};
        if (::ppoll(&p, 1, &ts, nullptr) > 0) {
          std::uint64_t v;
          [[maybe_unused]] auto r = ::read(wake_, &v, sizeof v);
        }
      }
      parked_.store(false);
      continue;
    }
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
    std::lock_guard pl(progress_mu_);
    progress_thread_ = std::this_thread::get_id();
    if (poll_once() > 0) last_activity = clk::now();
    progress_thread_.store(std::thread::id{});
  }
}

}  // namespace conveyor::soft
