// The shm engine: its atomics are atomic against the region owner's own, a
// busy-polling application is not woken by doorbells, an idle connection burns
// no CPU, and cold QPs are found through their hints.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"
#include "shm_fixture.hpp"

namespace cvt {
namespace {

TEST_P(shm_only, engine_fetch_add_is_atomic_against_the_owners_own_atomics) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_ATOMICS();
  // What this test proves is what the device claims: atomic against the CPU too.
  EXPECT_EQ(static_cast<int>(tgt.dev.attr().atomic_cap),
            static_cast<int>(conveyor::atomic_scope::global));
  auto result = make_region(init.pd, 8, access::local_write, 0x5400);
  CVT_ASSERT_OK(result);
  auto* word = reinterpret_cast<std::uint64_t*>(tgt_main.bytes().data() + 64);
  std::atomic_ref<std::uint64_t>(*word).store(0);
  constexpr int n = 2000;
  // The owner increments the word for as long as the remote fetch-adds run
  // (yielding now and then: two cores), so the two sides really overlap; the
  // values the fetch-adds return show the owner's increments between them.
  std::atomic<bool> started{false}, stop{false};
  std::uint64_t owner_adds = 0;
  std::thread owner([&] {
    std::atomic_ref<std::uint64_t> w(*word);
    while (!stop.load(std::memory_order_relaxed)) {
      w.fetch_add(1);
      if (++owner_adds == 1) started.store(true, std::memory_order_release);
      if (owner_adds % 64 == 0) std::this_thread::yield();
    }
  });
  while (!started.load(std::memory_order_acquire)) std::this_thread::yield();
  std::uint64_t prev = 0;
  int interleaved = 0;  // fetch-adds that saw owner increments since the previous one
  for (int i = 0; i < n; ++i) {
    CVT_ASSERT_POST_OK(init.qp.post_fetch_add(result->sge(0, 8), tgt_main.remote(64, 8), 1, i));
    if (!wait_ok(init.send_reader(), 1, op_timeout(8))) {
      stop = true;
      owner.join();
      FAIL() << "fetch_add " << i << " did not complete";
    }
    std::uint64_t got = 0;
    std::memcpy(&got, result->bytes().data(), 8);
    if (i > 0) {
      ASSERT_GT(got, prev) << "fetch_add " << i << " returned a value not above the previous one";
      interleaved += got > prev + 1;
    }
    prev = got;
  }
  stop = true;
  owner.join();
  std::cout << "[   INFO   ] owner adds " << owner_adds << "; " << interleaved << " of " << n - 1
            << " remote fetch-adds saw owner increments since the previous one\n";
  EXPECT_GT(interleaved, 0)
      << "the owner's increments never fell between two remote fetch-adds: no overlap";
  EXPECT_EQ(std::atomic_ref<std::uint64_t>(*word).load(), owner_adds + n)
      << "an increment was lost";
}

// Manual progress: an application that keeps polling is not asleep, so its
// peer has no reason to ring its doorbell (a system call per message). Every
// empty poll used to flag the poller asleep: 2000 WRITEs, each awaited by
// polling, made the target ring the initiator's doorbell about 2000 times.
TEST_P(shm_only, a_busy_polling_application_is_not_woken_by_doorbells) {
  if (!manual()) GTEST_SKIP() << "the engine thread sleeps on the doorbells in thread mode";
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto src = make_region(init.pd, 8, access::local_write, 0x6a00);
  CVT_ASSERT_OK(src);
  ASSERT_TRUE(sync_target(op_timeout(64)));
  const auto bells0 = tgt.qp.counters().shm.value().doorbells;
  constexpr int n = 2000;
  std::array<conveyor::work_completion, 4> wcs;
  for (int i = 0; i < n; ++i) {
    CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 8), peer.slice(8 * (i % 64), 8), 0x6b00 + i));
    const auto deadline = std::chrono::steady_clock::now() + op_timeout(8);
    std::size_t got = 0;
    while (got == 0) {  // poll, never wait: this thread never sleeps
      auto r = init.scq.poll(wcs);
      ASSERT_TRUE(r.has_value());
      got = *r;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "WRITE " << i << " never completed";
    }
    ASSERT_EQ(wcs[0].status, conveyor::wc_status::success);
  }
  const auto bells = tgt.qp.counters().shm.value().doorbells - bells0;
  EXPECT_LT(bells, n / 20u) << "the target rang a polling initiator's doorbell " << bells
                            << " times for " << n << " WRITEs";
}

// Manual progress, two application threads: one asleep in wait() on the receive
// CQ, the other polling the send CQ of the same device. The poll must leave the
// sleeper's flags set, so the peer's SEND rings its doorbell and wakes it (a
// poll that cleared them left it asleep until its wait's next one-second
// slice).
TEST_P(shm_only, a_poll_on_one_thread_keeps_another_threads_wake_up) {
  if (!manual()) GTEST_SKIP() << "the engine thread sleeps on the doorbells in thread mode";
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto sink = make_region(init.pd, 64, access::local_write, 0);
  CVT_ASSERT_OK(sink);
  CVT_ASSERT_POST_OK(init.qp.post_recv(sink->sge(0, 64), 0x6d00));
  std::atomic<bool> woke{false};
  conveyor::work_completion got{};
  std::thread sleeper([&] {
    auto r = init.rcq.wait(std::span(&got, 1), op_timeout(64) + milliseconds(5000));
    woke = r.has_value() && *r == 1;
  });
  std::this_thread::sleep_for(milliseconds(100));  // well past the wait's spin
  std::array<conveyor::work_completion, 4> wcs;
  auto polled = init.scq.poll(wcs);  // the other thread: one poll, nothing to find
  ASSERT_TRUE(polled.has_value());
  EXPECT_EQ(*polled, 0u);
  const auto bells0 = tgt.qp.counters().shm.value().doorbells;
  CVT_ASSERT_POST_OK(tgt.qp.post_send_msg(tgt_main.sge(0, 64), 0x6d01));
  sleeper.join();
  ASSERT_TRUE(woke.load()) << "the sleeping thread never got the SEND";
  EXPECT_EQ(got.status, conveyor::wc_status::success);
  EXPECT_EQ(got.wr_id, 0x6d00u);
  EXPECT_GE(tgt.qp.counters().shm.value().doorbells - bells0, 1u)
      << "the SEND rang no doorbell: the poll had cleared the sleeper's flags";
}

TEST_P(shm_only, an_idle_connection_burns_no_cpu) {
  if (manual()) GTEST_SKIP() << "manual progress has no engine thread";
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  ASSERT_TRUE(sync_target(op_timeout(64)));
  std::this_thread::sleep_for(milliseconds(50));  // past the engines' spin window
  timespec a{}, b{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  std::this_thread::sleep_for(milliseconds(500));
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  const double used_ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
  EXPECT_LT(used_ms, 50.0) << "two idle engines used " << used_ms << " ms of CPU in 500 ms";
  // And they wake up for the next request.
  ASSERT_TRUE(sync_target(op_timeout(64)));
}

// A QP idle past engine_spin_us turns cold: its engine stops looking at it
// at every step and asks the peer for a hint (its bit in the device's hint
// page) instead, so a step costs what the active QPs cost. Rounds of READs
// over 24 QPs, each round after every QP of both sides went cold: each READ
// is found by the target through its hint and each response by the initiator
// through its own. In manual mode nothing else can find them: the initiator
// only polls (no wait, so its peer rings no doorbell) and a hinted QP is never
// looked at in turn, so a lost hint is a READ that never completes.
TEST_P(shm_only, cold_qps_are_found_through_their_hints) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  constexpr int nqp = 24, rounds = 5;
  const std::string addr = "@cvt-hints-" + std::to_string(::getpid());
  auto lis = conveyor::listener::bind(tgt.dev, addr);
  CVT_ASSERT_OK(lis);
  auto cq = init.dev.create_cq({.depth = 64});
  CVT_ASSERT_OK(cq);
  auto tcq = tgt.dev.create_cq({.depth = 64});
  CVT_ASSERT_OK(tcq);
  auto sink = make_region(init.pd, 8 * nqp, access::local_write, 0);
  CVT_ASSERT_OK(sink);
  std::vector<conveyor::queue_pair> qps, tqps;
  for (int k = 0; k < nqp; ++k)
    ASSERT_TRUE(add_extra_pair(*lis, addr, *cq, *tcq, qps, tqps)) << "QP " << k;
  for (int r = 0; r < rounds; ++r) {
    // Far longer than engine_spin_us (50 us): every QP goes cold.
    std::this_thread::sleep_for(milliseconds(3));
    for (int k = 0; k < nqp; ++k) {
      const std::size_t off = 8 * std::size_t(r * nqp + k);
      CVT_ASSERT_POST_OK(qps[k].post_read(sink->sge(8 * k, 8), tgt_main.remote(off, 8), k));
      conveyor::work_completion wc{};
      std::size_t got = 0;
      const auto deadline = std::chrono::steady_clock::now() + op_timeout(8);
      while (got == 0 && std::chrono::steady_clock::now() < deadline) {
        auto p = cq->poll(std::span(&wc, 1));
        ASSERT_TRUE(p.has_value());
        got = *p;
      }
      ASSERT_EQ(got, 1u) << "round " << r << ", QP " << k << ": the READ never completed";
      ASSERT_EQ(wc.status, conveyor::wc_status::success) << describe(wc);
      ASSERT_EQ(wc.wr_id, std::uint64_t(k));
      EXPECT_TRUE(ok(check_pattern(sink->bytes().subspan(8 * k, 8), opts_.tgt_region_seed, off)))
          << "round " << r << ", QP " << k;
    }
  }
  std::uint64_t hints = 0;
  for (auto& q : tqps) hints += q.counters().shm.value().hints;
  // In thread mode the initiator's engine thread may be asleep instead (then a
  // doorbell wakes it); in manual mode it never is.
  if (manual()) {
    EXPECT_GT(hints, 0u) << "no response went to a cold initiator QP through a hint";
  }
}

INSTANTIATE_TEST_SUITE_P(shm, shm_only, testing::ValuesIn(shm_params()), param_name);

}  // namespace
}  // namespace cvt
