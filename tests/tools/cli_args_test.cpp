// The `conveyor` tool, run as a separate program: argument handling, errors a
// person can act on, and the perf hello's encoding (docs/CLI.md). The other
// cli_*_test.cpp files, perftest_test.cpp and ping_test.cpp hold the rest;
// cli_support.hpp what they share.
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "common/env.hpp"
#include "common/raw_tcp.hpp"
#include "perf_session.hpp"

namespace {

using namespace std::chrono_literals;
using namespace cvt_cli;
using nlohmann::json;

// ---------------------------------------------------------------- arguments --

struct bad_args_case {
  std::vector<std::string> args;
  std::string message;  // part of what stderr must say
};

void PrintTo(const bad_args_case& c, std::ostream* os) {
  for (const auto& a : c.args) *os << a << ' ';
}

class bad_arguments : public testing::TestWithParam<bad_args_case> {};

TEST_P(bad_arguments, exit_with_status_2_and_say_what_is_wrong) {
  const auto r = run(GetParam().args, 10s);
  EXPECT_EQ(exit_code(r), 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().message), std::string::npos) << "output was:\n" << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    cli, bad_arguments,
    testing::Values(
        bad_args_case{{}, "subcommand"}, bad_args_case{{"frobnicate"}, "subcommand"},
        bad_args_case{{"perf", "127.0.0.1:1", "--test", "teleport"}, "teleport"},
        bad_args_case{{"perf", "127.0.0.1:1", "--mode", "fast"}, "fast"},
        bad_args_case{{"perf", "127.0.0.1:1", "--size", "12parsecs"}, "not a size"},
        bad_args_case{{"perf", "127.0.0.1:1", "--sizes", "8,4K,huge"}, "huge"},
        bad_args_case{{"perf", "127.0.0.1:1", "--size", "8", "--all"}, "choose one"},
        bad_args_case{{"perf", "127.0.0.1:1", "--iters", "5", "--duration", "1"}, "exclude"},
        bad_args_case{{"perf", "127.0.0.1:1", "--iters", "-3"}, "iters"},
        bad_args_case{{"perf", "127.0.0.1:1", "--qps", "0"}, "qps"},
        bad_args_case{{"perf", "127.0.0.1:1", "--crc", "maybe"}, "maybe"},
        bad_args_case{{"perf", "127.0.0.1:1", "--progress", "sometimes"}, "sometimes"},
        bad_args_case{{"perf"}, "address is missing"},
        bad_args_case{{"perf", "127.0.0.1:1", "--test", "fetch-add", "--size", "64"},
                      "exactly 8 bytes"},
        bad_args_case{{"perf", "127.0.0.1:1", "--mode", "lat", "--size", "4"}, "at least 8"},
        bad_args_case{{"perf", "127.0.0.1:1", "--tx-depth", "4", "--batch", "8"},
                      "exceeds --tx-depth"},
        bad_args_case{{"perf", "127.0.0.1:1", "--mode", "lat", "--qps", "2"},
                      "READ and atomics only"},
        bad_args_case{{"perf", "127.0.0.1:1", "--qps", "4097"}, "qps"},
        bad_args_case{{"devices", "--color"}, "color"}));

TEST(cli, help_exits_0_and_lists_the_perf_options) {
  const auto r = run({"perf", "--help"}, 10s);
  EXPECT_EQ(exit_code(r), 0) << r.output;
  for (const char* opt : {"--server", "--test", "--mode", "--size", "--all", "--iters",
                          "--duration", "--qps", "--tx-depth", "--inline", "--batch", "--crc",
                          "--progress", "--provider", "--device", "--cpu", "--verify", "--json"})
    EXPECT_NE(r.output.find(opt), std::string::npos) << opt << " missing from --help";
}

TEST(cli, sizes_accept_units) {
  // Every unit spelling reaches the run as the byte count it names.
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--mode", "lat", "--iters", "20", "--warmup", "0",
                      "--sizes", "8,4K,64KiB,1M", "--json", "--quiet"},
                     60s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  std::vector<std::uint64_t> sizes;
  for (const auto& row : j.at("results")) sizes.push_back(row.at("size").get<std::uint64_t>());
  EXPECT_EQ(sizes, (std::vector<std::uint64_t>{8, 4096, 65536, 1048576}));
}

// ------------------------------------------------------------------- errors --

TEST(cli, nothing_listening_says_to_start_the_server) {
  const std::uint16_t port = cvt::unused_port();  // bound and closed again: nothing listens there
  ASSERT_NE(port, 0);
  const auto r = run({"perf", "127.0.0.1:" + std::to_string(port), "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nothing is listening"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conveyor perf --server"), std::string::npos) << r.output;
}

TEST(cli, malformed_address_is_named) {
  const auto r = run({"perf", "not-an-address", "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("not-an-address"), std::string::npos) << r.output;
}

TEST(cli, unknown_device_points_to_conveyor_devices) {
  const auto r = run({"perf", "127.0.0.1:9", "--device", "nosuchnic0"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nosuchnic0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conveyor devices"), std::string::npos) << r.output;
}

TEST(cli, size_over_the_servers_max_size_is_refused_with_the_reason) {
  server_process srv({"--max-size", "64K"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--size", "1M", "--iters", "10"}, 30s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("--max-size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rejected"), std::string::npos) << r.output;
}

TEST(cli, a_client_of_another_protocol_version_is_refused_with_the_reason) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // A client speaking "version 99": the library's own connect with a crafted hello.
  auto dev = conveyor::device::open("soft");
  ASSERT_TRUE(dev) << dev.error().to_string();
  auto pd = dev->alloc_pd();
  ASSERT_TRUE(pd);
  auto cq = dev->create_cq();
  ASSERT_TRUE(cq);
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
  ASSERT_TRUE(qp);
  std::vector<std::byte> hello{std::byte{'C'}, std::byte{'V'}, std::byte{'P'},
                               std::byte{'F'}, std::byte{99},  std::byte{0}};
  auto info =
      conveyor::connect(*qp, srv.address(), {.private_data = hello, .timeout = cvt::scaled(10s)});
  ASSERT_FALSE(info);
  EXPECT_EQ(cvt::name(info.error().code), cvt::name(conveyor::errc::rejected));
  EXPECT_NE(info.error().context.find("version mismatch"), std::string::npos)
      << info.error().to_string();
}

// The hello travels in a connect's private data: on InfiniBand and RoCE that is
// at most 55 bytes (rdma_cm's header takes the rest of the CM REQ), so a larger
// hello made every verbs run on rxe fail before it started.
TEST(cli, hello_fits_an_ib_roce_connect_and_round_trips) {
  conveyor::tool::perf_hello h;
  h.qps = 64;
  h.index = 63;
  h.tx_depth = 0xfffffff0u;
  h.rx_depth = 4096;
  h.slots = 4096;
  h.max_size = 64ull << 20;
  h.data = {0x7f00'1234'5678'9000ull, 1, 0xa1b2c3d4u};
  h.ctl = {0x7f00'8765'4321'0000ull, 8192, 0x01020304u};
  const auto b = h.encode();
  EXPECT_LE(b.size(), conveyor::tool::perf_hello::max_encoded);
  std::string why;
  auto d = conveyor::tool::perf_hello::decode(b, why);
  ASSERT_TRUE(d.has_value()) << why;
  EXPECT_EQ(d->qps, 64);
  EXPECT_EQ(d->index, 63);
  EXPECT_EQ(d->tx_depth, 0xfffffff0u);
  EXPECT_EQ(d->rx_depth, 4096u);
  EXPECT_EQ(d->slots, 4096u);
  EXPECT_EQ(d->max_size, 64ull << 20);
  // The server sizes the client's data region from the hello: 4096 slots of
  // 64 MiB for 64 QPs, plus the spare slot.
  EXPECT_EQ(d->data.length, (64ull << 20) * (4096ull * 64 + 1));
  EXPECT_EQ(d->data.addr, h.data.addr);
  EXPECT_EQ(d->data.rkey, h.data.rkey);
  EXPECT_EQ(d->ctl.addr, h.ctl.addr);
  EXPECT_EQ(d->ctl.rkey, h.ctl.rkey);
  EXPECT_EQ(d->ctl.length, conveyor::tool::ctl_layout::bytes);
  auto short_one = std::span(b).first(b.size() - 1);
  EXPECT_FALSE(conveyor::tool::perf_hello::decode(short_one, why).has_value());
}

TEST(cli, a_peer_that_is_not_a_perf_client_is_refused) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  auto dev = conveyor::device::open("soft");
  ASSERT_TRUE(dev);
  auto pd = dev->alloc_pd();
  auto cq = dev->create_cq();
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
  ASSERT_TRUE(qp);
  auto info = conveyor::connect(*qp, srv.address(), {.timeout = cvt::scaled(10s)});
  ASSERT_FALSE(info);
  EXPECT_NE(info.error().context.find("not a conveyor perf client"), std::string::npos)
      << info.error().to_string();
}

}  // namespace
