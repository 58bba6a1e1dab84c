#include "common/pair.hpp"

#include "common/caps.hpp"

#include <iostream>
#include <thread>

namespace cvt {

using conveyor::errc;
using conveyor::qp_state;
using conveyor::wc_opcode;
using conveyor::wc_status;
using conveyor::work_completion;

std::chrono::milliseconds op_timeout(std::size_t bytes) {
  return scaled(bytes >= MiB ? std::chrono::milliseconds(30000) : std::chrono::milliseconds(10000));
}

namespace {

void close_endpoint(endpoint& e) {
  e.qp = conveyor::queue_pair();
  if (e.sr) e.sr->stop_pump();
  if (e.rr) e.rr->stop_pump();
  e.sr.reset();
  e.rr.reset();
  e.info = {};
  e.scq = conveyor::completion_queue();
  e.rcq = conveyor::completion_queue();
  e.pd = conveyor::protection_domain();
  e.dev = conveyor::device();
}

}  // namespace

void pair_test::TearDown() {
  reset_pair();
}

void pair_test::reset_pair() {
  // QPs first (bounded disconnect) while the target poller still drives the target.
  init.qp = conveyor::queue_pair();
  tgt.qp = conveyor::queue_pair();
  if (tgt.sr) tgt.sr->stop_pump();
  sync_src = test_region();
  sync_sink = test_region();
  tgt_main = test_region();
  close_endpoint(init);
  close_endpoint(tgt);
}

void pair_test::prepare_pair(const pair_options& o) {
  opts_ = o;
  const auto& p = GetParam();

  auto idev = conveyor::device::open(device_name(p.provider, "init"),
                                     make_options(p.progress, o.init_crc, o.max_sge_rd));
  CVT_ASSERT_OK(idev);
  init.dev = std::move(*idev);
  auto tdev = conveyor::device::open(device_name(p.provider, "tgt"),
                                     make_options(p.progress, o.tgt_crc, o.max_sge_rd));
  CVT_ASSERT_OK(tdev);
  tgt.dev = std::move(*tdev);
  ASSERT_EQ(init.dev.attr().provider, p.provider);
  ASSERT_EQ(tgt.dev.attr().provider, p.provider);

  auto ipd = init.dev.alloc_pd();
  CVT_ASSERT_OK(ipd);
  init.pd = std::move(*ipd);
  auto tpd = tgt.dev.alloc_pd();
  CVT_ASSERT_OK(tpd);
  tgt.pd = std::move(*tpd);

  auto iscq = init.dev.create_cq({.depth = o.init_send_cq_depth});
  CVT_ASSERT_OK(iscq);
  init.scq = std::move(*iscq);
  auto ircq = init.dev.create_cq({.depth = o.init_recv_cq_depth});
  CVT_ASSERT_OK(ircq);
  init.rcq = std::move(*ircq);
  auto tcq = tgt.dev.create_cq({.depth = o.tgt_cq_depth});
  CVT_ASSERT_OK(tcq);
  tgt.scq = std::move(*tcq);

  init.sr = std::make_unique<cq_reader>(&init.scq, "initiator send CQ");
  init.rr = std::make_unique<cq_reader>(&init.rcq, "initiator recv CQ");
  tgt.sr = std::make_unique<cq_reader>(&tgt.scq, "target CQ");
  if (manual()) tgt.sr->start_pump();

  auto iqp = init.pd.create_qp({.send_cq = &init.scq,
                                .recv_cq = &init.rcq,
                                .cap = o.init_caps,
                                .sq_sig_all = o.init_sq_sig_all,
                                .max_rd_atomic = o.init_max_rd_atomic,
                                .max_dest_rd_atomic = o.init_max_dest_rd_atomic});
  CVT_ASSERT_OK(iqp);
  init.qp = std::move(*iqp);
  auto tqp = tgt.pd.create_qp({.send_cq = &tgt.scq,
                               .recv_cq = &tgt.scq,
                               .cap = o.tgt_caps,
                               .sq_sig_all = false,
                               .max_rd_atomic = o.tgt_max_rd_atomic,
                               .max_dest_rd_atomic = o.tgt_max_dest_rd_atomic});
  CVT_ASSERT_OK(tqp);
  tgt.qp = std::move(*tqp);
  ASSERT_EQ(name(init.qp.state()), name(qp_state::init));
  ASSERT_EQ(name(tgt.qp.state()), name(qp_state::init));

  auto main = make_region(tgt.pd, o.tgt_region_size, all_rights, o.tgt_region_seed);
  CVT_ASSERT_OK(main);
  tgt_main = std::move(*main);
  auto src = make_region(init.pd, 64, conveyor::access::local_write, 0x5eed0001);
  CVT_ASSERT_OK(src);
  sync_src = std::move(*src);
  auto sink = make_region(tgt.pd, 64, conveyor::access::local_write, 0x5eed0002);
  CVT_ASSERT_OK(sink);
  sync_sink = std::move(*sink);
}

void pair_test::connect_pair(const pair_options& o) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair(o));

  // An ephemeral address in the provider's own syntax (cm.hpp).
  auto lis = conveyor::listener::bind(tgt.dev);
  CVT_ASSERT_OK(lis);
  listen_address_ = lis->address();
  ASSERT_FALSE(listen_address_.empty());
  if (has_wire(tgt.dev.attr())) {  // "ip:port": the port it reports is the one it holds
    ASSERT_NE(lis->port(), 0) << "listener bound to port 0: " << listen_address_;
  }

  const auto timeout = scaled(std::chrono::milliseconds(10000));
  const std::vector<std::byte> published = tgt_main.remote().encode();
  const std::vector<std::byte> hello = as_bytes("cvt initiator hello");
  std::string accept_err;
  std::vector<std::byte> seen_hello;
  std::thread acceptor([&] {
    auto req = lis->accept(timeout);
    if (!req) {
      accept_err = "listener.accept: " + req.error().to_string();
      return;
    }
    seen_hello.assign(req->private_data().begin(), req->private_data().end());
    auto info = req->accept(tgt.qp, published);
    if (!info) {
      accept_err = "connect_request.accept: " + info.error().to_string();
      return;
    }
    tgt.info = std::move(*info);
  });
  auto info =
      conveyor::connect(init.qp, listen_address_, {.private_data = hello, .timeout = timeout});
  acceptor.join();
  ASSERT_TRUE(info.has_value()) << "connect to " << listen_address_ << ": "
                                << info.error().to_string()
                                << (accept_err.empty() ? "" : "; target: " + accept_err);
  ASSERT_EQ(accept_err, "");
  init.info = std::move(*info);
  EXPECT_TRUE(check_equal(seen_hello, hello).empty()) << "initiator private data corrupted";

  auto decoded = conveyor::remote_region::decode(init.info.private_data);
  CVT_ASSERT_OK(decoded);
  peer = *decoded;
  ASSERT_EQ(peer, tgt_main.remote()) << "remote_region changed in transit";
  ASSERT_EQ(name(init.qp.state()), name(qp_state::rts));
  ASSERT_EQ(name(tgt.qp.state()), name(qp_state::rts));
}

std::vector<cq_reader*> pair_test::drivers() const {
  std::vector<cq_reader*> d;
  if (init.sr) d.push_back(init.sr.get());
  if (init.rr) d.push_back(init.rr.get());
  return d;
}

void pair_test::drive() {
  for (auto* r : drivers()) r->poll_once();
}

testing::AssertionResult pair_test::wait(cq_reader& r, std::size_t n,
                                         std::chrono::milliseconds timeout,
                                         std::vector<work_completion>& out) {
  auto d = drivers();
  return ok(wait_for(r, n, timeout, out, d));
}

testing::AssertionResult pair_test::wait_ok(cq_reader& r, std::size_t n,
                                            std::chrono::milliseconds timeout,
                                            std::vector<work_completion>* out) {
  std::vector<work_completion> local;
  auto& v = out != nullptr ? *out : local;
  const std::size_t before = v.size();
  auto d = drivers();
  if (auto e = wait_for(r, n, timeout, v, d); !e.empty()) return ok(e);
  return ok(all_success(std::span<const work_completion>(v.data() + before, v.size() - before)));
}

testing::AssertionResult pair_test::expect_no_completion(cq_reader& r,
                                                         std::chrono::milliseconds d) {
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < deadline) {
    drive();
    r.wait_some(std::chrono::milliseconds(2));
    if (r.buffered() > 0) {
      auto extra = r.take(r.buffered());
      return testing::AssertionFailure()
             << r.name() << ": unexpected completion(s) " << describe(extra);
    }
  }
  return testing::AssertionSuccess();
}

testing::AssertionResult pair_test::sync_target(std::chrono::milliseconds timeout) {
  const std::uint64_t id = next_sync_id_++;
  if (auto st = tgt.qp.post_recv(sync_sink.sge(0, 64), id); st != errc::ok) {
    return testing::AssertionFailure() << "sync: target post_recv returned " << name(st);
  }
  if (auto st = init.qp.post_send_msg(sync_src.sge(0, 8), id); st != errc::ok) {
    return testing::AssertionFailure() << "sync: initiator post_send_msg returned " << name(st);
  }
  std::vector<work_completion> t, i;
  if (auto r = wait(tgt.recv_reader(), 1, timeout, t); !r) return r << " (sync: target receive)";
  if (auto e = check_wc(t[0], wc_status::success, wc_opcode::recv, id); !e.empty())
    return ok("sync: " + e);
  if (auto r = wait(init.send_reader(), 1, timeout, i); !r) return r << " (sync: initiator send)";
  if (auto e = check_wc(i[0], wc_status::success, wc_opcode::send, id); !e.empty())
    return ok("sync: " + e);
  return testing::AssertionSuccess();
}

testing::AssertionResult pair_test::wait_state(const conveyor::queue_pair& qp, qp_state s,
                                               std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto cur = qp.state();
    if (cur == s) return testing::AssertionSuccess();
    if (std::chrono::steady_clock::now() >= deadline) {
      return testing::AssertionFailure()
             << "QP " << qp.qp_num() << " is in state " << name(cur) << ", expected " << name(s)
             << " within " << timeout.count() << " ms";
    }
    drive();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

namespace {
std::string capability_text(const endpoint& init, const endpoint& tgt, bool ext, bool init_cap,
                            bool tgt_cap, const char* what) {
  return std::string(what) + ": initiator device attr " + (init_cap ? "true" : "false") +
         ", target device attr " + (tgt_cap ? "true" : "false") + ", connection extensions " +
         (ext ? "true" : "false") + " (" + init.dev.attr().provider + " <-> " +
         tgt.dev.attr().provider + ")";
}
}  // namespace

std::string pair_test::atomics_unavailable() {
  auto c = init.qp.connection();
  if (!c) {
    [&] { FAIL() << "qp.connection(): " << c.error().to_string(); }();
    return "no connection";
  }
  const bool ic = init.dev.attr().atomics, tc = tgt.dev.attr().atomics;
  const bool usable = ic && tc && c->extensions;
  if (conveyor_peer(param().provider)) {
    if (!usable) {
      [&] {
        FAIL() << "a Conveyor<->Conveyor connection must offer RFC 7306 atomics; "
               << capability_text(init, tgt, c->extensions, ic, tc, "atomics");
      }();
      return "not negotiated";
    }
    return {};
  }
  return usable ? std::string()
                : capability_text(init, tgt, c->extensions, ic, tc, "atomics unavailable");
}

std::string pair_test::immediate_unavailable() {
  auto c = init.qp.connection();
  if (!c) {
    [&] { FAIL() << "qp.connection(): " << c.error().to_string(); }();
    return "no connection";
  }
  const bool ic = init.dev.attr().immediate_data, tc = tgt.dev.attr().immediate_data;
  const bool usable = ic && tc && c->extensions;
  if (conveyor_peer(param().provider)) {
    if (!usable) {
      [&] {
        FAIL() << "a Conveyor<->Conveyor connection must offer RFC 7306 immediate data; "
               << capability_text(init, tgt, c->extensions, ic, tc, "immediate data");
      }();
      return "not negotiated";
    }
    return {};
  }
  return usable ? std::string()
                : capability_text(init, tgt, c->extensions, ic, tc, "immediate data unavailable");
}

bool pair_test::size_fits(std::size_t size) {
  const std::uint64_t max = std::min(init.dev.attr().max_msg_size, tgt.dev.attr().max_msg_size);
  if (size <= max) return true;
  if (conveyor_peer(param().provider)) {
    ADD_FAILURE() << "max_msg_size " << max << " is below the " << size
                  << "-byte messages the conformance suite requires of Conveyor's providers";
  } else {
    std::cout << "[   INFO   ] size " << size << " skipped: above max_msg_size " << max << '\n';
  }
  return false;
}

}  // namespace cvt
