#include "providers/swnic/handshake_pump.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.hpp"

namespace conveyor::detail {

namespace {

using clk = std::chrono::steady_clock;

// The listener thread never sleeps longer than this (it also wakes for every
// event and for its stop signal).
constexpr int max_wait_ms = 1000;
// Out of descriptors with nothing to evict: accept again after this long.
constexpr std::chrono::milliseconds emfile_pause{50};
// Connections taken from the kernel per wake-up, so the half-open ones are
// served between bursts.
constexpr int accept_burst = 64;

constexpr std::uint64_t listen_tag = ~std::uint64_t{0};
constexpr std::uint64_t wake_tag = ~std::uint64_t{0} - 1;

}  // namespace

handshake_pump::handshake_pump(int listen_fd, std::string what, handshake_limits limits,
                               make_fn make)
    : listen_fd_(listen_fd), what_(std::move(what)), limits_(limits), make_(std::move(make)) {
  if (limits_.max_pending == 0) limits_.max_pending = 1;
  if (limits_.max_ready == 0) limits_.max_ready = 1;
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    start_error_ = std::strerror(errno);
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = listen_tag;
  if (listen_fd_ < 0) {
    listen_armed_ = false;  // adopted handshakes only: never re-armed
  } else if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
    start_error_ = std::strerror(errno);
    return;
  }
  ev.data.u64 = wake_tag;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    start_error_ = std::strerror(errno);
    return;
  }
  thread_ = std::thread([this] { run(); });
}

handshake_pump::~handshake_pump() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  if (wake_fd_ >= 0) {
    const std::uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  pending_.clear();  // each handshake closes its socket
  by_fd_.clear();
  ready_.clear();  // each unaccepted request rejects its peer
  adopted_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

result<std::unique_ptr<conn_request_impl>> handshake_pump::accept(
    std::chrono::milliseconds timeout) {
  if (!start_error_.empty())
    return make_error(errc::resource_exhausted,
                      what_ + ": cannot start the listener thread: " + start_error_);
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !ready_.empty(); }))
    return make_error(errc::timed_out, what_ + ": no connection request before the timeout");
  auto r = std::move(ready_.front());
  ready_.pop_front();
  return r;
}

result<void> handshake_pump::started() const {
  if (!start_error_.empty() || !thread_.joinable())
    return make_error(errc::resource_exhausted,
                      what_ + ": cannot start the handshake thread: " + start_error_);
  return {};
}

result<void> handshake_pump::adopt(std::unique_ptr<pending_handshake> hs) {
  if (auto ok = started(); !ok) return ok;
  {
    std::lock_guard lk(mu_);
    adopted_.push_back(std::move(hs));
  }
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  return {};
}

handshake_counters handshake_pump::counters() const {
  std::lock_guard lk(mu_);
  return counters_;
}

void handshake_pump::drop(std::list<entry>::iterator it, const char* why,
                          std::uint64_t handshake_counters::*counter, const std::string& detail) {
  const int fd = it->hs->fd();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  by_fd_.erase(fd);
  if (log_enabled(log_level::info))
    log_line(log_level::info,
             what_ + ": handshake dropped (" + why + (detail.empty() ? "" : ": " + detail) + ")");
  pending_.erase(it);  // closes the socket
  std::lock_guard lk(mu_);
  ++(counters_.*counter);
  counters_.pending = pending_.size();
}

void handshake_pump::accept_new() {
  for (int i = 0; i < accept_burst; ++i) {
    const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (!pending_.empty()) {
          drop(pending_.begin(), "out of descriptors: the oldest half-open handshake makes room",
               &handshake_counters::evicted);
          continue;
        }
        // Nothing to give back: stop watching the listening socket for a while
        // (level-triggered, it would wake this thread at once, for ever).
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        listen_armed_ = false;
        rearm_at_ = clk::now() + emfile_pause;
        log_line(log_level::warn, what_ + ": out of descriptors (" + std::strerror(errno) +
                                      "); new connections wait in the kernel's backlog");
      }
      return;  // EAGAIN, or an error of the listening socket (reported by nobody: accept() times
               // out)
    }
    add_pending(make_(c));  // owns c
  }
}

void handshake_pump::add_pending(std::unique_ptr<pending_handshake> hs) {
  if (pending_.size() >= limits_.max_pending)
    drop(pending_.begin(), "too many half-open handshakes: the oldest makes room",
         &handshake_counters::evicted);
  const int c = hs->fd();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = static_cast<std::uint64_t>(c);
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev) != 0) return;  // hs closes c
  pending_.push_back(entry{std::move(hs), clk::now() + limits_.deadline});
  by_fd_[c] = std::prev(pending_.end());
  std::lock_guard lk(mu_);
  ++counters_.accepted;
  counters_.pending = pending_.size();
}

void handshake_pump::take_adopted() {
  std::vector<std::unique_ptr<pending_handshake>> in;
  {
    std::lock_guard lk(mu_);
    in.swap(adopted_);
  }
  for (auto& hs : in) add_pending(std::move(hs));
}

void handshake_pump::on_event(int fd) {
  auto f = by_fd_.find(fd);
  if (f == by_fd_.end()) return;  // dropped earlier in this round
  auto it = f->second;
  std::string why;
  switch (it->hs->on_readable(why)) {
    case pending_handshake::step::more:
      return;
    case pending_handshake::step::failed:
      drop(it, "not a valid request", &handshake_counters::failed, why);
      return;
    case pending_handshake::step::done:
      break;
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  by_fd_.erase(fd);
  std::unique_ptr<pending_handshake> hs = std::move(it->hs);
  pending_.erase(it);
  std::unique_lock lk(mu_);
  counters_.pending = pending_.size();
  if (ready_.size() >= limits_.max_ready) {
    ++counters_.busy;
    lk.unlock();
    if (log_enabled(log_level::info))
      log_line(log_level::info, what_ + ": request refused: " + std::to_string(limits_.max_ready) +
                                    " requests already wait for accept()");
    hs->refuse_busy();
    return;
  }
  lk.unlock();
  // Only this thread adds to ready_: it can only have shrunk meanwhile.
  auto req = hs->take();
  lk.lock();
  ++counters_.completed;
  if (!req) return;
  ready_.push_back(std::move(req));
  lk.unlock();
  cv_.notify_one();
}

void handshake_pump::expire() {
  const auto now = clk::now();
  // Every handshake gets the same deadline from its accept: the oldest first.
  while (!pending_.empty() && pending_.front().deadline <= now)
    drop(pending_.begin(), "deadline passed before a complete request",
         &handshake_counters::timed_out);
}

void handshake_pump::run() {
  epoll_event evs[64];
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
    }
    int wait_ms = max_wait_ms;
    const auto now = clk::now();
    if (!pending_.empty()) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(pending_.front().deadline - now).count();
      wait_ms = static_cast<int>(std::clamp<std::int64_t>(left, 0, wait_ms));
    }
    if (listen_fd_ >= 0 && !listen_armed_) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(rearm_at_ - now).count();
      wait_ms = static_cast<int>(std::clamp<std::int64_t>(left, 0, wait_ms));
    }
    const int n = ::epoll_wait(epoll_fd_, evs, 64, wait_ms);
    if (n < 0 && errno != EINTR) {
      log_line(log_level::error, what_ + ": epoll_wait: " + std::strerror(errno));
      return;
    }
    bool listen_ready = false;
    for (int i = 0; i < n; ++i) {
      const std::uint64_t tag = evs[i].data.u64;
      if (tag == wake_tag) {
        std::uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof v);
      } else if (tag == listen_tag) {
        listen_ready = true;
      } else {
        on_event(static_cast<int>(tag));
      }
    }
    take_adopted();
    expire();
    if (listen_fd_ >= 0 && !listen_armed_ && clk::now() >= rearm_at_) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = listen_tag;
      if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) == 0) listen_armed_ = true;
      listen_ready = true;
    }
    if (listen_ready && listen_armed_) accept_new();
  }
}

}  // namespace conveyor::detail
