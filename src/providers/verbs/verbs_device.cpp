// The verbs device: an ibv_context, its ports and attributes, the thread that
// reads the device's async events (and what they do to the QPs: verbs_events.*
// translates, this applies), PD and CQ creation, and the provider's entry
// points (list_devices, open_device). The objects are in verbs_objects.hpp.
#include "providers/verbs/verbs_provider.hpp"

#include "providers/verbs/verbs_events.hpp"
#include "providers/verbs/verbs_objects.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>

namespace conveyor::verbs {

static_assert(sizeof(sge) == sizeof(ibv_sge) && offsetof(sge, addr) == offsetof(ibv_sge, addr) &&
                  offsetof(sge, length) == offsetof(ibv_sge, length) &&
                  offsetof(sge, lkey) == offsetof(ibv_sge, lkey),
              "conveyor::sge must have ibv_sge's layout (posted without copying)");

verbs_device::verbs_device(ibv_context* ctx, const device_options& opts) : ctx_(ctx) {
  opts_ = opts;
  rdma_core().ibv_query_device(ctx_, &dattr_);
  ibdev_ = rdma_core().ibv_get_device_name(ctx_->device);
  attr_.name = "verbs:" + ibdev_;
  attr_.provider = "verbs";
  const bool iwarp = ctx_->device->transport_type == IBV_TRANSPORT_IWARP;
  ports_.resize(dattr_.phys_port_cnt);
  for (std::uint8_t p = 1; p <= dattr_.phys_port_cnt; ++p) query_port(ctx_, p, &ports_[p - 1]);
  port_ = 1;
  for (std::uint8_t p = 1; p <= dattr_.phys_port_cnt; ++p) {
    if (ports_[p - 1].state == IBV_PORT_ACTIVE) {
      port_ = p;
      break;
    }
  }
  const bool eth = !ports_.empty() && ports_[port_ - 1].link_layer == IBV_LINK_LAYER_ETHERNET;
  attr_.transport_type = iwarp ? transport::iwarp : eth ? transport::roce : transport::infiniband;
  attr_.max_qp = static_cast<std::uint32_t>(dattr_.max_qp);
  attr_.max_cqe = static_cast<std::uint32_t>(dattr_.max_cqe);
  attr_.max_qp_wr = static_cast<std::uint32_t>(dattr_.max_qp_wr);
  attr_.max_sge = static_cast<std::uint32_t>(dattr_.max_sge);
  // siw reports 1 and, given more, reads only the first SGE's length.
  attr_.max_sge_rd = dattr_.max_sge_rd > 0
                         ? std::min(attr_.max_sge, static_cast<std::uint32_t>(dattr_.max_sge_rd))
                         : attr_.max_sge;
  attr_.max_inline_data = 0;  // known per QP (ibv_create_qp reports it)
  attr_.max_mr = static_cast<std::uint32_t>(dattr_.max_mr);
  attr_.max_mr_size = dattr_.max_mr_size;
  attr_.max_msg_size = ports_.empty() ? 0 : ports_[port_ - 1].max_msg_sz;
  attr_.max_qp_rd_atom = static_cast<std::uint32_t>(dattr_.max_qp_rd_atom);
  attr_.max_srq = static_cast<std::uint32_t>(std::max(dattr_.max_srq, 0));
  attr_.max_srq_wr = attr_.max_srq ? static_cast<std::uint32_t>(std::max(dattr_.max_srq_wr, 0)) : 0;
  attr_.max_srq_sge =
      attr_.max_srq ? static_cast<std::uint32_t>(std::max(dattr_.max_srq_sge, 0)) : 0;
  attr_.atomics = dattr_.atomic_cap != IBV_ATOMIC_NONE;
  attr_.atomic_cap = dattr_.atomic_cap == IBV_ATOMIC_GLOB  ? atomic_scope::global
                     : dattr_.atomic_cap == IBV_ATOMIC_HCA ? atomic_scope::rdma
                                                           : atomic_scope::none;
  // iWARP (RDMAP, RFC 5040) has no immediate data; IB and RoCE have it.
  attr_.immediate_data = !iwarp;
  // Remote invalidation applies to memory windows and fast-registered MRs;
  // register_memory makes plain MRs, which rxe refuses to invalidate.
  attr_.send_with_invalidate = false;
  attr_.registration_pins_pages = true;  // the NIC (or rxe/siw) keeps the pages it was given
  // post_recv_checks_lkeys, inline_checks_lkeys, deregister_stops_outstanding,
  // runs_mpa: false, the kernel's or the NIC's business.
  for (std::uint8_t p = 1; p <= dattr_.phys_port_cnt; ++p) attr_.ports.push_back(describe_port(p));
  if (auto g = detail::env_u32("CONVEYOR_VERBS_GID_INDEX")) gid_override_ = static_cast<int>(*g);
  dev_path_ = ctx_->device->dev_path;
  if (::access(dev_path_.c_str(), F_OK) != 0)
    dev_path_.clear();  // (no sysfs here: nothing to watch)
  set_nonblock(ctx_->async_fd);
  async_thread_ = std::thread([this] { async_loop(); });
}

verbs_device::~verbs_device() {
  stop_ = true;
  if (async_thread_.joinable()) async_thread_.join();
  rdma_core().ibv_close_device(ctx_);
  // librdmacm keeps a context of its own per device it has used and closes
  // that of a removed device only when it rescans the device list (and the
  // device's last cm_id is gone); the kernel's removal waits for it (rxe and
  // siw cannot disassociate), so rescan. librdmacm 44 skips the rescan when
  // no device is left at all: the last device's removal then ends only
  // with the process.
  if (fatal_ && !dev_path_.empty() && ::access(dev_path_.c_str(), F_OK) != 0) {
    int n = -1;
    if (ibv_context** l = rdma_core().rdma_get_devices(&n)) rdma_core().rdma_free_devices(l);
    log(detail::log_level::info, "device " + ibdev_ + " closed after its removal (" +
                                     std::to_string(n) + " RDMA devices left)");
  }
}

port_attr verbs_device::describe_port(std::uint8_t p) const {
  const auto& a = ports_[p - 1];
  port_attr out;
  out.num = p;
  out.state = port_state_name(a.state);
  out.link_layer = a.link_layer == IBV_LINK_LAYER_ETHERNET     ? "ethernet"
                   : a.link_layer == IBV_LINK_LAYER_INFINIBAND ? "infiniband"
                                                               : "unspecified";
  out.mtu =
      a.active_mtu >= IBV_MTU_256 && a.active_mtu <= IBV_MTU_4096 ? mtu_bytes(a.active_mtu) : 0u;
  for (int i = 0; i < a.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (rdma_core().ibv_query_gid(ctx_, p, i, &gid) != 0) break;
    if (std::all_of(std::begin(gid.raw), std::end(gid.raw), [](std::uint8_t b) { return b == 0; }))
      continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET6, gid.raw, text, sizeof text) != nullptr)
      out.addresses.emplace_back(text);
  }
  return out;
}

std::string verbs_device::describe() const {
  std::string s =
      ibdev_ + " (" + std::string(to_string(attr_.transport_type)) + ", fw " + dattr_.fw_ver + ")";
  for (std::size_t i = 0; i < ports_.size(); ++i) {
    const auto& a = ports_[i];
    s += "; port " + std::to_string(i + 1) + " " + port_state_name(a.state) + " mtu " +
         mtu_name(a.active_mtu) + "/" + mtu_name(a.max_mtu) + " gids " +
         std::to_string(a.gid_tbl_len);
  }
  s += std::string("; atomics ") + (attr_.atomics ? "yes" : "no") + ", immediate " +
       (attr_.immediate_data ? "yes" : "no") + ", max_qp_rd_atom " +
       std::to_string(dattr_.max_qp_rd_atom);
  return s;
}

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

std::vector<device_event> verbs_device::fail_selected(
    const std::function<std::optional<std::string>(const verbs_qp&)>& pick) noexcept {
  std::vector<device_event> out;
  try {
    std::lock_guard lk(qps_mu_);  // a QP leaves the table before it is destroyed
    for (auto& [n, q] : qps_) {
      const auto cause = pick(*q);
      if (!cause) continue;
      const bool already = q->state() == qp_state::error;
      if (!already) q->fail();
      if (!q->claim_error_report()) continue;
      out.push_back(
          qp_failed_event(q->connected() ? q->where() : where() + " QP " + std::to_string(n),
                          q->port(), n, *cause, already));
    }
  } catch (...) {  // (allocation failure) the QPs failed so far stay failed
  }
  return out;
}

std::vector<device_event> verbs_device::fail_qps(std::uint8_t port,
                                                 std::string_view cause) noexcept {
  try {
    const std::string c(cause);
    return fail_selected([&](const verbs_qp& q) -> std::optional<std::string> {
      if (port != 0 && (!q.connected() || q.port() != port)) return std::nullopt;
      return c;
    });
  } catch (...) {
    return {};
  }
}

std::vector<device_event> verbs_device::port_went_down(
    std::uint8_t port, clock_type::time_point now, std::size_t& pending,
    std::chrono::milliseconds& soonest) noexcept {
  ports_down_.down(port, now);
  pending = 0;
  soonest = max_port_down_grace;
  {
    std::lock_guard lk(qps_mu_);
    for (auto& [n, q] : qps_) {
      if (!q->connected() || q->port() != port || q->port_down_grace().count() == 0) continue;
      ++pending;
      soonest = std::min(soonest, q->port_down_grace());
    }
  }
  return expire_port_down(now);
}

std::vector<device_event> verbs_device::expire_port_down(clock_type::time_point now) noexcept {
  next_expiry_.reset();
  if (!ports_down_.any_down()) return {};
  try {
    return fail_selected([&](const verbs_qp& q) -> std::optional<std::string> {
      if (!q.connected()) return std::nullopt;
      const auto since = ports_down_.down_since(q.port());
      if (!since) return std::nullopt;
      if (!ports_down_.expired(q.port(), q.port_down_grace(), now)) {
        const auto at = *since + q.port_down_grace();
        if (!next_expiry_ || at < *next_expiry_) next_expiry_ = at;
        return std::nullopt;
      }
      const auto g = q.port_down_grace().count();
      if (g == 0) return "port " + std::to_string(q.port()) + " went down";
      return "port " + std::to_string(q.port()) + " stayed down longer than its grace period (" +
             std::to_string(g) + " ms)";
    });
  } catch (...) {
    return {};
  }
}

std::vector<device_event> verbs_device::port_came_back(std::uint8_t port,
                                                       std::chrono::milliseconds down_for,
                                                       std::size_t& kept) noexcept {
  kept = 0;
  std::vector<device_event> out;
  try {
    std::lock_guard lk(qps_mu_);
    for (auto& [n, q] : qps_) {
      if (!q->connected() || q->port() != port) continue;
      if (q->state() != qp_state::error) {
        ++kept;
        continue;
      }
      if (!q->claim_error_report()) continue;
      out.push_back(qp_failed_event(q->where(), port, n,
                                    "port " + std::to_string(port) + " was down for " +
                                        std::to_string(down_for.count()) + " ms",
                                    true));
    }
  } catch (...) {
  }
  return out;
}

void verbs_device::async_loop() {
  const auto& cb = options().on_event;
  auto deliver = [&](const device_event& e) {
    if (!deliver_event(cb, e))
      log(detail::log_level::error,
          "device " + ibdev_ + ": the on_event callback threw; the event is dropped");
  };
  while (!stop_) {
    // QPs on a down port fail once their grace period has passed; the wait
    // below ends at the next such deadline.
    if (auto expired = expire_port_down(clock_type::now()); !expired.empty()) {
      for (const auto& x : expired) log(detail::log_level::warn, x.description);
      for (const auto& x : expired) deliver(x);
    }
    int wait_ms = 100;
    if (next_expiry_) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(*next_expiry_ - clock_type::now()).count();
      wait_ms = static_cast<int>(std::clamp<long long>(left, 1, 100));
    }
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (::poll(&p, 1, wait_ms) <= 0) {
      // A removed device whose driver cannot disassociate (rxe, siw) reports
      // nothing on this fd; its uverbs node vanishing is the sign.
      if (!fatal_ && !dev_path_.empty() && ::access(dev_path_.c_str(), F_OK) != 0 &&
          errno == ENOENT) {
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
    while (rdma_core().ibv_get_async_event(ctx_, &ev) == 0) {
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
        case IBV_EVENT_CQ_ERR:
          c = static_cast<verbs_cq*>(ev.element.cq->cq_context);
          break;
        case IBV_EVENT_SRQ_ERR:
        case IBV_EVENT_SRQ_LIMIT_REACHED:
          // ibv_destroy_srq waits for this event's ack: the SRQ is alive here.
          f.srq_num = ev.element.srq->handle;
          if (auto* sq = static_cast<verbs_srq*>(ev.element.srq->srq_context);
              sq != nullptr && ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED)
            f.srq_limit = sq->limit_fired();
          break;
        case IBV_EVENT_PORT_ACTIVE:
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_LID_CHANGE:
        case IBV_EVENT_PKEY_CHANGE:
        case IBV_EVENT_GID_CHANGE:
        case IBV_EVENT_SM_CHANGE:
        case IBV_EVENT_CLIENT_REREGISTER:
          f.event_port = static_cast<std::uint8_t>(ev.element.port_num);
          break;
        default:
          break;
      }
      auto t = translate_async_event(f);
      std::vector<device_event> failed;
      std::size_t pending = 0, kept = 0;  // QPs a port_down/port_active leaves connected
      std::chrono::milliseconds soonest{0};
      std::optional<std::chrono::milliseconds> back_after;
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
          if (options().verbs.fail_qps_on_port_down)
            failed = port_went_down(f.event_port, clock_type::now(), pending, soonest);
          break;
        case async_effect::device_fatal:
          fatal_ = true;  // (the removal check then stays quiet)
          failed = fail_qps(0, "the device failed");
          break;
        case async_effect::none:
          if (ev.event_type == IBV_EVENT_PORT_ACTIVE) {
            if (const auto d = ports_down_.up(f.event_port, clock_type::now())) {
              failed = port_came_back(f.event_port, *d, kept);
              back_after = d;
            }
          }
          break;
      }
      rdma_core().ibv_ack_async_event(&ev);
      if (!failed.empty())
        t.event.description += " (" + std::to_string(failed.size()) + " QP" +
                               (failed.size() == 1 ? "" : "s") + " on it: qp_error events follow)";
      if (pending > 0)
        t.event.description += " (" + std::to_string(pending) + " connected QP" +
                               (pending == 1 ? "" : "s") +
                               " on it: failed if it stays down longer than " +
                               std::to_string(soonest.count()) + " ms)";
      if (back_after)
        t.event.description += " (down for " + std::to_string(back_after->count()) + " ms; " +
                               std::to_string(kept) + " connected QP" + (kept == 1 ? "" : "s") +
                               " on it kept)";
      log(t.level, t.event.description);
      for (const auto& e : failed) log(detail::log_level::warn, e.description);
      // The port's (or device's) event first, then one per QP it failed.
      deliver(t.event);
      for (const auto& e : failed) deliver(e);
    }
  }
}

result<std::shared_ptr<detail::pd_impl>> verbs_device::alloc_pd() {
  ibv_pd* pd = rdma_core().ibv_alloc_pd(ctx_);
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
  ibv_comp_channel* ch = rdma_core().ibv_create_comp_channel(ctx_);
  if (ch == nullptr)
    return make_error(errc::resource_exhausted, w + ": completion channel: " + err_text(errno),
                      errno);
  set_nonblock(ch->fd);
  ibv_cq* cq = rdma_core().ibv_create_cq(ctx_, static_cast<int>(opts.depth), nullptr, ch, 0);
  if (cq == nullptr) {
    int e = errno;
    rdma_core().ibv_destroy_comp_channel(ch);
    return make_error(e == ENOMEM ? errc::resource_exhausted : errc::io_error,
                      w + ": " + err_text(e), e);
  }
  auto self = std::static_pointer_cast<verbs_device>(shared_from_this());
  auto c = std::make_shared<verbs_cq>(std::move(self), ch, cq, opts.depth);
  cq->cq_context = c.get();
  return std::shared_ptr<detail::cq_impl>(std::move(c));
}

namespace {

struct device_list {
  ibv_device** list = nullptr;
  int n = 0;
  device_list() { list = rdma_core().ibv_get_device_list(&n); }
  ~device_list() {
    if (list) rdma_core().ibv_free_device_list(list);
  }
};

}  // namespace

std::vector<device_info> list_devices() {
  std::vector<device_info> out;
  // rdma-core is loaded here, on first use: without it the provider lists one
  // unavailable entry that says what to install.
  std::string missing;
  if (load_rdma_core(&missing) == nullptr)
    return {device_info{"verbs", "verbs", transport::infiniband, false, std::move(missing)}};
  device_list dl;
  for (int i = 0; dl.list != nullptr && i < dl.n; ++i) {
    ibv_device* d = dl.list[i];
    device_info info;
    info.name = std::string("verbs:") + rdma_core().ibv_get_device_name(d);
    info.provider = "verbs";
    ibv_context* ctx = rdma_core().ibv_open_device(d);
    if (ctx == nullptr) {
      info.available = false;
      info.reason = "ibv_open_device: " + err_text(errno);
      out.push_back(std::move(info));
      continue;
    }
    ibv_device_attr da{};
    rdma_core().ibv_query_device(ctx, &da);
    bool active = false;
    std::string ports;
    bool eth = false;
    for (std::uint8_t p = 1; p <= da.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (query_port(ctx, p, &pa) != 0) continue;
      if (p == 1) eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      active = active || pa.state == IBV_PORT_ACTIVE;
      if (!ports.empty()) ports += ", ";
      ports += "port " + std::to_string(p) + " " + port_state_name(pa.state);
    }
    info.transport_type = d->transport_type == IBV_TRANSPORT_IWARP ? transport::iwarp
                          : eth                                    ? transport::roce
                                                                   : transport::infiniband;
    info.available = active;
    if (!active) info.reason = "no active port (" + ports + ")";
    rdma_core().ibv_close_device(ctx);
    out.push_back(std::move(info));
  }
  if (out.empty()) {
    out.push_back(
        device_info{"verbs", "verbs", transport::infiniband, false,
                    "libibverbs found no RDMA device (no driver loaded, or no /dev/infiniband; "
                    "see `rdma link` and `ibv_devices`)"});
  }
  return out;
}

result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts) {
  std::string want;
  if (auto c = name.find(':'); c != std::string_view::npos) want = std::string(name.substr(c + 1));
  std::string missing;
  if (load_rdma_core(&missing) == nullptr)
    return make_error(errc::unsupported, "open " + std::string(name) + ": " + missing);
  device_list dl;
  if (dl.list == nullptr || dl.n == 0)
    return make_error(
        errc::not_found,
        "open " + std::string(name) +
            ": libibverbs found no RDMA device (no driver loaded, or no /dev/infiniband)");
  ibv_device* pick = nullptr;
  std::string known;
  for (int i = 0; i < dl.n; ++i) {
    std::string n = rdma_core().ibv_get_device_name(dl.list[i]);
    if (!known.empty()) known += ", ";
    known += "verbs:" + n;
    if (!want.empty() && n == want) pick = dl.list[i];
  }
  if (want.empty()) pick = dl.list[0];
  if (pick == nullptr)
    return make_error(errc::not_found, "open " + std::string(name) +
                                           ": no such verbs device (known: " + known + ")");
  ibv_context* ctx = rdma_core().ibv_open_device(pick);
  if (ctx == nullptr)
    return make_error(errc::io_error,
                      "open " + std::string(name) + ": ibv_open_device(" +
                          rdma_core().ibv_get_device_name(pick) + "): " + err_text(errno),
                      errno);
  auto dev = std::make_shared<verbs_device>(ctx, opts);
  log(detail::log_level::info, "opened device " + dev->attr().name + ": " + dev->describe());
  return std::shared_ptr<detail::device_impl>(std::move(dev));
}

}  // namespace conveyor::verbs
