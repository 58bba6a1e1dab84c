// The process-wide userfaultfd monitor of the registration cache
// (memory_monitor.hpp; docs/REGISTRATION-CACHE.md).
#include "core/memory_monitor.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/log.hpp"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

namespace conveyor::detail {

namespace {

// PROCMAP_QUERY (Linux 6.11, <linux/fs.h>): one VMA's facts by address,
// without parsing /proc/self/maps. Declared here for older kernel headers;
// the layout is ABI.
struct procmap_query_arg {
  std::uint64_t size;
  std::uint64_t query_flags;
  std::uint64_t query_addr;
  std::uint64_t vma_start;
  std::uint64_t vma_end;
  std::uint64_t vma_flags;
  std::uint64_t vma_page_size;
  std::uint64_t vma_offset;
  std::uint64_t inode;
  std::uint32_t dev_major;
  std::uint32_t dev_minor;
  std::uint32_t vma_name_size;
  std::uint32_t build_id_size;
  std::uint64_t vma_name_addr;
  std::uint64_t build_id_addr;
};
constexpr unsigned long procmap_query_ioctl = _IOWR('f', 17, procmap_query_arg);
constexpr std::uint64_t procmap_vma_shared = 0x08;

std::mutex g_mu;
std::atomic<pid_t> g_pid{0};

std::uintptr_t page_size() noexcept {
  static const std::uintptr_t p = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  return p;
}

std::string errno_text(const char* what, int e) {
  return std::string(what) + ": " + std::strerror(e);
}

}  // namespace

std::mutex& regcache_mutex() noexcept {
  return g_mu;
}

uffd_monitor& uffd_monitor::get() noexcept {
  // Never destroyed: a cache (or a handle) may outlive static destruction.
  static uffd_monitor* m = [] {
    auto* p = new uffd_monitor();
    g_pid.store(getpid());
    pthread_atfork(&uffd_monitor::at_fork_prepare, &uffd_monitor::at_fork_parent,
                   &uffd_monitor::at_fork_child);
    return p;
  }();
  return *m;
}

int uffd_monitor::pid() noexcept {
  get();  // the fork handlers keep g_pid right from here on
  return g_pid.load(std::memory_order_relaxed);
}

std::string uffd_monitor::subscribe(regcache_sink* s) {
  std::lock_guard life(lifecycle_mu_);
  std::lock_guard lk(g_mu);
  if (nsinks_ == max_sinks) return "more than 64 registration caches in this process";
  sinks_[nsinks_++] = s;
  if (forked_) return status_;
  if (!running_ && !start_locked()) return status_;
  return "";
}

void uffd_monitor::unsubscribe(regcache_sink* s) noexcept {
  std::lock_guard life(lifecycle_mu_);
  bool last = false;
  {
    std::lock_guard lk(g_mu);
    for (std::size_t i = 0; i < nsinks_; ++i) {
      if (sinks_[i] == s) {
        sinks_[i] = sinks_[--nsinks_];
        sinks_[nsinks_] = nullptr;
        break;
      }
    }
    last = nsinks_ == 0 && running_;
  }
  if (last) stop();
}

bool uffd_monitor::start_locked() {
  // UFFD_USER_MODE_ONLY needs no privilege even where
  // vm.unprivileged_userfaultfd is 0; only user-mode faults would reach us,
  // and we arm none (write-protect mode without UFFDIO_WRITEPROTECT).
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0 && errno == EINVAL)  // kernels before 5.11 know no UFFD_USER_MODE_ONLY
    fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) {
    status_ = errno_text("userfaultfd", errno);
    log_line(log_level::info, "registration cache: no monitor (" + status_ + "), caching nothing");
    return false;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
  if (ioctl(fd, UFFDIO_API, &api) != 0) {
    status_ = errno_text("UFFDIO_API (unmap/remove/remap events)", errno);
    ::close(fd);
    return false;
  }
  int maps = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  procmap_query_arg q{};
  q.size = sizeof q;
  q.query_addr = reinterpret_cast<std::uintptr_t>(&q);  // the stack is mapped
  if (maps < 0 || ioctl(maps, procmap_query_ioctl, &q) != 0) {
    status_ = errno_text("PROCMAP_QUERY on /proc/self/maps (Linux 6.11)", errno);
    if (maps >= 0) ::close(maps);
    ::close(fd);
    return false;
  }
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    status_ = errno_text("eventfd", errno);
    ::close(maps);
    ::close(fd);
    return false;
  }
  uffd_ = fd;
  maps_fd_ = maps;
  wake_fd_ = wake;
  stopping_ = false;
  running_ = true;
  status_.clear();
  try {
    thread_ = new std::thread([this] { run(); });
  } catch (...) {
    status_ = "cannot start the monitor thread";
    running_ = false;
    ::close(wake);
    ::close(maps);
    ::close(fd);
    uffd_ = maps_fd_ = wake_fd_ = -1;
    return false;
  }
  log_line(log_level::info, "registration cache: userfaultfd monitor started");
  return true;
}

void uffd_monitor::stop() noexcept {
  // Under lifecycle_mu_, not g_mu (the thread may be waiting for it).
  {
    std::lock_guard lk(g_mu);
    stopping_ = true;
    running_ = false;
    status_ = "stopped: no registration cache left";
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  auto* t = static_cast<std::thread*>(thread_);
  thread_ = nullptr;
  if (t != nullptr) {
    t->join();
    delete t;
  }
  // Closing the userfaultfd unregisters every watched range and releases any
  // thread the kernel still holds for an unread event.
  ::close(uffd_);
  ::close(maps_fd_);
  ::close(wake_fd_);
  uffd_ = maps_fd_ = wake_fd_ = -1;
}

void uffd_monitor::run() noexcept {
  for (;;) {
    pollfd p[2] = {{uffd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int n = ::poll(p, 2, 500);  // bounded: the stop flag is seen within 0.5 s anyway
    std::lock_guard lk(g_mu);
    if (stopping_) return;
    if (n > 0 && (p[0].revents & POLLIN) != 0) sync_locked();
    if (n > 0 && (p[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
      running_ = false;
      status_ = "the userfaultfd failed (poll error); caching nothing";
      for (std::size_t i = 0; i < nsinks_; ++i) sinks_[i]->invalidate_locked(0, UINTPTR_MAX);
      return;
    }
  }
}

bool uffd_monitor::sync_locked() noexcept {
  if (!running_) return false;
  uffd_msg msgs[16];
  for (;;) {
    ssize_t n = ::read(uffd_, msgs, sizeof msgs);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return true;
      running_ = false;  // unknown failure: serve nothing from now on
      status_ = "reading the userfaultfd failed; caching nothing";
      for (std::size_t i = 0; i < nsinks_; ++i) sinks_[i]->invalidate_locked(0, UINTPTR_MAX);
      return false;
    }
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) / sizeof(uffd_msg); ++i) {
      const uffd_msg& m = msgs[i];
      switch (m.event) {
        case UFFD_EVENT_UNMAP:
        case UFFD_EVENT_REMOVE:
          apply_locked(m.arg.remove.start, m.arg.remove.end);
          break;
        case UFFD_EVENT_REMAP:
          apply_locked(m.arg.remap.from, m.arg.remap.from + m.arg.remap.len);
          break;
        case UFFD_EVENT_PAGEFAULT: {
          // Never armed; if a kernel delivers one anyway, let the thread go on.
          uffdio_range r{m.arg.pagefault.address & ~(page_size() - 1), page_size()};
          ioctl(uffd_, UFFDIO_WAKE, &r);
          break;
        }
        default:
          apply_locked(0, UINTPTR_MAX);  // unknown: assume everything changed
          break;
      }
    }
  }
}

void uffd_monitor::apply_locked(std::uintptr_t start, std::uintptr_t end) noexcept {
  ++seq_;
  ring_[seq_ % ring_size] = {start, end};
  for (std::size_t i = 0; i < nsinks_; ++i) sinks_[i]->invalidate_locked(start, end);
}

bool uffd_monitor::touched_since_locked(std::uint64_t seq, std::uintptr_t start,
                                        std::uintptr_t end) const noexcept {
  if (seq_ - seq >= ring_size) return seq_ != seq;
  for (std::uint64_t s = seq + 1; s <= seq_; ++s) {
    const event_range& r = ring_[s % ring_size];
    if (r.start < end && start < r.end) return true;
  }
  return false;
}

bool uffd_monitor::watch(std::uintptr_t start, std::uintptr_t end) noexcept {
  // Only a subscribed cache calls this, so uffd_ and maps_fd_ stay open.
  const std::uintptr_t ps = page_size();
  const std::uintptr_t a = start & ~(ps - 1);
  const std::uintptr_t b = (end + ps - 1) & ~(ps - 1);
  std::uintptr_t first = 0, last = 0;
  for (std::uintptr_t at = a; at < b;) {
    procmap_query_arg q{};
    q.size = sizeof q;
    q.query_addr = at;  // flags 0: the VMA covering `at`, ENOENT if none
    if (ioctl(maps_fd_, procmap_query_ioctl, &q) != 0) return false;
    // Private anonymous only: shared or file-backed pages can change without
    // an unmap/remove event (shmdt, truncation, hole punching).
    if ((q.vma_flags & procmap_vma_shared) != 0 || q.inode != 0 || q.dev_major != 0 ||
        q.dev_minor != 0)
      return false;
    if (at == a) first = q.vma_start;
    last = q.vma_end;
    at = q.vma_end;
  }
  // Whole VMAs: registering part of one would split it, and the splits would
  // outlive the entries (we never unregister) and could exhaust max_map_count.
  uffdio_register r{};
  r.range.start = first;
  r.range.len = last - first;
  r.mode = UFFDIO_REGISTER_MODE_WP;
  return ioctl(uffd_, UFFDIO_REGISTER, &r) == 0;
}

void uffd_monitor::at_fork_prepare() noexcept {
  uffd_monitor& m = get();
  m.lifecycle_mu_.lock();
  g_mu.lock();
}

void uffd_monitor::at_fork_parent() noexcept {
  g_mu.unlock();
  get().lifecycle_mu_.unlock();
}

void uffd_monitor::at_fork_child() noexcept {
  // The child has no monitor thread, and its mappings are not registered with
  // the (inherited) userfaultfd (no UFFD_FEATURE_EVENT_FORK): nothing can be
  // served here. The thread object is leaked; it names a thread of the parent.
  uffd_monitor& m = get();
  g_pid.store(getpid());
  m.forked_ = true;
  m.running_ = false;
  m.thread_ = nullptr;
  for (int* fd : {&m.uffd_, &m.maps_fd_, &m.wake_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  m.status_ = "a forked child: the monitor does not run here; caching nothing";
  g_mu.unlock();
  m.lifecycle_mu_.unlock();
}

}  // namespace conveyor::detail
