#include "providers/swnic/sw_cq.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace conveyor::detail {

result<std::shared_ptr<sw_cq>> sw_cq::create(std::uint32_t depth, std::shared_ptr<void> keep,
                                             progress_source* engine, std::uint32_t spin_us,
                                             bool manual) {
  if (depth == 0 || depth > (1u << 22))
    return make_error(errc::invalid_argument,
                      "create_cq: depth " + std::to_string(depth) + " not in 1..4194304");
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return make_error(errc::resource_exhausted, "create_cq: eventfd", errno);
  auto cq = std::make_shared<sw_cq>(depth, efd, std::move(keep), engine, spin_us, manual);
  if (manual && engine) {
    // What fd() returns: readable when a completion is signalled or the
    // engine has work (level-triggered, as both descriptors are).
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return make_error(errc::resource_exhausted, "create_cq: epoll_create1", errno);
    cq->wfd_ = ep;
    for (int fd : {efd, engine->wait_fd()}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
        return make_error(errc::resource_exhausted, "create_cq: epoll_ctl", errno);
    }
  }
  return cq;
}

sw_cq::sw_cq(std::uint32_t depth, int efd, std::shared_ptr<void> keep, progress_source* engine,
             std::uint32_t spin_us, bool manual)
    : depth_(depth),
      efd_(efd),
      keep_(std::move(keep)),
      spin_us_(spin_us),
      engine_(engine),
      manual_(manual),
      ring_(depth) {}

sw_cq::~sw_cq() {
  if (fd_waiting_.load(std::memory_order_acquire)) engine_->end_wait();
  if (wfd_ >= 0) ::close(wfd_);
  ::close(efd_);
}

void sw_cq::notify() noexcept {
  if (armed_.exchange(false, std::memory_order_acq_rel)) {
    signal();
  }
}

bool sw_cq::push(const work_completion& wc) noexcept {
  bool ok;
  {
    std::lock_guard lk(mu_);
    ok = count_ < depth_;
    if (ok) {
      ring_[(head_ + count_) % depth_] = wc;
      ++count_;
      approx_count_.store(count_, std::memory_order_release);
    } else {
      overflow_.store(true, std::memory_order_release);
    }
  }
  notify();
  return ok;
}

std::size_t sw_cq::take(std::span<work_completion> out) noexcept {
  if (approx_count_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard lk(mu_);
  std::size_t n = 0;
  while (n < out.size() && count_ > 0) {
    out[n++] = ring_[head_];
    head_ = (head_ + 1) % depth_;
    --count_;
  }
  approx_count_.store(count_, std::memory_order_release);
  return n;
}

void sw_cq::signal() noexcept {
  signaled_.store(true, std::memory_order_release);
  std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(efd_, &one, sizeof one);
}

std::expected<std::size_t, errc> sw_cq::poll(std::span<work_completion> out) noexcept {
  // The application is awake again: the wait arm() prepared is over.
  if (fd_waiting_.load(std::memory_order_relaxed) &&
      fd_waiting_.exchange(false, std::memory_order_acq_rel))
    engine_->end_wait();
  if (overflow_.load(std::memory_order_acquire)) return std::unexpected(errc::cq_overflow);
  std::size_t n = take(out);
  if (n == 0 && engine_) {
    engine_->progress();
    n = take(out);
  }
  if (n == 0 && signaled_.load(std::memory_order_acquire)) {
    // Reset the event descriptor so level-triggered users do not spin.
    signaled_.store(false, std::memory_order_release);
    std::uint64_t v;
    [[maybe_unused]] auto r = ::read(efd_, &v, sizeof v);
  }
  return n;
}

void sw_cq::arm() noexcept {
  arm_event();
  // Manual progress: the caller is about to sleep on fd(), and only poll()
  // runs the engine. Ask the engine to be woken by new work (a shm peer then
  // rings its doorbell; soft's sockets wake wait_fd() by themselves), which
  // fd() watches; work that turned up meanwhile makes fd() readable at once.
  if (!manual_ || !engine_ || fd_waiting_.exchange(true, std::memory_order_acq_rel)) return;
  if (engine_->prepare_wait()) {
    fd_waiting_.store(false, std::memory_order_release);
    signal();
  }
}

void sw_cq::arm_event() noexcept {
  armed_.store(true, std::memory_order_release);
  // Arming means the caller is about to sleep on fd() (epoll): hand progress
  // back to the engine thread, as wait() does before it sleeps. Without this an
  // event loop that drains with poll() left the engine parked behind a poller
  // that was asleep, and each request waited out the park window (1 ms).
  if (engine_ && !manual_) engine_->idle();
  if (approx_count_.load(std::memory_order_acquire) != 0 || overflowed()) notify();
}

std::expected<std::size_t, errc> sw_cq::wait(std::span<work_completion> out,
                                             std::chrono::nanoseconds timeout) noexcept {
  using clk = std::chrono::steady_clock;
  const auto start = clk::now();
  const auto deadline = start + timeout;
  const auto spin_end = start + std::chrono::microseconds(spin_us_);
  for (;;) {
    auto r = poll(out);
    if (!r || *r > 0) {
      // The caller stops polling now: hand progress back to the engine thread,
      // as arm() does (poll() above may have run the engine and parked the
      // engine thread behind this caller). Left parked, the engine thread
      // waited out the rest of its park window (1 ms) before serving the
      // peer's next request whenever the application went on to something
      // other than polling: `conveyor ping`'s RDMA WRITE took about 1 ms after
      // the server's wait() for its echo returned within the spin. Cheap when
      // the engine thread is not parked: a store and a load.
      if (engine_ && !manual_) engine_->idle();
      return r;
    }
    const auto now = clk::now();
    if (now >= deadline) return std::unexpected(errc::timed_out);
    if (now < spin_end) {
      std::this_thread::yield();
      continue;
    }
    arm_event();  // wait() prepares the engine below itself
    r = poll(out);
    if (!r || *r > 0) return r;
    if (engine_ && !manual_) engine_->idle();  // the engine thread takes over
    if (engine_ && manual_ && engine_->prepare_wait()) continue;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clk::now()).count();
    int ms = static_cast<int>(std::min<long long>(std::max<long long>(left, 0) + 1, 1000));
    pollfd fds[2] = {{efd_, POLLIN, 0}, {manual_ ? engine_->wait_fd() : -1, POLLIN, 0}};
    ::poll(fds, manual_ ? 2 : 1, ms);
    if (engine_ && manual_) engine_->end_wait();
  }
}

}  // namespace conveyor::detail
