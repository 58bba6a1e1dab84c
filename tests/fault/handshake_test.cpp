// Connection setup against broken, silent and absent peers (raw sockets).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <conveyor/conveyor.hpp>

#include "common/caps.hpp"
#include "common/pair.hpp"
#include "common/raw_tcp.hpp"

namespace cvt {
namespace {

using conveyor::access;
using conveyor::errc;
using conveyor::qp_state;
using conveyor::wc_opcode;
using conveyor::wc_status;
using conveyor::work_completion;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

class handshake : public pair_test {
 protected:
  // Accepts one connection on `lis` in a thread while the initiator connects,
  // then moves 4 KiB each way (WRITE, then READ back) to prove the link works.
  void connect_and_transfer(conveyor::listener& lis);
};

void handshake::connect_and_transfer(conveyor::listener& lis) {
  const std::string addr = "127.0.0.1:" + std::to_string(lis.port());
  std::string err;
  const auto published = tgt_main.remote().encode();
  std::thread acceptor([&] {
    // A broken connection still pending may be reported first: skip such errors.
    const auto deadline = steady_clock::now() + scaled(milliseconds(15000));
    while (steady_clock::now() < deadline) {
      auto req = lis.accept(scaled(milliseconds(10000)));
      if (!req) {
        err += "[accept: " + req.error().to_string() + "] ";
        continue;
      }
      auto r = req->accept(tgt.qp, published);
      if (!r) {
        err += "[connect_request.accept: " + r.error().to_string() + "] ";
      } else {
        err.clear();
      }
      return;
    }
  });
  auto info = conveyor::connect(init.qp, addr, {.timeout = scaled(milliseconds(10000))});
  acceptor.join();
  ASSERT_TRUE(info.has_value()) << info.error().to_string() << " target: " << err;
  ASSERT_EQ(err, "");
  auto src = make_region(init.pd, 4096, access::local_write, 0xe100);
  CVT_ASSERT_OK(src);
  auto back = make_region(init.pd, 4096, access::local_write, 0xe200);
  CVT_ASSERT_OK(back);
  CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 4096), tgt_main.remote(0, 4096), 1));
  CVT_ASSERT_POST_OK(init.qp.post_read(back->sge(0, 4096), tgt_main.remote(0, 4096), 2));
  std::vector<work_completion> iw;
  ASSERT_TRUE(wait_ok(init.send_reader(), 2, op_timeout(4096), &iw));
  EXPECT_TRUE(ok(check_pattern(back->bytes(), 0xe100)))
      << "READ after WRITE over the new connection";
}

TEST_P(handshake, connect_after_the_listener_closed_is_connection_refused) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  if (!has_wire(init.dev.attr()))
    GTEST_SKIP() << "a TCP port refusing connections: shared memory has no wire (no host:port)";
  std::string addr;
  {
    auto lis = conveyor::listener::bind(tgt.dev);
    CVT_ASSERT_OK(lis);
    addr = lis->address();
  }
  const auto t0 = steady_clock::now();
  auto info = conveyor::connect(init.qp, addr, {.timeout = milliseconds(5000)});
  CVT_EXPECT_ERRC(info, errc::connection_refused);
  if (!info) {
    EXPECT_NE(info.error().context.find(addr), std::string::npos) << info.error().to_string();
  }
  EXPECT_LT(steady_clock::now() - t0, milliseconds(4000));
}

TEST_P(handshake, silent_mpa_peer_makes_connect_time_out_after_the_connect_timeout) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  if (!runs_mpa(init.dev.attr()))
    GTEST_SKIP() << "a raw TCP peer speaks MPA to a device whose MPA is Conveyor's only: here it "
                    "is the kernel's (rdma_cm) or there is no MPA ("
                 << init.dev.attr().name << ")";
  raw_server server(raw_server::behaviour::silent);
  ASSERT_TRUE(server.ok()) << server.error();
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto t0 = steady_clock::now();
  auto info = conveyor::connect(init.qp, addr, {.timeout = milliseconds(1000)});
  const auto took = steady_clock::now() - t0;
  CVT_EXPECT_ERRC(info, errc::timed_out);
  if (!info) {
    EXPECT_NE(info.error().context.find("timed out"), std::string::npos)
        << "the message should say \"timed out\": " << info.error().to_string();
    EXPECT_NE(info.error().context.find(addr), std::string::npos) << info.error().to_string();
  }
  // connect_options.timeout (1 s) governs, not handshake_timeout_ms (5 s default).
  EXPECT_GE(took, milliseconds(900)) << "gave up before the timeout";
  EXPECT_LT(took, milliseconds(3000)) << "took far longer than the 1 s timeout";
  EXPECT_GE(server.bytes_received(), 20u) << "no MPA request reached the peer";
  EXPECT_NE(name(init.qp.state()), name(qp_state::rts));
}

TEST_P(handshake, garbage_instead_of_an_mpa_reply_is_protocol_error) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  if (!runs_mpa(init.dev.attr()))
    GTEST_SKIP() << "a raw TCP peer speaks MPA to a device whose MPA is Conveyor's only: here it "
                    "is the kernel's (rdma_cm) or there is no MPA ("
                 << init.dev.attr().name << ")";
  raw_server server(raw_server::behaviour::garbage_reply);
  ASSERT_TRUE(server.ok()) << server.error();
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto t0 = steady_clock::now();
  auto info = conveyor::connect(init.qp, addr, {.timeout = milliseconds(5000)});
  CVT_EXPECT_ERRC(info, errc::protocol_error);
  EXPECT_LT(steady_clock::now() - t0, milliseconds(4000))
      << "garbage must fail at once, not by timeout";
  EXPECT_NE(name(init.qp.state()), name(qp_state::rts));
}

TEST_P(handshake, peer_closing_during_the_mpa_handshake_is_connection_reset) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  if (!runs_mpa(init.dev.attr()))
    GTEST_SKIP() << "a raw TCP peer speaks MPA to a device whose MPA is Conveyor's only: here it "
                    "is the kernel's (rdma_cm) or there is no MPA ("
                 << init.dev.attr().name << ")";
  raw_server server(raw_server::behaviour::close_at_once);
  ASSERT_TRUE(server.ok()) << server.error();
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto t0 = steady_clock::now();
  auto info = conveyor::connect(init.qp, addr, {.timeout = milliseconds(5000)});
  CVT_EXPECT_ERRC(info, errc::connection_reset);
  EXPECT_LT(steady_clock::now() - t0, milliseconds(4000))
      << "a closed peer must fail at once, not by timeout";
}

TEST_P(handshake, garbage_from_a_raw_client_is_dropped_at_once_and_the_listener_keeps_working) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  if (!runs_mpa(init.dev.attr()))
    GTEST_SKIP() << "a raw TCP peer speaks MPA to a device whose MPA is Conveyor's only: here it "
                    "is the kernel's (rdma_cm) or there is no MPA ("
                 << init.dev.attr().name << ")";
  auto lis = conveyor::listener::bind(tgt.dev, "127.0.0.1:0");
  CVT_ASSERT_OK(lis);
  std::string why;
  const int fd = raw_connect(lis->port(), why);
  ASSERT_GE(fd, 0) << why;
  const auto t0 = steady_clock::now();
  ASSERT_TRUE(raw_send_all(fd, garbage_bytes(64)));
  // The listener closes the connection without waiting for its deadline...
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 4000), 1) << "the garbage connection was not closed";
  char b;
  EXPECT_LE(::recv(fd, &b, 1, MSG_DONTWAIT), 0) << "the listener answered garbage";
  EXPECT_LT(steady_clock::now() - t0, milliseconds(4000))
      << "garbage must be dropped at once, not by timeout";
  // ...and accept() never hands it out: a failed handshake is the peer's, not the listener's.
  auto req = lis->accept(milliseconds(200));
  EXPECT_FALSE(req.has_value()) << "accept() returned a request for a client that sent garbage";
  if (!req) {
    EXPECT_EQ(name(req.error().code), name(errc::timed_out)) << req.error().to_string();
  }
  ::close(fd);
  // The listener still accepts a real connection, which then works.
  ASSERT_NO_FATAL_FAILURE(connect_and_transfer(*lis));
}

TEST_P(handshake, silent_raw_client_does_not_stop_the_listener_from_accepting_a_real_one) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  if (!runs_mpa(init.dev.attr()))
    GTEST_SKIP() << "a raw TCP peer speaks MPA to a device whose MPA is Conveyor's only: here it "
                    "is the kernel's (rdma_cm) or there is no MPA ("
                 << init.dev.attr().name << ")";
  auto lis = conveyor::listener::bind(tgt.dev, "127.0.0.1:0");
  CVT_ASSERT_OK(lis);
  std::string why;
  const int fd = raw_connect(lis->port(), why);  // connects and never speaks
  ASSERT_GE(fd, 0) << why;
  ASSERT_NO_FATAL_FAILURE(connect_and_transfer(*lis));
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(providers, handshake, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
