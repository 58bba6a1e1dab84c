// `conveyor perf` client against `perf --server`: every test x mode on soft
// and shm with --verify, the documented JSON schema (docs/CLI.md), --slots,
// and the table output.
#include <cctype>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "common/caps.hpp"
#include "common/env.hpp"

namespace {

using namespace std::chrono_literals;
using namespace cvt_cli;
using nlohmann::json;

// -------------------------------------------------------------- runs + JSON --

void expect_perf_schema(const json& j, const std::string& test, const std::string& mode,
                        const std::vector<std::uint64_t>& sizes,
                        const std::string& provider = "soft") {
  ASSERT_EQ(j.at("schema"), "conveyor-perf/2");
  const auto& s = j.at("settings");
  for (const char* k : {"provider", "device", "transport", "local_address", "peer_address",
                        "progress", "test", "mode"})
    EXPECT_TRUE(s.at(k).is_string()) << k;
  for (const char* k :
       {"ird", "ord", "iters", "warmup", "qps", "tx_depth", "slots", "rx_depth", "batch", "inline"})
    EXPECT_TRUE(s.at(k).is_number_unsigned()) << k;
  for (const char* k : {"extensions", "verify"}) EXPECT_TRUE(s.at(k).is_boolean()) << k;
  // The transport's own facts: an object where the provider has them, else null.
  for (const char* k : {"iwarp", "shm", "verbs"})
    EXPECT_TRUE(s.at(k).is_object() || s.at(k).is_null()) << k;
  if (s.at("iwarp").is_object()) {
    const auto& w = s.at("iwarp");
    for (const char* k : {"mss", "max_fpdu", "mpa_revision"})
      EXPECT_TRUE(w.at(k).is_number_unsigned()) << k;
    EXPECT_TRUE(w.at("crc").is_boolean());
    EXPECT_TRUE(w.at("rtr").is_string());
    EXPECT_TRUE(w.at("large_fpdus").is_boolean());
  }
  if (s.at("shm").is_object()) {
    const auto& m = s.at("shm");
    EXPECT_TRUE(m.at("data_path") == "cma" || m.at("data_path") == "staged") << m.dump();
    EXPECT_TRUE(m.at("direct_mapping").is_boolean());
    EXPECT_TRUE(m.at("slot_payload").is_number_unsigned());
  }
  if (s.at("verbs").is_object()) {
    for (const char* k : {"path_mtu", "port_mtu"})
      EXPECT_TRUE(s.at("verbs").at(k).is_number_unsigned()) << k;
  }
  // Exactly one part: MPA's where Conveyor runs MPA, shm's without a wire.
  EXPECT_EQ(int{s.at("iwarp").is_object()} + int{s.at("shm").is_object()} +
                int{s.at("verbs").is_object()},
            1)
      << s.dump();
  const auto& da = cvt::device_attr_of(provider);
  EXPECT_EQ(s.at("iwarp").is_object(), cvt::runs_mpa(da)) << s.dump();
  EXPECT_EQ(s.at("shm").is_object(), !cvt::has_wire(da)) << s.dump();
  EXPECT_TRUE(s.at("duration_s").is_number());
  EXPECT_TRUE(s.at("cpu").is_number_integer());
  EXPECT_EQ(s.at("test"), test);
  EXPECT_EQ(s.at("mode"), mode);
  EXPECT_EQ(s.at("provider"), provider);
  EXPECT_GT(s.at("ord").get<unsigned>(), 0u);
  const auto& rows = j.at("results");
  ASSERT_EQ(rows.size(), sizes.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    EXPECT_EQ(r.at("test"), test);
    EXPECT_EQ(r.at("mode"), mode);
    EXPECT_EQ(r.at("size").get<std::uint64_t>(), sizes[i]);
    // Every run asks for --iters 300: exactly that many are timed and
    // reported, --warmup's untimed requests not among them.
    EXPECT_EQ(r.at("iterations").get<std::uint64_t>(), 300u);
    EXPECT_GT(r.at("seconds").get<double>(), 0.0);
    EXPECT_GE(r.at("mb_per_s").get<double>(), 0.0);
    EXPECT_GT(r.at("mops").get<double>(), 0.0);
    const auto& c = r.at("cpu");
    for (const char* k : {"user_s", "sys_s", "peer_user_s", "peer_sys_s", "s_per_gb"})
      EXPECT_GE(c.at(k).get<double>(), 0.0) << k;
    EXPECT_TRUE(r.at("verified").get<bool>());
    EXPECT_EQ(r.at("verify_errors").get<std::uint64_t>(), 0u) << "bytes moved did not match";
    if (mode == "lat") {
      const auto& l = r.at("lat_us");
      for (const char* k : {"min", "mean", "p50", "p99", "p999", "max"})
        EXPECT_GT(l.at(k).get<double>(), 0.0) << k;
      EXPECT_LE(l.at("min").get<double>(), l.at("p50").get<double>());
      EXPECT_LE(l.at("p50").get<double>(), l.at("p99").get<double>());
      EXPECT_LE(l.at("p99").get<double>(), l.at("p999").get<double>());
      EXPECT_LE(l.at("p999").get<double>(), l.at("max").get<double>());
    } else {
      EXPECT_TRUE(r.at("lat_us").is_null());
      if (sizes[i] > 0) {
        EXPECT_GT(r.at("mb_per_s").get<double>(), 0.0);
      }
    }
  }
}

struct run_case {
  std::string test, mode;
  std::vector<std::string> extra;
};

void PrintTo(const run_case& c, std::ostream* os) {
  *os << c.test << ' ' << c.mode;
  for (const auto& a : c.extra) *os << ' ' << a;
}

class perf_run : public testing::TestWithParam<run_case> {};

TEST_P(perf_run, verifies_its_data_and_prints_the_documented_json) {
  const auto& c = GetParam();
  server_process srv(c.extra);
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const bool atomic = c.test == "fetch-add" || c.test == "compare-swap";
  const std::vector<std::uint64_t> sizes =
      atomic ? std::vector<std::uint64_t>{8} : std::vector<std::uint64_t>{8, 4096, 65536};
  std::vector<std::string> args{"perf",    srv.address(), "--test",   c.test,   "--mode", c.mode,
                                "--iters", "300",         "--verify", "--json", "--quiet"};
  if (!atomic) args.insert(args.end(), {"--sizes", "8,4K,64K"});
  args.insert(args.end(), c.extra.begin(), c.extra.end());
  const auto r = run(args, 120s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  expect_perf_schema(j, c.test, c.mode, sizes);
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0)
      << "the server must end cleanly after the client's goodbye\n"
      << srv.drain_log();
}

std::vector<run_case> run_cases() {
  std::vector<run_case> out;
  for (const char* t : {"write", "read", "send", "fetch-add", "compare-swap", "write-imm"})
    for (const char* m : {"bw", "lat", "rate"}) out.push_back({t, m, {}});
  out.push_back({"write", "bw", {"--qps", "3", "--progress", "manual"}});
  out.push_back({"send", "bw", {"--qps", "2", "--rx-depth", "8", "--tx-depth", "32"}});
  // Past the 128 QPs whose credit words fit before protocol 3: every QP's
  // receives are credited at its own word.
  out.push_back({"send", "bw", {"--qps", "200", "--rx-depth", "2", "--tx-depth", "2"}});
  // One-sided latency over several QPs: each round trip takes the next one;
  // the atomics' returned values and the server's sum of the QPs' words check
  // that every request went where it was aimed.
  out.push_back({"read", "lat", {"--qps", "5"}});
  out.push_back({"fetch-add", "lat", {"--qps", "3"}});
  out.push_back({"compare-swap", "lat", {"--qps", "3"}});
  out.push_back({"read", "lat", {"--progress", "manual", "--crc", "off"}});
  out.push_back({"write", "rate", {"--batch", "4", "--tx-depth", "8", "--inline", "0"}});
  // Untimed requests first: the server's count of the phase includes them.
  out.push_back({"send", "bw", {"--warmup", "100", "--qps", "2"}});
  out.push_back({"fetch-add", "bw", {"--warmup", "50"}});
  // Every request through the same buffer (--slots 1), as bench/compare's
  // bandwidth rows run: the bytes of each still check.
  out.push_back({"read", "bw", {"--slots", "1", "--tx-depth", "32"}});
  out.push_back({"send", "bw", {"--slots", "1"}});
  return out;
}

std::string run_case_name(const testing::TestParamInfo<run_case>& info) {
  std::string n = info.param.test + "_" + info.param.mode +
                  (info.param.extra.empty() ? "" : "_" + std::to_string(info.index));
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(cli, perf_run, testing::ValuesIn(run_cases()), run_case_name);

// --slots reaches the server in the hello: the same 8 MiB of requests in
// flight fit its 1 MiB bound when they share one 64 KiB buffer, and every
// request's bytes still check.
TEST(cli, slots_bound_the_buffers_requests_rotate_through_on_both_sides) {
  server_process srv({"--max-memory", "1M"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--size", "64K", "--tx-depth", "128", "--slots", "1",
                      "--iters", "300", "--verify", "--json", "--quiet"},
                     60s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  EXPECT_EQ(j.at("settings").at("slots").get<unsigned>(), 1u);
  expect_perf_schema(j, "write", "bw", {65536});
}

// Without --slots every outstanding request gets its own buffer, and the report
// says how many were laid out; a latency run uses one each way.
TEST(cli, the_report_gives_the_buffers_per_qp_as_laid_out) {
  server_process srv({"--persistent"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  for (const auto& [mode, want] : {std::pair{"bw", 8u}, std::pair{"lat", 1u}}) {
    const auto r =
        run({"perf", srv.address(), "--mode", mode, "--size", "4K", "--tx-depth",
             std::string(mode) == "bw" ? "8" : "1", "--iters", "100", "--json", "--quiet"},
            60s);
    ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
    json j;
    ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
    EXPECT_EQ(j.at("settings").at("slots").get<unsigned>(), want) << mode;
  }
}

TEST(cli, slots_are_for_bandwidth_and_rate_runs) {
  const auto r = run({"perf", "127.0.0.1:1", "--mode", "lat", "--slots", "1"}, 10s);
  EXPECT_EQ(exit_code(r), 2) << r.output;
  EXPECT_NE(r.output.find("--slots"), std::string::npos) << r.output;
}

// The same runs over the shm provider: the server listens on an abstract Unix
// socket name. Sizes 8 B and 4 KiB go through the shared rings, 64 KiB by
// cross-memory attach where the kernel allows it (staged otherwise): --verify
// checks the bytes on both sides either way.

class perf_run_shm : public testing::TestWithParam<run_case> {};

TEST_P(perf_run_shm, verifies_its_data_and_prints_the_documented_json) {
  const auto& c = GetParam();
  std::vector<std::string> srv_extra{"--provider", "shm"};
  srv_extra.insert(srv_extra.end(), c.extra.begin(), c.extra.end());
  server_process srv(srv_extra, unique_shm_name());
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  ASSERT_EQ(srv.address().front(), '@') << srv.drain_log();
  const bool atomic = c.test == "fetch-add" || c.test == "compare-swap";
  const std::vector<std::uint64_t> sizes =
      atomic ? std::vector<std::uint64_t>{8} : std::vector<std::uint64_t>{8, 4096, 65536};
  std::vector<std::string> args{"perf",     srv.address(), "--provider", "shm",     "--test",
                                c.test,     "--mode",      c.mode,       "--iters", "300",
                                "--verify", "--json",      "--quiet"};
  if (!atomic) args.insert(args.end(), {"--sizes", "8,4K,64K"});
  args.insert(args.end(), c.extra.begin(), c.extra.end());
  const auto r = run(args, 120s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  expect_perf_schema(j, c.test, c.mode, sizes, "shm");
  EXPECT_EQ(j.at("settings").at("transport"), "shared memory");
  EXPECT_EQ(j.at("settings").at("peer_address"), srv.address());
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0)
      << "the server must end cleanly after the client's goodbye\n"
      << srv.drain_log();
}

std::vector<run_case> shm_run_cases() {
  std::vector<run_case> out;
  for (const char* t : {"write", "read", "send", "fetch-add", "compare-swap", "write-imm"})
    for (const char* m : {"lat", "bw"}) out.push_back({t, m, {}});
  out.push_back({"read", "lat", {"--progress", "manual"}});
  out.push_back({"write", "bw", {"--qps", "2", "--progress", "manual"}});
  out.push_back({"send", "bw", {"--qps", "200", "--rx-depth", "2", "--tx-depth", "2"}});
  out.push_back({"compare-swap", "lat", {"--qps", "3"}});
  return out;
}

INSTANTIATE_TEST_SUITE_P(cli, perf_run_shm, testing::ValuesIn(shm_run_cases()), run_case_name);

TEST(cli, table_output_names_units_and_the_resolved_settings) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r =
      run({"perf", srv.address(), "--mode", "lat", "--size", "8", "--iters", "100"}, 60s);
  ASSERT_EQ(exit_code(r), 0) << r.output;
  for (const char* s : {"provider soft", "IRD/ORD", "CRC on", "MSS", "bytes", "p50[us]", "p99[us]",
                        "p999[us]", "max[us]"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << " missing:\n" << r.output;
}

}  // namespace
