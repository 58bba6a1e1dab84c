// The registration cache (include/conveyor/registration_cache.hpp): an index
// of registrations by start address, an LRU list of the unused ones, and the
// rules of memory_monitor.hpp (nothing freed under the lock: dropped entries
// wait on a list that the caller reaps after unlocking).
#include <conveyor/registration_cache.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/impl.hpp"
#include "core/memory_monitor.hpp"

namespace conveyor {

const char* to_string(memory_monitor m) noexcept {
  switch (m) {
    case memory_monitor::none:
      return "none";
    case memory_monitor::userfaultfd:
      return "userfaultfd";
  }
  return "?";
}

namespace detail {

using index_t = std::multimap<std::uintptr_t, regcache_entry*>;

struct regcache_entry {
  std::uintptr_t start = 0, end = 0;
  access rights = access::none;
  memory_region mr;
  pid_t pid = 0;  // the process that registered it (a forked child leaves it alone)
  std::size_t refs = 0;
  bool indexed = false;
  bool in_lru = false;
  index_t::iterator it;
  index_t::node_type node;  // once out of the index: freed with the entry, unlocked
  regcache_entry* lru_prev = nullptr;
  regcache_entry* lru_next = nullptr;
  regcache_entry* dead_next = nullptr;
};

class regcache_state final : public regcache_sink,
                             public std::enable_shared_from_this<regcache_state> {
 public:
  regcache_state(protection_domain pd, const registration_cache_options& o)
      : pd_(std::move(pd)), opts_(o), pid_(uffd_monitor::pid()) {}
  ~regcache_state() {
    if (subscribed_) uffd_monitor::get().unsubscribe(this);
    if (in_child()) return;  // the parent's entries are left alone (reap())
    {
      std::lock_guard lk(regcache_mutex());
      drop_all_locked(false);
    }
    reap();
  }

  void start() {
    const char* env = std::getenv("CONVEYOR_REGCACHE");
    if (!opts_.enabled || (env != nullptr && std::strcmp(env, "0") == 0)) {
      status_ = opts_.enabled ? "disabled by CONVEYOR_REGCACHE=0" : "disabled by the options";
      return;
    }
    status_ = uffd_monitor::get().subscribe(this);
    subscribed_ = true;
    monitored_ = status_.empty();
  }

  result<cached_registration> acquire(std::span<std::byte> buf, access rights);
  void release(regcache_entry* e) noexcept;
  void flush() noexcept;
  registration_cache_stats stats();
  memory_monitor monitor() {
    std::lock_guard lk(regcache_mutex());
    return monitoring_locked() ? memory_monitor::userfaultfd : memory_monitor::none;
  }

  void invalidate_locked(std::uintptr_t start, std::uintptr_t end) noexcept override {
    remove_range_locked(start, end, true);
  }

 private:
  bool monitoring_locked() const noexcept {
    return monitored_ && uffd_monitor::get().running_locked();
  }
  // A forked child of the process that made the cache: its index, lists and
  // entries are the parent's and may have been mid-update at fork(); the
  // child never touches them and caches nothing.
  bool in_child() const noexcept { return pid_ != uffd_monitor::pid(); }
  regcache_entry* find_locked(std::uintptr_t s, std::uintptr_t e, access rights) noexcept;
  void remove_range_locked(std::uintptr_t start, std::uintptr_t end, bool count) noexcept;
  void remove_locked(regcache_entry* e) noexcept;
  void drop_all_locked(bool count) noexcept { remove_range_locked(0, UINTPTR_MAX, count); }
  bool make_room_locked(std::size_t len) noexcept;
  void lru_push_locked(regcache_entry* e) noexcept;
  void lru_unlink_locked(regcache_entry* e) noexcept;
  void kill_locked(regcache_entry* e) noexcept {
    e->dead_next = dead_;
    dead_ = e;
    has_dead_.store(true, std::memory_order_relaxed);
  }
  void reap() noexcept;
  // A new entry of `mr` for [s, e), held once by its caller.
  static regcache_entry* new_entry(std::uintptr_t s, std::uintptr_t e, access rights,
                                   memory_region mr) {
    auto* ent = new regcache_entry;
    ent->start = s;
    ent->end = e;
    ent->rights = rights;
    ent->mr = std::move(mr);
    ent->pid = uffd_monitor::pid();
    ent->refs = 1;
    return ent;
  }
  cached_registration handle(regcache_entry* e, std::span<std::byte> buf) {
    cached_registration h;
    h.cache_ = shared_from_this();
    h.entry_ = e;
    h.data_ = buf.data();
    h.size_ = buf.size();
    return h;
  }

  protection_domain pd_;
  registration_cache_options opts_;
  pid_t pid_;           // the process that made the cache
  std::string status_;  // why not monitored (at creation)
  bool subscribed_ = false;
  bool monitored_ = false;
  // Under regcache_mutex():
  index_t index_;
  std::uintptr_t max_len_ = 0;          // longest entry ever indexed: bounds the scans
  regcache_entry* lru_head_ = nullptr;  // most recently released
  regcache_entry* lru_tail_ = nullptr;
  regcache_entry* dead_ = nullptr;
  std::atomic<bool> has_dead_{false};  // a hint: reap() skips the lock when false
  registration_cache_stats st_;
};

regcache_entry* regcache_state::find_locked(std::uintptr_t s, std::uintptr_t e,
                                            access rights) noexcept {
  // Entries starting at or before s, nearest first; none further than the
  // longest entry can reach e.
  auto it = index_.upper_bound(s);
  while (it != index_.begin()) {
    --it;
    regcache_entry* c = it->second;
    if (c->start + max_len_ < e) break;
    if (c->end >= e && has(c->rights, rights)) return c;
  }
  return nullptr;
}

void regcache_state::remove_range_locked(std::uintptr_t start, std::uintptr_t end,
                                         bool count) noexcept {
  auto it = index_.lower_bound(start > max_len_ ? start - max_len_ : 0);
  while (it != index_.end() && it->first < end) {
    regcache_entry* c = it->second;
    ++it;
    if (c->end > start) {
      remove_locked(c);
      if (count) ++st_.invalidations;
    }
  }
}

void regcache_state::remove_locked(regcache_entry* e) noexcept {
  e->node = index_.extract(e->it);  // no free here: the node goes with the entry
  e->indexed = false;
  st_.entries -= 1;
  st_.bytes -= e->end - e->start;
  if (e->in_lru) lru_unlink_locked(e);
  if (e->refs == 0) kill_locked(e);  // else its last release kills it
}

bool regcache_state::make_room_locked(std::size_t len) noexcept {
  if (len > opts_.max_bytes) return false;
  while (st_.entries + 1 > opts_.max_entries || st_.bytes + len > opts_.max_bytes) {
    if (lru_tail_ == nullptr) return false;  // everything is in use
    remove_locked(lru_tail_);
    ++st_.evictions;
  }
  return true;
}

void regcache_state::lru_push_locked(regcache_entry* e) noexcept {
  e->lru_prev = nullptr;
  e->lru_next = lru_head_;
  if (lru_head_ != nullptr) lru_head_->lru_prev = e;
  lru_head_ = e;
  if (lru_tail_ == nullptr) lru_tail_ = e;
  e->in_lru = true;
}

void regcache_state::lru_unlink_locked(regcache_entry* e) noexcept {
  (e->lru_prev != nullptr ? e->lru_prev->lru_next : lru_head_) = e->lru_next;
  (e->lru_next != nullptr ? e->lru_next->lru_prev : lru_tail_) = e->lru_prev;
  e->lru_prev = e->lru_next = nullptr;
  e->in_lru = false;
}

void regcache_state::reap() noexcept {
  // Only this thread's own kills must be reaped now; those are visible to it.
  if (!has_dead_.load(std::memory_order_relaxed)) return;
  regcache_entry* d;
  {
    std::lock_guard lk(regcache_mutex());
    d = dead_;
    dead_ = nullptr;
    has_dead_.store(false, std::memory_order_relaxed);
  }
  const pid_t self = uffd_monitor::pid();
  while (d != nullptr) {
    regcache_entry* next = d->dead_next;
    // A forked child never deregisters its parent's registrations (the
    // provider's state for them belongs to the parent): they are left alone.
    if (d->pid == self) delete d;  // deregisters (memory_region's destructor)
    d = next;
  }
}

result<cached_registration> regcache_state::acquire(std::span<std::byte> buf, access rights) {
  if (buf.empty())
    return make_error(errc::invalid_argument, "registration_cache::acquire: empty buffer");
  const auto s = reinterpret_cast<std::uintptr_t>(buf.data());
  const auto e = s + buf.size();
  uffd_monitor& mon = uffd_monitor::get();
  if (in_child()) {
    auto mr = pd_.register_memory(buf, rights);
    if (!mr) return std::unexpected(std::move(mr.error()));
    auto* ent = new_entry(s, e, rights, std::move(*mr));
    std::lock_guard lk(regcache_mutex());  // a new lock in the child
    ++st_.misses;
    ++st_.uncached;
    ++st_.in_use;
    return handle(ent, buf);
  }
  bool monitored = false;
  std::uint64_t seq0 = 0;
  {
    std::lock_guard lk(regcache_mutex());
    // Every event already raised is applied before the lookup.
    monitored = monitored_ && mon.sync_locked();
    if (!monitored && st_.entries != 0) drop_all_locked(true);  // forked, or the monitor failed
    if (monitored) {
      if (regcache_entry* hit = find_locked(s, e, rights)) {
        if (hit->refs++ == 0) lru_unlink_locked(hit);
        ++st_.in_use;
        ++st_.hits;
        return handle(hit, buf);
      }
      seq0 = mon.seq_locked();
    }
    ++st_.misses;
  }
  reap();
  const bool watched = monitored && buf.size() <= opts_.max_bytes && mon.watch(s, e);
  auto mr = pd_.register_memory(buf, rights);
  if (!mr) return std::unexpected(std::move(mr.error()));
  auto* ent = new_entry(s, e, rights, std::move(*mr));
  // The index node is made here: nothing under the lock allocates (see
  // memory_monitor.hpp).
  index_t::node_type node;
  {
    index_t one;
    node = one.extract(one.emplace(s, ent));
  }
  {
    std::lock_guard lk(regcache_mutex());
    ++st_.in_use;
    // Cached only if no event touched the range since the lookup (an entry
    // inserted now is dropped by any later event).
    const bool keep = watched && mon.sync_locked() && !mon.touched_since_locked(seq0, s, e) &&
                      make_room_locked(buf.size());
    if (keep) {
      ent->it = index_.insert(std::move(node));
      ent->indexed = true;
      st_.entries += 1;
      st_.bytes += buf.size();
      if (buf.size() > max_len_) max_len_ = buf.size();
    } else {
      ++st_.uncached;
    }
  }
  reap();
  return handle(ent, buf);
}

void regcache_state::release(regcache_entry* e) noexcept {
  if (e->pid != uffd_monitor::pid()) return;  // the parent's, in a forked child: left alone
  if (in_child()) {                           // the child's own, never cached
    {
      std::lock_guard lk(regcache_mutex());
      --st_.in_use;
    }
    delete e;
    return;
  }
  {
    std::lock_guard lk(regcache_mutex());
    --st_.in_use;
    if (--e->refs == 0) {
      if (e->indexed)
        lru_push_locked(e);
      else
        kill_locked(e);
    }
  }
  reap();
}

void regcache_state::flush() noexcept {
  if (in_child()) return;
  {
    std::lock_guard lk(regcache_mutex());
    while (lru_tail_ != nullptr) {
      remove_locked(lru_tail_);
      ++st_.evictions;
    }
  }
  reap();
}

registration_cache_stats regcache_state::stats() {
  registration_cache_stats s;
  char why[160] = "";
  {
    std::lock_guard lk(regcache_mutex());
    s.hits = st_.hits;
    s.misses = st_.misses;
    s.uncached = st_.uncached;
    s.evictions = st_.evictions;
    s.invalidations = st_.invalidations;
    s.entries = st_.entries;
    s.bytes = st_.bytes;
    s.in_use = st_.in_use;
    s.monitor = monitoring_locked() ? memory_monitor::userfaultfd : memory_monitor::none;
    if (s.monitor == memory_monitor::none && monitored_)
      std::snprintf(why, sizeof why, "%s", uffd_monitor::get().status_locked());
  }
  // Built after unlocking: nothing under the lock allocates.
  if (s.monitor == memory_monitor::none) s.monitor_status = monitored_ ? why : status_;
  return s;
}

}  // namespace detail

// ------------------------------------------------------- cached_registration ----
cached_registration::cached_registration(cached_registration&& o) noexcept
    : cache_(std::move(o.cache_)), entry_(o.entry_), data_(o.data_), size_(o.size_) {
  o.entry_ = nullptr;
  o.data_ = nullptr;
  o.size_ = 0;
}
cached_registration& cached_registration::operator=(cached_registration&& o) noexcept {
  if (this != &o) {
    release();
    cache_ = std::move(o.cache_);
    entry_ = o.entry_;
    data_ = o.data_;
    size_ = o.size_;
    o.entry_ = nullptr;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}
cached_registration::~cached_registration() {
  release();
}
std::uint32_t cached_registration::lkey() const noexcept {
  return entry_ != nullptr ? entry_->mr.lkey() : 0;
}
std::uint32_t cached_registration::rkey() const noexcept {
  return entry_ != nullptr ? entry_->mr.rkey() : 0;
}
access cached_registration::rights() const noexcept {
  return entry_ != nullptr ? entry_->rights : access::none;
}
const memory_region& cached_registration::region() const noexcept {
  static const memory_region empty;
  return entry_ != nullptr ? entry_->mr : empty;
}
bool cached_registration::cached() const noexcept {
  if (entry_ == nullptr) return false;
  std::lock_guard lk(detail::regcache_mutex());
  return entry_->indexed;
}
void cached_registration::release() noexcept {
  if (entry_ == nullptr) return;
  cache_->release(entry_);
  entry_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  cache_.reset();
}

// -------------------------------------------------------- registration_cache ----
registration_cache::~registration_cache() = default;

result<registration_cache> registration_cache::create(const protection_domain& pd,
                                                      const registration_cache_options& opts) {
  if (!pd) return make_error(errc::invalid_argument, "registration_cache: empty protection_domain");
  if (opts.max_entries == 0 || opts.max_bytes == 0)
    return make_error(errc::invalid_argument,
                      "registration_cache: max_entries and max_bytes must be at least 1");
  registration_cache c;
  c.impl_ = std::make_shared<detail::regcache_state>(
      protection_domain(detail::handle_access::shared(pd)), opts);
  c.impl_->start();
  return c;
}

result<cached_registration> registration_cache::acquire(std::span<std::byte> buf, access rights) {
  if (!impl_) return make_error(errc::invalid_state, "registration_cache: empty cache");
  return impl_->acquire(buf, rights);
}

memory_monitor registration_cache::monitor() const noexcept {
  return impl_ ? impl_->monitor() : memory_monitor::none;
}

registration_cache_stats registration_cache::stats() const {
  if (!impl_) return {.monitor_status = "empty cache"};
  return impl_->stats();
}

void registration_cache::flush() noexcept {
  if (impl_) impl_->flush();
}

}  // namespace conveyor
