// `conveyor perf` frictions (issue 17): bounds and addresses, --version, a
// busy server, silent clients, CPU while the target is stopped, SIGINT, shm
// settings, CONVEYOR_LOG and `conveyor env`; and the phase messages'
// placement.
#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cli_support.hpp"
#include "common/env.hpp"
#include "common/process.hpp"
#include "common/raw_tcp.hpp"
#include "perf_session.hpp"

using namespace std::chrono_literals;
using namespace cvt_cli;

// ------------------------------------------------------ frictions (issue 17) --

TEST(cli, negative_counts_and_durations_are_refused_naming_the_bound_only) {
  auto r = run({"perf", "127.0.0.1:1", "--warmup", "-1"}, 10s);
  EXPECT_EQ(exit_code(r), 2) << "--warmup -1 must not wrap to 2^64 - 1:\n" << r.output;
  EXPECT_NE(r.output.find("--warmup"), std::string::npos) << r.output;
  for (const char* opt : {"--duration", "--timeout", "--accept-timeout"}) {
    r = run({"perf", "127.0.0.1:1", opt, "-1"}, 10s);
    EXPECT_EQ(exit_code(r), 2) << r.output;
    EXPECT_NE(r.output.find(opt), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("17976931348623157"), std::string::npos) << "DBL_MAX printed:\n"
                                                                     << r.output;
    EXPECT_LT(r.output.size(), 400u) << r.output;
  }
}

TEST(cli, bare_hosts_and_ipv6_without_brackets_reach_the_default_port) {
  // Nothing listens: the message names the resolved address with port 18515.
  // (Whether something listens on 18515 on this machine does not matter.)
  for (const std::string host : {"::1", "localhost", "127.0.0.1"}) {
    const auto r = run(
        {"perf", host, "--timeout", "3", "--mode", "lat", "--iters", "1", "--warmup", "0"}, 20s);
    EXPECT_NE(r.output.find(":18515"), std::string::npos) << host << ":\n" << r.output;
    EXPECT_EQ(r.output.find("not a numeric"), std::string::npos) << host << ":\n" << r.output;
    EXPECT_EQ(r.output.find("missing port"), std::string::npos) << host << ":\n" << r.output;
  }
  conveyor::tool::perf_options o;
  std::string why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "::1", why), "[::1]:18515") << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "[::1]", why), "[::1]:18515") << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "localhost:7000", why), "127.0.0.1:7000")
      << "a name resolves to IPv4 first (the server's default is 0.0.0.0) " << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "10.1.2.3", why), "10.1.2.3:18515") << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "no-such-host.invalid", why), "");
  EXPECT_NE(why.find("no-such-host.invalid"), std::string::npos) << why;
  o.provider = "shm";
  EXPECT_EQ(conveyor::tool::resolve_address(o, "@name", why), "@name");
  // A server on a bare IPv6 address ("::1" -> [::1]:PORT) listens where it says.
  server_process srv({}, "[::1]:0");
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  EXPECT_EQ(srv.address().rfind("[::1]:", 0), 0u) << srv.address();
}

TEST(cli, version_prints_the_build_facts) {
  for (const char* arg : {"--version", "version"}) {
    const auto r = run({arg}, 10s);
    EXPECT_EQ(exit_code(r), 0) << r.output;
    for (const char* s : {"conveyor 0.", "commit ", "compiler ", "providers  soft shm", "ISA-L "})
      EXPECT_NE(r.output.find(s), std::string::npos) << s << " missing:\n" << r.output;
  }
}

TEST(cli, a_second_client_of_a_busy_server_hears_busy_at_once) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  cvt::command_result first;
  // The first client's run and the wait before the second both scale with the
  // build (a sanitizer build is slower): the second must arrive mid-run, not
  // after the one-client server has gone (tsan failed it so).
  const std::string first_s = std::to_string(cvt::scaled(4000ms).count() / 1000.0);
  std::thread t([&] {
    first = run({"perf", srv.address(), "--duration", first_s, "--quiet"}, 60s);
  });
  std::this_thread::sleep_for(cvt::scaled(1500ms));  // the first is running its test
  const auto t0 = std::chrono::steady_clock::now();
  const auto second = run({"perf", srv.address(), "--duration", "0.2", "--quiet"}, 30s);
  const auto took = std::chrono::steady_clock::now() - t0;
  t.join();
  EXPECT_EQ(exit_code(first), 0) << first.output;
  EXPECT_EQ(exit_code(second), 1) << second.output;
  EXPECT_NE(second.output.find("server busy"), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("timed out"), std::string::npos) << second.output;
  EXPECT_LT(took, cvt::scaled(3s)) << "the refusal must not wait for a handshake timeout";
}

// A script (bench/compare, bench/ab) starts the next client the moment the
// last one exits. Its request can reach the server while the server still
// turns clients away for the run that just said goodbye; that request must be
// served, not told "server busy".
TEST(cli, a_client_started_as_the_last_one_exits_is_served_not_told_busy) {
  server_process srv({"--persistent"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  for (int i = 0; i < 8; ++i) {
    const auto r =
        run({"perf", srv.address(), "--duration", "0.05", "--size", "64", "--quiet"}, 60s);
    ASSERT_EQ(exit_code(r), 0) << "client " << i << ":\n" << r.output << srv.drain_log();
  }
}

// A client that opens its control and data connections with a valid hello
// and then says nothing held a --persistent server for a day (every other
// client heard "server busy"): between phases the server waits --timeout at
// most, says so, and serves the next client.
TEST(cli, a_silent_client_between_phases_is_dropped_after_timeout_and_the_next_is_served) {
  server_process srv({"--persistent", "--timeout", "2"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto h = small_hello();
  raw_client ctl;
  auto ci = ctl.connect(srv.address(), h);
  ASSERT_TRUE(ci) << ci.error().to_string();
  auto dh = h;
  dh.index = 1;
  raw_client data;
  auto di = data.connect(srv.address(), dh);
  ASSERT_TRUE(di) << di.error().to_string();
  ASSERT_TRUE(srv.wait_log("connected (1 data QPs)", cvt::scaled(5s))) << srv.drain_log();
  // Silent from here on. After --timeout the server drops it and logs why.
  ASSERT_TRUE(srv.wait_log("sent nothing for --timeout 2 s between phases", cvt::scaled(8s)))
      << "the silent client still holds the server:\n"
      << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 60s);
  EXPECT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  EXPECT_EQ(srv.wait_exit(100ms), -1) << "a --persistent server exited: " << srv.drain_log();
}

// CPU time (user + system) a process has used so far, in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string st;
  std::getline(in, st);
  const auto close = st.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> f;
  std::size_t at = close + 2;
  while (at < st.size()) {
    const auto sp = st.find(' ', at);
    f.push_back(st.substr(at, sp - at));
    if (sp == std::string::npos) break;
    at = sp + 1;
  }
  if (f.size() < 13) return -1;
  return static_cast<double>(std::stoull(f[11]) + std::stoull(f[12])) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A bandwidth client whose target stops answering must give the CPU away: on
// a core it shares with the target, a client that only yields kept the
// target's engine off the CPU for 0.3 to 4 s at a time (bench/ab's shared-core
// rows, each process in its own session). With the target stopped for a
// second, the client waits on its CQ instead of spinning.
TEST(cli, a_bandwidth_client_sleeps_while_its_target_is_stopped) {
  server_process srv({"--persistent"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  server_process client(
      server_process::raw_args{{"perf", srv.address(), "--test", "read", "--mode", "bw", "--size",
                                "64K", "--duration", "120", "--timeout", "120", "--quiet"},
                               false});
  ASSERT_TRUE(srv.wait_log("connected", cvt::scaled(20s))) << srv.drain_log();
  std::this_thread::sleep_for(cvt::scaled(500ms));  // the client is in its loop, READs out
  ASSERT_EQ(::kill(srv.pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(200ms);  // what was in flight has arrived
  const double before = cpu_seconds(client.pid());
  std::this_thread::sleep_for(1s);
  const double after = cpu_seconds(client.pid());
  ::kill(srv.pid(), SIGCONT);
  ASSERT_GE(before, 0) << client.drain_log();
  EXPECT_LT(after - before, 0.4)
      << "the client used " << after - before
      << " s of CPU in the second its target was stopped: it spins instead of sleeping";
}

TEST(cli, sigint_removes_the_shm_socket_path_and_a_restart_binds_it) {
  const std::string path = "/tmp/cvt-cli-" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  for (int sig : {SIGINT, SIGTERM}) {
    server_process srv({"--provider", "shm"}, path);
    ASSERT_FALSE(srv.address().empty()) << "bind after a " << sig << " stop failed:\n"
                                        << srv.drain_log();
    ASSERT_EQ(::access(path.c_str(), F_OK), 0) << "the server listens on the path";
    EXPECT_EQ(srv.interrupt(sig, cvt::scaled(10s)), 128 + sig) << srv.drain_log();
    EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the socket path was left behind";
    EXPECT_NE(srv.drain_log().find("interrupted by"), std::string::npos) << srv.drain_log();
  }
  ::unlink(path.c_str());
}

TEST(cli, sigint_on_a_client_prints_what_was_measured) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // Each size's run scales with the build like the wait does, so SIGINT lands
  // after a size or two of the four, not after all of them (tsan failed it so).
  const std::string per_size = std::to_string(cvt::scaled(1500ms).count() / 1000.0);
  server_process client(server_process::raw_args{
      {"perf", srv.address(), "--sizes", "8,16,32,64", "--duration", per_size, "--json", "--quiet"},
      false});
  // The client in the background: give it time for a size or two of the four.
  std::this_thread::sleep_for(cvt::scaled(2500ms));
  EXPECT_EQ(client.interrupt(SIGINT, cvt::scaled(10s)), 128 + SIGINT) << client.drain_log();
  const std::string err = client.drain_log();
  EXPECT_NE(err.find("interrupted by SIGINT after "), std::string::npos) << err;
  EXPECT_NE(err.find(" of 4 sizes"), std::string::npos) << err;
}

TEST(cli, shm_settings_name_the_data_path) {
  server_process srv({"--provider", "shm"}, unique_shm_name());
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r =
      run({"perf", srv.address(), "--provider", "shm", "--size", "64K", "--iters", "50"}, 60s);
  ASSERT_EQ(exit_code(r), 0) << r.output;
  EXPECT_NE(r.output.find("data path "), std::string::npos) << r.output;
  const bool named = r.output.find("direct mapping") != std::string::npos ||
                     r.output.find("cross-memory attach") != std::string::npos ||
                     r.output.find("staged") != std::string::npos;
  EXPECT_TRUE(named) << r.output;
  EXPECT_EQ(r.output.find("MPA rev"), std::string::npos) << "shm has no MPA:\n" << r.output;
}

TEST(cli, a_log_level_that_is_not_one_is_named_in_a_warning) {
  const auto r =
      cvt::run_command({"/usr/bin/env", "CONVEYOR_LOG=verbose", tool, "devices"}, cvt::scaled(20s));
  EXPECT_EQ(exit_code(r), 0) << r.output;
  EXPECT_NE(r.output.find("CONVEYOR_LOG=verbose is not a log level"), std::string::npos)
      << r.output;
}

TEST(cli, env_lists_every_variable_with_its_value_and_default) {
  const auto r =
      cvt::run_command({"/usr/bin/env", "CONVEYOR_SPIN_US=7", tool, "env"}, cvt::scaled(10s));
  EXPECT_EQ(exit_code(r), 0) << r.output;
  for (const char* v : {"CONVEYOR_LOG", "CONVEYOR_SPIN_US", "CONVEYOR_ENGINE_SPIN_US",
                        "CONVEYOR_ENGINE_PARK", "CONVEYOR_SHM_CMA", "CONVEYOR_SHM_DIRECT",
                        "CONVEYOR_VERBS_GID_INDEX", "CONVEYOR_GLOO_DEVICE"})
    EXPECT_NE(r.output.find(v), std::string::npos) << v << " missing:\n" << r.output;
  const auto line = r.output.substr(r.output.find("CONVEYOR_SPIN_US"));
  EXPECT_LT(line.find(" 7 "), line.find('\n')) << "the current value is shown:\n" << r.output;
}

// Begin and ready carry where each side runs; a latency loop whose peer is
// pinned to its own CPU yields at once instead of spinning the peer off the
// core (one shared CPU: the WRITE ping-pong spun 2 x 5 us per round trip).
TEST(cli, the_phase_messages_carry_the_placement_and_a_shared_cpu_skips_the_spin) {
  using conveyor::tool::ctl_msg;
  using conveyor::tool::placement;
  ctl_msg m{.kind = conveyor::tool::ctl_kind::ready,
            .size = 4096,
            .host = 0x1122334455667788ull,
            .cpu = 3};
  std::array<std::byte, ctl_msg::wire_size> wire{};
  m.encode(wire);
  const ctl_msg d = ctl_msg::decode(wire);
  EXPECT_EQ(d.kind, conveyor::tool::ctl_kind::ready);
  EXPECT_EQ(d.size, 4096u);
  EXPECT_EQ(d.host, 0x1122334455667788ull);
  EXPECT_EQ(d.cpu, 3u);

  conveyor::tool::perf_options o;
  o.cpu = 2;
  const placement a = placement::here(o);
  EXPECT_NE(a.host, 0u) << "no boot id read";
  EXPECT_EQ(a.cpu, 3u);
  EXPECT_TRUE(a.shares_cpu_with(placement::here(o)));
  EXPECT_FALSE(a.shares_cpu_with({a.host, 4}));          // another CPU
  EXPECT_FALSE(a.shares_cpu_with({a.host + 1, a.cpu}));  // another machine
  EXPECT_FALSE(a.shares_cpu_with({0, 0}));               // a peer that does not say
  o.cpu = -1;
  EXPECT_FALSE(placement::here(o).shares_cpu_with(placement::here(o))) << "unpinned";

  EXPECT_TRUE(conveyor::tool::latency_spin(false).spins_first());
  EXPECT_FALSE(conveyor::tool::latency_spin(false, true).spins_first());
}
