// The shm provider's connection manager: a Unix stream socket (abstract name
// "@name" or a filesystem path) carries a three-message handshake.
//
//   initiator -> target  request: private data, IRD/ORD, a probe word's address
//                        and value, the segment's memfd and the initiator
//                        device's hint page (SCM_RIGHTS) with its QP's bit
//   target -> initiator  accept (private data, IRD/ORD, its probe word, whether
//                        it can reach the initiator's memory, whether it mapped
//                        the initiator's hint page; its own hint page and bit)
//                        or reject (reason)
//   initiator -> target  ready: whether it can reach the target's memory and
//                        whether it mapped the target's hint page
//
// Each side probes the other's memory with process_vm_readv on the peer's
// probe word: a side whose peer can reach it sends bulk requests as
// descriptors the peer serves by cross-memory attach; otherwise it stages the
// bytes through the rings. The socket then stays open as doorbell and as the
// liveness signal (EOF/HUP when the peer closes or dies).
#include "providers/shm/engine/shm_qp.hpp"
#include "providers/shm/net/unix_socket.hpp"
#include "providers/shm/shm_attach.hpp"
#include "providers/shm/shm_device.hpp"
#include "providers/shm/shm_memfd.hpp"

#include "core/log.hpp"
#include "providers/swnic/handshake_pump.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <utility>

namespace conveyor::shm {

using clk = std::chrono::steady_clock;

namespace {

std::string printable(const std::uint8_t* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const char c = static_cast<char>(p[i]);
    if (c == 0) break;
    s += (c >= 32 && c < 127) ? c : '?';
  }
  return s;
}

using net::fd_holder;

// Sends one handshake message (and up to two descriptors with it: the ones
// that are not -1, in order).
result<void> send_msg(int fd, const hs_msg& m, int pass_fd, clk::time_point deadline,
                      const std::string& what, int pass_fd2 = -1) {
  int fds[2];
  std::size_t n = 0;
  for (const int f : {pass_fd, pass_fd2})
    if (f >= 0) fds[n++] = f;
  return net::send_with_fds(fd, &m, sizeof m, std::span<const int>(fds, n), deadline, what);
}

// Receives one handshake message and checks it; *got_fd receives a passed
// descriptor (or -1; when got_fd is null, any passed descriptor is closed).
result<void> recv_msg(int fd, hs_msg& m, int* got_fd, clk::time_point deadline,
                      std::chrono::milliseconds t, const std::string& what) {
  int spare = -1;
  int* slot = got_fd != nullptr ? got_fd : &spare;
  *slot = -1;
  auto r = net::recv_with_fds(fd, &m, sizeof m, std::span<int>(slot, got_fd != nullptr ? 1 : 0),
                              deadline, t, what);
  if (!r || !handshake_valid(m)) {
    if (*slot >= 0) ::close(std::exchange(*slot, -1));
    if (!r) return r;
    return make_error(errc::protocol_error,
                      what + ": not a Conveyor shm handshake (or another version)");
  }
  return {};
}

// The peer device's hint page as its handshake message passed it, mapped
// (one mapping per file for the whole device) when it is what a hint page is:
// a sealed memfd of exactly hint_page_bytes, with the peer QP's bit inside.
// Null otherwise: then this side does not hint that QP, and the peer looks at
// it in turn instead.
std::shared_ptr<peer_mapping> map_hint_page(shm_device& dev, int fd, std::uint32_t bit) {
  struct stat st {};
  if (fd < 0 || bit >= hint_bits || !sealed_memfd_ok(fd, hint_page_bytes, true, 0) ||
      ::fstat(fd, &st) != 0)
    return nullptr;
  return dev.peer_maps().get(fd, static_cast<std::uint64_t>(st.st_ino), hint_page_bytes,
                             PROT_READ | PROT_WRITE, false);
}

// Our QP's hint page descriptor for its handshake message (-1: no bit).
int hint_fd_of(shm_device& dev, const shm_qp& qp) {
  return qp.hint_bit() == no_hint ? -1 : dev.eng().hint_fd();
}

std::string endpoint_name(pid_t pid, std::uint32_t qpn) {
  return "pid " + std::to_string(pid) + " qp " + std::to_string(qpn);
}

struct mapping {
  void* p = MAP_FAILED;
  mapping() = default;
  mapping(mapping&& o) noexcept : p(std::exchange(o.p, MAP_FAILED)) {}
  mapping& operator=(mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p = std::exchange(o.p, MAP_FAILED);
    }
    return *this;
  }
  ~mapping() { reset(); }
  void reset() {
    if (p != MAP_FAILED) ::munmap(p, seg_size);
    p = MAP_FAILED;
  }
  void* release() { return std::exchange(p, MAP_FAILED); }
};

class shm_listener final : public detail::listener_impl {
 public:
  shm_listener(std::shared_ptr<shm_device> dev, fd_holder fd, std::string addr, int backlog);
  ~shm_listener() override {
    pump_.reset();  // its thread stops before the socket and the path go
    if (!addr_.empty() && addr_[0] != '@') ::unlink(addr_.c_str());
  }
  std::string address() const override { return addr_; }
  std::uint16_t port() const noexcept override { return 0; }
  result<std::unique_ptr<detail::conn_request_impl>> accept(
      std::chrono::milliseconds timeout) override;
  // The listener thread's second half of a handshake: `req` has arrived whole
  // on `conn` (with the segment descriptor `memfd` and the hint page's
  // `hintfd`, or -1): check it and map the segment (and the hint page).
  result<std::unique_ptr<detail::conn_request_impl>> finish(fd_holder conn, const hs_msg& req,
                                                            int memfd, int hintfd, pid_t pid);

 private:
  std::shared_ptr<shm_device> dev_;
  fd_holder fd_;
  std::string addr_;
  std::unique_ptr<detail::handshake_pump> pump_;
};

// One request being read by the listener thread, never blocking: the bytes
// of one hs_msg (and the descriptor that comes with them), then finish().
class shm_request_reader final : public detail::pending_handshake {
 public:
  shm_request_reader(shm_listener& lis, int fd) : lis_(lis), fd_(fd), pid_(net::peer_pid(fd)) {}
  ~shm_request_reader() override {
    for (const int f : fds_)
      if (f >= 0) ::close(f);
  }
  int fd() const noexcept override { return fd_.get(); }
  step on_readable(std::string& why) override {
    switch (net::recv_some_with_fds(fd_.get(), &msg_, sizeof msg_, &off_, fds_)) {
      case net::recv_step::more:
        return step::more;
      case net::recv_step::closed:
        why = "shm handshake with pid " + std::to_string(pid_) + ": the peer closed the connection";
        return step::failed;
      case net::recv_step::done:
        break;
    }
    if (!handshake_valid(msg_)) {
      why = "shm handshake with pid " + std::to_string(pid_) +
            ": not a Conveyor shm handshake (or another version)";
      return step::failed;
    }
    auto r = lis_.finish(std::move(fd_), msg_, std::exchange(fds_[0], -1),
                         std::exchange(fds_[1], -1), pid_);
    if (!r) {
      why = r.error().context;
      return step::failed;
    }
    req_ = std::move(*r);
    return step::done;
  }
  std::unique_ptr<detail::conn_request_impl> take() override { return std::move(req_); }
  void refuse_busy() noexcept override {
    static constexpr std::string_view busy = "listener busy: too many requests wait for accept()";
    (void)req_->reject(std::as_bytes(std::span(busy.data(), busy.size())));
  }

 private:
  shm_listener& lis_;
  fd_holder fd_;
  pid_t pid_;
  hs_msg msg_{};
  std::size_t off_ = 0;
  int fds_[2] = {-1, -1};  // the segment's memfd, the initiator's hint page
  std::unique_ptr<detail::conn_request_impl> req_;
};

shm_listener::shm_listener(std::shared_ptr<shm_device> dev, fd_holder fd, std::string addr,
                           int backlog)
    : dev_(std::move(dev)), fd_(std::move(fd)), addr_(std::move(addr)) {
  detail::handshake_limits l;
  l.max_pending = std::max<std::uint32_t>(1, dev_->options().software.max_pending_handshakes);
  l.deadline = std::chrono::milliseconds(dev_->options().handshake_timeout_ms);
  l.max_ready = static_cast<std::size_t>(std::max(1, backlog));
  pump_ = std::make_unique<detail::handshake_pump>(
      fd_.get(), "accept on " + addr_, l,
      [this](int c) { return std::make_unique<shm_request_reader>(*this, c); });
}

class shm_conn_request final : public detail::conn_request_impl {
 public:
  shm_conn_request(std::shared_ptr<shm_device> dev, fd_holder fd, mapping map,
                   std::shared_ptr<peer_mapping> hints, hs_msg req, pid_t pid, std::string local)
      : dev_(std::move(dev)),
        fd_(std::move(fd)),
        map_(std::move(map)),
        hints_(std::move(hints)),
        req_(req),
        pid_(pid),
        local_(std::move(local)),
        peer_(endpoint_name(pid, req.qpn)) {}
  ~shm_conn_request() override {
    if (fd_) (void)reject(std::as_bytes(std::span("not accepted", 12)));
  }
  std::span<const std::byte> private_data() const noexcept override {
    return std::as_bytes(std::span(req_.pd, req_.pd_len));
  }
  std::string peer_address() const override { return peer_; }
  result<connection_info> accept(queue_pair& qp, std::span<const std::byte> pd) override;
  result<void> reject(std::span<const std::byte> reason) override;

 private:
  std::shared_ptr<shm_device> dev_;
  fd_holder fd_;
  mapping map_;
  std::shared_ptr<peer_mapping> hints_;  // the initiator's hint page (null: we do not hint it)
  hs_msg req_;
  pid_t pid_;
  std::string local_;
  std::string peer_;
};

result<std::unique_ptr<detail::conn_request_impl>> shm_listener::accept(
    std::chrono::milliseconds timeout) {
  return pump_->accept(timeout);
}

result<std::unique_ptr<detail::conn_request_impl>> shm_listener::finish(fd_holder conn,
                                                                        const hs_msg& req,
                                                                        int memfd, int hintfd,
                                                                        pid_t pid) {
  const std::string who = "shm handshake with pid " + std::to_string(pid) + " on " + addr_;
  fd_holder seg_fd(memfd);
  fd_holder hint_fd(hintfd);
  if (req.kind != hs_kind::request || !seg_fd)
    return make_error(errc::protocol_error,
                      who + ": expected a request with the segment descriptor");
  // A segment the initiator could still shrink would fault (SIGBUS) in this
  // process on the next access past its new end: only a sealed one is mapped.
  if (!sealed_memfd_ok(seg_fd.get(), seg_size, true, 0))
    return make_error(errc::protocol_error, who + ": the segment is not a " +
                                                std::to_string(seg_size) +
                                                "-byte memfd sealed against shrinking and growing");
  mapping m;
  m.p = ::mmap(nullptr, seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd.get(), 0);
  if (m.p == MAP_FAILED)
    return make_error(errc::resource_exhausted, who + ": mmap of the segment", errno);
  if (!segment_header_valid(*static_cast<const seg_header*>(m.p)))
    return make_error(errc::protocol_error, who + ": segment layout mismatch");
  auto hints = map_hint_page(*dev_, hint_fd.get(), req.hint_bit);
  return std::unique_ptr<detail::conn_request_impl>(
      new shm_conn_request(dev_, std::move(conn), std::move(m), std::move(hints), req, pid, addr_));
}

result<void> shm_conn_request::reject(std::span<const std::byte> reason) {
  if (!fd_) return make_error(errc::invalid_state, "reject: request already answered");
  hs_msg rep;
  rep.kind = hs_kind::reject;
  rep.pd_len = static_cast<std::uint32_t>(std::min(reason.size(), max_private_data));
  if (rep.pd_len) std::memcpy(rep.pd, reason.data(), rep.pd_len);
  auto r =
      send_msg(fd_.get(), rep, -1, clk::now() + std::chrono::seconds(1), "shm reject to " + peer_);
  fd_.reset();
  map_.reset();
  hints_.reset();
  return r;
}

result<connection_info> shm_conn_request::accept(queue_pair& qp, std::span<const std::byte> pd) {
  auto target = swnic::accept_target(qp, *dev_, "accept from " + peer_, pd.size());
  if (!target) return std::unexpected(target.error());
  auto* sq = static_cast<shm_qp*>(*target);  // a QP of this (shm) device
  if (!fd_)
    return make_error(errc::invalid_state, "accept from " + peer_ + ": request already answered");
  const auto hs = std::chrono::milliseconds(dev_->options().handshake_timeout_ms);
  const auto deadline = clk::now() + hs;
  // The initiator probes us once it has our accept: declare it first.
  attach_grant grant;
  if (dev_->cma_enabled()) grant.grant(pid_);
  int perr = 0;
  const bool reach =
      dev_->cma_enabled() && probe_peer(pid_, req_.probe_addr, req_.probe_value, &perr);
  hs_msg rep;
  rep.kind = hs_kind::accept;
  rep.qpn = sq->qp_num();
  // The responder's IRD: the initiator's ORD, never more than its own limit.
  const std::uint32_t ird = std::clamp<std::uint32_t>(std::min(sq->want_ird(), req_.ord), 1, 128);
  const std::uint32_t ord = std::clamp<std::uint32_t>(std::min(sq->want_ord(), req_.ird), 1, 128);
  rep.ird = ird;
  rep.ord = ord;
  rep.probe_addr = reinterpret_cast<std::uint64_t>(&probe_word());
  rep.probe_value = probe_word();
  rep.cma_ok = reach ? 1 : 0;
  rep.hint_bit = sq->hint_bit();
  rep.hints_peer = hints_ ? 1 : 0;
  rep.pd_len = static_cast<std::uint32_t>(pd.size());
  if (!pd.empty()) std::memcpy(rep.pd, pd.data(), pd.size());
  auto w = send_msg(fd_.get(), rep, hint_fd_of(*dev_, *sq), deadline, "shm accept to " + peer_);
  if (!w) return std::unexpected(w.error());
  hs_msg ready;
  auto r =
      recv_msg(fd_.get(), ready, nullptr, deadline, hs, "shm handshake with " + peer_ + " (ready)");
  if (!r) return std::unexpected(r.error());
  if (ready.kind != hs_kind::ready)
    return make_error(errc::protocol_error, "shm handshake with " + peer_ + ": expected ready");
  if (!reach && dev_->cma_enabled() && detail::log_enabled(detail::log_level::warn))
    detail::log_line(detail::log_level::warn,
                     dev_->attr().name + ": cannot reach the memory of " + peer_ + " (" +
                         std::strerror(perr) + "): its bulk requests are staged through the rings");
  conn_setup s;
  s.side = 1;
  s.peer_pid = pid_;
  if (ready.cma_ok == 0) grant.reset();  // it cannot (or will not) reach us
  s.attach_pid = grant.release();
  s.cma_tx = ready.cma_ok != 0 && dev_->cma_enabled();
  s.cma_rx = reach;
  s.attr.local_address = local_;
  s.attr.peer_address = peer_;
  s.attr.ird = ird;
  s.attr.ord = ord;
  s.attr.extensions = true;
  s.peer_hints = std::move(hints_);
  s.peer_hint_bit = req_.hint_bit;
  s.hinted = ready.hints_peer != 0;
  s.attr.shm = shm_connection_attr{.data_path = s.cma_tx ? "cma" : "staged",
                                   .slot_payload = slot_payload};  // start() sets direct_mapping
  s.sock = fd_.release();
  s.map = map_.release();
  const qp_connection_attr attr = s.attr;
  sq->start(std::move(s));
  // start() decides direct mapping: report what qp.connection() reports.
  connection_info info{std::vector<std::byte>(private_data().begin(), private_data().end()),
                       sq->connection().value_or(attr)};
  return info;
}

}  // namespace

result<std::unique_ptr<detail::listener_impl>> shm_device::bind_listener(std::string_view address,
                                                                         int backlog) {
  auto a = net::parse_address(address);
  if (!a) return std::unexpected(a.error());
  return listen_at(&*a, std::string(address), backlog);
}

result<std::unique_ptr<detail::listener_impl>> shm_device::bind_ephemeral_listener(int backlog) {
  // A name only the family: the kernel binds a fresh abstract name of its own
  // choosing (five hex digits), unique while the socket lives (unix(7),
  // "Autobind feature").
  return listen_at(nullptr, {}, backlog);
}

result<std::unique_ptr<detail::listener_impl>> shm_device::listen_at(const net::unix_address* a,
                                                                     std::string address,
                                                                     int backlog) {
  const std::string where = address.empty() ? "an ephemeral name" : address;
  auto fd = net::listen(a, detail::kernel_accept_queue, &address, where);
  if (!fd) return std::unexpected(fd.error());
  auto self = std::static_pointer_cast<shm_device>(shared_from_this());
  return std::unique_ptr<detail::listener_impl>(
      new shm_listener(std::move(self), std::move(*fd), std::move(address), backlog));
}

result<connection_info> shm_qp::connect(std::string_view address, const connect_options& opts) {
  if (auto ok = check_connect(opts); !ok) return std::unexpected(ok.error());
  auto sa = net::parse_address(address);
  if (!sa) return std::unexpected(sa.error());
  const std::string peer(address);
  const std::string where =
      "connect QP " + std::to_string(qpn_) + " of " + dev_->attr().name + " to " + peer;
  const auto deadline = clk::now() + opts.timeout;

  // The segment: anonymous memory with a descriptor, nothing in any filesystem.
  // Sealed against shrinking and growing: the target maps it only then.
  fd_holder mfd(sealed_memfd("conveyor-shm", seg_size, nullptr));
  if (!mfd)
    return make_error(errc::resource_exhausted, where + ": sealed memfd of the segment", errno);
  mapping m;
  m.p = ::mmap(nullptr, seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd.get(), 0);
  if (m.p == MAP_FAILED) return make_error(errc::resource_exhausted, where + ": mmap", errno);
  auto* h = new (m.p) seg_header();
  h->magic = seg_magic;
  h->version = seg_version;
  h->slots = ring_slots;
  h->slot_bytes = slot_size;

  auto sock = net::connect(*sa, deadline, where, peer);
  if (!sock) return std::unexpected(sock.error());
  fd_holder s = std::move(*sock);
  // The target probes us when it has our request: declare it first (the
  // listener's pid, the creator of the socket we reached).
  attach_grant grant;
  if (dev_->cma_enabled()) grant.grant(net::peer_pid(s.get()));
  hs_msg req;
  req.kind = hs_kind::request;
  req.qpn = qpn_;
  req.ird = want_ird_;
  req.ord = want_ord_;
  req.probe_addr = reinterpret_cast<std::uint64_t>(&probe_word());
  req.probe_value = probe_word();
  req.hint_bit = hint_bit_;
  req.pd_len = static_cast<std::uint32_t>(opts.private_data.size());
  if (!opts.private_data.empty())
    std::memcpy(req.pd, opts.private_data.data(), opts.private_data.size());
  auto w =
      send_msg(s.get(), req, mfd.get(), deadline, where + " (request)", hint_fd_of(*dev_, *this));
  if (!w) return std::unexpected(w.error());
  mfd.reset();  // the mapping keeps the segment; the peer has its own descriptor
  hs_msg rep;
  int rep_fd = -1;
  auto r = recv_msg(s.get(), rep, &rep_fd, deadline, opts.timeout, "shm handshake with " + peer);
  if (!r) return std::unexpected(r.error());
  fd_holder hint_fd(rep_fd);
  if (rep.kind == hs_kind::reject) {
    const std::string why = printable(rep.pd, rep.pd_len);
    return make_error(errc::rejected, "peer " + peer + " rejected: " +
                                          (why.empty() ? std::string("(no reason given)") : why));
  }
  if (rep.kind != hs_kind::accept)
    return make_error(errc::protocol_error,
                      "shm handshake with " + peer + ": expected accept or reject");
  const pid_t pid = net::peer_pid(s.get());
  int perr = 0;
  const bool reach = dev_->cma_enabled() && probe_peer(pid, rep.probe_addr, rep.probe_value, &perr);
  hs_msg ready;
  ready.kind = hs_kind::ready;
  ready.qpn = qpn_;
  ready.cma_ok = reach ? 1 : 0;
  auto hints = map_hint_page(*dev_, hint_fd.get(), rep.hint_bit);
  hint_fd.reset();
  ready.hints_peer = hints ? 1 : 0;
  w = send_msg(s.get(), ready, -1, deadline, where + " (ready)");
  if (!w) return std::unexpected(w.error());
  if (!reach && dev_->cma_enabled() && detail::log_enabled(detail::log_level::warn))
    detail::log_line(detail::log_level::warn,
                     dev_->attr().name + ": cannot reach the memory of " + peer + " (" +
                         std::strerror(perr) + "): its bulk requests are staged through the rings");
  conn_setup cs;
  cs.side = 0;
  cs.peer_pid = pid;
  if (rep.cma_ok == 0) grant.reset();  // it cannot (or will not) reach us
  cs.attach_pid = grant.release();
  cs.cma_tx = rep.cma_ok != 0 && dev_->cma_enabled();
  cs.cma_rx = reach;
  cs.attr.local_address = endpoint_name(::getpid(), qpn_);
  cs.attr.peer_address = peer;
  cs.attr.ord = std::clamp<std::uint32_t>(std::min(want_ord_, rep.ird), 1, 128);
  cs.attr.ird = std::clamp<std::uint32_t>(std::min(want_ird_, rep.ord), 1, 128);
  cs.attr.extensions = true;
  cs.attr.shm = shm_connection_attr{.data_path = cs.cma_tx ? "cma" : "staged",
                                    .slot_payload = slot_payload};  // start() sets direct_mapping
  cs.peer_hints = std::move(hints);
  cs.peer_hint_bit = rep.hint_bit;
  cs.hinted = rep.hints_peer != 0;
  cs.sock = s.release();
  cs.map = m.release();
  const auto rep_pd = std::as_bytes(std::span(rep.pd, rep.pd_len));
  const qp_connection_attr attr = cs.attr;
  start(std::move(cs));
  // start() decides direct mapping: report what qp.connection() reports.
  connection_info info{std::vector<std::byte>(rep_pd.begin(), rep_pd.end()),
                       connection().value_or(attr)};
  return info;
}

}  // namespace conveyor::shm
