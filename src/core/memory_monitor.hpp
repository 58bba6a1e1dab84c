// The registration cache's memory monitor: one process-wide userfaultfd whose
// thread reads UFFD_EVENT_UNMAP/REMOVE/REMAP and tells every subscribed cache
// which address ranges changed. docs/REGISTRATION-CACHE.md explains the
// choice; the rules that keep it deadlock-free are:
//  - events are read and applied under regcache_mutex(), so an unmapping
//    thread (which the kernel holds until its event is read) cannot look an
//    entry up between the read and the invalidation;
//  - nothing done under regcache_mutex(), and nothing the monitor thread does,
//    frees memory or unmaps pages (a free() could trim the heap over a watched
//    range, and the thread would then wait for an event only it could read):
//    dropped entries go to a list that callers reap after unlocking.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace conveyor::detail {

// Implemented by each cache; called with regcache_mutex() held, never frees.
class regcache_sink {
 public:
  // [start, end) changed: drop every entry that overlaps it.
  virtual void invalidate_locked(std::uintptr_t start, std::uintptr_t end) noexcept = 0;

 protected:
  ~regcache_sink() = default;
};

// The lock over the monitor's events and every cache's index.
std::mutex& regcache_mutex() noexcept;

class uffd_monitor {
 public:
  // The process's monitor (created at the first call, never destroyed).
  static uffd_monitor& get() noexcept;
  // This process's id without a system call (a forked child's after fork).
  static int pid() noexcept;

  // Adds a sink; the first starts the monitor (userfaultfd and thread).
  // Returns "" when the monitor runs, else why not (the sink is added anyway
  // and is told nothing). Not under regcache_mutex().
  std::string subscribe(regcache_sink* s);
  // Removes a sink; the last stops the thread and closes the userfaultfd
  // (which unregisters every watched range). Bounded: the thread wakes on an
  // eventfd. Not under regcache_mutex().
  void unsubscribe(regcache_sink* s) noexcept;

  // Under regcache_mutex(): reads and applies every pending event; false when
  // the monitor does not run (never started, failed, or this is a forked
  // child), in which case nothing may be served from a cache.
  bool sync_locked() noexcept;
  bool running_locked() const noexcept { return running_; }
  // Under regcache_mutex(): a count of the events applied so far, and whether
  // an event since `seq` touched [start, end) (true too when too many
  // happened to tell).
  std::uint64_t seq_locked() const noexcept { return seq_; }
  bool touched_since_locked(std::uint64_t seq, std::uintptr_t start,
                            std::uintptr_t end) const noexcept;
  // Not under regcache_mutex(): starts watching the mappings that hold
  // [start, end). False when they cannot be watched: not all private
  // anonymous memory, not all mapped, or the kernel refused.
  bool watch(std::uintptr_t start, std::uintptr_t end) noexcept;
  // Under regcache_mutex(): "" when running, else why not (a fixed buffer:
  // nothing under the lock allocates).
  const char* status_locked() const noexcept { return status_; }

 private:
  uffd_monitor() = default;
  void start();
  void stop() noexcept;
  void run() noexcept;
  bool read_events_locked() noexcept;
  void fail_locked(const char* why) noexcept;
  void apply_locked(std::uintptr_t start, std::uintptr_t end) noexcept;
  void set_status_locked(const char* why) noexcept;
  static void at_fork_child() noexcept;

  static constexpr std::size_t max_sinks = 64;
  static constexpr std::size_t ring_size = 256;
  struct event_range {
    std::uintptr_t start = 0, end = 0;
  };

  std::mutex lifecycle_mu_;  // subscribe/unsubscribe; before regcache_mutex()
  // Under regcache_mutex():
  regcache_sink* sinks_[max_sinks] = {};
  std::size_t nsinks_ = 0;
  bool running_ = false;   // events are read: caches may serve
  bool stopping_ = false;  // the thread is to leave
  bool failed_ = false;    // reading failed: serve nothing, keep reading slowly
  bool forked_ = false;
  char status_[160] = "not started";
  std::uint64_t seq_ = 0;
  event_range ring_[ring_size];
  // Set by start()/stop() (under lifecycle_mu_), read anywhere.
  std::atomic<int> uffd_{-1};
  std::atomic<int> wake_fd_{-1};        // eventfd: stop the thread
  std::atomic<int> maps_fd_{-1};        // /proc/self/maps, for PROCMAP_QUERY
  std::atomic<bool> maps_query_{true};  // false: the kernel has none; read the text
  void* thread_ = nullptr;              // std::thread*, leaked in a forked child
};

}  // namespace conveyor::detail
