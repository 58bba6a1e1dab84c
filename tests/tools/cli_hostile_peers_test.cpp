// `conveyor perf --server` among hostile peers: hellos that ask too much,
// clients that stall, junk and refused peers before a real client.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "cli_support.hpp"
#include "common/env.hpp"
#include "common/raw_tcp.hpp"

namespace {

using namespace std::chrono_literals;
using namespace cvt_cli;

// ------------------------------------------------ a server among hostile peers --
// (issue 11, finding 10)

TEST(cli, a_hello_asking_for_gigabytes_is_refused_with_the_reason) {
  // 64 QPs x 64 MiB: 4 GiB the server would allocate (and zero) for one hello.
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  auto h = small_hello();
  h.qps = 64;
  h.max_size = 64ull << 20;
  h.tx_depth = 64;
  raw_client c;
  const auto t0 = std::chrono::steady_clock::now();
  auto info = c.connect(srv.address(), h);
  ASSERT_FALSE(info) << "the server accepted a 4 GiB run";
  EXPECT_EQ(cvt::name(info.error().code), cvt::name(conveyor::errc::rejected))
      << info.error().to_string();
  EXPECT_NE(info.error().context.find("--max-memory"), std::string::npos)
      << info.error().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, cvt::scaled(5s))
      << "refused only after allocating";
}

TEST(cli, max_memory_bounds_what_a_real_client_may_ask_for) {
  server_process srv({"--max-memory", "1M"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // 64 KiB x 128 outstanding: 8 MiB of server memory.
  const auto r =
      run({"perf", srv.address(), "--size", "64K", "--tx-depth", "128", "--iters", "10", "--quiet"},
          30s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("--max-memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rejected"), std::string::npos) << r.output;
}

TEST(cli, a_client_that_stalls_after_its_hello_makes_the_next_one_hear_busy_not_out_of_order) {
  server_process srv({"--timeout", "2"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // A: a control connection whose data connection never comes.
  raw_client a;
  auto ai = a.connect(srv.address(), small_hello());
  ASSERT_TRUE(ai) << ai.error().to_string();
  // B, a real client, meanwhile: told the server is busy.
  const auto b = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 30s);
  EXPECT_EQ(exit_code(b), 1) << b.output;
  EXPECT_NE(b.output.find("server busy"), std::string::npos) << b.output;
  EXPECT_EQ(b.output.find("expected data connection"), std::string::npos) << b.output;
  // The server drops A after --timeout and serves C, then exits 0 (not persistent).
  EXPECT_EQ(srv.wait_exit(200ms), -1) << "the server gave up: " << srv.drain_log();
  std::this_thread::sleep_for(cvt::scaled(2500ms));
  const auto c = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 60s);
  EXPECT_EQ(exit_code(c), 0) << c.output;
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
}

TEST(cli, a_server_keeps_waiting_for_a_real_client_past_junk_and_refused_peers) {
  server_process srv;  // not persistent: it serves one client, then exits
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto port =
      static_cast<std::uint16_t>(std::stoi(srv.address().substr(srv.address().rfind(':') + 1)));
  std::string why;
  const int fd = cvt::raw_connect(port, why);  // bytes that are not MPA at all
  ASSERT_GE(fd, 0) << why;
  ASSERT_TRUE(cvt::raw_send_all(fd, cvt::garbage_bytes(64)));
  ::close(fd);
  raw_client x;  // an MPA peer with no hello
  auto xi = conveyor::connect(x.qp, srv.address(), {.timeout = cvt::scaled(10s)});
  ASSERT_FALSE(xi);
  EXPECT_EQ(srv.wait_exit(500ms), -1)
      << "the server left without serving a client: " << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 60s);
  EXPECT_EQ(exit_code(r), 0) << r.output;
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
}

}  // namespace
