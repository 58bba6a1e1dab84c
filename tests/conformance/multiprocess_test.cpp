// Across processes and across hosts (two network namespaces on a veth pair).
#include <sys/wait.h>

#include <csignal>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/caps.hpp"
#include "common/env.hpp"
#include "common/netns.hpp"
#include "common/process.hpp"
#include "common/script.hpp"

namespace cvt {
namespace {

using std::chrono::milliseconds;

class processes : public testing::TestWithParam<provider_param> {
 protected:
  two_party_script script() const {
    two_party_script s;
    s.provider = GetParam().provider;
    s.progress = GetParam().progress;
    return s;
  }
};

std::vector<std::string> with(const std::string& role, const std::vector<std::string>& args,
                              const std::vector<std::string>& more) {
  std::vector<std::string> out;
  out.reserve(1 + args.size() + more.size());
  out.push_back(role);
  for (const auto& a : args) out.push_back(a);
  for (const auto& a : more) out.push_back(a);
  return out;
}

// "address A" part of the child's "port N address A" line, or "".
std::string parse_address(const std::string& line) {
  const auto at = line.find(" address ");
  return at == std::string::npos ? std::string() : line.substr(at + 9);
}

// "port N ..." -> N, or 0.
std::uint16_t parse_port(const std::string& line) {
  if (line.rfind("port ", 0) != 0) return 0;
  return static_cast<std::uint16_t>(std::strtoul(line.c_str() + 5, nullptr, 10));
}

testing::AssertionResult exited_cleanly(child_process& c, const char* who, milliseconds timeout) {
  auto st = c.wait_exit(timeout);
  if (!st) return testing::AssertionFailure() << who << ": " << st.error();
  if (WIFEXITED(*st) && WEXITSTATUS(*st) == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << who << " " << child_process::describe_status(*st) << " (its stderr above says why)";
}

TEST_P(processes, child_target_serves_write_read_atomics_and_send_across_processes) {
  const auto s = script();
  // Fork before this process opens any device; the child opens its own.
  auto child = child_process::spawn(
      with("target", s.to_args(),
           {"--mode=verify",
            "--lifetime=" + std::to_string(scaled(milliseconds(120000)).count() / 1000)}));
  ASSERT_TRUE(child.has_value()) << child.error();
  auto line = child->read_line(scaled(milliseconds(30000)));
  ASSERT_TRUE(line.has_value()) << line.error();
  const std::string addr = parse_address(*line);
  ASSERT_NE(addr, "") << "child reported: " << *line;

  const std::string err = run_two_party_initiator(s, addr);
  EXPECT_EQ(err, "");
  if (!err.empty()) child->kill(SIGKILL);
  EXPECT_TRUE(exited_cleanly(*child, "target child", scaled(milliseconds(60000))));
}

TEST_P(processes, two_namespaces_over_veth_move_16_mib_with_mss_at_most_1460) {
  const auto& da = device_attr_of(GetParam().provider);
  if (!has_wire(da))
    GTEST_SKIP() << "same host only (shared memory): network namespaces on a veth pair need a wire";
  if (!runs_mpa(da))
    GTEST_SKIP() << "the TCP MSS across network namespaces is reported where Conveyor runs MPA "
                    "over its own TCP socket; an RDMA device lives in one namespace";
  std::string why;
  bool environmental = false;
  auto ns = netns_pair::create(why, environmental);
  if (!ns) {
    if (environmental) GTEST_SKIP() << why;
    FAIL() << "setting up the namespaces failed: " << why;
  }
  auto s = script();
  s.region_size = 16 * MiB;
  s.write_len = 16 * MiB;
  s.msg_len = 4096;
  s.max_mss = 1460;  // MTU 1500 - 20 (IPv4) - 20 (TCP)
  const std::string lifetime =
      "--lifetime=" + std::to_string(scaled(milliseconds(200000)).count() / 1000);

  auto target =
      child_process::spawn(with("target", s.to_args(),
                                {"--mode=verify", "--netns=" + ns->a(),
                                 std::string("--addr=") + netns_pair::addr_a + ":0", lifetime}));
  ASSERT_TRUE(target.has_value()) << target.error();
  auto line = target->read_line(scaled(milliseconds(30000)));
  ASSERT_TRUE(line.has_value()) << line.error();
  const std::uint16_t port = parse_port(*line);
  ASSERT_NE(port, 0) << "target reported: " << *line;

  auto initiator = child_process::spawn(with(
      "initiator", s.to_args(),
      {"--netns=" + ns->b(),
       std::string("--connect=") + netns_pair::addr_a + ":" + std::to_string(port), lifetime}));
  ASSERT_TRUE(initiator.has_value()) << initiator.error();
  const bool init_ok =
      exited_cleanly(*initiator, "initiator child (namespace B)", scaled(milliseconds(180000)));
  EXPECT_TRUE(init_ok) << "initiator child failed";
  if (!init_ok) target->kill(SIGKILL);
  EXPECT_TRUE(exited_cleanly(*target, "target child (namespace A)", scaled(milliseconds(60000))));
}

INSTANTIATE_TEST_SUITE_P(providers, processes, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
