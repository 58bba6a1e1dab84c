// The fixture of the shm-only suites (shm_data_path_test.cpp,
// shm_engine_test.cpp, shm_direct_test.cpp): a connected pair on the shm
// provider with a 4 MiB target region, bulk round trips, extra QP pairs.
#pragma once

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"

namespace cvt {

// What every shm-only file names unqualified (milliseconds: common/env.hpp).
using conveyor::access;
using conveyor::errc;
using conveyor::qp_state;
using conveyor::work_completion;

class shm_only : public pair_test {
 protected:
  void TearDown() override {
    pair_test::TearDown();
    ::unsetenv("CONVEYOR_SHM_CMA");
  }
  static pair_options big() {
    pair_options o;
    o.tgt_region_size = 4 * MiB;
    return o;
  }
  // WRITE 3 MiB + 5 bytes, READ it back into another buffer, check both ways.
  void bulk_round_trip() {
    const std::size_t n = 3 * MiB + 5;
    auto src = make_region(init.pd, n, access::local_write, 0x5100);
    CVT_ASSERT_OK(src);
    auto back = make_region(init.pd, n, access::local_write, 0x5200);
    CVT_ASSERT_OK(back);
    CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, n), tgt_main.remote(7, n), 1));
    CVT_ASSERT_POST_OK(init.qp.post_read(back->sge(0, n), tgt_main.remote(7, n), 2));
    ASSERT_TRUE(wait_ok(init.send_reader(), 2, op_timeout(n)));
    // As in the conformance suite, look at the target's bytes after a SEND the
    // target received: in one process the two sides' ring indices live at two
    // mappings of the segment, so TSan cannot see the ordering the WRITE
    // completion already guarantees.
    ASSERT_TRUE(sync_target(op_timeout(64)));
    EXPECT_TRUE(ok(check_pattern(tgt_main.bytes().subspan(7, n), 0x5100)));
    EXPECT_TRUE(ok(check_pattern(back->bytes(), 0x5100)));
  }
  // Connects one more initiator QP `qp` to target QP `tqp` through `lis`
  // (bound at `addr` on the target's device).
  testing::AssertionResult connect_extra(conveyor::listener& lis, const std::string& addr,
                                         conveyor::queue_pair& qp, conveyor::queue_pair& tqp) {
    std::thread acceptor([&] {
      auto req = lis.accept(scaled(milliseconds(10000)));
      if (req) (void)req->accept(tqp, {});
    });
    auto info = conveyor::connect(qp, addr, {.timeout = scaled(milliseconds(10000))});
    acceptor.join();
    if (!info) return testing::AssertionFailure() << "connect: " << info.error().to_string();
    return testing::AssertionSuccess();
  }
  // Creates an initiator QP on `cq` and a target QP on `tcq`, connects them
  // through `lis` (bound at `addr`) and appends them to `qps` and `tqps`.
  testing::AssertionResult add_extra_pair(conveyor::listener& lis, const std::string& addr,
                                          conveyor::completion_queue& cq,
                                          conveyor::completion_queue& tcq,
                                          std::vector<conveyor::queue_pair>& qps,
                                          std::vector<conveyor::queue_pair>& tqps) {
    auto qp = init.pd.create_qp({.send_cq = &cq, .recv_cq = &cq});
    if (!qp) return testing::AssertionFailure() << "initiator QP: " << qp.error().to_string();
    auto tqp = tgt.pd.create_qp({.send_cq = &tcq, .recv_cq = &tcq});
    if (!tqp) return testing::AssertionFailure() << "target QP: " << tqp.error().to_string();
    if (auto r = connect_extra(lis, addr, *qp, *tqp); !r) return r;
    qps.push_back(std::move(*qp));
    tqps.push_back(std::move(*tqp));
    return testing::AssertionSuccess();
  }
};

// shm in both progress modes: what the shm-only suites are instantiated with.
inline std::vector<provider_param> shm_params() {
  return {{"shm", conveyor::progress_mode::thread}, {"shm", conveyor::progress_mode::manual}};
}

}  // namespace cvt
