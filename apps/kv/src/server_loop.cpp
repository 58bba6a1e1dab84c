// The loop: one epoll set, an eventfd for post()/stop(), and timers kept as
// deadlines that bound the epoll_wait timeout (no timerfd per timer).
#include "server_loop.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace conveyor::kv {

namespace {
using clock = std::chrono::steady_clock;

struct watched {
  std::function<void(unsigned)> fn;
};

struct timer {
  std::uint64_t id;
  std::chrono::milliseconds period;
  clock::time_point next;
  std::function<void()> fn;
  bool dead = false;  // cancelled: skipped, then swept at an iteration's start
};

struct before_fn {
  std::uint64_t id;
  std::function<void()> fn;
  bool dead = false;
};
}  // namespace

struct server_loop::state {
  int epfd = -1;
  int wakefd = -1;
  // Shared pointers so that a callback removing its own fd (or another ready
  // in the same batch) does not destroy a function that is running.
  std::unordered_map<int, std::shared_ptr<watched>> fds;
  std::vector<timer> timers;
  std::vector<before_fn> before;
  std::uint64_t next_id = 1;
  bool swept = true;  // no cancelled entry is waiting to be removed
  std::mutex mu;      // guards posted
  std::vector<std::function<void()>> posted;
  std::atomic<bool> stopping{false};
  int running_fd = -1;  // the fd whose callback run() is in
  bool nested = false;  // in serve_ready_now
};

// The before_wait functions, by index (one may add another) and skipping the
// cancelled (one may cancel another, or itself: it is not destroyed here).
void server_loop::run_before(state& s) {
  for (std::size_t i = 0; i < s.before.size(); ++i) {
    if (s.before[i].dead) continue;
    auto fn = s.before[i].fn;
    fn();
  }
}

server_loop::server_loop() : s_(new state) {
  s_->epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (s_->epfd < 0) {
    int e = errno;
    delete s_;
    throw std::system_error(e, std::generic_category(), "server_loop: epoll_create1");
  }
  s_->wakefd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s_->wakefd < 0) {
    int e = errno;
    ::close(s_->epfd);
    delete s_;
    throw std::system_error(e, std::generic_category(), "server_loop: eventfd");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = s_->wakefd;
  if (::epoll_ctl(s_->epfd, EPOLL_CTL_ADD, s_->wakefd, &ev) != 0) {
    int e = errno;
    ::close(s_->wakefd);
    ::close(s_->epfd);
    delete s_;
    throw std::system_error(e, std::generic_category(), "server_loop: epoll_ctl(eventfd)");
  }
}

server_loop::~server_loop() {
  ::close(s_->wakefd);
  ::close(s_->epfd);
  delete s_;
}

void server_loop::add_fd(int fd, unsigned events, std::function<void(unsigned)> on_ready) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (::epoll_ctl(s_->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
    throw std::system_error(errno, std::generic_category(), "server_loop: epoll_ctl(ADD)");
  s_->fds[fd] = std::make_shared<watched>(watched{std::move(on_ready)});
}

void server_loop::modify_fd(int fd, unsigned events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  ::epoll_ctl(s_->epfd, EPOLL_CTL_MOD, fd, &ev);
}

void server_loop::remove_fd(int fd) {
  ::epoll_ctl(s_->epfd, EPOLL_CTL_DEL, fd, nullptr);
  s_->fds.erase(fd);
}

server_loop::callback_id server_loop::every(std::chrono::milliseconds period,
                                            std::function<void()> fn) {
  if (period.count() <= 0) period = std::chrono::milliseconds(1);
  const auto id = s_->next_id++;
  s_->timers.push_back(timer{id, period, clock::now() + period, std::move(fn)});
  return id;
}

server_loop::callback_id server_loop::before_wait(std::function<void()> fn) {
  const auto id = s_->next_id++;
  s_->before.push_back(before_fn{id, std::move(fn)});
  return id;
}

void server_loop::cancel(callback_id id) {
  for (auto& t : s_->timers)
    if (t.id == id) t.dead = true;
  for (auto& b : s_->before)
    if (b.id == id) b.dead = true;
  s_->swept = false;
}

void server_loop::post(std::function<void()> fn) {
  {
    std::lock_guard lock(s_->mu);
    s_->posted.push_back(std::move(fn));
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(s_->wakefd, &one, sizeof one);
}

void server_loop::stop() {
  s_->stopping.store(true, std::memory_order_release);
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(s_->wakefd, &one, sizeof one);
}

void server_loop::serve_ready_now() {
  if (s_->nested) return;
  s_->nested = true;
  struct reset {
    bool& b;
    ~reset() { b = false; }
  } guard{s_->nested};
  constexpr int max_events = 64;
  epoll_event events[max_events];
  int n = ::epoll_wait(s_->epfd, events, max_events, 0);
  for (int i = 0; i < n; ++i) {
    int fd = events[i].data.fd;
    if (fd == s_->wakefd || fd == s_->running_fd) continue;  // level-triggered: seen again later
    auto it = s_->fds.find(fd);
    if (it == s_->fds.end()) continue;
    auto w = it->second;
    w->fn(events[i].events);
  }
  run_before(*s_);
}

void server_loop::run() {
  constexpr int max_events = 256;
  epoll_event events[max_events];
  std::vector<std::function<void()>> batch;
  while (!s_->stopping.load(std::memory_order_acquire)) {
    if (!s_->swept) {  // no callback of this loop is running here
      std::erase_if(s_->timers, [](const timer& t) { return t.dead; });
      std::erase_if(s_->before, [](const before_fn& b) { return b.dead; });
      s_->swept = true;
    }
    run_before(*s_);
    int timeout_ms = 1000;  // wake up at least once a second even with no timer
    auto now = clock::now();
    for (auto& t : s_->timers) {
      if (t.dead) continue;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(t.next - now).count();
      if (left < 0) left = 0;
      if (left < timeout_ms) timeout_ms = static_cast<int>(left);
    }
    int n = ::epoll_wait(s_->epfd, events, max_events, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "server_loop: epoll_wait");
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == s_->wakefd) {
        std::uint64_t v;
        [[maybe_unused]] auto r = ::read(s_->wakefd, &v, sizeof v);
        {
          std::lock_guard lock(s_->mu);
          batch.swap(s_->posted);
        }
        for (auto& fn : batch) fn();
        batch.clear();
        continue;
      }
      auto it = s_->fds.find(fd);
      if (it == s_->fds.end()) continue;  // removed by an earlier callback of this batch
      auto w = it->second;
      s_->running_fd = fd;
      w->fn(events[i].events);
      s_->running_fd = -1;
      if (s_->stopping.load(std::memory_order_acquire)) return;
    }
    now = clock::now();
    // Index loop: a timer callback may add timers (push_back invalidates references).
    for (std::size_t i = 0; i < s_->timers.size(); ++i) {
      if (s_->timers[i].dead || s_->timers[i].next > now) continue;
      s_->timers[i].next = now + s_->timers[i].period;
      auto fn = s_->timers[i].fn;
      fn();
    }
  }
}

}  // namespace conveyor::kv
