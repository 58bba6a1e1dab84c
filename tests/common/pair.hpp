// tests/common/pair.hpp — the connected-pair fixture of the integration suites.
//
// connect_pair() opens two devices of the provider under test (an initiator
// and a target, separate instances), creates a PD, CQs and an RC QP on each,
// binds a listener on 127.0.0.1 port 0, accepts in a std::thread while the
// initiator connects, and hands the target's main region to the initiator as a
// remote_region in the accept's private data.
//
// Progress: with progress_mode::manual the target gets a "target poller" (a
// pumped cq_reader calling cq.wait with short timeouts until TearDown), so it
// serves one-sided operations; the initiator's engine runs inside the test's
// own waits (wait() polls every initiator CQ while it waits). With
// progress_mode::thread nothing polls on the target side unless a test waits
// for a target completion itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include "common/buffer.hpp"
#include "common/completions.hpp"
#include "common/env.hpp"
#include "common/pattern.hpp"

namespace cvt {

struct endpoint {
  conveyor::device dev;
  conveyor::protection_domain pd;
  conveyor::completion_queue scq;  // send CQ
  conveyor::completion_queue rcq;  // receive CQ (the target uses scq for both)
  std::unique_ptr<cq_reader> sr;   // reads scq
  std::unique_ptr<cq_reader> rr;   // reads rcq; null when the QP shares scq
  conveyor::queue_pair qp;
  conveyor::connection_info info;

  cq_reader& send_reader() const { return *sr; }
  cq_reader& recv_reader() const { return rr ? *rr : *sr; }
};

struct pair_options {
  bool init_crc = true;  // device_options.software.request_crc of each side
  bool tgt_crc = true;
  std::uint32_t init_send_cq_depth = 1024;
  std::uint32_t init_recv_cq_depth = 1024;
  std::uint32_t tgt_cq_depth = 2048;
  conveyor::qp_caps init_caps{};
  conveyor::qp_caps tgt_caps{};
  bool init_sq_sig_all = false;
  std::uint32_t init_max_rd_atomic = 16;
  std::uint32_t init_max_dest_rd_atomic = 16;
  std::uint32_t tgt_max_rd_atomic = 16;
  std::uint32_t tgt_max_dest_rd_atomic = 16;
  std::size_t tgt_region_size = MiB;  // the region published in the private data
  std::uint64_t tgt_region_seed = 0x7a11;
  // device_options.software.max_sge_rd of each side (0: the device's)
  std::uint32_t max_sge_rd = 0;
};

class pair_test : public testing::TestWithParam<provider_param> {
 protected:
  void TearDown() override;

  const provider_param& param() const { return GetParam(); }
  bool manual() const { return GetParam().progress == conveyor::progress_mode::manual; }

  // Opens devices and creates PD/CQs/QPs (state INIT) and the main and sync
  // regions; starts the target poller in manual mode. Use ASSERT_NO_FATAL_FAILURE.
  void prepare_pair(const pair_options& o = {});
  // prepare_pair() + listen/accept/connect; both QPs end in RTS and `peer` is
  // the target's main region decoded from the private data.
  void connect_pair(const pair_options& o = {});
  // Closes both QPs, stops the pollers and releases everything (TearDown does it too).
  void reset_pair();

  // Waits for n completions on r (initiator CQs are driven meanwhile).
  testing::AssertionResult wait(cq_reader& r, std::size_t n, std::chrono::milliseconds timeout,
                                std::vector<conveyor::work_completion>& out);
  // Same, and every completion must have status success.
  testing::AssertionResult wait_ok(cq_reader& r, std::size_t n, std::chrono::milliseconds timeout,
                                   std::vector<conveyor::work_completion>* out = nullptr);
  // Polls for `d` and fails if any completion shows up on r (for "no completion" checks).
  testing::AssertionResult expect_no_completion(cq_reader& r, std::chrono::milliseconds d);
  // Makes every earlier initiator WRITE visible at the target: the target posts a
  // receive, the initiator SENDs 8 bytes, both completions are awaited (RDMA
  // ordering: the SEND is placed after the WRITEs before it).
  testing::AssertionResult sync_target(std::chrono::milliseconds timeout);
  // Waits up to `timeout` for qp to reach state s (the engine may set it a moment
  // after delivering the completion that caused it).
  testing::AssertionResult wait_state(const conveyor::queue_pair& qp, conveyor::qp_state s,
                                      std::chrono::milliseconds timeout);

  // "" when atomics / immediate data are usable on this connection, else why
  // not. On a Conveyor<->Conveyor connection they must be usable: this adds a
  // fatal failure instead of returning a reason.
  std::string atomics_unavailable();
  std::string immediate_unavailable();

  // Drives the initiator's CQs once (manual progress).
  void drive();
  std::vector<cq_reader*> drivers() const;

  // Largest message the pair can move (device attr), and whether `size` fits.
  bool size_fits(std::size_t size);

  pair_options opts_;
  endpoint init;
  endpoint tgt;
  test_region tgt_main;          // published to the initiator via private data
  conveyor::remote_region peer;  // what the initiator decoded
  test_region sync_src;          // initiator, 64 bytes
  test_region sync_sink;         // target, 64 bytes
  std::uint64_t next_sync_id_ = 0x5c000000;
  std::string listen_address_;
};

// Canonical sizes of the opcode tests.
inline constexpr std::size_t k_sizes[] = {0, 1, 63, 4096, MiB, 16 * MiB};
// Generous per-operation timeouts (scaled under sanitizers).
std::chrono::milliseconds op_timeout(std::size_t bytes);

// Requires RFC 7306 atomics / immediate data; skips with the reason otherwise.
#define CVT_REQUIRE_ATOMICS()                           \
  do {                                                  \
    std::string cvt_why_ = this->atomics_unavailable(); \
    if (::testing::Test::HasFatalFailure()) return;     \
    if (!cvt_why_.empty()) GTEST_SKIP() << cvt_why_;    \
  } while (0)
#define CVT_REQUIRE_IMMEDIATE()                           \
  do {                                                    \
    std::string cvt_why_ = this->immediate_unavailable(); \
    if (::testing::Test::HasFatalFailure()) return;       \
    if (!cvt_why_.empty()) GTEST_SKIP() << cvt_why_;      \
  } while (0)

}  // namespace cvt
