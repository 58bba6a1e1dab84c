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
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <new>
#include <thread>

#include "core/log.hpp"
#include "core/proc_maps.hpp"

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

}  // namespace

std::mutex& regcache_mutex() noexcept {
  return g_mu;
}

uffd_monitor& uffd_monitor::get() noexcept {
  // Never destroyed: a cache (or a handle) may outlive static destruction.
  static uffd_monitor* m = [] {
    auto* p = new uffd_monitor();
    g_pid.store(getpid());
    pthread_atfork(nullptr, nullptr, &uffd_monitor::at_fork_child);
    return p;
  }();
  return *m;
}

int uffd_monitor::pid() noexcept {
  get();  // the fork handler keeps g_pid right from here on
  return g_pid.load(std::memory_order_relaxed);
}

void uffd_monitor::set_status_locked(const char* why) noexcept {
  std::snprintf(status_, sizeof status_, "%s", why);
}

std::string uffd_monitor::subscribe(regcache_sink* s) {
  std::lock_guard life(lifecycle_mu_);
  bool start_now = false;
  bool full = false;
  {
    std::lock_guard lk(g_mu);
    if (nsinks_ == max_sinks) {
      full = true;
    } else {
      sinks_[nsinks_++] = s;
      start_now = !forked_ && !running_ && !failed_;
    }
  }
  if (full) return "more than 64 registration caches in this process";
  if (start_now) start();
  char why[sizeof status_];
  {
    std::lock_guard lk(g_mu);
    std::memcpy(why, status_, sizeof why);
  }
  return why;  // the string is built after unlocking
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
    last = nsinks_ == 0 && thread_ != nullptr;
  }
  if (last) stop();
}

// Under lifecycle_mu_ only: nothing here may allocate under g_mu (a thread
// that holds malloc's arena lock may be waiting in brk() for an event that
// only a holder of g_mu reads).
void uffd_monitor::start() {
  char why[sizeof status_] = "";
  auto failed = [&](const char* what, int e, std::initializer_list<int> fds) {
    std::snprintf(why, sizeof why, "%s: %s", what, std::strerror(e));
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    {
      std::lock_guard lk(g_mu);
      set_status_locked(why);
    }
    log_line(log_level::info,
             std::string("registration cache: no monitor (") + why + "), caching nothing");
  };
  // UFFD_USER_MODE_ONLY needs no privilege even where
  // vm.unprivileged_userfaultfd is 0; only user-mode faults would reach us,
  // and we arm none (write-protect mode without UFFDIO_WRITEPROTECT).
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0 && errno == EINVAL)  // kernels before 5.11 know no UFFD_USER_MODE_ONLY
    fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) return failed("userfaultfd", errno, {});
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
  if (ioctl(fd, UFFDIO_API, &api) != 0)
    return failed("UFFDIO_API (unmap/remove/remap events)", errno, {fd});
  int maps = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (maps < 0) return failed("open /proc/self/maps", errno, {fd});
  procmap_query_arg q{};
  q.size = sizeof q;
  q.query_addr = reinterpret_cast<std::uintptr_t>(&q);  // the stack is mapped
  // Kernels before 6.11 (Debian 12's 6.1) answer ENOTTY: watch() then reads
  // the maps as text (proc_maps.hpp), slower but only on a miss.
  const bool query = ioctl(maps, procmap_query_ioctl, &q) == 0;
  if (!query && errno != ENOTTY && errno != EINVAL)
    return failed("PROCMAP_QUERY on /proc/self/maps", errno, {fd, maps});
  if (!query && !maps_private_anonymous(q.query_addr, q.query_addr + 1))
    return failed("/proc/self/maps: the stack is not private anonymous memory", EINVAL, {fd, maps});
  maps_query_ = query;
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return failed("eventfd", errno, {fd, maps});
  uffd_.store(fd);
  maps_fd_.store(maps);
  wake_fd_.store(wake);
  {
    std::lock_guard lk(g_mu);
    stopping_ = false;
    running_ = true;
    status_[0] = '\0';
  }
  std::thread* t = nullptr;
  try {
    t = new std::thread([this] { run(); });
  } catch (...) {
  }
  if (t == nullptr) {
    {
      std::lock_guard lk(g_mu);
      running_ = false;
      set_status_locked("cannot start the monitor thread; caching nothing");
    }
    // Closing the userfaultfd unregisters whatever a cache watched meanwhile.
    uffd_.store(-1);
    maps_fd_.store(-1);
    wake_fd_.store(-1);
    ::close(wake);
    ::close(maps);
    ::close(fd);
    return;
  }
  thread_ = t;
  log_line(log_level::info, "registration cache: userfaultfd monitor started");
}

void uffd_monitor::stop() noexcept {
  // Under lifecycle_mu_, not g_mu (the thread may be waiting for it).
  {
    std::lock_guard lk(g_mu);
    stopping_ = true;
    running_ = false;
    failed_ = false;
    set_status_locked("stopped: no registration cache left");
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_.load(), &one, sizeof one);
  auto* t = static_cast<std::thread*>(thread_);
  thread_ = nullptr;
  t->join();
  delete t;
  // Closing the userfaultfd unregisters every watched range and releases any
  // thread the kernel still holds for an unread event.
  for (std::atomic<int>* fd : {&uffd_, &maps_fd_, &wake_fd_}) ::close(fd->exchange(-1));
}

void uffd_monitor::run() noexcept {
  const int ufd = uffd_.load();
  const int wake = wake_fd_.load();
  for (;;) {
    bool slow = false;
    {
      std::lock_guard lk(g_mu);
      slow = failed_;
    }
    // Bounded waits: the stop flag is seen within 0.5 s anyway. After a
    // failure the descriptor may stay readable: retry at 100 Hz, never spin,
    // and keep reading so that no unmapping thread is held for ever.
    pollfd p[2] = {{slow ? -1 : ufd, POLLIN, 0}, {wake, POLLIN, 0}};
    int n = ::poll(p, 2, slow ? 10 : 500);
    std::lock_guard lk(g_mu);
    if (stopping_) return;
    if (slow || (n > 0 && p[0].revents != 0)) read_events_locked();
  }
}

bool uffd_monitor::sync_locked() noexcept {
  if (!running_) return false;
  return read_events_locked();
}

void uffd_monitor::fail_locked(const char* why) noexcept {
  running_ = false;
  failed_ = true;
  set_status_locked(why);
  for (std::size_t i = 0; i < nsinks_; ++i) sinks_[i]->invalidate_locked(0, UINTPTR_MAX);
}

bool uffd_monitor::read_events_locked() noexcept {
  uffd_msg msgs[16];
  const int ufd = uffd_.load(std::memory_order_relaxed);
  for (;;) {
    ssize_t n = ::read(ufd, msgs, sizeof msgs);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return running_;
      if (!failed_) fail_locked("reading the userfaultfd failed; caching nothing");
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
          ioctl(ufd, UFFDIO_WAKE, &r);
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
  if (!maps_query_.load() && !maps_private_anonymous(a, b)) return false;
  for (std::uintptr_t at = a; maps_query_.load() && at < b;) {
    procmap_query_arg q{};
    q.size = sizeof q;
    q.query_addr = at;  // flags 0: the VMA covering `at`, ENOENT if none
    if (ioctl(maps_fd_.load(), procmap_query_ioctl, &q) != 0) return false;
    // Private anonymous only: shared or file-backed pages can change without
    // an unmap/remove event (shmdt, truncation, hole punching).
    if ((q.vma_flags & procmap_vma_shared) != 0 || q.inode != 0 || q.dev_major != 0 ||
        q.dev_minor != 0)
      return false;
    at = q.vma_end;
  }
  // Exactly the range's pages, not the whole VMAs that hold them: a VMA may
  // have merged with memory that is not ours (a sanitizer's runtime, a thread
  // stack), and whoever unmaps that would then wait for the monitor, the
  // monitor thread itself included (it deadlocked so under TSan). The cost:
  // registering part of a VMA splits it, and the split stays until the pages
  // are unmapped (docs/REGISTRATION-CACHE.md, "What is left").
  uffdio_register r{};
  r.range.start = a;
  r.range.len = b - a;
  r.mode = UFFDIO_REGISTER_MODE_WP;
  return ioctl(uffd_.load(), UFFDIO_REGISTER, &r) == 0;
}

void uffd_monitor::at_fork_child() noexcept {
  // No prepare handler takes the locks: fork() takes malloc's arena locks
  // after the prepare handlers, and a thread holding one may be waiting in
  // brk() for the monitor, which would wait for g_mu. So the child makes new
  // locks (the child is one thread; whatever the parent's threads held is
  // abandoned). The child has no monitor thread, and its mappings are not
  // registered with the inherited userfaultfd (no UFFD_FEATURE_EVENT_FORK):
  // nothing can be served here. The thread object is leaked; it names a
  // thread of the parent.
  uffd_monitor& m = get();
  new (&g_mu) std::mutex();
  new (&m.lifecycle_mu_) std::mutex();
  g_pid.store(getpid());
  m.forked_ = true;
  m.running_ = false;
  m.thread_ = nullptr;
  for (std::atomic<int>* fd : {&m.uffd_, &m.maps_fd_, &m.wake_fd_}) {
    int f = fd->exchange(-1);
    if (f >= 0) ::close(f);
  }
  m.set_status_locked("a forked child: the monitor does not run here; caching nothing");
}

}  // namespace conveyor::detail
