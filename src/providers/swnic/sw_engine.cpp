#include "providers/swnic/sw_engine.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace conveyor::swnic {

std::int64_t sw_engine::now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

sw_engine::sw_engine(std::uint32_t spin_us, bool park) : spin_us_(spin_us), park_(park) {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ >= 0 && wake_ >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_, &ev);
  }
}

sw_engine::~sw_engine() {
  stop_thread();
  if (epfd_ >= 0) ::close(epfd_);
  if (wake_ >= 0) ::close(wake_);
}

void sw_engine::start_thread(const char* name) {
  if (!ok()) return;
  thread_ = std::thread([this] { run(); });
  ::pthread_setname_np(thread_.native_handle(), name);
}

void sw_engine::stop_thread() noexcept {
  stop_.store(true);
  kick();
  if (thread_.joinable()) thread_.join();
}

void sw_engine::watch_fd(int op, int fd, void* owner, std::uint32_t events) noexcept {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = owner;
  ::epoll_ctl(epfd_, op, fd, &ev);
}

void sw_engine::kick() noexcept {
  if (wake_ < 0) return;
  std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_, &one, sizeof one);
}

void sw_engine::drain_wake() noexcept {
  std::uint64_t v;
  [[maybe_unused]] auto r = ::read(wake_, &v, sizeof v);
}

void sw_engine::idle() noexcept {
  app_poll_ns_.store(0);
  if (parked_.load()) kick();
}

bool sw_engine::park_while_app_polls() noexcept {
  const std::int64_t window = std::chrono::nanoseconds(app_window).count();
  std::int64_t last = app_poll_ns_.load();
  if (last == 0 || now_ns() - last >= window) return false;
  parked_.store(true);
  last = app_poll_ns_.load();  // re-check after publishing parked_ (idle() race)
  const std::int64_t left = last == 0 ? 0 : window - (now_ns() - last);
  if (left > 0) {
    pollfd p{wake_, POLLIN, 0};
    timespec ts{0, static_cast<long>(left)};
    if (::ppoll(&p, 1, &ts, nullptr) > 0) drain_wake();
  }
  parked_.store(false);
  return true;
}

}  // namespace conveyor::swnic
