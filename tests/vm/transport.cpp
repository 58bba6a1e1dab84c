// The verbs transport parameters and the port-down grace period, on a kernel
// device in the VM (tests/vm/guest.sh runs them on rxe and siw):
//
//   conveyor_vm_interop --transport verbs:rxe0 10.11.0.1
//   conveyor_vm_interop --port-flap verbs:rxe0 veth0 10.11.0.1
//
// --transport: create_qp refuses verbs_transport_params out of range, on every
// device; on IB/RoCE each parameter shows in what the connection does: a SEND
// that finds no receive fails with rnr_retry_exc_err after the default RNR
// retries (6, each waiting the responder's RNR timer), at once with
// rnr_retry = 0, quickly with a responder's min_rnr_timer of 0.01 ms; QPs
// with path_mtu 512 report path_mtu 512 and still move 64 KiB both ways.
// --port-flap: two QPs of one connection, with grace periods from their own
// timeout and retry count (IB/RoCE: 2148 ms and 1074 ms; iWARP: 5 s each). The
// link goes down for 300 ms and comes back: the provider fails no QP, and
// both still move data (siw fails them by itself: then each gets its
// qp_error, as the device's doing, once the port is back). Then, on a fresh
// connection, it stays down: each QP gets its qp_error once its own grace
// has passed, not before, and is in ERROR.
#include "vm_common.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;

namespace vmcheck {
namespace {

// One connection on one device: both QPs, their CQs and registered memory.
struct conn {
  cvy::completion_queue ccq, scq;
  cvy::queue_pair cqp, sqp;
  std::vector<std::byte> cbuf, sbuf;
  cvy::memory_region cmr, smr;
  cvy::remote_region peer;  // the server's region
  cvy::qp_connection_attr cattr, sattr;
};

constexpr std::size_t buf_len = 1 << 17;

std::uint32_t path_mtu(const cvy::qp_connection_attr& a) {
  return a.verbs ? a.verbs->path_mtu : 0;
}

std::optional<conn> connect_pair(cvy::device& dev, cvy::protection_domain& pd,
                                 const std::string& ip, const cvy::verbs_transport_params& client,
                                 const cvy::verbs_transport_params& server, int server_recvs) {
  conn c;
  c.ccq = dev.create_cq({.depth = 256}).value();
  c.scq = dev.create_cq({.depth = 256}).value();
  const cvy::qp_caps caps{.max_send_wr = 64,
                          .max_recv_wr = 32,
                          .max_send_sge = 1,
                          .max_recv_sge = 1,
                          .max_inline_data = 0};
  auto cq =
      pd.create_qp({.send_cq = &c.ccq, .recv_cq = &c.ccq, .cap = caps, .verbs_transport = client});
  auto sq =
      pd.create_qp({.send_cq = &c.scq, .recv_cq = &c.scq, .cap = caps, .verbs_transport = server});
  if (!cq || !sq) {
    std::printf("interop: FAIL create_qp: %s\n",
                (!cq ? cq.error() : sq.error()).to_string().c_str());
    ++failures;
    return std::nullopt;
  }
  c.cqp = std::move(*cq);
  c.sqp = std::move(*sq);
  c.cbuf.assign(buf_len, std::byte{0});
  c.sbuf.assign(buf_len, std::byte{0});
  fill(c.cbuf, 5);
  const auto all = cvy::access::local_write | cvy::access::remote_read | cvy::access::remote_write;
  c.cmr = pd.register_memory(std::span(c.cbuf), all).value();
  c.smr = pd.register_memory(std::span(c.sbuf), all).value();
  for (int i = 0; i < server_recvs; ++i)
    CHECK(c.sqp.post_recv(c.smr.slice(static_cast<std::size_t>(i) * 4096, 4096), 500 + i) ==
              cvy::errc::ok,
          "server post_recv");
  auto lis = cvy::listener::bind(dev, ip + ":0");
  if (!lis) {
    std::printf("interop: FAIL bind: %s\n", lis.error().to_string().c_str());
    ++failures;
    return std::nullopt;
  }
  std::array<std::byte, cvy::remote_region::encoded_size> pdata{};
  c.smr.remote().encode_to(pdata);
  std::string serr;
  std::thread srv([&] {
    auto req = lis->accept(20s);
    if (!req) {
      serr = req.error().to_string();
      return;
    }
    auto a = req->accept(c.sqp, pdata);
    if (!a)
      serr = a.error().to_string();
    else
      c.sattr = a->attr;
  });
  auto info = cvy::connect(c.cqp, lis->address(), {.timeout = 20s});
  srv.join();
  if (!info || !serr.empty()) {
    std::printf("interop: FAIL connect: %s\n",
                !info ? info.error().to_string().c_str() : serr.c_str());
    ++failures;
    return std::nullopt;
  }
  c.cattr = info->attr;
  c.peer = cvy::remote_region::decode(info->private_data).value();
  return c;
}

// The next completion on `cq` within `t`.
std::optional<cvy::work_completion> next_wc(cvy::completion_queue& cq,
                                            std::chrono::milliseconds t) {
  std::array<cvy::work_completion, 1> wc{};
  auto n = cq.wait(wc, t);
  if (!n || *n == 0) return std::nullopt;
  return wc[0];
}

// A SEND of 64 bytes to a server that has no receive posted: its status and
// how long it took.
void send_without_receive(conn& c, const char* label, cvy::wc_status want, double min_ms,
                          double max_ms) {
  const auto t0 = steady::now();
  CHECK(c.cqp.post_send_msg(c.cmr.slice(0, 64), 7) == cvy::errc::ok, "post SEND");
  auto wc = next_wc(c.ccq, 30s);
  const double took = ms_since(t0, steady::now());
  if (!wc) {
    std::printf("interop: FAIL [%s] no completion for the SEND within 30 s\n", label);
    ++failures;
    return;
  }
  std::printf("interop: [%s] SEND without a receive: %s after %.1f ms (want %s in %.0f..%.0f ms)\n",
              label, st(wc->status).c_str(), took, st(want).c_str(), min_ms, max_ms);
  CHECK(wc->status == want, "[%s] SEND completed %s, expected %s", label, st(wc->status).c_str(),
        st(want).c_str());
  CHECK(took >= min_ms && took <= max_ms,
        "[%s] the SEND failed after %.1f ms, expected %.0f..%.0f ms", label, took, min_ms, max_ms);
}

// WRITE 64 KiB to the server, READ it back into the other half, compare, then
// one SEND the server receives: the connection moves data.
void moves_data(conn& c, const char* label) {
  constexpr std::size_t len = 1 << 16;
  auto post_wait = [&](cvy::status s, const char* what) {
    CHECK(s == cvy::errc::ok, "[%s] post %s: %s", label, what,
          std::string(cvy::to_string(s)).c_str());
    auto wc = next_wc(c.ccq, 20s);
    CHECK(wc && wc->status == cvy::wc_status::success, "[%s] %s: %s", label, what,
          wc ? st(wc->status).c_str() : "no completion within 20 s");
  };
  std::fill(c.cbuf.begin() + len, c.cbuf.begin() + 2 * len, std::byte{0});
  post_wait(c.cqp.post_write(c.cmr.slice(0, len), c.peer.slice(0, len), 11), "WRITE");
  post_wait(c.cqp.post_read(c.cmr.slice(len, len), c.peer.slice(0, len), 12), "READ");
  CHECK(std::memcmp(c.cbuf.data(), c.cbuf.data() + len, len) == 0,
        "[%s] READ did not return what WRITE put", label);
  post_wait(c.cqp.post_send_msg(c.cmr.slice(0, 256), 13), "SEND");
  auto r = next_wc(c.scq, 20s);
  CHECK(r && r->status == cvy::wc_status::success && r->byte_len == 256, "[%s] server receive: %s",
        label, r ? st(r->status).c_str() : "none within 20 s");
}

}  // namespace

int transport_check(const std::string& dev_name, const std::string& ip) {
  auto d = cvy::device::open(dev_name);
  if (!d) {
    std::printf("interop: FAIL open %s: %s\n", dev_name.c_str(), d.error().to_string().c_str());
    return 1;
  }
  auto& dev = *d;
  auto pd = dev.alloc_pd().value();
  auto cq = dev.create_cq({.depth = 16}).value();
  // Out of range: refused on every verbs device, naming the field.
  for (const auto& [p, field] :
       {std::pair{cvy::verbs_transport_params{.retry_count = 8}, "retry_count 8"},
        std::pair{cvy::verbs_transport_params{.rnr_retry = 8}, "rnr_retry 8"},
        std::pair{cvy::verbs_transport_params{.timeout = 40}, "timeout 40"},
        std::pair{cvy::verbs_transport_params{.path_mtu = 1500}, "path_mtu 1500"}}) {
    auto q = pd.create_qp({.send_cq = &cq, .recv_cq = &cq, .verbs_transport = p});
    CHECK(!q && q.error().code == cvy::errc::invalid_argument,
          "create_qp with %s: not invalid_argument", field);
    if (!q) {
      CHECK(q.error().context.find(field) != std::string::npos, "the error does not name %s: %s",
            field, q.error().to_string().c_str());
      std::printf("interop: create_qp with %s: %s\n", field, q.error().to_string().c_str());
    }
  }
  if (dev.attr().transport_type == cvy::transport::iwarp) {
    std::printf(
        "interop: %s is iWARP: the transport parameters do not apply (TCP's); validation only\n",
        dev_name.c_str());
  } else {
    // Defaults: rnr_retry 6, each retry after the responder's RNR timer
    // (Linux's CM sets 0: 655 ms), so about 6 x 655 ms.
    if (auto c = connect_pair(dev, pd, ip, {}, {}, 0))
      send_without_receive(*c, "defaults", cvy::wc_status::rnr_retry_exc_err, 3000, 20000);
    // rnr_retry 0: the first RNR NAK ends it.
    if (auto c = connect_pair(dev, pd, ip, {.rnr_retry = 0}, {}, 0))
      send_without_receive(*c, "rnr_retry 0", cvy::wc_status::rnr_retry_exc_err, 0, 600);
    // The responder asks for 0.01 ms between retries: 6 retries take no time.
    if (auto c = connect_pair(dev, pd, ip, {}, {.min_rnr_timer = 1}, 0))
      send_without_receive(*c, "server min_rnr_timer 1", cvy::wc_status::rnr_retry_exc_err, 0,
                           1500);
    // path_mtu 512 on both sides (a responder refuses the middle packets of a
    // message that are not its path MTU: both must agree), below the path's
    // (veth 1500: 1024); 64 KiB messages move both ways in 512-byte packets.
    const cvy::verbs_transport_params mtu512{.retry_count = 3, .timeout = 14, .path_mtu = 512};
    if (auto c = connect_pair(dev, pd, ip, mtu512, mtu512, 4)) {
      const std::uint32_t cm = path_mtu(c->cattr), sm = path_mtu(c->sattr);
      std::printf("interop: [path_mtu 512] client path_mtu %u, server path_mtu %u\n", cm, sm);
      CHECK(cm == 512 && sm == 512, "path_mtu client %u, server %u, expected 512", cm, sm);
      auto again = c->cqp.connection();
      CHECK(again && path_mtu(*again) == 512,
            "qp.connection().verbs->path_mtu differs from connect()'s");
      moves_data(*c, "path_mtu 512");
    }
    // Without it, the path's.
    if (auto c = connect_pair(dev, pd, ip, {}, {}, 4)) {
      const std::uint32_t cm = path_mtu(c->cattr), sm = path_mtu(c->sattr);
      std::printf("interop: [default path_mtu] client path_mtu %u, server path_mtu %u\n", cm, sm);
      CHECK(cm > 512 && cm == sm, "default path_mtu client %u, server %u", cm, sm);
    }
  }
  std::printf("interop: transport parameters %s: %s\n", dev_name.c_str(),
              failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

int port_flap(const std::string& dev_name, const std::string& netdev, const std::string& ip) {
  event_log ev;
  cvy::device_options o;  // fail_qps_on_port_down, port_down_grace unset: each QP's own
  o.on_event = [&](const cvy::device_event& e) { ev.add(e); };
  auto d = cvy::device::open(dev_name, o);
  if (!d) {
    std::printf("interop: FAIL open %s: %s\n", dev_name.c_str(), d.error().to_string().c_str());
    return 1;
  }
  auto& dev = *d;
  auto pd = dev.alloc_pd().value();
  const bool iwarp = dev.attr().transport_type == cvy::transport::iwarp;
  // 4.096 us x 2^16 x 8 = 2148 ms; 2^15: 1074 ms. iWARP: 5 s (TCP's retries are the kernel's).
  const double grace_c = iwarp ? 5000 : 2148, grace_s = iwarp ? 5000 : 1074;
  auto c = connect_pair(dev, pd, ip, {.retry_count = 7, .timeout = 16},
                        {.retry_count = 7, .timeout = 15}, 8);
  if (!c) return 1;
  const auto cnum = c->cqp.qp_num(), snum = c->sqp.qp_num();
  std::printf(
      "interop: [flap] connected QP %u (client, grace %.0f ms) <-> QP %u (server, grace %.0f ms)\n",
      cnum, grace_c, snum, grace_s);
  // Waits for an event of `type` (for QP `num`, unless 0) stamped after `after`.
  auto wait_event = [&](cvy::device_event_type type, steady::time_point after,
                        std::chrono::milliseconds t, std::uint32_t num = 0) {
    std::unique_lock lk(ev.mu);
    std::optional<std::pair<steady::time_point, cvy::device_event>> got;
    ev.cv.wait_for(lk, t, [&] {
      for (const auto& e : ev.events)
        if (e.second.type == type && e.first >= after && (num == 0 || e.second.qp_num == num)) {
          got = e;
          return true;
        }
      return false;
    });
    return got;
  };
  auto qp_error = [&](std::uint32_t num, steady::time_point after, std::chrono::milliseconds t) {
    return wait_event(cvy::device_event_type::qp_error, after, t, num);
  };

  // 1. A flap shorter than either grace: nothing fails.
  const auto t_flap = steady::now();
  CHECK(set_link(netdev, false), "taking %s down failed", netdev.c_str());
  auto down1 = wait_event(cvy::device_event_type::port_down, t_flap, 20s);
  CHECK(down1.has_value(), "no port_down within 20 s");
  if (down1) {
    std::printf("interop: [flap] port_down %.1f ms after the link went down: %s\n",
                ms_since(t_flap, down1->first), down1->second.description.c_str());
    CHECK(
        down1->second.description.find("failed if it stays down longer than") != std::string::npos,
        "the port_down event does not say when its QPs fail: %s",
        down1->second.description.c_str());
  }
  std::this_thread::sleep_for(300ms);
  const auto t_up = steady::now();
  CHECK(set_link(netdev, true), "taking %s up failed", netdev.c_str());
  std::printf("interop: [flap] link down for %.0f ms\n", ms_since(t_flap, t_up));
  auto up1 = wait_event(cvy::device_event_type::port_active, t_up, 20s);
  CHECK(up1.has_value(), "no port_active within 20 s of taking %s up", netdev.c_str());
  if (up1) std::printf("interop: [flap] port_active: %s\n", up1->second.description.c_str());
  CHECK(ms_since(t_flap, t_up) < std::min(grace_c, grace_s),
        "the flap lasted longer than a grace period (slow VM)");
  // siw fails an idle connection by itself when its link goes down (its
  // TCP connection is torn down with it): the provider must not have, and
  // reports each such QP once the port is back, as the device's doing. Those
  // qp_error events follow port_active on the event thread: a QP already in
  // ERROR waits for its event (looking without waiting failed one full VM
  // run; alone, the old check passed 6 runs of 6).
  bool kept = true;
  for (auto num : {cnum, snum}) {
    const auto& q = num == cnum ? c->cqp : c->sqp;
    auto e = qp_error(num, t_flap, q.state() == cvy::qp_state::error ? 10s : 0ms);
    if (!e) continue;
    kept = false;
    std::printf("interop: [flap] QP %u: %s\n", num, e->second.description.c_str());
    CHECK(iwarp, "QP %u failed although the port came back within its grace period: %s", num,
          e->second.description.c_str());
    CHECK(e->second.description.find("already in ERROR") != std::string::npos && up1 &&
              e->first >= up1->first,
          "QP %u: the provider failed it during the flap: %s", num, e->second.description.c_str());
  }
  if (kept) {
    CHECK(c->cqp.state() == cvy::qp_state::rts && c->sqp.state() == cvy::qp_state::rts,
          "after the flap: client %s, server %s, expected rts",
          std::string(cvy::to_string(c->cqp.state())).c_str(),
          std::string(cvy::to_string(c->sqp.state())).c_str());
    moves_data(*c, "after the flap");
  } else {
    std::printf("interop: [flap] note: %s failed the connection by itself during a 300 ms flap\n",
                dev_name.c_str());
  }

  // 2. Down for good, on a fresh connection: each QP fails once its own grace
  // has passed (a QP the device failed first is reported then too).
  c.reset();
  c = connect_pair(dev, pd, ip, {.retry_count = 7, .timeout = 16},
                   {.retry_count = 7, .timeout = 15}, 8);
  if (!c) return 1;
  const auto cnum2 = c->cqp.qp_num(), snum2 = c->sqp.qp_num();
  const auto t_down = steady::now();
  CHECK(set_link(netdev, false), "taking %s down failed", netdev.c_str());
  const auto bound = std::chrono::milliseconds(static_cast<long>(std::max(grace_c, grace_s))) + 15s;
  for (auto [num, grace, who] :
       {std::tuple{cnum2, grace_c, "client"}, std::tuple{snum2, grace_s, "server"}}) {
    auto e = qp_error(num, t_down, bound);
    CHECK(e.has_value(), "no qp_error for the %s QP %u within %.0f ms of the link going down", who,
          num, grace + 15000);
    if (!e) continue;
    const double at = ms_since(t_down, e->first);
    std::printf(
        "interop: [down] %s QP %u: qp_error %.1f ms after the link went down (grace %.0f ms): %s\n",
        who, num, at, grace, e->second.description.c_str());
    // The event thread checks deadlines to the millisecond; an emulated guest
    // may be late by seconds, never early.
    CHECK(at >= grace - 5, "the %s QP failed after %.1f ms, before its grace period (%.0f ms)", who,
          at, grace);
    CHECK(at <= grace + 5000, "the %s QP failed %.1f ms after the link went down, grace %.0f ms",
          who, at, grace);
    CHECK(e->second.description.find("QP " + std::to_string(num)) != std::string::npos &&
              e->second.description.find("peer ") != std::string::npos,
          "the qp_error does not name the QP and its peer: %s", e->second.description.c_str());
  }
  CHECK(c->cqp.state() == cvy::qp_state::error && c->sqp.state() == cvy::qp_state::error,
        "QPs not in ERROR");
  const auto t_up2 = steady::now();
  CHECK(set_link(netdev, true), "taking %s up failed", netdev.c_str());
  CHECK(wait_event(cvy::device_event_type::port_active, t_up2, 20s).has_value(),
        "no port_active after the outage");
  std::printf("interop: port flap %s: %s\n", dev_name.c_str(), failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

}  // namespace vmcheck
