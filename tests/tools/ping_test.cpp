// `conveyor ping`: SEND, WRITE and READ verified on soft and shm, -C/-n
// statistics, one-line failures, and peers that never send their RTR.
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_support.hpp"
#include "common/caps.hpp"
#include "common/env.hpp"
#include "common/raw_tcp.hpp"
#include "providers/soft/wire/wire.hpp"

using namespace std::chrono_literals;
using namespace cvt_cli;

// ------------------------------------------------------------ conveyor ping --

TEST(ping, verifies_send_write_and_read_and_prints_what_was_negotiated) {
  for (const std::string provider : {"soft", "shm"}) {
    // The server is another process: a free port where there is a wire, else a fresh "@name".
    const std::string bind =
        cvt::has_wire(cvt::device_attr_of(provider)) ? "127.0.0.1:0" : unique_shm_name();
    server_process srv(
        server_process::raw_args{{"ping", "--server", bind, "-p", provider, "--once"}});
    ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
    const auto r = run({"ping", srv.address(), "-p", provider, "--size", "64K"}, 30s);
    ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
    for (const char* s : {"connected", "IRD/ORD", "SEND 65536 B, echoed and verified: round trip",
                          "RDMA READ of it, verified", "conveyor ping: OK"})
      EXPECT_NE(r.output.find(s), std::string::npos) << provider << ": " << s << " missing:\n"
                                                     << r.output;
    // What the connection negotiated: MPA's facts where Conveyor runs MPA, the
    // data path without a wire.
    const auto& da = cvt::device_attr_of(provider);
    if (cvt::runs_mpa(da)) {
      EXPECT_NE(r.output.find("MPA rev 2"), std::string::npos) << r.output;
    }
    if (!cvt::has_wire(da)) {
      EXPECT_NE(r.output.find("data path"), std::string::npos) << r.output;
    }
    EXPECT_TRUE(cvt::runs_mpa(da) || !cvt::has_wire(da)) << provider << ": nothing to look for";
    EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
  }
}

// -C N runs each step N times and prints one row per step with its min,
// median and max (rping -C, ibv_rc_pingpong -n); -n is the same option.
TEST(ping, count_repeats_each_step_and_prints_min_median_max_per_step) {
  for (const std::string provider : {"soft", "shm"}) {
    const std::string bind =
        cvt::has_wire(cvt::device_attr_of(provider)) ? "127.0.0.1:0" : unique_shm_name();
    server_process srv(server_process::raw_args{{"ping", "--server", bind, "-p", provider}});
    ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
    for (const char* flag : {"-C", "-n"}) {
      const auto r = run({"ping", srv.address(), "-p", provider, flag, "5"}, 30s);
      ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
      EXPECT_NE(r.output.find("5 times each"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("min us"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("median us"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("max us"), std::string::npos) << r.output;
      for (const char* step : {"SEND, echoed", "RDMA WRITE", "RDMA READ of it"}) {
        const auto at = r.output.find(std::string("  ") + step);
        ASSERT_NE(at, std::string::npos) << step << " row missing:\n" << r.output;
        // The row: the step, then min <= median <= max, in microseconds.
        const auto line = r.output.substr(at, r.output.find('\n', at) - at);
        double mn = -1, med = -1, mx = -1;
        const auto nums =
            line.find_first_of("0123456789", line.find_last_of("abcdefghijklmnopqrstuvwxyz)") + 1);
        ASSERT_NE(nums, std::string::npos) << line;
        ASSERT_EQ(std::sscanf(line.c_str() + nums, "%lf %lf %lf", &mn, &med, &mx), 3) << line;
        EXPECT_GT(mn, 0) << line;
        EXPECT_LE(mn, med) << line;
        EXPECT_LE(med, mx) << line;
      }
      EXPECT_NE(r.output.find("every echo and every READ verified"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("conveyor ping: OK"), std::string::npos) << r.output;
    }
  }
}

TEST(ping, failures_are_one_line_that_says_what_is_wrong) {
  const std::uint16_t port = cvt::unused_port();
  ASSERT_NE(port, 0);
  auto r = run({"ping", "127.0.0.1:" + std::to_string(port), "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nothing is listening"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conveyor ping --server"), std::string::npos) << r.output;

  server_process perf_srv;  // a perf server refuses a ping client with its reason
  ASSERT_FALSE(perf_srv.address().empty()) << perf_srv.drain_log();
  r = run({"ping", perf_srv.address(), "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("rejected the connection"), std::string::npos) << r.output;

  r = run({"ping", "@cvt-no-such-ping-server", "-p", "shm", "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nothing is listening"), std::string::npos) << r.output;

  r = run({"ping"}, 10s);
  EXPECT_EQ(exit_code(r), 2) << r.output;
  EXPECT_NE(r.output.find("address is missing"), std::string::npos) << r.output;
}

// Peers that send a valid ping request (MPA, "CVPG" hello) and never their
// MPA RTR: the server's accept returns at once and each client is served on
// its own thread, so a real ping behind three of them completes in a fraction
// of the handshake timeout (5 s) instead of one timeout per silent peer.
TEST(ping, peers_that_never_send_their_rtr_do_not_hold_the_server) {
  server_process srv(server_process::raw_args{{"ping", "--server", "127.0.0.1:0"}});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto port =
      static_cast<std::uint16_t>(std::stoi(srv.address().substr(srv.address().rfind(':') + 1)));
  conveyor::wire::mpa_frame f;
  f.revision = 2;
  f.v2 = conveyor::wire::mpa_v2_words{4, 4, true, false, true, false};
  f.private_data = {std::byte{'C'}, std::byte{'V'}, std::byte{'P'}, std::byte{'G'},
                    std::byte{0},   std::byte{0},   std::byte{0},   std::byte{64}};
  const auto request = conveyor::wire::encode_mpa(f);
  std::vector<int> silent;
  for (int i = 0; i < 3; ++i) {
    std::string why;
    const int fd = cvt::raw_connect(port, why);
    ASSERT_GE(fd, 0) << why;
    silent.push_back(fd);
    ASSERT_TRUE(cvt::raw_send_all(fd, request));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run({"ping", srv.address(), "--timeout", "10"}, 30s);
  const auto took = std::chrono::steady_clock::now() - t0;
  for (int fd : silent) ::close(fd);
  EXPECT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  EXPECT_NE(r.output.find("conveyor ping: OK"), std::string::npos) << r.output;
  EXPECT_LT(took, cvt::scaled(2500ms)) << "the ping waited behind peers without RTR:\n"
                                       << srv.drain_log();
}
