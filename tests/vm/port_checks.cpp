// conveyor_vm_interop's port checks (run by tests/vm/guest.sh, part "events"):
// --port-events takes the device's netdev down and up again (`ip link`) and
// checks that device_options::on_event reported port_down, then port_active,
// for the device's port.
// --port-down connects two QPs of the device to each other, posts 64 READs and
// WRITEs of 1 MiB and 16 receives on each side, takes the netdev down under
// them and checks that every request completes (the first error, then
// flushes) within 30 s, that on_event reported port_down and a qp_error per QP
// naming device, port, QP and peer, and that posting then says qp_in_error;
// the link comes back up (port_active) before it ends (port_down_grace 0 ms:
// the grace period has its own check, transport.cpp). It then measures what
// the kernel device does by itself (fail_qps_on_port_down = false) and prints
// it without judging it. --device-removal does the same but removes the
// device (`rdma link delete`) instead: device_fatal and a qp_error per QP,
// every request completed, then closing every object lets the removal end.
#include "vm_common.hpp"

#include <conveyor/conveyor.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace vmcheck {

// Takes `netdev` down and up; the device must report both through on_event.
int port_events(const std::string& dev_name, const std::string& netdev) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<cvy::device_event> events;
  cvy::device_options o;
  o.on_event = [&](const cvy::device_event& e) {
    std::lock_guard lk(mu);
    events.push_back(e);
    cv.notify_all();
  };
  auto dev = cvy::device::open(dev_name, o);
  if (!dev) {
    std::printf("interop: FAIL open %s: %s\n", dev_name.c_str(), dev.error().to_string().c_str());
    return 1;
  }
  const std::string ibdev = dev_name.substr(dev_name.find(':') + 1);
  // Waits up to 20 s (an emulated guest is slow) for an event of type t.
  auto expect = [&](cvy::device_event_type t) {
    std::unique_lock lk(mu);
    const bool got = cv.wait_for(lk, 20s, [&] {
      for (const auto& e : events)
        if (e.type == t) return true;
      return false;
    });
    CHECK(got, "no %s event from %s within 20 s", std::string(cvy::to_string(t)).c_str(),
          dev_name.c_str());
    for (const auto& e : events) {
      if (e.type != t) continue;
      std::printf("interop: event %s: port %u: %s\n", std::string(cvy::to_string(e.type)).c_str(),
                  unsigned{e.port}, e.description.c_str());
      CHECK(e.port == 1, "the event names port %u, expected 1", unsigned{e.port});
      CHECK(e.description.find(ibdev) != std::string::npos, "the description does not name %s",
            ibdev.c_str());
    }
    events.clear();
  };
  const std::string down = "ip link set " + netdev + " down", up = "ip link set " + netdev + " up";
  CHECK(std::system(down.c_str()) == 0, "%s failed", down.c_str());
  expect(cvy::device_event_type::port_down);
  CHECK(std::system(up.c_str()) == 0, "%s failed", up.c_str());
  expect(cvy::device_event_type::port_active);
  std::printf("interop: port events %s: %s\n", dev_name.c_str(), failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

// One connection on `dev_name` (both QPs on one device), requests in flight,
// then the cut. Everything is checked except for port_down_kernel_alone,
// which prints what the kernel device does by itself.
void port_down_once(const std::string& dev_name, const std::string& netdev, const std::string& ip,
                    cut how) {
  const bool enforce = how != cut::port_down_kernel_alone;
  const char* label = how == cut::port_down ? "conveyor"
                      : how == cut::removal ? "removal"
                                            : "kernel alone";
  const char* what = how == cut::removal ? "device removal" : "link down";
  const int before = failures;
  event_log ev;
  cvy::device_options o;
  o.on_event = [&](const cvy::device_event& e) { ev.add(e); };
  o.verbs.fail_qps_on_port_down = how != cut::port_down_kernel_alone;
  o.verbs.port_down_grace = 0ms;  // at once: the grace period has its own check (--port-flap)
  auto d = cvy::device::open(dev_name, o);
  if (!d) {
    std::printf("interop: FAIL open %s: %s\n", dev_name.c_str(), d.error().to_string().c_str());
    ++failures;
    return;
  }
  auto& dev = *d;
  const std::string ibdev = dev_name.substr(dev_name.find(':') + 1);
  auto pd = dev.alloc_pd().value();
  auto ccq = dev.create_cq({.depth = 1024}).value();
  auto scq = dev.create_cq({.depth = 1024}).value();
  constexpr std::size_t mib = 1 << 20, n_ops = 64, n_recv = 16, slots = 8;
  const cvy::qp_caps caps{.max_send_wr = 128,
                          .max_recv_wr = 32,
                          .max_send_sge = 1,
                          .max_recv_sge = 1,
                          .max_inline_data = 0};
  auto cqp = pd.create_qp({.send_cq = &ccq, .recv_cq = &ccq, .cap = caps}).value();
  auto sqp = pd.create_qp({.send_cq = &scq, .recv_cq = &scq, .cap = caps}).value();
  std::vector<std::byte> local(slots * mib), remote(slots * mib), rbuf(2 * n_recv * 4096);
  fill(local, 3);
  fill(remote, 4);
  auto lmr = pd.register_memory(std::span(local), cvy::access::local_write).value();
  auto rmr =
      pd.register_memory(std::span(remote), cvy::access::local_write | cvy::access::remote_read |
                                                cvy::access::remote_write)
          .value();
  auto bmr = pd.register_memory(std::span(rbuf), cvy::access::local_write).value();
  for (std::uint64_t i = 0; i < n_recv; ++i) {
    CHECK(cqp.post_recv(bmr.slice(i * 4096, 4096), 1000 + i) == cvy::errc::ok, "client post_recv");
    CHECK(sqp.post_recv(bmr.slice((n_recv + i) * 4096, 4096), 2000 + i) == cvy::errc::ok,
          "server post_recv");
  }
  std::optional<cvy::listener> lis;
  if (auto l = cvy::listener::bind(dev, ip + ":0"); l) {
    lis = std::move(*l);
  } else {
    std::printf("interop: FAIL bind: %s\n", l.error().to_string().c_str());
    ++failures;
    return;
  }
  std::array<std::byte, cvy::remote_region::encoded_size> pdata{};
  rmr.remote().encode_to(pdata);
  std::atomic<bool> accepted{false};
  std::thread srv([&] {
    auto req = lis->accept(20s);
    if (!req) {
      std::printf("interop: FAIL server accept: %s\n", req.error().to_string().c_str());
      ++failures;
      return;
    }
    auto a = req->accept(sqp, pdata);
    if (!a) {
      std::printf("interop: FAIL server accept: %s\n", a.error().to_string().c_str());
      ++failures;
      return;
    }
    accepted = true;
  });
  auto info = cvy::connect(cqp, lis->address(), {.timeout = 20s});
  srv.join();
  if (!info || !accepted) {
    if (!info) std::printf("interop: FAIL connect: %s\n", info.error().to_string().c_str());
    ++failures;
    return;
  }
  const auto peer = cvy::remote_region::decode(info->private_data).value();
  std::printf("interop: [%s] connected QP %u (client, %s) <-> QP %u (server)\n", label,
              cqp.qp_num(), info->attr.local_address.c_str(), sqp.qp_num());
  // READs and WRITEs, alternating, 1 MiB each, all signaled.
  std::vector<cvy::sge> sg(n_ops);
  std::vector<cvy::send_wr> wrs(n_ops);
  for (std::size_t i = 0; i < n_ops; ++i) {
    const std::size_t off = (i % slots) * mib;
    sg[i] = lmr.slice(off, mib);
    wrs[i] = {.wr_id = i + 1,
              .opcode = i % 2 == 0 ? cvy::wr_opcode::rdma_read : cvy::wr_opcode::rdma_write,
              .sg_list = std::span(&sg[i], 1),
              .remote_addr = peer.addr + off,
              .rkey = peer.rkey};
  }
  CHECK(cqp.post_send(wrs) == cvy::errc::ok, "post %zu READ/WRITEs", n_ops);
  const auto t_down = steady::now();
  // `rdma link delete` returns only once every object of the device is
  // closed (rxe cannot disassociate a user context): on its own thread.
  std::atomic<bool> rm_done{false};
  std::atomic<int> rm_rc{-1};
  std::thread rm;
  if (how == cut::removal) {
    rm = std::thread([&] {
      rm_rc = std::system(("rdma link delete " + ibdev).c_str());
      rm_done = true;
    });
  } else {
    CHECK(set_link(netdev, false), "taking %s down failed", netdev.c_str());
  }
  // Every completion of both CQs, time-stamped, until all are in or the bound.
  struct done {
    double at_ms;
    cvy::work_completion wc;
  };
  std::vector<done> sends, crecv, srecv;
  const auto bound = enforce ? 30s : 20s;
  std::array<cvy::work_completion, 64> buf{};
  bool first_error_seen = false;
  auto last_activity = t_down;
  while (steady::now() - t_down < bound) {
    bool any = false;
    for (auto* cq : {&ccq, &scq}) {
      auto n = cq->poll(buf);
      if (!n) {
        std::printf("interop: FAIL poll: %s\n", std::string(cvy::to_string(n.error())).c_str());
        ++failures;
        break;
      }
      for (std::size_t i = 0; i < *n; ++i) {
        any = true;
        const done x{ms_since(t_down, steady::now()), buf[i]};
        if (x.wc.status != cvy::wc_status::success) first_error_seen = true;
        if (x.wc.wr_id >= 2000)
          srecv.push_back(x);
        else if (x.wc.wr_id >= 1000)
          crecv.push_back(x);
        else
          sends.push_back(x);
      }
    }
    if (sends.size() >= n_ops && crecv.size() >= n_recv && srecv.size() >= n_recv) break;
    if (any) last_activity = steady::now();
    // Measuring the kernel alone: the first error and 2 quiet seconds after it are enough.
    if (!enforce && first_error_seen && steady::now() - last_activity > 2s) break;
    if (!any) std::this_thread::sleep_for(1ms);
  }
  const double waited = ms_since(t_down, steady::now());
  // What happened, in numbers.
  std::map<std::string, int> hist;
  std::optional<done> first_err;
  double last_ms = 0;
  for (const auto* v : {&sends, &crecv, &srecv})
    for (const auto& x : *v) {
      last_ms = std::max(last_ms, x.at_ms);
      ++hist[st(x.wc.status)];
      if (x.wc.status != cvy::wc_status::success && (!first_err || x.at_ms < first_err->at_ms))
        first_err = x;
    }
  std::size_t ok_sends = 0;
  for (const auto& x : sends) ok_sends += x.wc.status == cvy::wc_status::success;
  std::string h;
  for (const auto& [k, v] : hist) h += " " + k + "=" + std::to_string(v);
  std::printf(
      "interop: [%s] after %s (%.0f ms watched): %zu/%zu READ/WRITEs completed (%zu success), "
      "receives %zu/%zu client %zu/%zu server, the last %.1f ms after %s; statuses:%s\n",
      label, what, waited, sends.size(), n_ops, ok_sends, crecv.size(), n_recv, srecv.size(),
      n_recv, last_ms, what, h.c_str());
  if (first_err)
    std::printf(
        "interop: [%s] first error completion %.1f ms after %s: wr_id %llu %s (vendor_err 0x%x)\n",
        label, first_err->at_ms, what, static_cast<unsigned long long>(first_err->wc.wr_id),
        st(first_err->wc.status).c_str(), first_err->wc.vendor_err);
  else
    std::printf("interop: [%s] no error completion within %.0f ms of %s\n", label, waited, what);
  const auto want = how == cut::removal ? cvy::device_event_type::device_fatal
                                        : cvy::device_event_type::port_down;
  const std::string want_name(cvy::to_string(want));
  auto down =
      ev.wait([&](const cvy::device_event& e) { return e.type == want; }, enforce ? 20s : 1s);
  if (down)
    std::printf("interop: [%s] %s event %.1f ms after %s: %s\n", label, want_name.c_str(),
                ms_since(t_down, down->first), what, down->second.description.c_str());
  for (auto* q : {&cqp, &sqp}) {
    const auto num = q->qp_num();
    auto e = ev.wait(
        [&](const cvy::device_event& x) {
          return x.type == cvy::device_event_type::qp_error && x.qp_num == num;
        },
        enforce ? 5s : 0ms);
    if (e)
      std::printf("interop: [%s] qp_error event %.1f ms after %s: %s\n", label,
                  ms_since(t_down, e->first), what, e->second.description.c_str());
    if (enforce) {
      CHECK(e.has_value(), "no qp_error event for QP %u", num);
      if (e) {
        const auto& s = e->second.description;
        CHECK(s.find("device " + ibdev) != std::string::npos &&
                  s.find("port 1") != std::string::npos &&
                  s.find("QP " + std::to_string(num)) != std::string::npos &&
                  s.find("peer ") != std::string::npos,
              "the qp_error event does not name device, port, QP and peer: %s", s.c_str());
        CHECK(e->second.port == 1, "qp_error names port %u", unsigned{e->second.port});
      }
    }
    std::printf("interop: [%s] QP %u state %s\n", label, num,
                std::string(cvy::to_string(q->state())).c_str());
  }
  if (enforce) {
    CHECK(down.has_value(), "no %s event within 20 s", want_name.c_str());
    if (down) {
      if (how == cut::port_down)
        CHECK(down->second.port == 1, "port_down names port %u", unsigned{down->second.port});
      CHECK(down->second.description.find(ibdev) != std::string::npos, "%s does not name %s: %s",
            want_name.c_str(), ibdev.c_str(), down->second.description.c_str());
    }
    CHECK(sends.size() == n_ops, "only %zu of %zu READ/WRITEs completed within 30 s", sends.size(),
          n_ops);
    CHECK(crecv.size() == n_recv && srecv.size() == n_recv,
          "receives completed: client %zu, server %zu of %zu", crecv.size(), srecv.size(), n_recv);
    // Each request exactly once.
    std::vector<int> seen(n_ops + 1, 0);
    for (const auto& x : sends)
      if (x.wc.wr_id >= 1 && x.wc.wr_id <= n_ops) ++seen[x.wc.wr_id];
    CHECK(std::all_of(seen.begin() + 1, seen.end(), [](int c) { return c == 1; }),
          "a READ/WRITE completed twice or not at all");
    // Nothing succeeds after the first failure; receives flush (no peer sent anything).
    bool failed = false;
    for (const auto& x : sends) {
      if (x.wc.status != cvy::wc_status::success)
        failed = true;
      else
        CHECK(!failed, "wr_id %llu succeeded after an earlier request failed",
              static_cast<unsigned long long>(x.wc.wr_id));
    }
    for (const auto* v : {&crecv, &srecv})
      for (const auto& x : *v)
        CHECK(x.wc.status == cvy::wc_status::wr_flush_err,
              "receive %llu: %s, expected wr_flush_err",
              static_cast<unsigned long long>(x.wc.wr_id), st(x.wc.status).c_str());
    if (ok_sends == n_ops)
      std::printf("interop: [%s] note: every READ/WRITE had completed before the link went down\n",
                  label);
    CHECK(cqp.state() == cvy::qp_state::error && sqp.state() == cvy::qp_state::error,
          "QPs not in ERROR");
    std::array<cvy::sge, 1> g{lmr.slice(0, 8)};
    const auto p = cqp.post_send({.wr_id = 99,
                                  .opcode = cvy::wr_opcode::rdma_write,
                                  .sg_list = g,
                                  .remote_addr = peer.addr,
                                  .rkey = peer.rkey});
    CHECK(p == cvy::errc::qp_in_error, "post after the %s: %s, expected qp_in_error", what,
          std::string(cvy::to_string(p)).c_str());
  }
  if (how == cut::removal) {
    // Closing every object lets the kernel finish the removal.
    const auto t_close = steady::now();
    cqp = cvy::queue_pair{};
    sqp = cvy::queue_pair{};
    lmr = cvy::memory_region{};
    rmr = cvy::memory_region{};
    bmr = cvy::memory_region{};
    ccq = cvy::completion_queue{};
    scq = cvy::completion_queue{};
    pd = cvy::protection_domain{};
    lis.reset();
    *d = cvy::device{};
    for (int i = 0; i < 300 && !rm_done; ++i) {
      std::this_thread::sleep_for(100ms);
      if (i == 50) {  // (what still holds the device, if anything)
        std::printf("interop: [%s] after 5 s, open RDMA files:\n", label);
        std::fflush(stdout);
        (void)std::system(
            ("ls -l /proc/" + std::to_string(::getpid()) + "/fd | grep -i 'infiniband\\|rdma'")
                .c_str());
      }
    }
    CHECK(rm_done, "rdma link delete %s did not return within 30 s of closing the device",
          ibdev.c_str());
    if (rm_done) {
      rm.join();
      CHECK(rm_rc == 0, "rdma link delete %s: status %d", ibdev.c_str(), rm_rc.load());
      std::printf("interop: [%s] objects closed; rdma link delete returned %.0f ms later\n", label,
                  ms_since(t_close, steady::now()));
    } else {
      rm.detach();  // (blocked in the kernel; it ends with this process)
    }
    std::printf("interop: %s %s: %s\n", label, dev_name.c_str(),
                failures == before ? "PASS" : "FAIL");
    return;
  }
  // The link comes back for what runs next.
  CHECK(set_link(netdev, true), "taking %s up failed", netdev.c_str());
  auto upe = ev.wait(
      [](const cvy::device_event& e) { return e.type == cvy::device_event_type::port_active; },
      20s);
  CHECK(upe.has_value(), "no port_active within 20 s of taking %s up", netdev.c_str());
  if (upe)
    std::printf("interop: [%s] port_active again: %s\n", label, upe->second.description.c_str());
  const auto t_close = steady::now();
  cqp = cvy::queue_pair{};
  sqp = cvy::queue_pair{};
  std::printf("interop: [%s] QPs closed in %.0f ms\n", label, ms_since(t_close, steady::now()));
  std::printf("interop: port down [%s] %s: %s\n", label, dev_name.c_str(),
              failures == before ? "PASS" : "FAIL");
}

int port_down(const std::string& dev_name, const std::string& netdev, const std::string& ip) {
  port_down_once(dev_name, netdev, ip, cut::port_down);
  port_down_once(dev_name, netdev, ip, cut::port_down_kernel_alone);
  std::printf("interop: port down %s: %s (%d failure(s))\n", dev_name.c_str(),
              failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace vmcheck
