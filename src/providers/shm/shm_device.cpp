// The shm provider: device, protection domain, memory registration, QP
// creation, and the progress engine.
#include "providers/shm/shm_device.hpp"

#include "core/log.hpp"
#include "providers/shm/shm_memfd.hpp"
#include "providers/shm/shm_qp.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace conveyor::shm {

namespace {
constexpr std::uint32_t max_wr = 16384;
constexpr std::uint32_t max_sge = 16;
constexpr std::uint32_t max_inline = 1024;

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

// ------------------------------------------------------------------ engine ----
engine::engine(bool own_thread, std::uint32_t spin_us) : manual_(!own_thread), spin_us_(spin_us) {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ >= 0 && wake_ >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_, &ev);
  }
  if (own_thread && ok()) {
    thread_ = std::thread([this] { run(); });
    // Named so tools can tell the provider's engine (the "NIC") from the
    // application's threads in /proc/PID/task/*/comm (conveyor kv bench --server-pid).
    ::pthread_setname_np(thread_.native_handle(), "cv-shm-engine");
  }
}

engine::~engine() {
  stop_.store(true);
  if (wake_ >= 0) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (epfd_ >= 0) ::close(epfd_);
  if (wake_ >= 0) ::close(wake_);
}

void engine::attach(shm_qp* qp, int fd) noexcept {
  {
    std::lock_guard lk(mu_);
    live_.push_back(qp);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = qp;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }
  // Wake a sleeping engine thread so it includes the new QP in its sleep flags.
  std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_, &one, sizeof one);
}

void engine::detach(shm_qp* qp, int fd) noexcept {
  std::lock_guard lk(mu_);
  auto it = std::find(live_.begin(), live_.end(), qp);
  if (it == live_.end()) return;
  live_.erase(it);
  if (fd >= 0) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

int engine::poll_all_locked() noexcept {
  int n = 0;
  for (std::size_t i = 0; i < live_.size(); ++i) n += live_[i]->progress();
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
      if (drain) {  // the wake-up is for the sleeping thread, not for a passer-by
        std::uint64_t v;
        [[maybe_unused]] auto r = ::read(wake_, &v, sizeof v);
      }
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
  }
}

void engine::idle() noexcept {
  app_poll_ns_.store(0);
  if (parked_.load()) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_, &one, sizeof one);
  }
}

void engine::progress() noexcept {
  if (!manual_) app_poll_ns_.store(now_ns(), std::memory_order_relaxed);
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return;
  if (poll_all_locked() > 0) return;
  if (!manual_) {
    // The engine thread may be parked behind this poller: look at the sockets
    // now and then so a peer that died is noticed by a busy-polling application.
    const std::int64_t now = now_ns();
    if (now - last_socket_check_ns_ > 1000000) {
      last_socket_check_ns_ = now;
      socket_events_locked(0, nullptr, false);
    }
    return;
  }
  // Manual mode, nothing to do: look at the sockets (doorbells, hang-ups), then
  // ask peers for doorbells so a CQ wait that sleeps on wait_fd() is woken.
  socket_events_locked(0, nullptr, true);
  sleep_flags_locked(true);
  if (poll_all_locked() > 0) sleep_flags_locked(false);
}

void engine::run() {
  using clk = std::chrono::steady_clock;
  auto last = clk::now();
  const auto spin = std::chrono::microseconds(spin_us_);
  unsigned idle_rounds = 0;
  const std::int64_t window = std::chrono::nanoseconds(app_window).count();
  while (!stop_.load(std::memory_order_relaxed)) {
    // An application thread is polling and progressing the rings itself: stay
    // out of its way (on few cores a second spinner halves its speed).
    std::int64_t app = app_poll_ns_.load();
    if (app != 0 && now_ns() - app < window) {
      parked_.store(true);
      app = app_poll_ns_.load();  // re-check after publishing parked_ (idle() race)
      const std::int64_t left = app == 0 ? 0 : window - (now_ns() - app);
      if (left > 0) {
        pollfd p{wake_, POLLIN, 0};
        timespec ts{0, static_cast<long>(left)};
        if (::ppoll(&p, 1, &ts, nullptr) > 0) {
          std::uint64_t v;
          [[maybe_unused]] auto r = ::read(wake_, &v, sizeof v);
        }
      }
      parked_.store(false);
      last = clk::now();
      continue;
    }
    std::unique_lock lk(mu_);
    if (poll_all_locked() > 0) {
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
    : cma_(cma), direct_(direct) {
  opts_ = opts;
  attr_.name = std::move(name);
  attr_.provider = "shm";
  attr_.transport_type = transport::shm;
  attr_.max_qp = 4096;
  attr_.max_cqe = 1u << 22;
  attr_.max_qp_wr = max_wr;
  attr_.max_sge = max_sge;
  attr_.max_sge_rd = max_sge;
  attr_.max_inline_data = max_inline;
  attr_.max_mr = detail::key_table::capacity;
  attr_.max_mr_size = 1ull << 46;
  attr_.max_msg_size = 0x7FFFFFFFu;
  attr_.max_qp_rd_atom = 128;
  attr_.atomics = true;
  attr_.immediate_data = true;
  attr_.send_with_invalidate = true;
  // One "port": this host, reached by abstract Unix socket names ("@name") or
  // socket paths; there is no network address to list.
  attr_.ports.push_back(
      {.num = 1, .state = "active", .link_layer = "unix", .mtu = 0, .addresses = {}});
  engine_ =
      std::make_unique<shm::engine>(opts.progress == progress_mode::thread, opts.engine_spin_us);
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

result<std::shared_ptr<detail::cq_impl>> shm_device::create_cq(const cq_options& opts) {
  if (opts.depth > attr_.max_cqe)
    return make_error(errc::invalid_argument, "create_cq on " + attr_.name + ": depth " +
                                                  std::to_string(opts.depth) + " exceeds max_cqe " +
                                                  std::to_string(attr_.max_cqe));
  auto r = detail::sw_cq::create(opts.depth, shared_from_this(), engine_.get(), opts_.spin_us,
                                 opts_.progress == progress_mode::manual);
  if (!r) return std::unexpected(r.error());
  return std::shared_ptr<detail::cq_impl>(std::move(*r));
}

namespace {
result<void> check_rights(const std::string& where, access rights) {
  if ((has(rights, access::remote_write) || has(rights, access::remote_atomic)) &&
      !has(rights, access::local_write))
    return make_error(errc::invalid_argument,
                      where + ": remote_write and remote_atomic require local_write (as in verbs)");
  return {};
}
}  // namespace

result<std::shared_ptr<detail::mr_impl>> shm_pd::register_memory(std::span<std::byte> buf,
                                                                 access rights) {
  if (buf.empty() || buf.data() == nullptr)
    return make_error(errc::invalid_argument,
                      "register_memory on " + dev_->attr().name + ": empty buffer");
  if (auto ok = check_rights("register_memory on " + dev_->attr().name, rights); !ok)
    return std::unexpected(ok.error());
  auto key = dev_->keys().add(buf.data(), buf.size(), rights, id_);
  if (!key) return std::unexpected(key.error());
  auto self = std::static_pointer_cast<shm_pd>(shared_from_this());
  return std::make_shared<shm_mr>(std::move(self), buf, rights, *key);
}

result<std::shared_ptr<detail::mr_impl>> shm_pd::allocate_memory(std::size_t len, access rights) {
  const std::string where = "allocate_memory on " + dev_->attr().name;
  if (len == 0) return make_error(errc::invalid_argument, where + ": zero length");
  if (len > dev_->attr().max_mr_size)
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
  auto key = dev_->keys().add(base, len, rights, id_);
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
                        .pd_id = id_};
  if (auto ok = dev_->publish_direct(*key, d); !ok) return std::unexpected(ok.error());
  return std::shared_ptr<detail::mr_impl>(std::move(mr));
}

result<std::shared_ptr<detail::qp_impl>> shm_pd::create_qp(const qp_init_attr& attr) {
  const std::string where = "create_qp on " + dev_->attr().name;
  if (!attr.send_cq || !attr.recv_cq || !*attr.send_cq || !*attr.recv_cq)
    return make_error(errc::invalid_argument, where + ": send_cq and recv_cq are required");
  auto* scq = dynamic_cast<detail::sw_cq*>(attr.send_cq->impl());
  auto* rcq = dynamic_cast<detail::sw_cq*>(attr.recv_cq->impl());
  if (!scq || !rcq) return make_error(errc::invalid_argument, where + ": CQ of another provider");
  const auto& c = attr.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > max_wr || c.max_recv_wr == 0 || c.max_recv_wr > max_wr)
    return make_error(errc::invalid_argument,
                      where + ": max_send_wr/max_recv_wr must be 1.." + std::to_string(max_wr));
  if (c.max_send_sge == 0 || c.max_send_sge > max_sge || c.max_recv_sge == 0 ||
      c.max_recv_sge > max_sge)
    return make_error(errc::invalid_argument,
                      where + ": max_send_sge/max_recv_sge must be 1.." + std::to_string(max_sge));
  if (c.max_inline_data > max_inline)
    return make_error(errc::invalid_argument,
                      where + ": max_inline_data must be at most " + std::to_string(max_inline));
  auto self = std::static_pointer_cast<shm_pd>(shared_from_this());
  return std::shared_ptr<detail::qp_impl>(std::make_shared<shm_qp>(
      std::move(self), std::static_pointer_cast<detail::sw_cq>(attr.send_cq->shared_impl()),
      std::static_pointer_cast<detail::sw_cq>(attr.recv_cq->shared_impl()), attr,
      dev_->next_qpn()));
}

shm_mr::shm_mr(std::shared_ptr<shm_pd> pd, std::span<std::byte> buf, access rights,
               std::uint32_t key)
    : pd_(std::move(pd)) {
  data_ = buf.data();
  size_ = buf.size();
  rights_ = rights;
  lkey_ = rkey_ = key;
}

shm_mr::shm_mr(std::shared_ptr<shm_pd> pd, std::span<std::byte> buf, access rights,
               std::uint32_t key, int memfd, std::size_t map_len)
    : shm_mr(std::move(pd), buf, rights, key) {
  memfd_ = memfd;
  map_len_ = map_len;
}

shm_mr::~shm_mr() {
  deregister();
  if (memfd_ >= 0) {
    // A peer that still maps the pages keeps them alive; we never touch them again.
    ::munmap(data_, map_len_);
    ::close(memfd_);
  }
}

void shm_mr::deregister() noexcept {
  if (!live_.exchange(false)) return;
  if (memfd_ >= 0) pd_->dev().revoke_direct(rkey_);
  pd_->dev().keys().remove(rkey_);
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
  device_options o = opts;
  if (const char* v = std::getenv("CONVEYOR_SPIN_US"))
    o.spin_us = static_cast<std::uint32_t>(std::atoi(v));
  if (const char* v = std::getenv("CONVEYOR_ENGINE_SPIN_US"))
    o.engine_spin_us = static_cast<std::uint32_t>(std::atoi(v));
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
                         std::to_string(o.engine_spin_us) + " us)");
  return std::shared_ptr<detail::device_impl>(std::move(dev));
}

}  // namespace conveyor::shm
