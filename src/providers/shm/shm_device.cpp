// The shm provider: device, protection domain, memory registration, QP
// creation, and the progress engine.
#include "providers/shm/shm_device.hpp"

#include "core/log.hpp"
#include "providers/shm/engine/shm_qp.hpp"
#include "providers/shm/shm_memfd.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace conveyor::shm {

namespace {
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

// ------------------------------------------------------------------ engine ----
engine::engine(bool own_thread, std::uint32_t spin_us, bool park)
    : sw_engine(spin_us, park), manual_(!own_thread) {
  // Best effort: without a hint page every QP is looked at in turn when cold.
  const int fd = sealed_memfd("conveyor-hints", hint_page_bytes, nullptr);
  void* p = fd < 0 ? MAP_FAILED
                   : ::mmap(nullptr, hint_page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) {
    hint_fd_ = fd;
    hints_ = static_cast<std::atomic<std::uint64_t>*>(p);
  } else if (fd >= 0) {
    ::close(fd);
  }
  if (own_thread) start_thread("cv-shm-engine");
}

engine::~engine() {
  stop_thread();
  if (hints_ != nullptr) ::munmap(hints_, hint_page_bytes);
  if (hint_fd_ >= 0) ::close(hint_fd_);
}

std::uint32_t engine::take_hint_bit() noexcept {
  std::lock_guard lk(mu_);
  if (hints_ == nullptr) return no_hint;
  if (!free_bits_.empty()) {
    const std::uint32_t b = free_bits_.back();
    free_bits_.pop_back();
    return b;
  }
  if (next_bit_ >= hint_bits) return no_hint;
  try {
    by_hint_.resize(std::size_t(next_bit_) + 1, nullptr);
    // give_hint_bit never allocates. Grown by doubling: a reserve to the exact
    // size reallocated and copied the list at every QP's creation (quadratic
    // in the QPs of a device).
    if (free_bits_.capacity() < by_hint_.size()) free_bits_.reserve(2 * by_hint_.size());
  } catch (...) {
    return no_hint;
  }
  return next_bit_++;
}

void engine::give_hint_bit(std::uint32_t bit) noexcept {
  if (bit == no_hint) return;
  std::lock_guard lk(mu_);
  by_hint_[bit] = nullptr;
  free_bits_.push_back(bit);
}

void engine::attach(shm_qp* qp, int fd) noexcept {
  {
    std::lock_guard lk(mu_);
    live_.push_back(qp);
    if (qp->hinted())
      by_hint_[qp->hint_bit()] = qp;
    else
      unhinted_.push_back(qp);
    make_hot_locked(qp);
    watch_fd(EPOLL_CTL_ADD, fd, qp, EPOLLIN | EPOLLRDHUP);
  }
  // Wake a sleeping engine thread so it includes the new QP in its sleep flags.
  kick();
}

void engine::fence_local_key(std::uint32_t key) noexcept {
  std::lock_guard lk(mu_);
  for (shm_qp* qp : live_) qp->fence_local_key(key);
}

void engine::detach(shm_qp* qp, int fd) noexcept {
  std::lock_guard lk(mu_);
  auto it = std::find(live_.begin(), live_.end(), qp);
  if (it == live_.end()) return;
  live_.erase(it);
  if (qp->hinted())
    by_hint_[qp->hint_bit()] = nullptr;
  else if (auto u = std::find(unhinted_.begin(), unhinted_.end(), qp); u != unhinted_.end())
    unhinted_.erase(u);
  if (qp->eng_hot) {
    hot_.erase(std::find(hot_.begin(), hot_.end(), qp));
    qp->eng_hot = false;
  }
  if (fd >= 0) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

int engine::poll_all_locked() noexcept {
  int n = 0;
  for (std::size_t i = 0; i < live_.size(); ++i) {
    const int k = live_[i]->progress();
    if (k > 0) make_hot_locked(live_[i]);
    n += k;
  }
  return n;
}

void engine::make_hot_locked(shm_qp* qp) noexcept {
  qp->eng_idle_since_ns = 0;
  if (qp->eng_hot) return;
  qp->eng_hot = true;
  qp->set_cold(false);
  hot_.push_back(qp);
}

int engine::take_hints_locked() noexcept {
  int n = 0;
  const std::size_t words = (by_hint_.size() + 63) / 64;
  for (std::size_t w = 0; w < words; ++w) {
    if (hints_[w].load(std::memory_order_relaxed) == 0) continue;
    // seq_cst: what the peer published before setting the bit is seen below.
    std::uint64_t bits = hints_[w].exchange(0, std::memory_order_seq_cst);
    while (bits != 0) {
      const std::size_t b = w * 64 + std::size_t(__builtin_ctzll(bits));
      bits &= bits - 1;
      shm_qp* qp = b < by_hint_.size() ? by_hint_[b] : nullptr;
      if (qp == nullptr || qp->eng_hot) continue;  // a stale or spurious bit
      make_hot_locked(qp);
      n += qp->progress();
    }
  }
  return n;
}

int engine::poll_step_locked(std::int64_t now) noexcept {
  int n = hints_ != nullptr ? take_hints_locked() : 0;
  const std::int64_t window = std::int64_t(spin_us_) * 1000;
  for (std::size_t i = 0; i < hot_.size();) {
    shm_qp* qp = hot_[i];
    if (const int k = qp->progress(); k > 0) {
      n += k;
      qp->eng_idle_since_ns = 0;
    } else if (qp->eng_idle_since_ns == 0) {
      qp->eng_idle_since_ns = now;
    } else if (now - qp->eng_idle_since_ns >= window) {
      // Cold from now on: hinted by its peer, or looked at in turn. A peer
      // that published before it saw the flag is found by one more look
      // (every ring index and the flag are seq_cst: it saw one or we see it).
      if (qp->hinted()) {
        qp->set_cold(true);
        if (const int again = qp->progress(); again > 0) {
          n += again;
          qp->set_cold(false);
          qp->eng_idle_since_ns = 0;
          ++i;
          continue;
        }
      }
      qp->eng_hot = false;
      hot_[i] = hot_.back();
      hot_.pop_back();
      continue;
    }
    ++i;
  }
  std::size_t looks = std::min(unhinted_.size(), cold_per_step);
  for (std::size_t j = 0; looks > 0 && j < unhinted_.size(); ++j) {
    if (cold_cursor_ >= unhinted_.size()) cold_cursor_ = 0;
    shm_qp* qp = unhinted_[cold_cursor_++];
    if (qp->eng_hot) continue;
    --looks;
    if (const int k = qp->progress(); k > 0) {
      n += k;
      make_hot_locked(qp);
    }
  }
  return n;
}

void engine::sleep_flags_locked(bool on) noexcept {
  for (auto* qp : live_) qp->set_sleeping(on);
}

void engine::socket_events_locked(int timeout_ms, std::unique_lock<std::mutex>* unlock,
                                  bool drain) noexcept {
  epoll_event evs[64];
  if (unlock) unlock->unlock();
  const int n = ::epoll_wait(epfd_, evs, 64, timeout_ms);
  if (unlock) unlock->lock();
  for (int i = 0; i < n; ++i) {
    auto* qp = static_cast<shm_qp*>(evs[i].data.ptr);
    if (qp == nullptr) {
      if (drain) drain_wake();  // the wake-up is for the sleeping thread, not for a passer-by
      continue;
    }
    // The QP may have been detached while we waited without the lock.
    if (std::find(live_.begin(), live_.end(), qp) == live_.end()) continue;
    // Only the thread that sleeps on the doorbells may consume them: a byte
    // taken by anyone else would leave the sleeper blocked with its flag
    // already cleared by the peer (a lost wake-up).
    if (!drain && (evs[i].events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) == 0) continue;
    if (!qp->on_socket(evs[i].events)) {
      // The peer is gone: stop watching the socket (it stays readable forever).
      // The QP keeps its descriptor until it is destroyed.
      ::epoll_ctl(epfd_, EPOLL_CTL_DEL, qp->socket_fd(), nullptr);
    }
    make_hot_locked(qp);  // a doorbell: the peer published work for this side
  }
}

void engine::progress() noexcept {
  // One clock read per poll (this VM's clock costs ~25 ns a read; an empty
  // poll used to read it three times).
  const std::int64_t now = swnic::sw_engine::now_ns();
  note_app_poll(now);
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return;
  if (asleep_ && sleepers_ == 0) {
    // Polling again after a wait: peers need not ring the doorbell (a system
    // call for every message they publish) while this thread looks anyway.
    // Not while another thread sleeps on them: it would miss its wake-up.
    sleep_flags_locked(false);
    asleep_ = false;
  }
  if (poll_step_locked(now) > 0) return;
  // Look at the sockets now and then so that a peer that died is noticed by a
  // busy-polling application (the engine thread may be parked behind it; in
  // manual mode there is none). Manual mode consumes the doorbells too, unless
  // a thread sleeps on them (the byte is its wake-up).
  if (now - last_socket_check_ns_ > 1000000) {
    last_socket_check_ns_ = now;
    socket_events_locked(0, nullptr, manual_ && sleepers_ == 0);
  }
}

bool engine::prepare_wait() noexcept {
  if (!manual_) return false;
  std::lock_guard lk(mu_);
  // Doorbells and hang-ups first, then ask peers for doorbells and look at the
  // rings once more: what a peer published before it saw the flag is found
  // here, what it publishes after rings wait_fd().
  socket_events_locked(0, nullptr, true);
  sleep_flags_locked(true);
  asleep_ = true;
  if (poll_all_locked() == 0) {
    ++sleepers_;
    return false;
  }
  if (sleepers_ == 0) {
    sleep_flags_locked(false);
    asleep_ = false;
  }
  return true;
}

void engine::end_wait() noexcept {
  if (!manual_) return;
  std::lock_guard lk(mu_);
  if (sleepers_ > 0) --sleepers_;
}

void engine::run() {
  using clk = std::chrono::steady_clock;
  auto last = clk::now();
  const auto spin = std::chrono::microseconds(spin_us_);
  unsigned idle_rounds = 0;
  while (!stopping()) {
    // An application thread is polling and progressing the rings itself: stay
    // out of its way (on few cores a second spinner halves its speed).
    if (park_while_app_polls()) {
      last = clk::now();
      continue;
    }
    std::unique_lock lk(mu_);
    if (poll_step_locked(now_ns()) > 0) {
      last = clk::now();
      idle_rounds = 0;
      continue;
    }
    if (++idle_rounds < 64 || clk::now() - last < spin) {
      lk.unlock();
      cpu_relax();
      if ((idle_rounds & 63) == 0) std::this_thread::yield();
      continue;
    }
    // Going to sleep: flag it in every segment, look once more, then block.
    sleep_flags_locked(true);
    if (poll_all_locked() > 0) {
      sleep_flags_locked(false);
      last = clk::now();
      idle_rounds = 0;
      continue;
    }
    socket_events_locked(1000, &lk, true);
    sleep_flags_locked(false);
    last = clk::now();
    idle_rounds = 0;
  }
}

// ------------------------------------------------------------------ device ----
shm_device::shm_device(std::string name, const device_options& opts, bool cma, bool direct)
    : sw_device(std::move(name), "shm", transport::shm, opts), cma_(cma), direct_(direct) {
  // One "port": this host, reached by abstract Unix socket names ("@name") or
  // socket paths; there is no network address to list.
  attr_.ports.push_back(
      {.num = 1, .state = "active", .link_layer = "unix", .mtu = 0, .addresses = {}});
  engine_owned_ =
      std::make_unique<shm::engine>(opts.progress == progress_mode::thread,
                                    opts.software.engine_spin_us, opts.software.engine_park);
  engine_ = engine_owned_.get();
}

shm_device::~shm_device() {
  if (rev_ != nullptr) ::munmap(rev_, std::size_t(revocation_words) * 8);
  if (rev_fd_ >= 0) ::close(rev_fd_);
}

result<void> shm_device::revocation_page_locked() {
  if (rev_ != nullptr) return {};
  const std::size_t len = std::size_t(revocation_words) * 8;
  std::uint64_t ino = 0;
  const int fd = sealed_memfd("conveyor-revoke", len, &ino);
  void* p = fd < 0 ? MAP_FAILED : ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return make_error(errc::resource_exhausted,
                      "allocate_memory on " + attr_.name + ": revocation page: " + why);
  }
  rev_fd_ = fd;
  rev_ino_ = ino;
  rev_ = static_cast<std::atomic<std::uint64_t>*>(p);
  return {};
}

result<void> shm_device::publish_direct(std::uint32_t key, direct_region r) {
  std::lock_guard lk(direct_mu_);
  if (auto ok = revocation_page_locked(); !ok) return ok;
  r.gen = next_gen_++;
  rev_[detail::key_table::slot_of(key)].store(r.gen, std::memory_order_seq_cst);
  regions_[key] = r;
  return {};
}

void shm_device::revoke_direct(std::uint32_t key) noexcept {
  std::lock_guard lk(direct_mu_);
  if (regions_.erase(key) == 0) return;
  // A peer checks this word before each access: from now on it fails over to
  // the engine, which refuses the dead key.
  rev_[detail::key_table::slot_of(key)].store(0, std::memory_order_seq_cst);
}

bool shm_device::lookup_direct(std::uint32_t key, std::uint32_t pd_id, map_answer& out) noexcept {
  out = map_answer{};
  if (!direct_) return false;
  std::lock_guard lk(direct_mu_);
  auto it = regions_.find(key);
  if (it == regions_.end() || it->second.pd_id != pd_id) return false;
  const direct_region& r = it->second;
  out.ok = 1;
  out.rights = static_cast<std::uint32_t>(r.rights);
  out.fd = r.fd;
  out.rev_fd = rev_fd_;
  out.ino = r.ino;
  out.rev_ino = rev_ino_;
  out.base = r.base;
  out.len = r.len;
  out.map_len = r.map_len;
  out.gen = r.gen;
  out.word = detail::key_table::slot_of(key);
  return true;
}

result<std::shared_ptr<detail::pd_impl>> shm_device::alloc_pd() {
  auto self = std::static_pointer_cast<shm_device>(shared_from_this());
  return std::make_shared<shm_pd>(std::move(self), next_pd_id());
}

result<std::shared_ptr<detail::mr_impl>> shm_pd::allocate_memory(std::size_t len, access rights) {
  const std::string where = "allocate_memory on " + dev().attr().name;
  if (len == 0) return make_error(errc::invalid_argument, where + ": zero length");
  if (len > dev().attr().max_mr_size)
    return make_error(errc::invalid_argument,
                      where + ": " + std::to_string(len) + " bytes exceeds max_mr_size");
  if (auto ok = check_rights(where, rights); !ok) return std::unexpected(ok.error());
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t map_len = (len + page - 1) / page * page;
  std::uint64_t ino = 0;
  const int fd = sealed_memfd("conveyor-mr", map_len, &ino);
  void* p =
      fd < 0 ? MAP_FAILED
             : ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return make_error(errc::resource_exhausted,
                      where + ": memfd of " + std::to_string(map_len) + " bytes: " + why);
  }
  auto* base = static_cast<std::byte*>(p);
  auto key = dev().keys().add(base, len, rights, id());
  if (!key) {
    ::munmap(p, map_len);
    ::close(fd);
    return std::unexpected(key.error());
  }
  auto self = std::static_pointer_cast<shm_pd>(shared_from_this());
  // From here the region owns fd and mapping (its destructor releases both).
  auto mr = std::make_shared<shm_mr>(std::move(self), std::span<std::byte>(base, len), rights, *key,
                                     fd, map_len);
  const direct_region d{.fd = fd,
                        .ino = ino,
                        .base = reinterpret_cast<std::uint64_t>(base),
                        .len = len,
                        .map_len = map_len,
                        .rights = rights,
                        .pd_id = id()};
  if (auto ok = dev().publish_direct(*key, d); !ok) return std::unexpected(ok.error());
  return std::shared_ptr<detail::mr_impl>(std::move(mr));
}

std::shared_ptr<detail::qp_impl> shm_pd::make_qp(swnic::qp_args&& a) {
  return std::make_shared<shm_qp>(std::move(a));
}

shm_mr::shm_mr(std::shared_ptr<shm_pd> pd, std::span<std::byte> buf, access rights,
               std::uint32_t key, int memfd, std::size_t map_len)
    : sw_mr(std::move(pd), buf, rights, key), memfd_(memfd), map_len_(map_len) {}

shm_mr::~shm_mr() {
  shm_mr::deregister();
  // A peer that still maps the pages keeps them alive; we never touch them again.
  ::munmap(data_, map_len_);
  ::close(memfd_);
}

// The revocation word first, so a peer's next direct access fails over to the
// engine, which then refuses the dead key.
void shm_mr::deregister() noexcept {
  if (live()) dev().revoke_direct(rkey_);
  sw_mr::deregister();
}

namespace {
// CONVEYOR_SHM_CMA / CONVEYOR_SHM_DIRECT: unset or anything but 0/off/no is on.
bool env_on(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return true;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0 || std::strcmp(v, "no") == 0);
}
}  // namespace

std::vector<device_info> list_devices() {
  return {device_info{"shm", "shm", transport::shm, true, ""}};
}

result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts) {
  const device_options o = swnic::with_env_overrides(opts);
  const bool cma = env_on("CONVEYOR_SHM_CMA");
  const bool direct = env_on("CONVEYOR_SHM_DIRECT");
  auto dev = std::make_shared<shm_device>(std::string(name), o, cma, direct);
  if (!dev->eng().ok())
    return make_error(errc::resource_exhausted,
                      "open " + std::string(name) + ": epoll/eventfd failed");
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info,
                     "opened device " + std::string(name) +
                         " (provider shm, shared-memory rings + cross-memory attach, progress " +
                         (o.progress == progress_mode::thread ? "thread" : "manual") +
                         ", cross-memory attach " + (cma ? "allowed" : "off (CONVEYOR_SHM_CMA)") +
                         ", direct mapping " + (direct ? "allowed" : "off (CONVEYOR_SHM_DIRECT)") +
                         ", wait spin " + std::to_string(o.spin_us) + " us, engine spin " +
                         std::to_string(o.software.engine_spin_us) + " us, engine park " +
                         (o.software.engine_park ? "on" : "off") + ")");
  return std::shared_ptr<detail::device_impl>(std::move(dev));
}

}  // namespace conveyor::shm
