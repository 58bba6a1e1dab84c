// The perftest commands (write_bw, read_lat, ...; issue 17): perftest's flags
// parsed in process, its report columns and units, and a server and client run.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include "cli_support.hpp"
#include "common/env.hpp"
#include "common/raw_tcp.hpp"
#include "perf_report.hpp"
#include "perf_session.hpp"
#include "perftest.hpp"

using namespace std::chrono_literals;
using namespace cvt_cli;

// ------------------------------------------------- perftest habits (issue 17) --

namespace {

// Parses `conveyor <args>` with the tool's own perftest commands, in process.
struct parsed_perftest {
  std::string error;  // CLI11's or perftest_to_perf's
  conveyor::tool::perf_options o;
};
parsed_perftest parse_perftest(std::vector<std::string> args) {
  CLI::App app{"conveyor"};
  conveyor::tool::perftest_args a;
  const auto cmds = conveyor::tool::add_perftest_commands(app, a);
  parsed_perftest out;
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    out.error = e.what();
    return out;
  }
  for (const auto& c : cmds)
    if (*c.app) {
      out.error = conveyor::tool::perftest_to_perf(a, c.test, c.mode, out.o);
      if (out.error.empty()) out.error = conveyor::tool::validate_perf_options(out.o);
    }
  return out;
}

}  // namespace

TEST(perftest, flags_have_perftests_meanings) {
  using conveyor::tool::perf_mode;
  using conveyor::tool::perf_test;
  auto p = parse_perftest({"write_bw", "-s", "4096", "-n", "500", "-q", "4", "-t", "64", "-I", "0",
                           "-p", "7000", "-l", "8", "-F", "-R", "--report_gbits", "10.0.0.2"});
  ASSERT_EQ(p.error, "");
  EXPECT_FALSE(p.o.server);
  EXPECT_EQ(p.o.test, perf_test::write);
  EXPECT_EQ(p.o.mode, perf_mode::bw);
  EXPECT_EQ(p.o.sizes, (std::vector<std::uint64_t>{4096}));
  EXPECT_EQ(p.o.iters, 500u);
  EXPECT_EQ(p.o.qps, 4u);
  EXPECT_EQ(p.o.tx_depth, 64u);
  EXPECT_EQ(p.o.inline_size, 0u);
  EXPECT_EQ(p.o.batch, 8u);
  EXPECT_TRUE(p.o.report_gbits);
  EXPECT_EQ(p.o.address, "10.0.0.2");
  EXPECT_EQ(p.o.default_port, 7000);
  std::string why;
  EXPECT_EQ(conveyor::tool::resolve_address(p.o, p.o.address, why), "10.0.0.2:7000") << why;

  p = parse_perftest({"read_lat", "-a", "-D", "2", "-d", "soft"});
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.o.server) << "no host: the server, as perftest";
  EXPECT_EQ(p.o.address, "0.0.0.0:18515");
  EXPECT_EQ(p.o.test, perf_test::read);
  EXPECT_EQ(p.o.mode, perf_mode::lat);
  EXPECT_EQ(p.o.sizes.size(), 23u) << "-a: 2 B .. 8 MiB";
  EXPECT_EQ(p.o.duration, 2.0);
  EXPECT_EQ(p.o.device, "soft");

  p = parse_perftest({"write_lat", "-a", "h"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.sizes.front(), 8u) << "write_lat -a starts at the ping-pong's 8 bytes";
  EXPECT_EQ(p.o.sizes.back(), 8u << 20);

  p = parse_perftest({"send_bw", "-d", "mlx5_0", "-r", "128", "host7"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.device, "verbs:mlx5_0") << "an rdma-core name is the verbs provider's device";
  EXPECT_EQ(p.o.provider, "verbs");
  EXPECT_EQ(p.o.rx_depth, 128u);
  EXPECT_EQ(p.o.test, perf_test::send);

  p = parse_perftest({"atomic_lat", "-A", "CMP_AND_SWAP", "-d", "shm", "localhost"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.test, perf_test::compare_swap);
  EXPECT_EQ(p.o.address, "@conveyor-perf-18515") << "shm: the port names the socket";
  p = parse_perftest({"atomic_bw", "127.0.0.1"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.test, perf_test::fetch_add);
}

TEST(perftest, flags_that_do_not_apply_say_why) {
  EXPECT_NE(parse_perftest({"write_bw", "-c", "UD", "h"}).error.find("reliable connected"),
            std::string::npos);
  EXPECT_NE(parse_perftest({"write_bw", "-m", "4096", "h"}).error.find("MTU"), std::string::npos);
  EXPECT_NE(parse_perftest({"write_bw", "-b", "h"}).error.find("bidirectional"), std::string::npos);
  EXPECT_NE(parse_perftest({"write_bw", "-s", "lots", "h"}).error.find("not a size"),
            std::string::npos);
  EXPECT_NE(parse_perftest({"write_lat", "-s", "4", "h"}).error.find("at least 8"),
            std::string::npos);
  // perftest flags Conveyor does not offer are refused naming the flag and what to do.
  auto e = parse_perftest({"write_bw", "-e", "h"}).error;
  EXPECT_EQ(e.rfind("-e:", 0), 0u) << e;
  EXPECT_NE(e.find("polls"), std::string::npos) << e;
  e = parse_perftest({"write_bw", "--run_infinitely", "h"}).error;
  EXPECT_EQ(e.rfind("--run_infinitely:", 0), 0u) << e;
  EXPECT_NE(e.find("-D"), std::string::npos) << e;
  e = parse_perftest({"write_lat", "--output", "bandwidth", "h"}).error;
  EXPECT_NE(e.find("--output latency"), std::string::npos) << e;
}

TEST(perftest, port_peak_and_output_flags_are_taken) {
  auto p = parse_perftest({"write_bw", "-i", "1", "-N", "--output=bandwidth", "h"});
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.o.perftest_report);
  EXPECT_TRUE(p.o.perftest_no_peak);
  EXPECT_EQ(p.o.perftest_output, "bandwidth");
  p = parse_perftest({"send_lat", "--output", "latency", "h"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.perftest_output, "latency");
}

namespace {
// What print_table_header + print_table_row write for one result.
std::string perftest_report(conveyor::tool::perf_options o, const conveyor::tool::perf_result& r) {
  conveyor::tool::perf_settings s;
  s.opts = std::move(o);
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = ::open_memstream(&buf, &len);
  conveyor::tool::print_table_header(f, s);
  conveyor::tool::print_table_row(f, s, r);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  // Scripts split perftest's output on white space: compare it that way.
  std::string words;
  for (char c : out)
    if (c != ' ' || (!words.empty() && words.back() != ' ' && words.back() != '\n')) words += c;
  for (std::size_t i; (i = words.find(" \n")) != std::string::npos;) words.erase(i, 1);
  return words;
}
}  // namespace

TEST(perftest, reports_in_perftests_columns_and_units) {
  using conveyor::tool::perf_mode;
  using conveyor::tool::perf_test;
  // A latency run whose round trips are 10 us (min 8, max 30, p99 20, p99.9 30).
  conveyor::tool::perf_result r;
  r.mode = perf_mode::lat;
  r.size = 8;
  r.iterations = 1000;
  r.lat = conveyor::tool::latency_stats{
      .min = 8, .mean = 11, .p50 = 10, .p99 = 20, .p999 = 30, .max = 30, .stdev = 2};
  conveyor::tool::perf_options o;
  o.perftest_report = true;
  o.mode = perf_mode::lat;
  for (auto t : {perf_test::write, perf_test::send}) {
    o.test = r.test = t;
    const auto out = perftest_report(o, r);
    EXPECT_NE(out.find("#bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] "
                       "t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]"),
              std::string::npos)
        << out;
    // ib_write_lat / ib_send_lat: half the round trip.
    EXPECT_NE(out.find("\n8 1000 4.00 15.00 5.00 5.50 1.00 10.00 15.00\n"), std::string::npos)
        << out;
  }
  o.test = r.test = perf_test::read;
  auto out = perftest_report(o, r);
  EXPECT_NE(out.find("\n8 1000 8.00 30.00 10.00 11.00 2.00 20.00 30.00\n"), std::string::npos)
      << "ib_read_lat: the round trip\n"
      << out;
  o.test = r.test = perf_test::write;
  o.perftest_output = "latency";
  EXPECT_EQ(perftest_report(o, r), "5.00\n");

  // Bandwidth: MB/sec = 2^20 bytes/s; 1048.576 MB/s (10^6) is 1000 perftest MB/sec.
  conveyor::tool::perf_result b;
  b.test = perf_test::write;
  b.mode = perf_mode::bw;
  b.size = 65536;
  b.iterations = 5000;
  b.mb_per_s = 1048.576;
  b.mops = 0.016;
  o = {};
  o.perftest_report = true;
  out = perftest_report(o, b);
  EXPECT_NE(out.find("#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\n65536 5000 1000.00 1000.00 0.016000\n"), std::string::npos) << out;
  o.perftest_no_peak = true;
  out = perftest_report(o, b);
  EXPECT_NE(out.find("\n65536 5000 0.00 1000.00 0.016000\n"), std::string::npos) << out;
  o.perftest_output = "bandwidth";
  EXPECT_EQ(perftest_report(o, b), "1000.00\n");
}

TEST(perftest, write_bw_server_without_host_and_client_with_bare_host) {
  const std::uint16_t port = cvt::unused_port();
  ASSERT_NE(port, 0);
  server_process srv(
      server_process::raw_args{{"write_bw", "-p", std::to_string(port), "--verify"}});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  EXPECT_EQ(srv.address(), "0.0.0.0:" + std::to_string(port));
  const auto r = run({"write_bw", "-p", std::to_string(port), "-s", "4096", "-n", "200",
                      "--report_gbits", "-F", "--verify", "localhost"},
                     60s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  EXPECT_NE(r.output.find("BW average[Gb/sec]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("10^9 bits/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << "localhost, a bare host, is port " << port << ":\n"
      << r.output;
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
}

TEST(perftest, conveyor_perf_points_perftest_letters_to_the_right_flag) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"perf", "-s", "65536", "10.0.0.2"},
                                             {"perf", "-t", "128", "10.0.0.2"},
                                             {"perf", "-s", "4096"},
                                             {"perf", "-p", "18515", "10.0.0.2"}}) {
    const auto r = run(args, 10s);
    EXPECT_EQ(exit_code(r), 2) << r.output;
    EXPECT_NE(r.output.find("conveyor write_bw"), std::string::npos) << r.output;
  }
  const auto r = run({"perf", "-s", "65536", "10.0.0.2"}, 10s);
  EXPECT_NE(r.output.find("-S/--size"), std::string::npos) << r.output;
}
