// A target in another process that refuses cross-memory attach (the initiator
// stages its bulk data), and what shm must answer exactly as soft does.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"
#include "common/process.hpp"
#include "common/script.hpp"
#include "shm_fixture.hpp"

namespace cvt {
namespace {

// Cross-memory attach refused for real (not forced): the target child runs as
// another user without capabilities, so it may not attach to this process and
// the initiator's bulk requests fall back to staging, while this (privileged)
// process may still attach to the child. The whole two-party script (WRITE,
// READ, atomics, SEND) must pass with the right bytes over the mixed connection.
class shm_process : public testing::TestWithParam<provider_param> {};

TEST_P(shm_process, peer_refusing_cross_memory_attach_makes_the_initiator_stage_its_bulk_data) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the target child as another user";
  two_party_script s;
  s.provider = "shm";
  s.progress = GetParam().progress;
  s.expect_data_path = "staged";
  s.target_uid = 65534;  // nobody
  std::vector<std::string> args{"target"};
  for (const auto& a : s.to_args()) args.push_back(a);
  args.push_back("--mode=verify");
  args.push_back("--lifetime=" + std::to_string(scaled(milliseconds(120000)).count() / 1000));
  auto child = child_process::spawn(args);
  ASSERT_TRUE(child.has_value()) << child.error();
  auto line = child->read_line(scaled(milliseconds(30000)));
  ASSERT_TRUE(line.has_value()) << line.error();
  const auto at = line->find(" address ");
  ASSERT_NE(at, std::string::npos) << *line;
  const std::string err = run_two_party_initiator(s, line->substr(at + 9));
  EXPECT_EQ(err, "");
  if (!err.empty()) child->kill(SIGKILL);
  auto st = child->wait_exit(scaled(milliseconds(60000)));
  ASSERT_TRUE(st.has_value()) << st.error();
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << child_process::describe_status(*st);
}

// shm must answer a SEND that finds no posted receive exactly as soft does
// (soft has no RNR retry: the target answers at once). Runs on every provider.
class parity : public pair_test {};

TEST_P(parity, send_without_a_posted_receive_is_rnr_retry_exc_err_and_both_qps_fail) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_ASSERT_POST_OK(init.qp.post_send_msg(sync_src.sge(0, 8), 0x7a));
  std::vector<work_completion> iw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(8), iw));
  EXPECT_TRUE(
      ok(check_wc(iw[0], conveyor::wc_status::rnr_retry_exc_err, conveyor::wc_opcode::send, 0x7a)));
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(milliseconds(5000))));
  EXPECT_TRUE(wait_state(tgt.qp, qp_state::error, scaled(milliseconds(5000))));
}

TEST_P(parity, allocate_memory_gives_zeroed_registered_memory_that_moves_bytes) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_EXPECT_ERRC(tgt.pd.allocate_memory(0, all_rights), errc::invalid_argument);
  CVT_EXPECT_ERRC(tgt.pd.allocate_memory(4096, access::remote_write), errc::invalid_argument);
  auto region = tgt.pd.allocate_memory(10000, all_rights);
  CVT_ASSERT_OK(region);
  ASSERT_EQ(region->size(), 10000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(region->data()) % 4096, 0u);
  EXPECT_TRUE(std::all_of(region->data(), region->data() + 10000,
                          [](std::byte b) { return b == std::byte{0}; }));
  ASSERT_TRUE(sync_target(op_timeout(64)));  // our reads before the engine's writes
  auto src = make_region(init.pd, 10000, access::local_write, 0x6a00);
  CVT_ASSERT_OK(src);
  auto back = make_region(init.pd, 10000, access::local_write, 0);
  CVT_ASSERT_OK(back);
  CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 10000), region->remote(), 1));
  CVT_ASSERT_POST_OK(init.qp.post_read(back->sge(0, 10000), region->remote(), 2));
  ASSERT_TRUE(wait_ok(init.send_reader(), 2, op_timeout(10000)));
  EXPECT_TRUE(ok(check_pattern(back->bytes(), 0x6a00)));
  region->deregister();
  EXPECT_FALSE(*region) << "deregister() leaves the handle empty";
}

INSTANTIATE_TEST_SUITE_P(providers, parity, testing::ValuesIn(all_params()), param_name);

INSTANTIATE_TEST_SUITE_P(shm, shm_process, testing::ValuesIn(shm_params()), param_name);

}  // namespace
}  // namespace cvt
