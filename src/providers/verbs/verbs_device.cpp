// The verbs provider: Conveyor's objects mapped 1:1 onto rdma-core's.
//
//   device   -> ibv_context (+ a thread reading the device's async events)
//   pd / mr  -> ibv_pd / ibv_mr
//   cq       -> ibv_cq with a completion channel (fd/arm/wait)
//   qp       -> an RC ibv_qp created at create_qp and moved to INIT at once, so
//               receives can be posted before connecting, as in the Conveyor API
//   cm       -> librdmacm with that QP attached by number ("external QP"): on
//               IB/RoCE the provider moves it INIT->RTR->RTS from
//               rdma_init_qp_attr; on iWARP the kernel does at MPA completion
//
// Each connection owns its own rdma_cm event channel. Once established, a
// detached watcher thread reads it (peer disconnect -> the QP goes to ERROR and
// flushes) and, after the QP is closed, destroys the cm_id. Destroying a cm_id
// can wait on the peer (IB CM DREQ/DREP); doing it on that detached thread keeps
// every user-visible call bounded.
#include "providers/verbs/verbs_provider.hpp"

#include "providers/verbs/verbs_events.hpp"

#include "core/log.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace conveyor::verbs {

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

static_assert(sizeof(sge) == sizeof(ibv_sge) && offsetof(sge, addr) == offsetof(ibv_sge, addr) &&
                  offsetof(sge, length) == offsetof(ibv_sge, length) &&
                  offsetof(sge, lkey) == offsetof(ibv_sge, lkey),
              "conveyor::sge must have ibv_sge's layout (posted without copying)");

void log(detail::log_level l, const std::string& s) {
  if (detail::log_enabled(l)) detail::log_line(l, s);
}

std::string err_text(int e) { return std::string(std::strerror(e)); }

// IB/RoCE connection private data is padded by the CM to a fixed size; a
// one-byte length prefix keeps the user's bytes exact. iWARP (MPA) carries the
// exact length, so nothing is added there (and soft peers interoperate).
constexpr std::size_t ib_req_private = 56 - 1;  // REQ: 92 minus the rdma_cm header (36), minus prefix
constexpr std::size_t ib_rep_private = 196 - 1;
constexpr std::size_t ib_rej_private = 148 - 1;

const char* mtu_name(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
  }
  return "?";
}
std::uint32_t mtu_bytes(ibv_mtu m) { return 128u << static_cast<int>(m); }

const char* port_state_name(ibv_port_state s) { return ibv_port_state_str(s); }

result<sockaddr_storage> parse_address(std::string_view address, socklen_t& len) {
  sockaddr_storage ss{};
  auto colon = address.rfind(':');
  if (colon == std::string_view::npos)
    return make_error(errc::address_error, "address \"" + std::string(address) + "\": expected ip:port");
  std::string host(address.substr(0, colon));
  std::string port_s(address.substr(colon + 1));
  char* end = nullptr;
  unsigned long port = std::strtoul(port_s.c_str(), &end, 10);
  if (port_s.empty() || *end != '\0' || port > 65535)
    return make_error(errc::address_error, "address \"" + std::string(address) + "\": bad port");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &s6->sin6_addr) != 1)
      return make_error(errc::address_error, "address \"" + std::string(address) + "\": bad IPv6 address");
    len = sizeof(sockaddr_in6);
    return ss;
  }
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(static_cast<std::uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &s4->sin_addr) != 1)
    return make_error(errc::address_error,
                      "address \"" + std::string(address) + "\": bad IPv4 address (verbs needs a numeric address)");
  len = sizeof(sockaddr_in);
  return ss;
}

std::string format_address(const sockaddr* sa) {
  if (sa == nullptr) return "?";
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(s4->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(s6->sin6_port));
  }
  return "?";
}

bool set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

// Waits for the next event on a channel (non-blocking fd), bounded.
// Returns nullptr with errno = ETIMEDOUT on timeout.
rdma_cm_event* next_event(rdma_event_channel* ch, clock_type::time_point deadline) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return nullptr;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) {
      errno = ETIMEDOUT;
      return nullptr;
    }
    pollfd p{ch->fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count() + 1, 1000)));
  }
}

// Destroys a cm_id and its channel on a detached thread: acks whatever still
// arrives, never blocks the caller.
void destroy_id_detached(rdma_cm_id* id, rdma_event_channel* ch) {
  std::thread([id, ch] {
    if (ch != nullptr) {
      // Drain events already queued so rdma_destroy_id does not wait for their ack.
      rdma_cm_event* ev = nullptr;
      while (rdma_get_cm_event(ch, &ev) == 0) {
        if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
          rdma_cm_id* child = ev->id;
          rdma_reject(child, nullptr, 0);
          rdma_ack_cm_event(ev);
          rdma_destroy_id(child);
        } else {
          rdma_ack_cm_event(ev);
        }
      }
    }
    if (id != nullptr) rdma_destroy_id(id);
    if (ch != nullptr) rdma_destroy_event_channel(ch);
  }).detach();
}


int ibv_access(access a, bool atomics) {
  int f = 0;
  if (has(a, access::local_write)) f |= IBV_ACCESS_LOCAL_WRITE;
  if (has(a, access::remote_write)) f |= IBV_ACCESS_REMOTE_WRITE;
  if (has(a, access::remote_read)) f |= IBV_ACCESS_REMOTE_READ;
  if (has(a, access::remote_atomic) && atomics) f |= IBV_ACCESS_REMOTE_ATOMIC;
  return f;
}

wc_status map_status(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return wc_status::success;
    case IBV_WC_LOC_LEN_ERR: return wc_status::loc_len_err;
    case IBV_WC_LOC_QP_OP_ERR: return wc_status::loc_qp_op_err;
    case IBV_WC_LOC_PROT_ERR: return wc_status::loc_prot_err;
    case IBV_WC_WR_FLUSH_ERR: return wc_status::wr_flush_err;
    case IBV_WC_MW_BIND_ERR: return wc_status::mw_bind_err;
    case IBV_WC_BAD_RESP_ERR: return wc_status::bad_resp_err;
    case IBV_WC_LOC_ACCESS_ERR: return wc_status::loc_access_err;
    case IBV_WC_REM_INV_REQ_ERR: return wc_status::rem_inv_req_err;
    case IBV_WC_REM_ACCESS_ERR: return wc_status::rem_access_err;
    case IBV_WC_REM_OP_ERR: return wc_status::rem_op_err;
    case IBV_WC_RETRY_EXC_ERR: return wc_status::retry_exc_err;
    case IBV_WC_RNR_RETRY_EXC_ERR: return wc_status::rnr_retry_exc_err;
    case IBV_WC_FATAL_ERR: return wc_status::fatal_err;
    case IBV_WC_RESP_TIMEOUT_ERR: return wc_status::resp_timeout_err;
    default: return wc_status::general_err;
  }
}

wc_opcode map_opcode(ibv_wc_opcode o) {
  switch (o) {
    case IBV_WC_SEND: return wc_opcode::send;
    case IBV_WC_RDMA_WRITE: return wc_opcode::rdma_write;
    case IBV_WC_RDMA_READ: return wc_opcode::rdma_read;
    case IBV_WC_COMP_SWAP: return wc_opcode::comp_swap;
    case IBV_WC_FETCH_ADD: return wc_opcode::fetch_add;
    case IBV_WC_RECV: return wc_opcode::recv;
    case IBV_WC_RECV_RDMA_WITH_IMM: return wc_opcode::recv_rdma_with_imm;
    default: return (o & IBV_WC_RECV) ? wc_opcode::recv : wc_opcode::send;
  }
}

// ------------------------------------------------------------------ device ----

struct port_info {
  ibv_port_attr attr{};
};

class verbs_qp;

class verbs_device final : public detail::device_impl {
 public:
  verbs_device(ibv_context* ctx, const device_options& opts) : ctx_(ctx) {
    opts_ = opts;
    ibv_query_device(ctx_, &dattr_);
    ibdev_ = ibv_get_device_name(ctx_->device);
    attr_.name = "verbs:" + ibdev_;
    attr_.provider = "verbs";
    const bool iwarp = ctx_->device->transport_type == IBV_TRANSPORT_IWARP;
    ports_.resize(dattr_.phys_port_cnt);
    for (std::uint8_t p = 1; p <= dattr_.phys_port_cnt; ++p) ibv_query_port(ctx_, p, &ports_[p - 1].attr);
    port_ = 1;
    for (std::uint8_t p = 1; p <= dattr_.phys_port_cnt; ++p) {
      if (ports_[p - 1].attr.state == IBV_PORT_ACTIVE) {
        port_ = p;
        break;
      }
    }
    const bool eth = !ports_.empty() && ports_[port_ - 1].attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    attr_.transport_type = iwarp ? transport::iwarp : eth ? transport::roce : transport::infiniband;
    attr_.max_qp = static_cast<std::uint32_t>(dattr_.max_qp);
    attr_.max_cqe = static_cast<std::uint32_t>(dattr_.max_cqe);
    attr_.max_qp_wr = static_cast<std::uint32_t>(dattr_.max_qp_wr);
    attr_.max_sge = static_cast<std::uint32_t>(dattr_.max_sge);
    // siw reports 1 and, given more, reads only the first SGE's length.
    attr_.max_sge_rd = dattr_.max_sge_rd > 0 ? std::min(attr_.max_sge, static_cast<std::uint32_t>(dattr_.max_sge_rd))
                                             : attr_.max_sge;
    attr_.max_inline_data = 0;  // known per QP (ibv_create_qp reports it)
    attr_.max_mr = static_cast<std::uint32_t>(dattr_.max_mr);
    attr_.max_mr_size = dattr_.max_mr_size;
    attr_.max_msg_size = ports_.empty() ? 0 : ports_[port_ - 1].attr.max_msg_sz;
    attr_.max_qp_rd_atom = static_cast<std::uint32_t>(dattr_.max_qp_rd_atom);
    attr_.atomics = dattr_.atomic_cap != IBV_ATOMIC_NONE;
    // iWARP (RDMAP, RFC 5040) has no immediate data; IB and RoCE have it.
    attr_.immediate_data = !iwarp;
    // Remote invalidation applies to memory windows and fast-registered MRs;
    // register_memory makes plain MRs, which rxe refuses to invalidate.
    attr_.send_with_invalidate = false;
    for (std::uint8_t p = 1; p <= dattr_.phys_port_cnt; ++p) attr_.ports.push_back(describe_port(p));
    if (auto g = detail::env_u32("CONVEYOR_VERBS_GID_INDEX")) gid_override_ = static_cast<int>(*g);
    dev_path_ = ctx_->device->dev_path;
    if (::access(dev_path_.c_str(), F_OK) != 0) dev_path_.clear();  // (no sysfs here: nothing to watch)
    set_nonblock(ctx_->async_fd);
    async_thread_ = std::thread([this] { async_loop(); });
  }
  ~verbs_device() override {
    stop_ = true;
    if (async_thread_.joinable()) async_thread_.join();
    ibv_close_device(ctx_);
    // librdmacm keeps a context of its own per device it has used and closes
    // that of a removed device only when it rescans the device list (and the
    // device's last cm_id is gone); the kernel's removal waits for it (rxe and
    // siw cannot disassociate), so rescan. librdmacm 44 skips the rescan when
    // no device is left at all: the last device's removal then ends only
    // with the process.
    if (fatal_ && !dev_path_.empty() && ::access(dev_path_.c_str(), F_OK) != 0) {
      int n = -1;
      if (ibv_context** l = rdma_get_devices(&n)) rdma_free_devices(l);
      log(detail::log_level::info, "device " + ibdev_ + " closed after its removal (" + std::to_string(n) +
                                       " RDMA devices left)");
    }
  }

  result<std::shared_ptr<detail::pd_impl>> alloc_pd() override;
  result<std::shared_ptr<detail::cq_impl>> create_cq(const cq_options& opts) override;
  result<std::unique_ptr<detail::listener_impl>> bind_listener(std::string_view address,
                                                               int backlog) override;

  ibv_context* ctx() const noexcept { return ctx_; }
  const ibv_device_attr& dattr() const noexcept { return dattr_; }
  const std::string& ibdev() const noexcept { return ibdev_; }
  std::uint8_t port() const noexcept { return port_; }
  bool iwarp() const noexcept { return attr_.transport_type == transport::iwarp; }
  int gid_override() const noexcept { return gid_override_; }

  // QPs by number, to mark a QP in ERROR when its CQ reports an error
  // completion or overflows (error paths only; never on a successful poll).
  void add_qp(std::uint32_t qpn, verbs_qp* q) {
    std::lock_guard lk(qps_mu_);
    qps_[qpn] = q;
  }
  void remove_qp(std::uint32_t qpn) {
    std::lock_guard lk(qps_mu_);
    qps_.erase(qpn);
  }
  void qp_failed(std::uint32_t qpn) noexcept;
  void cq_failed(const void* cq) noexcept;
  // Moves to ERROR every QP of this device that is connected through `port`
  // (0: every QP, connected or not) and not in ERROR yet; returns one qp_error
  // event per such QP, those already in ERROR included, for the caller to
  // deliver outside the lock.
  std::vector<device_event> fail_qps(std::uint8_t port, std::string_view cause) noexcept;
  std::string where() const { return "device " + ibdev_ + " port " + std::to_string(port_); }

  // A port as device_attr reports it: state, link layer, active MTU in bytes
  // and the GID table's non-zero entries (RoCE v2 GIDs embed the IP address).
  port_attr describe_port(std::uint8_t p) const {
    const auto& a = ports_[p - 1].attr;
    port_attr out;
    out.num = p;
    out.state = port_state_name(a.state);
    out.link_layer = a.link_layer == IBV_LINK_LAYER_ETHERNET     ? "ethernet"
                     : a.link_layer == IBV_LINK_LAYER_INFINIBAND ? "infiniband"
                                                                 : "unspecified";
    out.mtu = a.active_mtu >= IBV_MTU_256 && a.active_mtu <= IBV_MTU_4096 ? mtu_bytes(a.active_mtu) : 0u;
    for (int i = 0; i < a.gid_tbl_len; ++i) {
      ibv_gid gid{};
      if (ibv_query_gid(ctx_, p, i, &gid) != 0) break;
      if (std::all_of(std::begin(gid.raw), std::end(gid.raw), [](std::uint8_t b) { return b == 0; })) continue;
      char text[INET6_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET6, gid.raw, text, sizeof text) != nullptr) out.addresses.emplace_back(text);
    }
    return out;
  }

  std::string describe() const {
    std::string s = ibdev_ + " (" + std::string(to_string(attr_.transport_type)) + ", fw " +
                    dattr_.fw_ver + ")";
    for (std::size_t i = 0; i < ports_.size(); ++i) {
      const auto& a = ports_[i].attr;
      s += "; port " + std::to_string(i + 1) + " " + port_state_name(a.state) + " mtu " +
           mtu_name(a.active_mtu) + "/" + mtu_name(a.max_mtu) + " gids " + std::to_string(a.gid_tbl_len);
    }
    s += std::string("; atomics ") + (attr_.atomics ? "yes" : "no") + ", immediate " +
         (attr_.immediate_data ? "yes" : "no") + ", max_qp_rd_atom " + std::to_string(dattr_.max_qp_rd_atom);
    return s;
  }

 private:
  void async_loop();

  ibv_context* ctx_;
  ibv_device_attr dattr_{};
  std::string ibdev_;
  std::vector<port_info> ports_;
  std::uint8_t port_ = 1;
  int gid_override_ = -1;
  std::atomic<bool> stop_{false};
  bool fatal_ = false;    // device_fatal was delivered (async thread only)
  std::string dev_path_;  // the uverbs node in sysfs: gone once the device is removed
  std::thread async_thread_;
  std::mutex qps_mu_;
  std::unordered_map<std::uint32_t, verbs_qp*> qps_;
};

// ---------------------------------------------------------------------- pd ----

class verbs_pd final : public detail::pd_impl {
 public:
  verbs_pd(std::shared_ptr<verbs_device> dev, ibv_pd* pd) : dev_(std::move(dev)), pd_(pd) {}
  ~verbs_pd() override { ibv_dealloc_pd(pd_); }
  result<std::shared_ptr<detail::mr_impl>> register_memory(std::span<std::byte> buf,
                                                           access rights) override;
  result<std::shared_ptr<detail::qp_impl>> create_qp(const qp_init_attr& attr) override;
  verbs_device& dev() noexcept { return *dev_; }
  ibv_pd* pd() const noexcept { return pd_; }

 private:
  std::shared_ptr<verbs_device> dev_;
  ibv_pd* pd_;
};

class verbs_mr final : public detail::mr_impl {
 public:
  verbs_mr(std::shared_ptr<verbs_pd> pd, ibv_mr* mr, access rights) : pd_(std::move(pd)), mr_(mr) {
    data_ = static_cast<std::byte*>(mr->addr);
    size_ = mr->length;
    lkey_ = mr->lkey;
    rkey_ = mr->rkey;
    rights_ = rights;
  }
  ~verbs_mr() override { deregister(); }
  void deregister() noexcept override {
    std::lock_guard lk(mu_);
    if (mr_ != nullptr) {
      ibv_dereg_mr(mr_);
      mr_ = nullptr;
    }
  }

 private:
  std::shared_ptr<verbs_pd> pd_;
  std::mutex mu_;
  ibv_mr* mr_;
};

// ---------------------------------------------------------------------- cq ----

class verbs_cq final : public detail::cq_impl {
 public:
  verbs_cq(std::shared_ptr<verbs_device> dev, ibv_comp_channel* ch, ibv_cq* cq, std::uint32_t depth)
      : dev_(std::move(dev)), ch_(ch), cq_(cq), depth_(depth) {
    // fd(): an epoll set of the completion channel and an eventfd, so that
    // arm() can make it readable at once when a completion is already queued
    // (a completion channel only signals new ones).
    efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event e{};
    e.events = EPOLLIN;
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, ch_->fd, &e);
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, efd_, &e);
  }
  ~verbs_cq() override {
    if (epfd_ >= 0) ::close(epfd_);
    if (efd_ >= 0) ::close(efd_);
    if (unacked_ > 0) ibv_ack_cq_events(cq_, unacked_);
    ibv_destroy_cq(cq_);
    ibv_destroy_comp_channel(ch_);
  }
  std::uint32_t depth() const noexcept override { return depth_; }

  std::expected<std::size_t, errc> poll(std::span<work_completion> out) noexcept override {
    if (out.empty()) return std::size_t{0};
    if (has_stash_.load(std::memory_order_acquire)) {
      std::lock_guard lk(stash_mu_);
      if (has_stash_.load(std::memory_order_relaxed)) {
        out[0] = stash_;
        has_stash_.store(false, std::memory_order_release);
        std::uint64_t v = 0;
        [[maybe_unused]] auto r = ::read(efd_, &v, sizeof v);
        auto more = poll_raw(out.subspan(1));
        return more ? 1 + *more : std::expected<std::size_t, errc>(std::size_t{1});
      }
    }
    return poll_raw(out);
  }

  std::expected<std::size_t, errc> poll_raw(std::span<work_completion> out) noexcept {
    if (errored_.load(std::memory_order_relaxed)) return std::unexpected(errc::cq_overflow);
    std::size_t total = 0;
    ibv_wc wc[32];
    while (total < out.size()) {
      int want = static_cast<int>(std::min<std::size_t>(32, out.size() - total));
      int n = ibv_poll_cq(cq_, want, wc);
      if (n < 0) {
        if (!errored_.exchange(true)) dev_->cq_failed(this);
        return std::unexpected(errc::cq_overflow);
      }
      for (int i = 0; i < n; ++i) {
        auto& o = out[total + static_cast<std::size_t>(i)];
        const auto& w = wc[i];
        o = work_completion{};
        o.wr_id = w.wr_id;
        o.status = map_status(w.status);
        o.opcode = map_opcode(w.opcode);
        o.byte_len = w.byte_len;
        o.qp_num = w.qp_num;
        o.vendor_err = w.vendor_err;
        if (w.status != IBV_WC_SUCCESS && w.status != IBV_WC_WR_FLUSH_ERR) dev_->qp_failed(w.qp_num);
        if (w.status == IBV_WC_SUCCESS) {
          if (w.wc_flags & IBV_WC_WITH_IMM) {
            o.with_imm = true;
            o.imm_data = ntohl(w.imm_data);
          } else if (w.wc_flags & IBV_WC_WITH_INV) {
            o.with_inv = true;
            o.invalidated_rkey = w.invalidated_rkey;
          }
        }
      }
      total += static_cast<std::size_t>(n);
      if (n < want) break;
    }
    return total;
  }

  std::expected<std::size_t, errc> wait(std::span<work_completion> out,
                                        std::chrono::nanoseconds timeout) noexcept override {
    const auto start = clock_type::now();
    const auto deadline = start + timeout;
    const auto spin_end = start + std::chrono::microseconds(dev_->options().spin_us);
    for (;;) {
      auto r = poll(out);
      if (!r || *r > 0) return r;
      if (clock_type::now() < spin_end) continue;
      break;
    }
    for (;;) {
      std::unique_lock lk(wait_mu_);
      if (ibv_req_notify_cq(cq_, 0) != 0) return std::unexpected(errc::io_error);
      auto r = poll(out);  // anything that arrived before arming
      if (!r || *r > 0) return r;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      if (left.count() <= 0 && clock_type::now() >= deadline) return std::unexpected(errc::timed_out);
      pollfd p{ch_->fd, POLLIN, 0};
      int pr = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left.count() + 1, 1, 100)));
      if (pr > 0) consume_events();
      lk.unlock();
      if (clock_type::now() >= deadline) {
        auto last = poll(out);
        if (!last || *last > 0) return last;
        return std::unexpected(errc::timed_out);
      }
    }
  }

  int fd() const noexcept override { return epfd_; }
  void arm() noexcept override {
    std::lock_guard lk(wait_mu_);
    consume_events();
    ibv_req_notify_cq(cq_, 0);
    std::lock_guard sl(stash_mu_);
    if (!has_stash_.load(std::memory_order_relaxed)) {
      auto r = poll_raw(std::span(&stash_, 1));
      if (r && *r == 1) {
        has_stash_.store(true, std::memory_order_release);
        std::uint64_t one = 1;
        [[maybe_unused]] auto w = ::write(efd_, &one, sizeof one);
      }
    }
  }

  ibv_cq* cq() const noexcept { return cq_; }
  void mark_error() noexcept { errored_ = true; }

 private:
  void consume_events() noexcept {
    ibv_cq* ev_cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(ch_, &ev_cq, &ctx) == 0) {
      if (++unacked_ >= 64) {
        ibv_ack_cq_events(cq_, unacked_);
        unacked_ = 0;
      }
    }
  }

  std::shared_ptr<verbs_device> dev_;
  ibv_comp_channel* ch_;
  ibv_cq* cq_;
  std::uint32_t depth_;
  std::mutex wait_mu_;
  unsigned unacked_ = 0;
  std::atomic<bool> errored_{false};
  int efd_ = -1, epfd_ = -1;
  std::mutex stash_mu_;
  work_completion stash_{};
  std::atomic<bool> has_stash_{false};
};

// ---------------------------------------------------------------------- qp ----

// A connection's rdma_cm state, shared by the QP and its watcher thread.
struct conn_state {
  std::mutex mu;
  rdma_cm_id* id = nullptr;
  rdma_event_channel* ch = nullptr;
  ibv_qp* qp = nullptr;  // cleared (under mu) before the QP is destroyed
  std::atomic<bool> closing{false};
  std::atomic<bool> peer_gone{false};
  std::string where;
};

void move_to_error(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

// Watches an established connection: a peer disconnect moves the QP to ERROR
// (outstanding requests flush); after the local close it waits at most 1 s for
// the CM to finish, then destroys the cm_id and channel.
void watch(std::shared_ptr<conn_state> c) {
  std::thread([c] {
    clock_type::time_point close_deadline = clock_type::time_point::max();
    bool done = false;
    while (!done) {
      if (c->closing && close_deadline == clock_type::time_point::max())
        close_deadline = clock_type::now() + 1s;
      if (clock_type::now() >= close_deadline) break;
      pollfd p{c->ch->fd, POLLIN, 0};
      ::poll(&p, 1, 50);
      rdma_cm_event* ev = nullptr;
      while (rdma_get_cm_event(c->ch, &ev) == 0) {
        const auto e = ev->event;
        rdma_ack_cm_event(ev);
        if (e == RDMA_CM_EVENT_DISCONNECTED || e == RDMA_CM_EVENT_DEVICE_REMOVAL ||
            e == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
          if (!c->closing) {
            log(detail::log_level::info, c->where + ": " + rdma_event_str(e) + " (peer closed)");
            c->peer_gone = true;
            std::lock_guard lk(c->mu);
            if (c->qp != nullptr) move_to_error(c->qp);
            rdma_disconnect(c->id);  // answers the peer's DREQ at once (IB CM)
          }
          if (c->closing) done = true;
        }
      }
    }
    rdma_cm_id* id = c->id;
    rdma_event_channel* ch = c->ch;
    c->id = nullptr;
    c->ch = nullptr;
    destroy_id_detached(id, ch);
  }).detach();
}

class verbs_qp final : public detail::qp_impl {
 public:
  verbs_qp(std::shared_ptr<verbs_pd> pd, std::shared_ptr<detail::cq_impl> scq,
           std::shared_ptr<detail::cq_impl> rcq, ibv_qp* qp, const qp_init_attr& a)
      : pd_(std::move(pd)), scq_(std::move(scq)), rcq_(std::move(rcq)), qp_(qp) {
    caps_ = a.cap;
    want_ord_ = a.max_rd_atomic;
    want_ird_ = a.max_dest_rd_atomic;
    qp_->qp_context = this;
    pd_->dev().add_qp(qp_->qp_num, this);
  }
  bool uses_cq(const void* cq) const noexcept { return scq_.get() == cq || rcq_.get() == cq; }
  ~verbs_qp() override {
    disconnect();
    if (conn_) {
      std::lock_guard lk(conn_->mu);
      conn_->qp = nullptr;
    }
    pd_->dev().remove_qp(qp_->qp_num);
    ibv_destroy_qp(qp_);
  }

  std::uint32_t qp_num() const noexcept override { return qp_->qp_num; }
  qp_state state() const noexcept override {
    if (conn_ && conn_->peer_gone.load(std::memory_order_relaxed)) return qp_state::error;
    auto s = state_.load(std::memory_order_relaxed);
    if (s == qp_state::rts) {
      // The device may have moved the QP to ERROR (a remote error, a Terminate).
      ibv_qp_attr a{};
      ibv_qp_init_attr ia{};
      if (ibv_query_qp(qp_, &a, IBV_QP_STATE, &ia) == 0 && (a.qp_state == IBV_QPS_ERR || a.qp_state == IBV_QPS_SQE)) {
        state_.store(qp_state::error, std::memory_order_relaxed);  // posts now refuse with qp_in_error
        return qp_state::error;
      }
    }
    return s;
  }
  const qp_caps& caps() const noexcept override { return caps_; }

  std::string where() const {
    std::string s = pd_->dev().where() + " QP " + std::to_string(qp_->qp_num);
    if (!peer_.empty()) s += " peer " + peer_;
    return s;
  }

  status post_send(std::span<const send_wr> wrs, std::size_t* bad) noexcept override {
    if (bad) *bad = 0;
    const auto st = (conn_ && conn_->peer_gone.load(std::memory_order_relaxed))
                        ? qp_state::error
                        : state_.load(std::memory_order_relaxed);
    if (st == qp_state::error) return errc::qp_in_error;
    if (st != qp_state::rts) return errc::invalid_state;
    const auto& da = pd_->dev().attr();
    constexpr std::size_t chunk = 16;
    ibv_send_wr w[chunk];
    std::size_t done = 0;
    while (done < wrs.size()) {
      std::size_t n = std::min(chunk, wrs.size() - done);
      // A request refused here ends the call, but the ones before it are
      // posted (and *bad names it), as ibv_post_send does for its own refusals.
      status refused = errc::ok;
      for (std::size_t i = 0; i < n; ++i) {
        const auto& s = wrs[done + i];
        auto& v = w[i];
        v = ibv_send_wr{};
        v.wr_id = s.wr_id;
        v.next = (i + 1 < n) ? &w[i + 1] : nullptr;
        v.sg_list = const_cast<ibv_sge*>(reinterpret_cast<const ibv_sge*>(s.sg_list.data()));
        v.num_sge = static_cast<int>(s.sg_list.size());
        if (s.sg_list.size() > caps_.max_send_sge) {
          refused = errc::invalid_argument;
          n = i;
          break;
        }
        if (has(s.flags, send_flags::signaled)) v.send_flags |= IBV_SEND_SIGNALED;
        if (has(s.flags, send_flags::fence)) v.send_flags |= IBV_SEND_FENCE;
        if (has(s.flags, send_flags::solicited)) v.send_flags |= IBV_SEND_SOLICITED;
        if (has(s.flags, send_flags::inline_data)) {
          std::uint64_t len = 0;
          for (const auto& g : s.sg_list) len += g.length;
          if (len > caps_.max_inline_data) {
            refused = errc::invalid_argument;
            n = i;
            break;
          }
          v.send_flags |= IBV_SEND_INLINE;
        }
        bool ok = true;
        switch (s.opcode) {
          case wr_opcode::send: v.opcode = IBV_WR_SEND; break;
          case wr_opcode::send_with_imm:
            ok = da.immediate_data;
            v.opcode = IBV_WR_SEND_WITH_IMM;
            v.imm_data = htonl(s.imm_data);
            break;
          case wr_opcode::send_with_inv:
            ok = da.send_with_invalidate;
            v.opcode = IBV_WR_SEND_WITH_INV;
            v.invalidate_rkey = s.invalidate_rkey;
            break;
          case wr_opcode::rdma_write:
          case wr_opcode::rdma_write_with_imm:
          case wr_opcode::rdma_read:
            if (s.opcode == wr_opcode::rdma_write) v.opcode = IBV_WR_RDMA_WRITE;
            if (s.opcode == wr_opcode::rdma_write_with_imm) {
              ok = da.immediate_data;
              v.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
              v.imm_data = htonl(s.imm_data);
            }
            if (s.opcode == wr_opcode::rdma_read) {
              // The device would read fewer bytes than asked (siw scatters into
              // the first SGE only), so refuse rather than report a short READ.
              if (s.sg_list.size() > da.max_sge_rd) ok = false;
              v.opcode = IBV_WR_RDMA_READ;
            }
            v.wr.rdma.remote_addr = s.remote_addr;
            v.wr.rdma.rkey = s.rkey;
            break;
          case wr_opcode::atomic_cmp_and_swp:
          case wr_opcode::atomic_fetch_and_add:
            ok = da.atomics;
            if (ok && (s.sg_list.size() != 1 || s.sg_list[0].length != 8 || (s.remote_addr % 8) != 0)) {
              refused = errc::invalid_argument;
              break;
            }
            v.opcode = s.opcode == wr_opcode::atomic_cmp_and_swp ? IBV_WR_ATOMIC_CMP_AND_SWP
                                                                 : IBV_WR_ATOMIC_FETCH_AND_ADD;
            v.wr.atomic.remote_addr = s.remote_addr;
            v.wr.atomic.rkey = s.rkey;
            v.wr.atomic.compare_add = s.compare_add;
            v.wr.atomic.swap = s.swap;
            break;
          default: ok = false;
        }
        if (refused == errc::ok && !ok)
          refused = s.opcode == wr_opcode::rdma_read ? errc::invalid_argument : errc::unsupported;
        if (refused != errc::ok) {
          n = i;
          break;
        }
      }
      if (n > 0) {
        w[n - 1].next = nullptr;
        ibv_send_wr* bad_wr = nullptr;
        int rc = ibv_post_send(qp_, w, &bad_wr);
        if (rc != 0) {
          if (bad) *bad = done + static_cast<std::size_t>(bad_wr ? bad_wr - w : 0);
          return map_post_error(rc);
        }
      }
      done += n;
      if (refused != errc::ok) {
        if (bad) *bad = done;
        return refused;
      }
    }
    return errc::ok;
  }

  status post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept override {
    if (bad) *bad = 0;
    const auto st = state_.load(std::memory_order_relaxed);
    if (st == qp_state::error || (conn_ && conn_->peer_gone.load(std::memory_order_relaxed)))
      return errc::qp_in_error;
    if (st == qp_state::reset) return errc::invalid_state;
    constexpr std::size_t chunk = 16;
    ibv_recv_wr w[chunk];
    std::size_t done = 0;
    while (done < wrs.size()) {
      std::size_t n = std::min(chunk, wrs.size() - done);
      bool refused = false;  // the requests before a refused one are posted
      for (std::size_t i = 0; i < n; ++i) {
        const auto& r = wrs[done + i];
        if (r.sg_list.size() > caps_.max_recv_sge) {
          refused = true;
          n = i;
          break;
        }
        w[i] = ibv_recv_wr{};
        w[i].wr_id = r.wr_id;
        w[i].next = (i + 1 < n) ? &w[i + 1] : nullptr;
        w[i].sg_list = const_cast<ibv_sge*>(reinterpret_cast<const ibv_sge*>(r.sg_list.data()));
        w[i].num_sge = static_cast<int>(r.sg_list.size());
      }
      if (n > 0) {
        w[n - 1].next = nullptr;
        ibv_recv_wr* bad_wr = nullptr;
        int rc = ibv_post_recv(qp_, w, &bad_wr);
        if (rc != 0) {
          if (bad) *bad = done + static_cast<std::size_t>(bad_wr ? bad_wr - w : 0);
          return map_post_error(rc);
        }
      }
      done += n;
      if (refused) {
        if (bad) *bad = done;
        return errc::invalid_argument;
      }
    }
    return errc::ok;
  }

  result<void> modify(qp_state target) override {
    const auto from = state();
    if (!detail::qp_transition_allowed(from, target) ||
        (target != qp_state::error && target != qp_state::reset && target != qp_state::init))
      return make_error(errc::invalid_state, "modify " + where() + " from " + std::string(to_string(from)) +
                                                 " to " + std::string(to_string(target)) +
                                                 ": not allowed (the connection manager drives RTR/RTS)");
    if (target == qp_state::error) {
      move_to_error(qp_);
      state_ = qp_state::error;
      return {};
    }
    if (target == qp_state::reset) {
      if (conn_) return make_error(errc::invalid_state, "modify " + where() + " to reset: the QP was connected; create a new QP");
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RESET;
      if (int rc = ibv_modify_qp(qp_, &a, IBV_QP_STATE); rc != 0)
        return make_error(errc::io_error, "modify " + where() + " to reset: " + err_text(rc), rc);
      state_ = qp_state::reset;
      return {};
    }
    if (from == qp_state::init) return {};
    if (auto r = to_init(); !r) return r;
    return {};
  }

  result<void> to_init() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.qp_access_flags = ibv_access(access::local_write | access::remote_write | access::remote_read |
                                       access::remote_atomic,
                                   pd_->dev().attr().atomics);
    int mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS;
    if (!pd_->dev().iwarp()) {
      a.pkey_index = 0;
      a.port_num = pd_->dev().port();
      mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    }
    if (int rc = ibv_modify_qp(qp_, &a, mask); rc != 0)
      return make_error(errc::io_error, "modify " + where() + " to INIT: " + err_text(rc), rc);
    state_ = qp_state::init;
    return {};
  }

  result<qp_connection_attr> connection() const override {
    if (!conn_) return make_error(errc::invalid_state, "connection of " + where() + ": not connected");
    return cattr_;
  }
  qp_counters counters() const noexcept override { return {}; }  // verbs keeps no per-QP counters

  void disconnect() noexcept override {
    if (!conn_ || conn_->closing.exchange(true)) {
      if (!conn_ && state_ != qp_state::error && state_ != qp_state::reset) {
        move_to_error(qp_);
        state_ = qp_state::error;
      }
      return;
    }
    {
      std::lock_guard lk(conn_->mu);
      if (conn_->id != nullptr) rdma_disconnect(conn_->id);
    }
    move_to_error(qp_);
    state_ = qp_state::error;
  }

  result<connection_info> connect(std::string_view address, const connect_options& opts) override;
  result<connection_info> accept_on(rdma_cm_id* id, rdma_event_channel* ch, const rdma_conn_param& req,
                                    const std::string& peer, std::span<const std::byte> pdata,
                                    std::chrono::milliseconds timeout);

  verbs_pd& pd() noexcept { return *pd_; }
  ibv_qp* ibv() const noexcept { return qp_; }
  void mark_error() noexcept { state_ = qp_state::error; }
  // Established (finish() ran): from then on peer_ and the port do not change,
  // so the device's event thread may read them.
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }
  // The port the connection runs on (rdma_cm resolved it); the device's port
  // before the QP is connected.
  std::uint8_t port() const noexcept {
    return connected() && conn_port_ != 0 ? conn_port_ : pd_->dev().port();
  }
  // Moves the QP to ERROR for a cause outside it (its port went down, the
  // device failed): every outstanding request completes with wr_flush_err.
  // (The caller logs it, with the event it delivers.)
  void fail() noexcept {
    state_ = qp_state::error;
    move_to_error(qp_);
  }

 private:
  status map_post_error(int rc) noexcept {
    if (rc == ENOMEM || rc == -ENOMEM) return errc::again;  // (some providers return -errno)
    if (state() == qp_state::error) {
      state_ = qp_state::error;
      return errc::qp_in_error;
    }
    return errc::invalid_argument;
  }
  result<void> ib_rtr_rts(rdma_cm_id* id, std::uint32_t ird, std::uint32_t ord);
  void finish(rdma_cm_id* id, rdma_event_channel* ch, std::uint32_t ird, std::uint32_t ord);

  std::shared_ptr<verbs_pd> pd_;
  std::shared_ptr<detail::cq_impl> scq_, rcq_;
  ibv_qp* qp_;
  qp_caps caps_;
  std::uint32_t want_ord_ = 16, want_ird_ = 16;
  mutable std::atomic<qp_state> state_{qp_state::init};
  std::shared_ptr<conn_state> conn_;
  qp_connection_attr cattr_;
  std::string peer_;
  std::atomic<bool> connected_{false};
  std::uint8_t conn_port_ = 0;  // written before connected_ is set
};

void verbs_device::qp_failed(std::uint32_t qpn) noexcept {
  std::lock_guard lk(qps_mu_);
  if (auto it = qps_.find(qpn); it != qps_.end()) it->second->mark_error();
}

void verbs_device::cq_failed(const void* cq) noexcept {
  std::lock_guard lk(qps_mu_);
  for (auto& [n, q] : qps_) {
    if (q->uses_cq(cq)) {
      q->mark_error();
      move_to_error(q->ibv());
    }
  }
}

std::vector<device_event> verbs_device::fail_qps(std::uint8_t port, std::string_view cause) noexcept {
  std::vector<device_event> out;
  try {
    std::lock_guard lk(qps_mu_);  // a QP leaves the table before it is destroyed
    for (auto& [n, q] : qps_) {
      if (port != 0 && (!q->connected() || q->port() != port)) continue;
      const bool already = q->state() == qp_state::error;
      if (!already) q->fail();
      out.push_back(qp_failed_event(q->connected() ? q->where() : where() + " QP " + std::to_string(n),
                                    q->port(), n, cause, already));
    }
  } catch (...) {  // (allocation failure) the QPs failed so far stay failed
  }
  return out;
}

void verbs_device::async_loop() {
  const auto& cb = options().on_event;
  auto deliver = [&](const device_event& e) {
    if (!deliver_event(cb, e))
      log(detail::log_level::error, "device " + ibdev_ + ": the on_event callback threw; the event is dropped");
  };
  while (!stop_) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) {
      // A removed device whose driver cannot disassociate (rxe, siw) reports
      // nothing on this fd; its uverbs node vanishing is the sign.
      if (!fatal_ && !dev_path_.empty() && ::access(dev_path_.c_str(), F_OK) != 0 && errno == ENOENT) {
        fatal_ = true;
        const auto e = device_removed_event(ibdev_);
        const auto failed = fail_qps(0, "the device was removed");
        log(detail::log_level::error, e.description);
        for (const auto& x : failed) log(detail::log_level::warn, x.description);
        deliver(e);
        for (const auto& x : failed) deliver(x);
      }
      continue;
    }
    ibv_async_event ev{};
    while (ibv_get_async_event(ctx_, &ev) == 0) {
      async_event_fields f{.type = ev.event_type, .ibdev = ibdev_, .device_port = port_};
      verbs_qp* q = nullptr;
      verbs_cq* c = nullptr;
      std::string qp_where;
      switch (ev.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_COMM_EST:
        case IBV_EVENT_SQ_DRAINED:
        case IBV_EVENT_PATH_MIG:
        case IBV_EVENT_PATH_MIG_ERR:
        case IBV_EVENT_QP_LAST_WQE_REACHED:
          f.qp_num = ev.element.qp->qp_num;
          q = static_cast<verbs_qp*>(ev.element.qp->qp_context);
          if (q != nullptr) {
            qp_where = q->connected() ? q->where() : where() + " QP " + std::to_string(f.qp_num);
            f.qp_where = qp_where;
          }
          break;
        case IBV_EVENT_CQ_ERR: c = static_cast<verbs_cq*>(ev.element.cq->cq_context); break;
        case IBV_EVENT_PORT_ACTIVE:
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_LID_CHANGE:
        case IBV_EVENT_PKEY_CHANGE:
        case IBV_EVENT_GID_CHANGE:
        case IBV_EVENT_SM_CHANGE:
        case IBV_EVENT_CLIENT_REREGISTER: f.event_port = static_cast<std::uint8_t>(ev.element.port_num); break;
        default: break;
      }
      auto t = translate_async_event(f);
      std::vector<device_event> failed;
      switch (t.effect) {
        case async_effect::fail_qp:
          if (q != nullptr) q->mark_error();
          break;
        case async_effect::fail_cq:
          if (c != nullptr) {
            c->mark_error();
            cq_failed(c);
          }
          break;
        case async_effect::port_down:
          if (options().fail_qps_on_port_down)
            failed = fail_qps(f.event_port, "port " + std::to_string(f.event_port) + " went down");
          break;
        case async_effect::device_fatal:
          fatal_ = true;  // (the removal check then stays quiet)
          failed = fail_qps(0, "the device failed");
          break;
        case async_effect::none: break;
      }
      ibv_ack_async_event(&ev);
      if (!failed.empty())
        t.event.description += " (" + std::to_string(failed.size()) + " QP" + (failed.size() == 1 ? "" : "s") +
                               " on it: qp_error events follow)";
      log(t.level, t.event.description);
      for (const auto& e : failed) log(detail::log_level::warn, e.description);
      // The port's (or device's) event first, then one per QP it failed.
      deliver(t.event);
      for (const auto& e : failed) deliver(e);
    }
  }
}

result<std::shared_ptr<detail::pd_impl>> verbs_device::alloc_pd() {
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  if (pd == nullptr)
    return make_error(errno == ENOMEM ? errc::resource_exhausted : errc::io_error,
                      "alloc_pd on " + where() + ": " + err_text(errno), errno);
  auto self = std::static_pointer_cast<verbs_device>(shared_from_this());
  return std::make_shared<verbs_pd>(std::move(self), pd);
}

result<std::shared_ptr<detail::cq_impl>> verbs_device::create_cq(const cq_options& opts) {
  const std::string w = "create_cq on " + where();
  if (opts.depth == 0 || opts.depth > attr_.max_cqe)
    return make_error(errc::invalid_argument, w + ": depth " + std::to_string(opts.depth) +
                                                  " must be 1.." + std::to_string(attr_.max_cqe));
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx_);
  if (ch == nullptr) return make_error(errc::resource_exhausted, w + ": completion channel: " + err_text(errno), errno);
  set_nonblock(ch->fd);
  ibv_cq* cq = ibv_create_cq(ctx_, static_cast<int>(opts.depth), nullptr, ch, 0);
  if (cq == nullptr) {
    int e = errno;
    ibv_destroy_comp_channel(ch);
    return make_error(e == ENOMEM ? errc::resource_exhausted : errc::io_error, w + ": " + err_text(e), e);
  }
  auto self = std::static_pointer_cast<verbs_device>(shared_from_this());
  auto c = std::make_shared<verbs_cq>(std::move(self), ch, cq, opts.depth);
  cq->cq_context = c.get();
  return std::shared_ptr<detail::cq_impl>(std::move(c));
}

result<std::shared_ptr<detail::mr_impl>> verbs_pd::register_memory(std::span<std::byte> buf, access rights) {
  const std::string w = "register_memory on " + dev_->where();
  if (buf.empty() || buf.data() == nullptr) return make_error(errc::invalid_argument, w + ": empty buffer");
  if ((has(rights, access::remote_write) || has(rights, access::remote_atomic)) && !has(rights, access::local_write))
    return make_error(errc::invalid_argument, w + ": remote_write and remote_atomic require local_write (as in verbs)");
  // remote_atomic on a device without atomics grants nothing more (atomics are
  // refused at post time with errc::unsupported), as a verbs MR would.
  ibv_mr* mr = ibv_reg_mr(pd_, buf.data(), buf.size(), ibv_access(rights, dev_->attr().atomics));
  if (mr == nullptr) {
    int e = errno;
    if (e == ENOMEM || e == EPERM || e == EAGAIN) {
      rlimit rl{};
      getrlimit(RLIMIT_MEMLOCK, &rl);
      std::string lim = rl.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(rl.rlim_cur / 1024) + " KiB";
      return make_error(errc::resource_exhausted,
                        w + ": the kernel refused to pin " + std::to_string(buf.size()) +
                            " bytes (locked-memory limit RLIMIT_MEMLOCK is " + lim +
                            "; raise it with `ulimit -l unlimited` or limits.conf memlock)",
                        e);
    }
    return make_error(errc::io_error, w + ": ibv_reg_mr of " + std::to_string(buf.size()) + " bytes: " + err_text(e), e);
  }
  auto self = std::static_pointer_cast<verbs_pd>(shared_from_this());
  return std::make_shared<verbs_mr>(std::move(self), mr, rights);
}

result<std::shared_ptr<detail::qp_impl>> verbs_pd::create_qp(const qp_init_attr& attr) {
  const std::string w = "create_qp on " + dev_->where();
  if (!attr.send_cq || !attr.recv_cq || !*attr.send_cq || !*attr.recv_cq)
    return make_error(errc::invalid_argument, w + ": send_cq and recv_cq are required");
  auto* scq = dynamic_cast<verbs_cq*>(detail::handle_access::impl(*attr.send_cq));
  auto* rcq = dynamic_cast<verbs_cq*>(detail::handle_access::impl(*attr.recv_cq));
  if (!scq || !rcq) return make_error(errc::invalid_argument, w + ": CQ of another provider");
  const auto& c = attr.cap;
  const auto& da = dev_->dattr();
  if (c.max_send_wr == 0 || c.max_send_wr > static_cast<std::uint32_t>(da.max_qp_wr) || c.max_recv_wr == 0 ||
      c.max_recv_wr > static_cast<std::uint32_t>(da.max_qp_wr))
    return make_error(errc::invalid_argument, w + ": max_send_wr/max_recv_wr must be 1.." + std::to_string(da.max_qp_wr));
  if (c.max_send_sge == 0 || c.max_send_sge > static_cast<std::uint32_t>(da.max_sge) || c.max_recv_sge == 0 ||
      c.max_recv_sge > static_cast<std::uint32_t>(da.max_sge))
    return make_error(errc::invalid_argument, w + ": max_send_sge/max_recv_sge must be 1.." + std::to_string(da.max_sge));
  ibv_qp_init_attr ia{};
  ia.send_cq = scq->cq();
  ia.recv_cq = rcq->cq();
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = attr.sq_sig_all ? 1 : 0;
  ia.cap.max_send_wr = c.max_send_wr;
  ia.cap.max_recv_wr = c.max_recv_wr;
  ia.cap.max_send_sge = c.max_send_sge;
  ia.cap.max_recv_sge = c.max_recv_sge;
  ia.cap.max_inline_data = c.max_inline_data;
  ibv_qp* qp = ibv_create_qp(pd_, &ia);
  // Devices cap inline data differently (siw: a few hundred bytes less than
  // rxe) and say so only by refusing: retry with less inline data; the QP's
  // caps report what was granted, and longer inline posts are refused.
  for (std::uint32_t inl = c.max_inline_data / 2; qp == nullptr && errno == EINVAL && c.max_inline_data > 0;
       inl /= 2) {
    ia.cap.max_inline_data = inl;
    qp = ibv_create_qp(pd_, &ia);
    if (inl == 0) break;
  }
  if (qp == nullptr) {
    int e = errno;
    return make_error(e == ENOMEM ? errc::resource_exhausted : errc::invalid_argument,
                      w + ": ibv_create_qp (send_wr " + std::to_string(c.max_send_wr) + ", recv_wr " +
                          std::to_string(c.max_recv_wr) + ", inline " + std::to_string(c.max_inline_data) +
                          "): " + err_text(e),
                      e);
  }
  qp_init_attr a = attr;
  // What the device granted (it may round queue sizes up): qp.caps() reports it.
  // ibv_create_qp's answer is not enough: rxe rounds a queue up to a power of
  // two minus one (16 receives become 31) but answers with the size asked for,
  // so the queue took more than caps() said. ibv_query_qp reports the queues
  // as they are.
  a.cap.max_inline_data = std::min(ia.cap.max_inline_data, c.max_inline_data);
  a.cap.max_send_wr = ia.cap.max_send_wr;
  a.cap.max_recv_wr = ia.cap.max_recv_wr;
  {
    ibv_qp_attr qa{};
    ibv_qp_init_attr qia{};
    if (ibv_query_qp(qp, &qa, IBV_QP_CAP, &qia) == 0) {
      a.cap.max_send_wr = std::max(a.cap.max_send_wr, qa.cap.max_send_wr);
      a.cap.max_recv_wr = std::max(a.cap.max_recv_wr, qa.cap.max_recv_wr);
    }
  }
  a.cap.max_send_sge = std::min<std::uint32_t>(ia.cap.max_send_sge, static_cast<std::uint32_t>(da.max_sge));
  a.cap.max_recv_sge = std::min<std::uint32_t>(ia.cap.max_recv_sge, static_cast<std::uint32_t>(da.max_sge));
  auto self = std::static_pointer_cast<verbs_pd>(shared_from_this());
  auto q = std::make_shared<verbs_qp>(std::move(self), detail::handle_access::shared(*attr.send_cq), detail::handle_access::shared(*attr.recv_cq),
                                      qp, a);
  if (auto r = q->to_init(); !r) return std::unexpected(r.error());
  return std::shared_ptr<detail::qp_impl>(std::move(q));
}

// ---------------------------------------------------------------------- cm ----

std::vector<std::byte> wrap_private(bool iwarp, std::span<const std::byte> d) {
  const std::size_t off = iwarp ? 0 : 1;
  std::vector<std::byte> out(off + d.size());
  if (!iwarp) out[0] = static_cast<std::byte>(d.size());
  if (!d.empty()) std::memcpy(out.data() + off, d.data(), d.size());
  return out;
}
std::vector<std::byte> unwrap_private(bool iwarp, const void* p, std::size_t len) {
  const auto* b = static_cast<const std::byte*>(p);
  if (p == nullptr || len == 0) return {};
  const std::size_t off = iwarp ? 0 : 1;
  const std::size_t n = iwarp ? len : std::min<std::size_t>(static_cast<std::size_t>(b[0]), len - 1);
  std::vector<std::byte> out(n);
  if (n > 0) std::memcpy(out.data(), b + off, n);
  return out;
}

result<void> verbs_qp::ib_rtr_rts(rdma_cm_id* id, std::uint32_t ird, std::uint32_t ord) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_INIT;
  if (rdma_init_qp_attr(id, &a, &mask) == 0) ibv_modify_qp(qp_, &a, mask);  // port/pkey of the route
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  if (rdma_init_qp_attr(id, &a, &mask) != 0)
    return make_error(errc::io_error, "connect " + where() + ": rdma_init_qp_attr(RTR): " + err_text(errno), errno);
  if (pd_->dev().gid_override() >= 0) a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(pd_->dev().gid_override());
  a.max_dest_rd_atomic = static_cast<std::uint8_t>(ird);
  if (int rc = ibv_modify_qp(qp_, &a, mask); rc != 0)
    return make_error(errc::io_error, "connect " + where() + ": modify to RTR (mtu " + mtu_name(a.path_mtu) +
                                          ", sgid index " + std::to_string(a.ah_attr.grh.sgid_index) + "): " + err_text(rc),
                      rc);
  cattr_.mss = mtu_bytes(a.path_mtu);
  log(detail::log_level::info, where() + ": RTR path mtu " + mtu_name(a.path_mtu) + ", sgid index " +
                                   std::to_string(a.ah_attr.grh.sgid_index) + ", dest QP " +
                                   std::to_string(a.dest_qp_num));
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  if (rdma_init_qp_attr(id, &a, &mask) != 0)
    return make_error(errc::io_error, "connect " + where() + ": rdma_init_qp_attr(RTS): " + err_text(errno), errno);
  a.max_rd_atomic = static_cast<std::uint8_t>(ord);
  if (int rc = ibv_modify_qp(qp_, &a, mask); rc != 0)
    return make_error(errc::io_error, "connect " + where() + ": modify to RTS: " + err_text(rc), rc);
  return {};
}

void verbs_qp::finish(rdma_cm_id* id, rdma_event_channel* ch, std::uint32_t ird, std::uint32_t ord) {
  cattr_.local_address = format_address(rdma_get_local_addr(id));
  cattr_.peer_address = format_address(rdma_get_peer_addr(id));
  peer_ = cattr_.peer_address;
  cattr_.ird = ird;
  cattr_.ord = ord;
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  if (ibv_query_qp(qp_, &qa, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PATH_MTU, &qi) == 0) {
    // What the device set after negotiation (iWARP: MPA v2 IRD/ORD in the kernel).
    if (qa.max_rd_atomic > 0) cattr_.ord = qa.max_rd_atomic;
    if (qa.max_dest_rd_atomic > 0) cattr_.ird = qa.max_dest_rd_atomic;
    if (!pd_->dev().iwarp()) cattr_.mss = mtu_bytes(qa.path_mtu);
  }
  if (cattr_.mss == 0) {  // iWARP: the port's MTU (the kernel's TCP segment size is not exposed)
    ibv_port_attr pa{};
    if (ibv_query_port(pd_->dev().ctx(), pd_->dev().port(), &pa) == 0) cattr_.mss = mtu_bytes(pa.active_mtu);
  }
  cattr_.max_fpdu = cattr_.mss;  // bytes of payload per packet (IB/RoCE: the path MTU)
  cattr_.extensions = pd_->dev().attr().atomics || pd_->dev().attr().immediate_data;
  cattr_.rtr = pd_->dev().iwarp() ? "kernel" : "none";
  conn_ = std::make_shared<conn_state>();
  conn_->id = id;
  conn_->ch = ch;
  conn_->qp = qp_;
  conn_->where = where();
  conn_port_ = id->port_num;
  state_ = qp_state::rts;
  connected_.store(true, std::memory_order_release);
  watch(conn_);
}

result<connection_info> verbs_qp::connect(std::string_view address, const connect_options& opts) {
  auto& dev = pd_->dev();
  const std::string w = "connect " + where() + " to " + std::string(address);
  if (state() != qp_state::init)
    return make_error(errc::invalid_state, w + ": QP is " + std::string(to_string(state())) + ", not INIT");
  const std::size_t limit = dev.iwarp() ? max_private_data : ib_req_private;
  if (opts.private_data.size() > limit)
    return make_error(errc::invalid_argument, w + ": private data of " + std::to_string(opts.private_data.size()) +
                                                  " bytes exceeds " + std::to_string(limit) + " on this transport");
  socklen_t len = 0;
  auto dst = parse_address(address, len);
  if (!dst) return std::unexpected(dst.error());
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) return make_error(errc::io_error, w + ": rdma_create_event_channel: " + err_text(errno) +
                                                           " (is rdma_ucm loaded?)", errno);
  set_nonblock(ch->fd);
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
    int e = errno;
    rdma_destroy_event_channel(ch);
    return make_error(errc::io_error, w + ": rdma_create_id: " + err_text(e), e);
  }
  bool handed_off = false;
  auto fail = [&](errc code, std::string what, int e = 0) -> std::unexpected<error> {
    if (!handed_off) destroy_id_detached(id, ch);
    handed_off = true;
    return make_error(code, w + ": " + what, e);
  };
  const auto deadline = clock_type::now() + opts.timeout;
  const int tmo = static_cast<int>(std::max<long long>(opts.timeout.count(), 100));
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&*dst), tmo) != 0)
    return fail(errc::address_error, "rdma_resolve_addr: " + err_text(errno), errno);
  std::uint32_t ird = std::min<std::uint32_t>(want_ird_, static_cast<std::uint32_t>(dev.dattr().max_qp_rd_atom));
  std::uint32_t ord = std::min<std::uint32_t>(want_ord_, static_cast<std::uint32_t>(dev.dattr().max_qp_init_rd_atom));
  connection_info info;
  for (;;) {
    rdma_cm_event* ev = next_event(ch, deadline);
    if (ev == nullptr) {
      if (errno == ETIMEDOUT)
        return fail(errc::timed_out, "no answer within " + std::to_string(opts.timeout.count()) + " ms");
      return fail(errc::io_error, "rdma_get_cm_event: " + err_text(errno), errno);
    }
    const auto e = ev->event;
    const int st = ev->status;
    rdma_conn_param param = ev->param.conn;
    std::vector<std::byte> pdata = unwrap_private(dev.iwarp(), param.private_data, param.private_data_len);
    rdma_ack_cm_event(ev);
    switch (e) {
      case RDMA_CM_EVENT_ADDR_RESOLVED: {
        if (id->verbs == nullptr || ibv_get_device_name(id->verbs->device) != dev.ibdev())
          return fail(errc::address_error,
                      "the address routes through device " +
                          std::string(id->verbs ? ibv_get_device_name(id->verbs->device) : "(none)") +
                          ", not " + dev.ibdev() + " (open that device, or use an address on this one)");
        if (rdma_resolve_route(id, tmo) != 0) return fail(errc::address_error, "rdma_resolve_route: " + err_text(errno), errno);
        break;
      }
      case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        auto wrapped = wrap_private(dev.iwarp(), opts.private_data);
        rdma_conn_param cp{};
        cp.private_data = wrapped.data();
        cp.private_data_len = static_cast<std::uint8_t>(wrapped.size());
        cp.responder_resources = static_cast<std::uint8_t>(ird);
        cp.initiator_depth = static_cast<std::uint8_t>(ord);
        cp.retry_count = 7;
        cp.rnr_retry_count = 6;
        cp.qp_num = qp_->qp_num;
        if (!dev.iwarp()) {
          ibv_qp_attr a{};
          int mask = 0;
          a.qp_state = IBV_QPS_INIT;
          if (rdma_init_qp_attr(id, &a, &mask) == 0) ibv_modify_qp(qp_, &a, mask);
        }
        if (rdma_connect(id, &cp) != 0) {
          const int ce = errno;  // iWARP connects TCP synchronously: a RST shows here
          if (ce == ECONNREFUSED) return fail(errc::connection_refused, "connection refused (nothing listens there)", ce);
          if (ce == ETIMEDOUT) return fail(errc::timed_out, "rdma_connect timed out", ce);
          return fail(errc::io_error, "rdma_connect: " + err_text(ce), ce);
        }
        break;
      }
      case RDMA_CM_EVENT_CONNECT_RESPONSE: {
        info.private_data = std::move(pdata);
        ord = std::min<std::uint32_t>(ord, param.responder_resources);
        ird = std::min<std::uint32_t>(ird, param.initiator_depth);
        if (auto r = ib_rtr_rts(id, ird, ord); !r) {
          rdma_reject(id, nullptr, 0);
          return fail(r.error().code, r.error().context, r.error().sys_errno);
        }
        if (rdma_establish(id) != 0) return fail(errc::io_error, "rdma_establish: " + err_text(errno), errno);
        finish(id, ch, ird, ord);
        handed_off = true;
        info.attr = cattr_;
        return info;
      }
      case RDMA_CM_EVENT_ESTABLISHED: {
        info.private_data = std::move(pdata);
        finish(id, ch, std::min<std::uint32_t>(ird, param.initiator_depth ? param.initiator_depth : ird),
               std::min<std::uint32_t>(ord, param.responder_resources ? param.responder_resources : ord));
        handed_off = true;
        info.attr = cattr_;
        return info;
      }
      case RDMA_CM_EVENT_REJECTED: {
        // IB CM: 28 = consumer reject, 8 = invalid service ID (nobody listens).
        // iWARP: -ECONNREFUSED (TCP RST) / -ECONNRESET (MPA reject).
        if (st == 8 || st == -ECONNREFUSED)
          return fail(errc::connection_refused, "connection refused (nothing listens there)");
        std::string reason(reinterpret_cast<const char*>(pdata.data()), pdata.size());
        return fail(errc::rejected, "peer " + std::string(address) + " rejected" +
                                        (reason.empty() ? "" : ": " + reason) + " (status " + std::to_string(st) + ")");
      }
      case RDMA_CM_EVENT_ADDR_ERROR:
        return fail(errc::address_error, "address resolution failed (status " + std::to_string(st) +
                                             "; no RDMA device owns a route to it?)");
      case RDMA_CM_EVENT_ROUTE_ERROR:
        return fail(errc::address_error, "route resolution failed (status " + std::to_string(st) + ")");
      case RDMA_CM_EVENT_UNREACHABLE:
        return fail(st == -ETIMEDOUT || st == -ETIMEDOUT * 1 ? errc::timed_out : errc::connection_refused,
                    "peer unreachable (status " + std::to_string(st) + ")");
      case RDMA_CM_EVENT_CONNECT_ERROR:
        return fail(errc::connection_reset, "connect error (status " + std::to_string(st) + ")");
      default:
        return fail(errc::protocol_error, std::string("unexpected CM event ") + rdma_event_str(e));
    }
  }
}

result<connection_info> verbs_qp::accept_on(rdma_cm_id* id, rdma_event_channel* ch, const rdma_conn_param& req,
                                            const std::string& peer, std::span<const std::byte> pdata,
                                            std::chrono::milliseconds timeout) {
  auto& dev = pd_->dev();
  peer_ = peer;
  const std::string w = "accept on " + where();
  auto fail = [&](errc code, std::string what, int e = 0) -> std::unexpected<error> {
    destroy_id_detached(id, ch);
    return make_error(code, w + ": " + what, e);
  };
  if (state() != qp_state::init)
    return fail(errc::invalid_state, "QP is " + std::string(to_string(state())) + ", not INIT");
  if (id->verbs == nullptr || ibv_get_device_name(id->verbs->device) != dev.ibdev())
    return fail(errc::invalid_argument, "the request arrived on device " +
                                            std::string(id->verbs ? ibv_get_device_name(id->verbs->device) : "?") +
                                            ", the QP belongs to " + dev.ibdev());
  const std::size_t limit = dev.iwarp() ? max_private_data : ib_rep_private;
  if (pdata.size() > limit)
    return fail(errc::invalid_argument, "private data of " + std::to_string(pdata.size()) + " bytes exceeds " +
                                            std::to_string(limit) + " on this transport");
  std::uint32_t ird = std::min<std::uint32_t>({want_ird_, static_cast<std::uint32_t>(dev.dattr().max_qp_rd_atom),
                                               std::max<std::uint32_t>(req.initiator_depth, 1)});
  std::uint32_t ord = std::min<std::uint32_t>({want_ord_, static_cast<std::uint32_t>(dev.dattr().max_qp_init_rd_atom),
                                               std::max<std::uint32_t>(req.responder_resources, 1)});
  if (!dev.iwarp()) {
    if (auto r = ib_rtr_rts(id, ird, ord); !r) {
      rdma_reject(id, nullptr, 0);
      return fail(r.error().code, r.error().context, r.error().sys_errno);
    }
  }
  auto wrapped = wrap_private(dev.iwarp(), pdata);
  rdma_conn_param cp{};
  cp.private_data = wrapped.data();
  cp.private_data_len = static_cast<std::uint8_t>(wrapped.size());
  cp.responder_resources = static_cast<std::uint8_t>(ird);
  cp.initiator_depth = static_cast<std::uint8_t>(ord);
  cp.retry_count = 7;
  cp.rnr_retry_count = 6;
  cp.qp_num = qp_->qp_num;
  if (rdma_accept(id, &cp) != 0) return fail(errc::io_error, "rdma_accept: " + err_text(errno), errno);
  const auto deadline = clock_type::now() + timeout;
  for (;;) {
    rdma_cm_event* ev = next_event(ch, deadline);
    if (ev == nullptr) {
      if (errno == ETIMEDOUT) {
        move_to_error(qp_);
        state_ = qp_state::error;
        return fail(errc::timed_out, "peer " + peer + " did not complete the connection within " +
                                         std::to_string(timeout.count()) + " ms");
      }
      return fail(errc::io_error, "rdma_get_cm_event: " + err_text(errno), errno);
    }
    const auto e = ev->event;
    const int st = ev->status;
    rdma_ack_cm_event(ev);
    if (e == RDMA_CM_EVENT_ESTABLISHED) {
      finish(id, ch, ird, ord);
      connection_info info;
      info.attr = cattr_;
      return info;
    }
    move_to_error(qp_);
    state_ = qp_state::error;
    return fail(errc::connection_reset, std::string("peer ") + peer + ": " + rdma_event_str(e) + " (status " +
                                            std::to_string(st) + ") instead of ESTABLISHED");
  }
}

class verbs_request final : public detail::conn_request_impl {
 public:
  verbs_request(std::shared_ptr<verbs_device> dev, rdma_cm_id* id, rdma_event_channel* ch, rdma_conn_param p,
                std::vector<std::byte> pdata)
      : dev_(std::move(dev)), id_(id), ch_(ch), param_(p), pdata_(std::move(pdata)) {
    param_.private_data = nullptr;
    param_.private_data_len = 0;
    peer_ = format_address(rdma_get_peer_addr(id_));
  }
  ~verbs_request() override {
    if (id_ != nullptr) {
      rdma_reject(id_, nullptr, 0);
      destroy_id_detached(id_, ch_);
    }
  }
  std::span<const std::byte> private_data() const noexcept override { return pdata_; }
  std::string peer_address() const override { return peer_; }
  result<connection_info> accept(queue_pair& qp, std::span<const std::byte> pd) override {
    auto* q = dynamic_cast<verbs_qp*>(detail::handle_access::impl(qp));
    if (q == nullptr)
      return make_error(errc::invalid_argument, "accept from " + peer_ + " on " + dev_->where() +
                                                    ": the QP is not a verbs QP");
    auto* id = std::exchange(id_, nullptr);
    return q->accept_on(id, ch_, param_, peer_, pd, std::chrono::milliseconds(dev_->options().handshake_timeout_ms));
  }
  result<void> reject(std::span<const std::byte> reason) override {
    auto* id = std::exchange(id_, nullptr);
    if (id == nullptr) return make_error(errc::invalid_state, "reject: already answered");
    auto wrapped = wrap_private(dev_->iwarp(), reason.subspan(0, std::min(reason.size(), dev_->iwarp() ? max_private_data : ib_rej_private)));
    int rc = rdma_reject(id, wrapped.data(), static_cast<std::uint8_t>(wrapped.size()));
    int e = errno;
    destroy_id_detached(id, ch_);
    if (rc != 0) return make_error(errc::io_error, "reject " + peer_ + " on " + dev_->where() + ": " + err_text(e), e);
    return {};
  }

 private:
  std::shared_ptr<verbs_device> dev_;
  rdma_cm_id* id_;
  rdma_event_channel* ch_;
  rdma_conn_param param_;
  std::vector<std::byte> pdata_;
  std::string peer_;
};

class verbs_listener final : public detail::listener_impl {
 public:
  verbs_listener(std::shared_ptr<verbs_device> dev, rdma_cm_id* id, rdma_event_channel* ch)
      : dev_(std::move(dev)), id_(id), ch_(ch) {
    addr_ = format_address(rdma_get_local_addr(id_));
  }
  ~verbs_listener() override {
    // Refuse what is queued, then release the port before returning.
    rdma_cm_event* ev = nullptr;
    while (rdma_get_cm_event(ch_, &ev) == 0) {
      if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_cm_id* child = ev->id;
        rdma_reject(child, nullptr, 0);
        rdma_ack_cm_event(ev);
        rdma_destroy_id(child);
      } else {
        rdma_ack_cm_event(ev);
      }
    }
    rdma_destroy_id(id_);
    rdma_destroy_event_channel(ch_);
  }
  std::string address() const override { return addr_; }
  std::uint16_t port() const noexcept override { return ntohs(rdma_get_src_port(id_)); }
  result<std::unique_ptr<detail::conn_request_impl>> accept(std::chrono::milliseconds timeout) override {
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
      rdma_cm_event* ev = next_event(ch_, deadline);
      if (ev == nullptr) {
        if (errno == ETIMEDOUT)
          return make_error(errc::timed_out, "accept on " + addr_ + " (" + dev_->where() + "): no connection request within " +
                                                 std::to_string(timeout.count()) + " ms");
        return make_error(errc::io_error, "accept on " + addr_ + ": " + err_text(errno), errno);
      }
      if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        log(detail::log_level::debug, "listener " + addr_ + ": ignoring " + rdma_event_str(ev->event));
        rdma_ack_cm_event(ev);
        continue;
      }
      rdma_cm_id* child = ev->id;
      rdma_conn_param p = ev->param.conn;
      auto pdata = unwrap_private(dev_->iwarp(), p.private_data, p.private_data_len);
      rdma_ack_cm_event(ev);
      rdma_event_channel* ch = rdma_create_event_channel();
      if (ch == nullptr || rdma_migrate_id(child, ch) != 0) {
        int e = errno;
        rdma_reject(child, nullptr, 0);
        rdma_destroy_id(child);
        if (ch) rdma_destroy_event_channel(ch);
        return make_error(errc::resource_exhausted, "accept on " + addr_ + ": event channel: " + err_text(e), e);
      }
      set_nonblock(ch->fd);
      return std::unique_ptr<detail::conn_request_impl>(
          std::make_unique<verbs_request>(dev_, child, ch, p, std::move(pdata)));
    }
  }

 private:
  std::shared_ptr<verbs_device> dev_;
  rdma_cm_id* id_;
  rdma_event_channel* ch_;
  std::string addr_;
};

result<std::unique_ptr<detail::listener_impl>> verbs_device::bind_listener(std::string_view address, int backlog) {
  const std::string w = "listen on " + std::string(address) + " (" + where() + ")";
  socklen_t len = 0;
  auto sa = parse_address(address, len);
  if (!sa) return std::unexpected(sa.error());
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr)
    return make_error(errc::io_error, w + ": rdma_create_event_channel: " + err_text(errno) + " (is rdma_ucm loaded?)", errno);
  set_nonblock(ch->fd);
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
    int e = errno;
    rdma_destroy_event_channel(ch);
    return make_error(errc::io_error, w + ": rdma_create_id: " + err_text(e), e);
  }
  auto fail = [&](errc code, std::string what, int e) -> std::unexpected<error> {
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    return make_error(code, w + ": " + what, e);
  };
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&*sa)) != 0)
    return fail(errc::address_error, "rdma_bind_addr: " + err_text(errno), errno);
  if (id->verbs != nullptr && ibv_get_device_name(id->verbs->device) != ibdev_)
    return fail(errc::address_error, "the address belongs to device " + std::string(ibv_get_device_name(id->verbs->device)) +
                                         ", not " + ibdev_, 0);
  if (rdma_listen(id, backlog) != 0) return fail(errc::address_error, "rdma_listen: " + err_text(errno), errno);
  auto self = std::static_pointer_cast<verbs_device>(shared_from_this());
  return std::unique_ptr<detail::listener_impl>(std::make_unique<verbs_listener>(std::move(self), id, ch));
}

struct device_list {
  ibv_device** list = nullptr;
  int n = 0;
  device_list() { list = ibv_get_device_list(&n); }
  ~device_list() {
    if (list) ibv_free_device_list(list);
  }
};

}  // namespace

std::vector<device_info> list_devices() {
  std::vector<device_info> out;
  device_list dl;
  for (int i = 0; dl.list != nullptr && i < dl.n; ++i) {
    ibv_device* d = dl.list[i];
    device_info info;
    info.name = std::string("verbs:") + ibv_get_device_name(d);
    info.provider = "verbs";
    ibv_context* ctx = ibv_open_device(d);
    if (ctx == nullptr) {
      info.available = false;
      info.reason = "ibv_open_device: " + err_text(errno);
      out.push_back(std::move(info));
      continue;
    }
    ibv_device_attr da{};
    ibv_query_device(ctx, &da);
    bool active = false;
    std::string ports;
    bool eth = false;
    for (std::uint8_t p = 1; p <= da.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (ibv_query_port(ctx, p, &pa) != 0) continue;
      if (p == 1) eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      active = active || pa.state == IBV_PORT_ACTIVE;
      if (!ports.empty()) ports += ", ";
      ports += "port " + std::to_string(p) + " " + port_state_name(pa.state);
    }
    info.transport_type = d->transport_type == IBV_TRANSPORT_IWARP ? transport::iwarp
                          : eth                                     ? transport::roce
                                                                    : transport::infiniband;
    info.available = active;
    if (!active) info.reason = "no active port (" + ports + ")";
    ibv_close_device(ctx);
    out.push_back(std::move(info));
  }
  if (out.empty()) {
    out.push_back(device_info{"verbs", "verbs", transport::infiniband, false,
                              "libibverbs found no RDMA device (no driver loaded, or no /dev/infiniband; "
                              "see `rdma link` and `ibv_devices`)"});
  }
  return out;
}

result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name, const device_options& opts) {
  std::string want;
  if (auto c = name.find(':'); c != std::string_view::npos) want = std::string(name.substr(c + 1));
  device_list dl;
  if (dl.list == nullptr || dl.n == 0)
    return make_error(errc::not_found, "open " + std::string(name) +
                                           ": libibverbs found no RDMA device (no driver loaded, or no /dev/infiniband)");
  ibv_device* pick = nullptr;
  std::string known;
  for (int i = 0; i < dl.n; ++i) {
    std::string n = ibv_get_device_name(dl.list[i]);
    if (!known.empty()) known += ", ";
    known += "verbs:" + n;
    if (!want.empty() && n == want) pick = dl.list[i];
  }
  if (want.empty()) pick = dl.list[0];
  if (pick == nullptr)
    return make_error(errc::not_found, "open " + std::string(name) + ": no such verbs device (known: " + known + ")");
  ibv_context* ctx = ibv_open_device(pick);
  if (ctx == nullptr)
    return make_error(errc::io_error, "open " + std::string(name) + ": ibv_open_device(" +
                                          ibv_get_device_name(pick) + "): " + err_text(errno), errno);
  auto dev = std::make_shared<verbs_device>(ctx, opts);
  log(detail::log_level::info, "opened device " + dev->attr().name + ": " + dev->describe());
  return std::shared_ptr<detail::device_impl>(std::move(dev));
}

}  // namespace conveyor::verbs
