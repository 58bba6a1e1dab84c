// conveyor/registration_cache.hpp — a safe registration cache: the second
// registration of the same range (or of a range inside a cached one, with
// rights it has) is a lookup instead of a provider call.
//
//   auto cache = registration_cache::create(pd).value();
//   auto reg = cache.acquire(std::as_writable_bytes(std::span(buf)), access::local_write).value();
//   qp.post_recv(reg.as_sge(), 1);     // ... wait for the completion ...
//   reg.release();                     // or let the handle go; the registration stays cached
//
// Safety. A cached range is never served after the memory under it changed:
// munmap (also free() of a large block, brk trimming the heap, mmap MAP_FIXED
// over it), mremap (moved, shrunk) and madvise(MADV_DONTNEED/MADV_FREE/
// MADV_REMOVE) all drop the entries they touch before the call that caused them
// can return to its caller. How: one process-wide userfaultfd, opened with
// UFFD_USER_MODE_ONLY (so it needs no privilege where
// /proc/sys/vm/unprivileged_userfaultfd is 0), registers each cached range's
// pages in write-protect mode, which never arms a fault, only the events
// UFFD_EVENT_UNMAP, UFFD_EVENT_REMOVE and UFFD_EVENT_REMAP. The kernel holds
// the unmapping thread until a monitor thread has read the event, and the
// monitor reads and applies events under the cache's lock, and acquire()
// drains pending events first, so no acquire after the unmapping call returns
// can see the old entry. Only private anonymous memory is cached (heap, stack,
// anonymous mmap): shared or file-backed pages can change without any of those
// events (shmdt, ftruncate, fallocate punching a hole), so such ranges are
// registered uncached. docs/REGISTRATION-CACHE.md has the reasoning, the
// alternatives (memory hooks as UCX and Open MPI do, validation on every hit)
// and what is left.
//
// Fail-safe. Where the monitor cannot run (no userfaultfd: seccomp, an old
// kernel, CONVEYOR_REGCACHE=0, options.enabled false, a forked child, a
// monitor error) the cache caches nothing: acquire() registers anew and the
// registration ends at release. monitor() and stats().monitor_status say which
// and why.
//
// What stays true on every provider: verbs pins the pages at registration, so
// a stale entry would make the NIC move the old pages; soft and shm reach
// memory through the virtual address, so a stale entry would move whatever is
// mapped there now, or fault on an unmapped range. The cache treats both alike.
//
// Keys: a released entry stays registered until evicted, invalidated or
// flushed, so a peer that was given its rkey can still reach that memory with
// the entry's rights. Cache remote rights only for memory you would keep
// registered anyway, or call flush().
//
// Thread safety: a registration_cache may be used from any number of threads
// at once; a cached_registration is thread-compatible (one owner). Handles keep
// the cache state and the protection domain alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "conveyor/error.hpp"
#include "conveyor/export.hpp"
#include "conveyor/mr.hpp"
#include "conveyor/pd.hpp"

namespace conveyor {

namespace detail {
class regcache_state;
struct regcache_entry;
}  // namespace detail

// What tells the cache that memory changed under a cached range.
enum class memory_monitor : std::uint8_t {
  none,         // nothing: the cache caches nothing (every acquire registers)
  userfaultfd,  // the process-wide userfaultfd monitor
};
CONVEYOR_API const char* to_string(memory_monitor m) noexcept;

struct registration_cache_options {
  // Bounds over every cached registration, in use or not. Over them, the least
  // recently used unused entries are deregistered; a registration that still
  // does not fit (all entries in use, or one range larger than max_bytes) is
  // handed out uncached.
  std::size_t max_entries = 1024;
  std::size_t max_bytes = std::size_t(1) << 30;
  // false: no monitor, nothing cached (the API without the cache). The
  // environment variable CONVEYOR_REGCACHE=0 forces false.
  bool enabled = true;
};

struct registration_cache_stats {
  memory_monitor monitor = memory_monitor::none;
  std::string monitor_status;  // "" when the monitor runs, else why not
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;         // acquires that registered
  std::uint64_t uncached = 0;       // of those, handed out uncached (see above)
  std::uint64_t evictions = 0;      // unused entries dropped for the bounds
  std::uint64_t invalidations = 0;  // entries dropped because their memory changed
  std::size_t entries = 0;          // cached entries (in use or not)
  std::size_t bytes = 0;            // bytes they cover
  std::size_t in_use = 0;           // entries some handle holds
};

// One use of a registration: the requested range, backed by a registration
// that covers it (maybe a larger one) with at least the requested rights.
// Move-only; releasing (or destroying) it ends this use. An uncached
// registration is deregistered then; a cached one stays for the next acquire.
class CONVEYOR_API cached_registration {
 public:
  cached_registration() = default;
  cached_registration(cached_registration&& o) noexcept;
  cached_registration& operator=(cached_registration&& o) noexcept;
  cached_registration(const cached_registration&) = delete;
  cached_registration& operator=(const cached_registration&) = delete;
  ~cached_registration();

  explicit operator bool() const noexcept { return entry_ != nullptr; }

  // The requested range.
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::uint64_t addr() const noexcept { return reinterpret_cast<std::uintptr_t>(data_); }
  // The keys and rights of the registration behind it.
  std::uint32_t lkey() const noexcept;
  std::uint32_t rkey() const noexcept;
  access rights() const noexcept;
  // The registration itself (it may cover more than the requested range).
  const memory_region& region() const noexcept;
  // Whether the registration stays cached after release.
  bool cached() const noexcept;

  // SGEs and the remote_region of the requested range (offsets from data()).
  sge as_sge() const noexcept { return slice(0, size_); }
  sge slice(std::size_t offset, std::size_t len) const noexcept {
    constexpr std::size_t max_len = 0xFFFFFFFFu;
    return {addr() + offset, static_cast<std::uint32_t>(len < max_len ? len : max_len), lkey()};
  }
  remote_region remote() const noexcept { return {addr(), size_, rkey()}; }

  // Ends this use now (the destructor does the same). Never blocks without
  // bound; deregisters an uncached registration.
  void release() noexcept;

 private:
  friend class detail::regcache_state;
  std::shared_ptr<detail::regcache_state> cache_;
  detail::regcache_entry* entry_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

class CONVEYOR_API registration_cache {
 public:
  registration_cache() = default;
  registration_cache(registration_cache&&) noexcept = default;
  registration_cache& operator=(registration_cache&&) noexcept = default;
  registration_cache(const registration_cache&) = delete;
  registration_cache& operator=(const registration_cache&) = delete;
  ~registration_cache();

  // A cache over `pd` (kept alive by the cache). Errors: invalid_argument
  // (empty pd, a bound of 0). A missing monitor is not an error: see monitor().
  static result<registration_cache> create(const protection_domain& pd,
                                           const registration_cache_options& opts = {});

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  // A registration of `buf` with at least `rights`: a cached entry that
  // contains buf with those rights (a hit), else a new registration (a miss),
  // cached when the monitor runs, the range is private anonymous memory and it
  // fits the bounds. Errors: those of protection_domain::register_memory,
  // invalid_state on an empty cache. The memory must stay mapped while the
  // handle is held (as for any registration).
  result<cached_registration> acquire(std::span<std::byte> buf, access rights);

  // Which monitor runs (none: nothing is cached; stats().monitor_status says why).
  memory_monitor monitor() const noexcept;
  registration_cache_stats stats() const;
  // Deregisters every unused entry now (their keys are revoked). Entries in
  // use stay until released.
  void flush() noexcept;

 private:
  std::shared_ptr<detail::regcache_state> impl_;
};

}  // namespace conveyor
