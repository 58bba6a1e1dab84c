// The verbs provider's connection manager, over librdmacm: the listener and
// its connection requests, connect and accept with the QP attached by number
// (IB/RoCE: the provider moves it INIT->RTR->RTS; iWARP: the kernel does), and
// the watcher thread of each established connection.
#include "providers/verbs/verbs_objects.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netpacket/packet.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

namespace conveyor::verbs {

using namespace std::chrono_literals;

namespace {

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
      while (rdma_core().rdma_get_cm_event(c->ch, &ev) == 0) {
        const auto e = ev->event;
        rdma_core().rdma_ack_cm_event(ev);
        if (e == RDMA_CM_EVENT_DISCONNECTED || e == RDMA_CM_EVENT_DEVICE_REMOVAL ||
            e == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
          if (!c->closing) {
            log(detail::log_level::info,
                c->where + ": " + rdma_core().rdma_event_str(e) + " (peer closed)");
            c->peer_gone = true;
            std::lock_guard lk(c->mu);
            if (c->qp != nullptr) move_to_error(c->qp);
            rdma_core().rdma_disconnect(c->id);  // answers the peer's DREQ at once (IB CM)
          }
          if (c->closing) done = true;
        }
      }
    }
    // Under mu: verbs_qp::disconnect reads id under it, and must find either
    // the live id or none (it read a null here once, between its check and
    // its rdma_disconnect, and librdmacm dereferenced it: a segfault in the VM).
    rdma_cm_id* id;
    rdma_event_channel* ch;
    {
      std::lock_guard lk(c->mu);
      id = std::exchange(c->id, nullptr);
      ch = std::exchange(c->ch, nullptr);
    }
    destroy_id_detached(id, ch);
  }).detach();
}

}  // namespace

rdma_conn_param verbs_qp::conn_param(const std::vector<std::byte>& wrapped, std::uint32_t ird,
                                     std::uint32_t ord) const noexcept {
  rdma_conn_param cp{};
  cp.private_data = wrapped.data();
  cp.private_data_len = static_cast<std::uint8_t>(wrapped.size());
  cp.responder_resources = static_cast<std::uint8_t>(ird);
  cp.initiator_depth = static_cast<std::uint8_t>(ord);
  cp.retry_count = transport_.retry_count;
  cp.rnr_retry_count = transport_.rnr_retry;
  cp.qp_num = qp_->qp_num;
  // The CM carries the SRQ bit (IB CM REQ/REP); librdmacm fills it only for
  // QPs it created itself, and this one is attached by number.
  cp.srq = srq_ ? 1 : 0;
  return cp;
}

result<void> verbs_qp::ib_rtr_rts(rdma_cm_id* id, std::uint32_t ird, std::uint32_t ord) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_INIT;
  if (rdma_core().rdma_init_qp_attr(id, &a, &mask) == 0)
    rdma_core().ibv_modify_qp(qp_, &a, mask);  // port/pkey of the route
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  if (rdma_core().rdma_init_qp_attr(id, &a, &mask) != 0)
    return make_error(errc::io_error,
                      "connect " + where() + ": rdma_init_qp_attr(RTR): " + err_text(errno), errno);
  if (pd_->dev().gid_override() >= 0)
    a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(pd_->dev().gid_override());
  a.max_dest_rd_atomic = static_cast<std::uint8_t>(ird);
  // The user's transport parameters (verbs_transport_params) over the CM's.
  const rc_attrs want = apply_transport_params(
      rc_attrs{.min_rnr_timer = a.min_rnr_timer, .path_mtu_bytes = mtu_bytes(a.path_mtu)},
      transport_);
  if (transport_.min_rnr_timer) {
    a.min_rnr_timer = want.min_rnr_timer;
    mask |= IBV_QP_MIN_RNR_TIMER;
  }
  if (transport_.path_mtu != 0) {
    a.path_mtu = mtu_from_bytes(want.path_mtu_bytes);
    mask |= IBV_QP_PATH_MTU;
  }
  if (int rc = rdma_core().ibv_modify_qp(qp_, &a, mask); rc != 0)
    return make_error(errc::io_error,
                      "connect " + where() + ": modify to RTR (mtu " + mtu_name(a.path_mtu) +
                          ", sgid index " + std::to_string(a.ah_attr.grh.sgid_index) +
                          "): " + err_text(rc),
                      rc);
  cattr_.verbs.emplace().path_mtu = mtu_bytes(a.path_mtu);
  log(detail::log_level::info, where() + ": RTR path mtu " + mtu_name(a.path_mtu) +
                                   ", sgid index " + std::to_string(a.ah_attr.grh.sgid_index) +
                                   ", dest QP " + std::to_string(a.dest_qp_num) +
                                   ", min_rnr_timer " + std::to_string(a.min_rnr_timer));
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  if (rdma_core().rdma_init_qp_attr(id, &a, &mask) != 0)
    return make_error(errc::io_error,
                      "connect " + where() + ": rdma_init_qp_attr(RTS): " + err_text(errno), errno);
  a.max_rd_atomic = static_cast<std::uint8_t>(ord);
  const rc_attrs rts = apply_transport_params(rc_attrs{.timeout = a.timeout}, transport_);
  a.retry_cnt = rts.retry_cnt;
  a.rnr_retry = rts.rnr_retry;
  a.timeout = rts.timeout;
  mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
  if (int rc = rdma_core().ibv_modify_qp(qp_, &a, mask); rc != 0)
    return make_error(errc::io_error,
                      "connect " + where() + ": modify to RTS (timeout " +
                          std::to_string(a.timeout) + ", retry_cnt " + std::to_string(a.retry_cnt) +
                          ", rnr_retry " + std::to_string(a.rnr_retry) + "): " + err_text(rc),
                      rc);
  return {};
}

void verbs_qp::finish(rdma_cm_id* id, rdma_event_channel* ch, std::uint32_t ird,
                      std::uint32_t ord) {
  cattr_.local_address = format_address(rdma_get_local_addr(id));
  cattr_.peer_address = format_address(rdma_get_peer_addr(id));
  peer_ = cattr_.peer_address;
  cattr_.ird = ird;
  cattr_.ord = ord;
  auto& va = cattr_.verbs ? *cattr_.verbs : cattr_.verbs.emplace();  // RTR set path_mtu (IB/RoCE)
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  const bool timed = !pd_->dev().iwarp();  // IB/RoCE: the QP's own timeout and retries
  if (rdma_core().ibv_query_qp(qp_, &qa,
                               IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC |
                                   IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY,
                               &qi) == 0) {
    // What the device set after negotiation (iWARP: MPA v2 IRD/ORD in the kernel).
    if (qa.max_rd_atomic > 0) cattr_.ord = qa.max_rd_atomic;
    if (qa.max_dest_rd_atomic > 0) cattr_.ird = qa.max_dest_rd_atomic;
    if (timed) va.path_mtu = mtu_bytes(qa.path_mtu);
  } else {
    qa.timeout = transport_.timeout.value_or(0);
    qa.retry_cnt = transport_.retry_count;
  }
  port_down_grace_ = verbs::port_down_grace(pd_->dev().options().verbs.port_down_grace, timed,
                                            qa.timeout, qa.retry_cnt);
  if (timed)
    log(detail::log_level::info, where() + ": RTS timeout " + std::to_string(qa.timeout) +
                                     ", retry_cnt " + std::to_string(qa.retry_cnt) +
                                     ", rnr_retry " + std::to_string(qa.rnr_retry) +
                                     "; a port down for longer than " +
                                     std::to_string(port_down_grace_.count()) + " ms fails it");
  if (!timed) va.path_mtu = 0;  // iWARP: TCP segments (the kernel's or NIC's, not exposed)
  ibv_port_attr pa{};
  if (query_port(pd_->dev().ctx(), pd_->dev().port(), &pa) == 0)
    va.port_mtu = mtu_bytes(pa.active_mtu);
  // iWARP: the kernel or the NIC negotiated MPA and tells us none of it, so
  // cattr_.iwarp stays empty.
  cattr_.extensions = pd_->dev().attr().atomics || pd_->dev().attr().immediate_data;
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
    return make_error(errc::invalid_state,
                      w + ": QP is " + std::string(to_string(state())) + ", not INIT");
  const std::size_t limit = dev.iwarp() ? max_private_data : ib_req_private;
  if (opts.private_data.size() > limit)
    return make_error(errc::invalid_argument,
                      w + ": private data of " + std::to_string(opts.private_data.size()) +
                          " bytes exceeds " + std::to_string(limit) + " on this transport");
  socklen_t len = 0;
  auto dst = parse_address(address, len);
  if (!dst) return std::unexpected(dst.error());
  auto ep = create_cm_id(w);
  if (!ep) return std::unexpected(ep.error());
  rdma_event_channel* ch = ep->ch;
  rdma_cm_id* id = ep->id;
  bool handed_off = false;
  auto fail = [&](errc code, std::string what, int e = 0) -> std::unexpected<error> {
    if (!handed_off) destroy_id_detached(id, ch);
    handed_off = true;
    return make_error(code, w + ": " + what, e);
  };
  const auto deadline = clock_type::now() + opts.timeout;
  const int tmo = static_cast<int>(std::max<long long>(opts.timeout.count(), 100));
  if (rdma_core().rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&*dst), tmo) != 0)
    return fail(errc::address_error, "rdma_resolve_addr: " + err_text(errno), errno);
  std::uint32_t ird =
      std::min<std::uint32_t>(want_ird_, static_cast<std::uint32_t>(dev.dattr().max_qp_rd_atom));
  std::uint32_t ord = std::min<std::uint32_t>(
      want_ord_, static_cast<std::uint32_t>(dev.dattr().max_qp_init_rd_atom));
  connection_info info;
  for (;;) {
    rdma_cm_event* ev = next_event(ch, deadline);
    if (ev == nullptr) {
      if (errno == ETIMEDOUT)
        return fail(errc::timed_out,
                    "no answer within " + std::to_string(opts.timeout.count()) + " ms");
      return fail(errc::io_error, "rdma_get_cm_event: " + err_text(errno), errno);
    }
    const auto e = ev->event;
    const int st = ev->status;
    rdma_conn_param param = ev->param.conn;
    std::vector<std::byte> pdata =
        unwrap_private(dev.iwarp(), param.private_data, param.private_data_len);
    rdma_core().rdma_ack_cm_event(ev);
    switch (e) {
      case RDMA_CM_EVENT_ADDR_RESOLVED: {
        if (id->verbs == nullptr ||
            rdma_core().ibv_get_device_name(id->verbs->device) != dev.ibdev())
          return fail(errc::address_error,
                      "the address routes through device " +
                          std::string(id->verbs ? rdma_core().ibv_get_device_name(id->verbs->device)
                                                : "(none)") +
                          ", not " + dev.ibdev() +
                          " (open that device, or use an address on this one)");
        if (rdma_core().rdma_resolve_route(id, tmo) != 0)
          return fail(errc::address_error, "rdma_resolve_route: " + err_text(errno), errno);
        break;
      }
      case RDMA_CM_EVENT_ROUTE_RESOLVED: {
        const auto wrapped = wrap_private(dev.iwarp(), opts.private_data);
        rdma_conn_param cp = conn_param(wrapped, ird, ord);
        if (!dev.iwarp()) {
          ibv_qp_attr a{};
          int mask = 0;
          a.qp_state = IBV_QPS_INIT;
          if (rdma_core().rdma_init_qp_attr(id, &a, &mask) == 0)
            rdma_core().ibv_modify_qp(qp_, &a, mask);
        }
        if (rdma_core().rdma_connect(id, &cp) != 0) {
          const int ce = errno;  // iWARP connects TCP synchronously: a RST shows here
          if (ce == ECONNREFUSED)
            return fail(errc::connection_refused, "connection refused (nothing listens there)", ce);
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
          rdma_core().rdma_reject(id, nullptr, 0);
          return fail(r.error().code, r.error().context, r.error().sys_errno);
        }
        if (rdma_core().rdma_establish(id) != 0)
          return fail(errc::io_error, "rdma_establish: " + err_text(errno), errno);
        finish(id, ch, ird, ord);
        handed_off = true;
        info.attr = cattr_;
        return info;
      }
      case RDMA_CM_EVENT_ESTABLISHED: {
        info.private_data = std::move(pdata);
        finish(id, ch,
               std::min<std::uint32_t>(ird, param.initiator_depth ? param.initiator_depth : ird),
               std::min<std::uint32_t>(
                   ord, param.responder_resources ? param.responder_resources : ord));
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
                                        (reason.empty() ? "" : ": " + reason) + " (status " +
                                        std::to_string(st) + ")");
      }
      case RDMA_CM_EVENT_ADDR_ERROR:
        return fail(errc::address_error, "address resolution failed (status " + std::to_string(st) +
                                             "; no RDMA device owns a route to it?)");
      case RDMA_CM_EVENT_ROUTE_ERROR:
        return fail(errc::address_error,
                    "route resolution failed (status " + std::to_string(st) + ")");
      case RDMA_CM_EVENT_UNREACHABLE:
        return fail(
            st == -ETIMEDOUT || st == -ETIMEDOUT * 1 ? errc::timed_out : errc::connection_refused,
            "peer unreachable (status " + std::to_string(st) + ")");
      case RDMA_CM_EVENT_CONNECT_ERROR:
        return fail(errc::connection_reset, "connect error (status " + std::to_string(st) + ")");
      default:
        return fail(errc::protocol_error,
                    std::string("unexpected CM event ") + rdma_core().rdma_event_str(e));
    }
  }
}

result<connection_info> verbs_qp::accept_on(rdma_cm_id* id, rdma_event_channel* ch,
                                            const rdma_conn_param& req, const std::string& peer,
                                            std::span<const std::byte> pdata,
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
  if (id->verbs == nullptr || rdma_core().ibv_get_device_name(id->verbs->device) != dev.ibdev())
    return fail(
        errc::invalid_argument,
        "the request arrived on device " +
            std::string(id->verbs ? rdma_core().ibv_get_device_name(id->verbs->device) : "?") +
            ", the QP belongs to " + dev.ibdev());
  const std::size_t limit = dev.iwarp() ? max_private_data : ib_rep_private;
  if (pdata.size() > limit)
    return fail(errc::invalid_argument, "private data of " + std::to_string(pdata.size()) +
                                            " bytes exceeds " + std::to_string(limit) +
                                            " on this transport");
  std::uint32_t ird =
      std::min<std::uint32_t>({want_ird_, static_cast<std::uint32_t>(dev.dattr().max_qp_rd_atom),
                               std::max<std::uint32_t>(req.initiator_depth, 1)});
  std::uint32_t ord = std::min<std::uint32_t>(
      {want_ord_, static_cast<std::uint32_t>(dev.dattr().max_qp_init_rd_atom),
       std::max<std::uint32_t>(req.responder_resources, 1)});
  if (!dev.iwarp()) {
    if (auto r = ib_rtr_rts(id, ird, ord); !r) {
      rdma_core().rdma_reject(id, nullptr, 0);
      return fail(r.error().code, r.error().context, r.error().sys_errno);
    }
  }
  const auto wrapped = wrap_private(dev.iwarp(), pdata);
  rdma_conn_param cp = conn_param(wrapped, ird, ord);
  if (rdma_core().rdma_accept(id, &cp) != 0)
    return fail(errc::io_error, "rdma_accept: " + err_text(errno), errno);
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
    rdma_core().rdma_ack_cm_event(ev);
    if (e == RDMA_CM_EVENT_ESTABLISHED) {
      finish(id, ch, ird, ord);
      connection_info info;
      info.attr = cattr_;
      return info;
    }
    move_to_error(qp_);
    state_ = qp_state::error;
    return fail(errc::connection_reset, std::string("peer ") + peer + ": " +
                                            rdma_core().rdma_event_str(e) + " (status " +
                                            std::to_string(st) + ") instead of ESTABLISHED");
  }
}

namespace {

class verbs_request final : public detail::conn_request_impl {
 public:
  verbs_request(std::shared_ptr<verbs_device> dev, rdma_cm_id* id, rdma_event_channel* ch,
                rdma_conn_param p, std::vector<std::byte> pdata)
      : dev_(std::move(dev)), id_(id), ch_(ch), param_(p), pdata_(std::move(pdata)) {
    param_.private_data = nullptr;
    param_.private_data_len = 0;
    peer_ = format_address(rdma_get_peer_addr(id_));
  }
  ~verbs_request() override {
    if (id_ != nullptr) {
      rdma_core().rdma_reject(id_, nullptr, 0);
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
    return q->accept_on(id, ch_, param_, peer_, pd,
                        std::chrono::milliseconds(dev_->options().handshake_timeout_ms));
  }
  result<void> reject(std::span<const std::byte> reason) override {
    auto* id = std::exchange(id_, nullptr);
    if (id == nullptr) return make_error(errc::invalid_state, "reject: already answered");
    auto wrapped = wrap_private(
        dev_->iwarp(), reason.subspan(0, std::min(reason.size(), dev_->iwarp() ? max_private_data
                                                                               : ib_rej_private)));
    int rc = rdma_core().rdma_reject(id, wrapped.data(), static_cast<std::uint8_t>(wrapped.size()));
    int e = errno;
    destroy_id_detached(id, ch_);
    if (rc != 0)
      return make_error(errc::io_error,
                        "reject " + peer_ + " on " + dev_->where() + ": " + err_text(e), e);
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
    drain_events(ch_);
    rdma_core().rdma_destroy_id(id_);
    rdma_core().rdma_destroy_event_channel(ch_);
  }
  std::string address() const override { return addr_; }
  std::uint16_t port() const noexcept override { return ntohs(rdma_core().rdma_get_src_port(id_)); }
  result<std::unique_ptr<detail::conn_request_impl>> accept(
      std::chrono::milliseconds timeout) override {
    const auto deadline = clock_type::now() + timeout;
    for (;;) {
      rdma_cm_event* ev = next_event(ch_, deadline);
      if (ev == nullptr) {
        if (errno == ETIMEDOUT)
          return make_error(errc::timed_out, "accept on " + addr_ + " (" + dev_->where() +
                                                 "): no connection request within " +
                                                 std::to_string(timeout.count()) + " ms");
        return make_error(errc::io_error, "accept on " + addr_ + ": " + err_text(errno), errno);
      }
      if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        log(detail::log_level::debug,
            "listener " + addr_ + ": ignoring " + rdma_core().rdma_event_str(ev->event));
        rdma_core().rdma_ack_cm_event(ev);
        continue;
      }
      rdma_cm_id* child = ev->id;
      rdma_conn_param p = ev->param.conn;
      auto pdata = unwrap_private(dev_->iwarp(), p.private_data, p.private_data_len);
      rdma_core().rdma_ack_cm_event(ev);
      rdma_event_channel* ch = rdma_core().rdma_create_event_channel();
      if (ch == nullptr || rdma_core().rdma_migrate_id(child, ch) != 0) {
        int e = errno;
        rdma_core().rdma_reject(child, nullptr, 0);
        rdma_core().rdma_destroy_id(child);
        if (ch) rdma_core().rdma_destroy_event_channel(ch);
        return make_error(errc::resource_exhausted,
                          "accept on " + addr_ + ": event channel: " + err_text(e), e);
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

}  // namespace

result<std::unique_ptr<detail::listener_impl>> verbs_device::bind_listener(std::string_view address,
                                                                           int backlog) {
  const std::string w = "listen on " + std::string(address) + " (" + where() + ")";
  socklen_t len = 0;
  auto sa = parse_address(address, len);
  if (!sa) return std::unexpected(sa.error());
  auto ep = create_cm_id(w);
  if (!ep) return std::unexpected(ep.error());
  rdma_event_channel* ch = ep->ch;
  rdma_cm_id* id = ep->id;
  auto fail = [&](errc code, std::string what, int e) -> std::unexpected<error> {
    rdma_core().rdma_destroy_id(id);
    rdma_core().rdma_destroy_event_channel(ch);
    return make_error(code, w + ": " + what, e);
  };
  if (rdma_core().rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&*sa)) != 0)
    return fail(errc::address_error, "rdma_bind_addr: " + err_text(errno), errno);
  if (id->verbs != nullptr && rdma_core().ibv_get_device_name(id->verbs->device) != ibdev_)
    return fail(errc::address_error,
                "the address belongs to device " +
                    std::string(rdma_core().ibv_get_device_name(id->verbs->device)) + ", not " +
                    ibdev_,
                0);
  if (rdma_core().rdma_listen(id, backlog) != 0)
    return fail(errc::address_error, "rdma_listen: " + err_text(errno), errno);
  auto self = std::static_pointer_cast<verbs_device>(shared_from_this());
  return std::unique_ptr<detail::listener_impl>(
      std::make_unique<verbs_listener>(std::move(self), id, ch));
}

namespace {

// The first IPv4 address of the network devices under an RDMA device, as
// sysfs names them: the one it was made on (rxe: "parent") and those its GID
// table refers to (ports/*/gid_attrs/ndevs/*); and, for iWARP devices, whose
// GID is their network device's MAC address followed by zeros (siw has neither
// sysfs entry), the network device with that MAC.
std::string netdev_ipv4(const std::string& ibdev, const std::vector<std::string>& gids) {
  namespace fs = std::filesystem;
  std::vector<std::string> netdevs;
  auto read_name = [&](const fs::path& p) {
    std::ifstream in(p);
    std::string n;
    if (in >> n && std::find(netdevs.begin(), netdevs.end(), n) == netdevs.end())
      netdevs.push_back(n);
  };
  const fs::path base = fs::path("/sys/class/infiniband") / ibdev;
  std::error_code ec;
  read_name(base / "parent");
  for (const auto& port : fs::directory_iterator(base / "ports", ec)) {
    std::error_code ec2;
    for (const auto& nd : fs::directory_iterator(port.path() / "gid_attrs" / "ndevs", ec2))
      read_name(nd.path());
  }
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return {};
  for (const auto& text : gids) {
    unsigned char raw[16] = {};
    if (::inet_pton(AF_INET6, text.c_str(), raw) != 1 ||
        !std::all_of(raw + 6, raw + 16, [](unsigned char b) { return b == 0; }))
      continue;
    for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_PACKET) continue;
      const auto* ll = reinterpret_cast<const sockaddr_ll*>(i->ifa_addr);
      if (ll->sll_halen == 6 && std::memcmp(ll->sll_addr, raw, 6) == 0 &&
          std::find(netdevs.begin(), netdevs.end(), i->ifa_name) == netdevs.end())
        netdevs.emplace_back(i->ifa_name);
    }
  }
  std::string out;
  for (const auto& want : netdevs) {
    for (ifaddrs* i = all; i != nullptr && out.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || want != i->ifa_name)
        continue;
      char text[INET_ADDRSTRLEN] = {};
      const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof text) != nullptr) out = text;
    }
    if (!out.empty()) break;
  }
  ::freeifaddrs(all);
  return out;
}

}  // namespace

result<std::unique_ptr<detail::listener_impl>> verbs_device::bind_ephemeral_listener(int backlog) {
  // An IPv4-mapped GID (RoCE v2) names the address directly; else the
  // device's network device's (iWARP, RoCE v1).
  std::string ip;
  std::vector<std::string> gids;
  for (const auto& p : attr().ports) {
    gids.insert(gids.end(), p.addresses.begin(), p.addresses.end());
    for (const auto& gid : p.addresses) {
      if (gid.starts_with("::ffff:") && gid.find('.') != std::string::npos) {
        ip = gid.substr(7);
        break;
      }
    }
    if (!ip.empty()) break;
  }
  if (ip.empty()) ip = netdev_ipv4(ibdev_, gids);
  if (ip.empty())
    return make_error(errc::address_error,
                      "listen on an ephemeral address (" + where() +
                          "): the device has no IPv4 address (no IPv4-mapped GID, no network "
                          "device with one); give listener::bind an address");
  return bind_listener(ip + ":0", backlog);
}

}  // namespace conveyor::verbs
