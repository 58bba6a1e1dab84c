// What only the shm provider promises: which bulk data path a connection uses
// (cross-memory attach, or staging through the rings when forced or refused),
// that both move the right bytes, that nothing is left in any filesystem, that
// engine atomics are atomic against the region owner's own atomics, and that an
// idle engine burns no CPU.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"
#include "common/process.hpp"
#include "common/script.hpp"

namespace cvt {
namespace {

using conveyor::access;
using conveyor::errc;
using conveyor::qp_state;
using conveyor::work_completion;
using std::chrono::milliseconds;

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

// Descriptors of this process that point at a Conveyor shm segment.
std::size_t segment_fds() {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().find("memfd:conveyor-shm") != std::string::npos) ++n;
  }
  return n;
}

// Mappings of this process backed by a Conveyor shm segment.
std::size_t segment_maps() {
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return 0;
  std::size_t n = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::string(line).find("memfd:conveyor-shm") != std::string::npos) ++n;
  }
  std::fclose(f);
  return n;
}

std::size_t dev_shm_entries() {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

TEST_P(shm_only, cross_memory_attach_is_the_default_bulk_path_and_moves_the_right_bytes) {
  ::unsetenv("CONVEYOR_SHM_CMA");
  ASSERT_NO_FATAL_FAILURE(connect_pair(big()));
  auto c = init.qp.connection();
  CVT_ASSERT_OK(c);
  // One process can always attach to itself.
  EXPECT_EQ(c->shm.value().data_path, "cma");
  EXPECT_EQ(tgt.qp.connection()->shm.value().data_path, "cma");
  bulk_round_trip();
  EXPECT_GT(tgt.qp.counters().reads_served, 0u);
}

TEST_P(shm_only, forced_staging_is_reported_and_moves_the_right_bytes) {
  ::setenv("CONVEYOR_SHM_CMA", "off", 1);
  ASSERT_NO_FATAL_FAILURE(connect_pair(big()));
  auto c = init.qp.connection();
  CVT_ASSERT_OK(c);
  EXPECT_EQ(c->shm.value().data_path, "staged");
  EXPECT_EQ(tgt.qp.connection()->shm.value().data_path, "staged");
  bulk_round_trip();
}

// Many bulk READs in flight at once, both data paths, sizes around the CMA
// threshold: every one completes, in order, with the right bytes.
TEST_P(shm_only, pipelined_bulk_reads_complete_in_order_on_both_data_paths) {
  for (const char* path : {"on", "off"}) {
    SCOPED_TRACE(std::string("CONVEYOR_SHM_CMA=") + path);
    ::setenv("CONVEYOR_SHM_CMA", path, 1);
    ASSERT_NO_FATAL_FAILURE(connect_pair(big()));
    auto sink = make_region(init.pd, 4 * MiB, access::local_write, 0x5500);
    CVT_ASSERT_OK(sink);
    const std::size_t sizes[] = {8, 8192, 64 * KiB, 1 * MiB};
    for (std::size_t sz : sizes) {
      SCOPED_TRACE("size " + std::to_string(sz));
      constexpr int n = 64, depth = 8;
      int posted = 0, done = 0;
      std::vector<work_completion> wcs;
      while (done < n) {
        while (posted < n && posted - done < depth) {
          const std::size_t off = static_cast<std::size_t>(posted % 4) * sz;
          CVT_ASSERT_POST_OK(
              init.qp.post_read(sink->sge(off, sz), tgt_main.remote(off, sz), posted));
          ++posted;
        }
        ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(sz), &wcs));
        EXPECT_EQ(wcs.back().wr_id, static_cast<std::uint64_t>(done));
        ++done;
      }
      EXPECT_TRUE(ok(check_pattern(sink->bytes().subspan(0, 4 * sz), opts_.tgt_region_seed)));
    }
    reset_pair();
  }
}

TEST_P(shm_only, segments_live_in_memfds_only_and_vanish_with_the_qps) {
  const std::size_t fs_before = dev_shm_entries();
  const std::size_t maps_before = segment_maps();
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  EXPECT_EQ(segment_maps(), maps_before + 2) << "each side maps the connection's segment once";
  EXPECT_EQ(segment_fds(), 0u) << "the segment's descriptor is closed once both sides mapped it";
  EXPECT_EQ(dev_shm_entries(), fs_before) << "nothing may appear in /dev/shm";
  ASSERT_FALSE(listen_address_.empty());
  EXPECT_EQ(listen_address_[0], '@') << "the suites listen on abstract names";
  reset_pair();
  EXPECT_EQ(segment_maps(), maps_before) << "the segment outlived its QPs";
}

TEST_P(shm_only, listener_on_a_socket_path_works_and_removes_its_file) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  const std::string path = "/tmp/cvt-shm-" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  {
    auto lis = conveyor::listener::bind(tgt.dev, path);
    CVT_ASSERT_OK(lis);
    EXPECT_TRUE(std::filesystem::exists(path));
    std::string err;
    std::thread acceptor([&] {
      auto req = lis->accept(scaled(milliseconds(10000)));
      if (!req) {
        err = req.error().to_string();
        return;
      }
      auto r = req->accept(tgt.qp, tgt_main.remote().encode());
      if (!r) err = r.error().to_string();
    });
    auto info = conveyor::connect(init.qp, path, {.timeout = scaled(milliseconds(10000))});
    acceptor.join();
    CVT_ASSERT_OK(info);
    ASSERT_EQ(err, "");
    auto back = make_region(init.pd, 4096, access::local_write, 0x5300);
    CVT_ASSERT_OK(back);
    CVT_ASSERT_POST_OK(init.qp.post_read(back->sge(0, 4096), tgt_main.remote(0, 4096), 3));
    ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(4096)));
    EXPECT_TRUE(ok(check_pattern(back->bytes(), opts_.tgt_region_seed)));
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "the listener left its socket file behind";
}

TEST_P(shm_only, a_tcp_address_is_an_address_error) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  CVT_EXPECT_ERRC(conveyor::listener::bind(tgt.dev, "127.0.0.1:0"), errc::address_error);
  CVT_EXPECT_ERRC(conveyor::connect(init.qp, "127.0.0.1:7471", {.timeout = milliseconds(500)}),
                  errc::address_error);
}

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

// ---- direct mapping (docs/SHM.md): regions from allocate_memory ----

// Mappings of this process backed by an allocated region, with their permissions.
std::vector<std::string> region_map_perms() {
  std::vector<std::string> out;
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    const std::string l(line);
    const auto sp = l.find(' ');
    if (l.find("memfd:conveyor-mr") != std::string::npos && sp != std::string::npos)
      out.push_back(l.substr(sp + 1, 4));
  }
  std::fclose(f);
  return out;
}

class shm_direct : public shm_only {
 protected:
  void TearDown() override {
    shm_only::TearDown();
    ::unsetenv("CONVEYOR_SHM_DIRECT");
  }
  // A target region from allocate_memory, filled with pattern `seed`.
  conveyor::memory_region alloc_target(std::size_t n, access rights, std::uint64_t seed) {
    auto mr = tgt.pd.allocate_memory(n, rights);
    EXPECT_TRUE(mr.has_value()) << (mr ? "" : mr.error().to_string());
    if (!mr) return {};
    fill_pattern(std::span<std::byte>(mr->data(), n), seed);
    // The target's engine may touch the region only after this thread's writes
    // (TSan cannot follow the order through the shared rings in one process;
    // the target's receive queue lock carries it).
    EXPECT_TRUE(sync_target(op_timeout(64)));
    return std::move(*mr);
  }
  // READs 8 bytes of `r` until the initiator serves them through its mapping
  // (the first goes to the target's engine and asks for the mapping).
  testing::AssertionResult map_it(const conveyor::remote_region& r) {
    auto sink = make_region(init.pd, 8, access::local_write, 0);
    if (!sink) return testing::AssertionFailure() << sink.error().to_string();
    const auto before = init.qp.counters().shm.value().direct_ops;
    for (int i = 0; i < 200; ++i) {
      if (init.qp.post_read(sink->sge(0, 8), r.slice(0, 8), 0x3a00 + i) != errc::ok)
        return testing::AssertionFailure() << "post_read failed";
      if (auto w = wait_ok(init.send_reader(), 1, op_timeout(8)); !w) return w;
      if (init.qp.counters().shm.value().direct_ops > before) return testing::AssertionSuccess();
      std::this_thread::sleep_for(milliseconds(1));
    }
    return testing::AssertionFailure() << "the region was never mapped";
  }
};

TEST_P(shm_direct, allocated_regions_are_served_by_the_initiator_without_the_targets_engine) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_ATOMICS();
  EXPECT_TRUE(init.qp.connection()->shm.value().direct_mapping);
  constexpr std::size_t n = 64 * KiB;
  auto region = alloc_target(n, all_rights, 0x6100);
  ASSERT_TRUE(region);
  ASSERT_TRUE(map_it(region.remote()));
  const auto t0 = tgt.qp.counters();
  const auto d0 = init.qp.counters().shm.value().direct_ops;

  auto src = make_region(init.pd, 4096, access::local_write, 0x6200);
  CVT_ASSERT_OK(src);
  auto back = make_region(init.pd, n, access::local_write, 0);
  CVT_ASSERT_OK(back);
  auto res = make_region(init.pd, 16, access::local_write, 0);
  CVT_ASSERT_OK(res);
  std::uint64_t a = 41, b = 0x1234;
  std::memcpy(region.data() + 8192, &a, 8);
  std::memcpy(region.data() + 8200, &b, 8);
  ASSERT_TRUE(sync_target(op_timeout(64)));
  CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 4096), region.remote().slice(100, 4096), 1));
  ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(4096)));
  CVT_ASSERT_POST_OK(init.qp.post_fetch_add(res->sge(0, 8), region.remote().slice(8192, 8), 1, 2));
  ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(8)));
  CVT_ASSERT_POST_OK(
      init.qp.post_cmp_swap(res->sge(8, 8), region.remote().slice(8200, 8), 0x1234, 0x99, 3));
  ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(8)));
  CVT_ASSERT_POST_OK(init.qp.post_read(back->sge(0, n), region.remote(), 4));
  ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(n)));

  EXPECT_EQ(init.qp.counters().shm.value().direct_ops, d0 + 4)
      << "all four were to be served directly";
  const auto t1 = tgt.qp.counters();
  EXPECT_EQ(t1.writes_placed, t0.writes_placed) << "the target's engine placed a WRITE";
  EXPECT_EQ(t1.reads_served, t0.reads_served) << "the target's engine served a READ";
  EXPECT_EQ(t1.atomics_served, t0.atomics_served) << "the target's engine ran an atomic";
  // The owner sees every change in its own memory, and the READ saw them too.
  EXPECT_TRUE(ok(check_pattern(std::span<const std::byte>(region.data() + 100, 4096), 0x6200)));
  EXPECT_TRUE(ok(check_pattern(std::span<const std::byte>(region.data(), 100), 0x6100)));
  std::uint64_t v[2];
  std::memcpy(v, res->data(), 16);
  EXPECT_EQ(v[0], 41u);
  EXPECT_EQ(v[1], 0x1234u);
  std::memcpy(v, region.data() + 8192, 16);
  EXPECT_EQ(v[0], 42u);
  EXPECT_EQ(v[1], 0x99u);
  EXPECT_EQ(std::memcmp(back->data(), region.data(), n), 0) << "the READ differs from the region";
}

// Every post_send carries two WRITEs: the first to plain registered memory
// (never mapped: the target's engine executes it), the second to an allocated
// region. So the second never finds the send queue empty. Once the mapping has
// arrived it waits for the first to complete, then goes direct: completions
// stay in posting order and every slot ends with its last WRITE. (The switch
// used to need an empty send queue at post time: such a stream never made it,
// and a bandwidth run that kept its queue full stayed on the engine path.)
TEST_P(shm_direct, a_request_behind_one_in_flight_still_moves_to_the_mapping) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  constexpr int slots = 64, rounds = 500;
  auto mapped = alloc_target(slots * 8, all_rights, 0x6900);
  ASSERT_TRUE(mapped);
  std::vector<std::byte> plain_buf(slots * 8);
  auto plain = tgt.pd.register_memory(std::span(plain_buf), all_rights);
  CVT_ASSERT_OK(plain);
  ASSERT_TRUE(sync_target(op_timeout(64)));
  auto src = make_region(init.pd, 2 * rounds * 8, access::local_write, 0);
  CVT_ASSERT_OK(src);
  for (std::uint64_t i = 0; i < 2 * rounds; ++i) std::memcpy(src->data() + 8 * i, &i, 8);
  const auto d0 = init.qp.counters().shm.value().direct_ops;
  const auto tx0 = init.qp.counters().tx_bytes;
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t i = 2 * r;
    const conveyor::sge sg[2] = {src->sge(8 * i, 8), src->sge(8 * (i + 1), 8)};
    const auto to_plain = plain->remote().slice(8 * (r % slots), 8);
    const auto to_mapped = mapped.remote().slice(8 * (r % slots), 8);
    const conveyor::send_wr wrs[2] = {{.wr_id = 0x7000 + i,
                                       .opcode = conveyor::wr_opcode::rdma_write,
                                       .sg_list = std::span(&sg[0], 1),
                                       .remote_addr = to_plain.addr,
                                       .rkey = to_plain.rkey},
                                      {.wr_id = 0x7001 + i,
                                       .opcode = conveyor::wr_opcode::rdma_write,
                                       .sg_list = std::span(&sg[1], 1),
                                       .remote_addr = to_mapped.addr,
                                       .rkey = to_mapped.rkey}};
    CVT_ASSERT_POST_OK(init.qp.post_send(std::span(wrs)));
    std::vector<work_completion> wcs;
    ASSERT_TRUE(wait(init.send_reader(), 2, op_timeout(8), wcs));
    for (std::uint64_t k = 0; k < 2; ++k)
      ASSERT_TRUE(ok(check_wc(wcs[k], conveyor::wc_status::success, conveyor::wc_opcode::rdma_write,
                              0x7000 + i + k)))
          << "round " << r << ": completion " << k << " out of order";
  }
  EXPECT_GT(init.qp.counters().shm.value().direct_ops - d0, 0u)
      << "no WRITE behind one in flight used the mapping";
  EXPECT_EQ(init.qp.counters().tx_bytes - tx0, 2u * rounds * 8)
      << "every WRITE's bytes are counted, direct or not";
  ASSERT_TRUE(sync_target(op_timeout(64)));
  for (std::uint64_t j = 0; j < slots; ++j) {
    const std::uint64_t last_round = (rounds - 1) - ((rounds - 1 - j) % slots);
    std::uint64_t v = 0;
    std::memcpy(&v, plain_buf.data() + 8 * j, 8);
    EXPECT_EQ(v, 2 * last_round) << "plain slot " << j;
    std::memcpy(&v, mapped.data() + 8 * j, 8);
    EXPECT_EQ(v, 2 * last_round + 1) << "mapped slot " << j;
  }
}

TEST_P(shm_direct, a_read_only_key_is_mapped_read_only_and_a_write_to_it_is_refused) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto region = alloc_target(8192, access::local_write | access::remote_read, 0x6300);
  ASSERT_TRUE(region);
  ASSERT_TRUE(map_it(region.remote()));
  const auto perms = region_map_perms();
  // The owner's own mapping is rw-s; the initiator's is r--s.
  EXPECT_NE(std::find(perms.begin(), perms.end(), "r--s"), perms.end())
      << "no read-only mapping of the region";
  auto src = make_region(init.pd, 64, access::local_write, 0x6400);
  CVT_ASSERT_OK(src);
  CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 64), region.remote().slice(0, 64), 9));
  std::vector<work_completion> wcs;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(64), wcs));
  EXPECT_TRUE(ok(
      check_wc(wcs[0], conveyor::wc_status::rem_access_err, conveyor::wc_opcode::rdma_write, 9)));
  EXPECT_TRUE(ok(check_pattern(std::span<const std::byte>(region.data(), 8192), 0x6300)));
}

TEST_P(shm_direct, out_of_bounds_on_a_mapped_region_is_rem_access_err_and_touches_nothing) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto region =
      alloc_target(4096 + 100, all_rights, 0x6500);  // the page's tail is not the region's
  ASSERT_TRUE(region);
  ASSERT_TRUE(map_it(region.remote()));
  const std::vector<std::byte> before(region.data(), region.data() + 8192);
  auto src = make_region(init.pd, 64, access::local_write, 0x6600);
  CVT_ASSERT_OK(src);
  CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 64), region.remote().slice(4096 + 80, 64), 5));
  std::vector<work_completion> wcs;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(64), wcs));
  EXPECT_TRUE(ok(
      check_wc(wcs[0], conveyor::wc_status::rem_access_err, conveyor::wc_opcode::rdma_write, 5)));
  EXPECT_EQ(std::memcmp(before.data(), region.data(), before.size()), 0) << "bytes changed";
}

// Resident kilobytes of each mapping of an allocated region of this process
// whose size is `size_kb`.
std::vector<long> region_map_rss_kb(long size_kb) {
  std::vector<long> out;
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return out;
  char line[512];
  bool ours = false, sized = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    const std::string l(line);
    long kb = 0;
    if (l.find("memfd:conveyor-mr") != std::string::npos) {
      ours = true;
      sized = false;
    } else if (std::sscanf(line, "Size: %ld kB", &kb) == 1) {
      sized = ours && kb == size_kb;
    } else if (std::sscanf(line, "Rss: %ld kB", &kb) == 1) {
      if (sized) out.push_back(kb);
      ours = sized = false;
    }
  }
  std::fclose(f);
  return out;
}

// Mapping a peer's region is done in the engine's step with the QP locked:
// populating a multi-GiB store there stalled every request of the connection
// for seconds (32 kv clients mapping a 3 GiB store on 2 CPUs timed out their
// first GETs). A large region is mapped without populating it, and reads are
// still right anywhere in it.
TEST_P(shm_direct, a_large_region_is_mapped_without_populating_it_all) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  constexpr std::size_t n = 256 * MiB;
  auto mr = tgt.pd.allocate_memory(n, all_rights);
  ASSERT_TRUE(mr.has_value()) << mr.error().to_string();
  const std::uint64_t deep = 0x5eedf00dull;
  std::memcpy(mr->data() + n - 4096, &deep, 8);
  ASSERT_TRUE(sync_target(op_timeout(64)));
  ASSERT_TRUE(map_it(mr->remote()));
  // Two mappings of it now: the owner's, populated by allocate_memory, and
  // the initiator's, with only what it touched.
  const auto rss = region_map_rss_kb(static_cast<long>(n / KiB));
  ASSERT_EQ(rss.size(), 2u) << "expected the owner's and the initiator's mapping";
  EXPECT_LT(std::min(rss[0], rss[1]), 64 * 1024)
      << "the initiator populated the whole region (" << std::min(rss[0], rss[1]) << " kB)";
  auto sink = make_region(init.pd, 8, access::local_write, 0);
  CVT_ASSERT_OK(sink);
  const auto d0 = init.qp.counters().shm.value().direct_ops;
  CVT_ASSERT_POST_OK(init.qp.post_read(sink->sge(0, 8), mr->remote().slice(n - 4096, 8), 0x3b00));
  ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(8)));
  EXPECT_EQ(init.qp.counters().shm.value().direct_ops, d0 + 1);
  std::uint64_t got = 0;
  std::memcpy(&got, sink->data(), 8);
  EXPECT_EQ(got, deep);
}

TEST_P(shm_direct, deregistration_revokes_a_mapping_in_use_and_later_access_fails) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto region = alloc_target(64 * KiB, all_rights, 0x6700);
  ASSERT_TRUE(region);
  ASSERT_TRUE(map_it(region.remote()));
  const auto remote = region.remote();
  const auto d0 = init.qp.counters().shm.value().direct_ops;
  auto src = make_region(init.pd, 64 * KiB, access::local_write, 0x6800);
  CVT_ASSERT_OK(src);
  // WRITEs stream in while the owner deregisters (and so frees) the region:
  // each completes successfully until one fails with rem_access_err; the rest
  // flush. Nothing crashes, nothing hangs.
  std::atomic<bool> go{false};
  std::thread owner([&] {
    while (!go.load()) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(5));
    region.deregister();
  });
  bool failed = false;
  int ok_count = 0;
  for (int i = 0; i < 100000 && !failed; ++i) {
    if (i == 10) go.store(true);
    CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 64 * KiB), remote, 0x6000 + i));
    std::vector<work_completion> wcs;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(64 * KiB), wcs));
    if (wcs[0].status == conveyor::wc_status::success) {
      ++ok_count;
      continue;
    }
    EXPECT_TRUE(ok(check_wc(wcs[0], conveyor::wc_status::rem_access_err,
                            conveyor::wc_opcode::rdma_write, 0x6000 + i)));
    failed = true;
  }
  go.store(true);
  owner.join();
  EXPECT_TRUE(failed) << "WRITEs to a deregistered region kept succeeding";
  EXPECT_GE(ok_count, 10);
  // At least the ten before the owner started went through the mapping (one
  // racing the revocation may reach the engine while the key is still live).
  EXPECT_GE(init.qp.counters().shm.value().direct_ops - d0, 10u)
      << "the stream did not use the mapping";
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(milliseconds(5000))));
}

TEST_P(shm_direct, direct_atomics_are_atomic_against_the_owner_and_the_targets_engine) {
  if (manual()) GTEST_SKIP() << "the second connection is driven by engine threads";
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_ATOMICS();
  auto region = alloc_target(4096, all_rights, 0);
  ASSERT_TRUE(region);
  auto* word = reinterpret_cast<std::uint64_t*>(region.data() + 64);
  std::atomic_ref<std::uint64_t>(*word).store(0);
  ASSERT_TRUE(map_it(region.remote()));

  // A second initiator that may not map (CONVEYOR_SHM_DIRECT=off on its device):
  // its fetch-adds run in the target's engine, on the same word.
  ::setenv("CONVEYOR_SHM_DIRECT", "off", 1);
  auto dev2 = conveyor::device::open("shm:nodirect");
  ::unsetenv("CONVEYOR_SHM_DIRECT");
  CVT_ASSERT_OK(dev2);
  auto pd2 = dev2->alloc_pd();
  CVT_ASSERT_OK(pd2);
  auto cq2 = dev2->create_cq({.depth = 64});
  CVT_ASSERT_OK(cq2);
  auto qp2 = pd2->create_qp({.send_cq = &*cq2, .recv_cq = &*cq2});
  CVT_ASSERT_OK(qp2);
  auto tcq = tgt.dev.create_cq({.depth = 64});
  CVT_ASSERT_OK(tcq);
  auto tqp = tgt.pd.create_qp({.send_cq = &*tcq, .recv_cq = &*tcq});
  CVT_ASSERT_OK(tqp);
  const std::string addr = "@cvt-direct-" + std::to_string(::getpid());
  auto lis = conveyor::listener::bind(tgt.dev, addr);
  CVT_ASSERT_OK(lis);
  ASSERT_TRUE(connect_extra(*lis, addr, *qp2, *tqp));
  EXPECT_FALSE(qp2->connection()->shm.value().direct_mapping);
  auto res2 = pd2->allocate_memory(8, access::local_write);
  CVT_ASSERT_OK(res2);
  auto res1 = make_region(init.pd, 8, access::local_write, 0);
  CVT_ASSERT_OK(res1);

  constexpr int n = 3000;
  std::atomic<int> errors{0};
  std::thread engine_side([&] {
    for (int i = 0; i < n; ++i) {
      if (qp2->post_fetch_add(res2->as_sge(), region.remote().slice(64, 8), 1, i) != errc::ok) {
        ++errors;
        return;
      }
      conveyor::work_completion wc;
      auto got = cq2->wait(std::span(&wc, 1), scaled(milliseconds(10000)));
      if (!got || *got != 1 || wc.status != conveyor::wc_status::success) {
        ++errors;
        return;
      }
    }
  });
  std::thread owner([&] {
    std::atomic_ref<std::uint64_t> w(*word);
    for (int i = 0; i < n; ++i) w.fetch_add(1);
  });
  const auto d0 = init.qp.counters().shm.value().direct_ops;
  for (int i = 0; i < n; ++i) {
    CVT_ASSERT_POST_OK(init.qp.post_fetch_add(res1->sge(0, 8), region.remote().slice(64, 8), 1, i));
    ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(8)));
  }
  engine_side.join();
  owner.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(init.qp.counters().shm.value().direct_ops - d0, static_cast<std::uint64_t>(n));
  EXPECT_EQ(tqp->counters().atomics_served, static_cast<std::uint64_t>(n));
  EXPECT_EQ(std::atomic_ref<std::uint64_t>(*word).load(), 3u * n) << "an increment was lost";
}

// Every QP of a device that maps the same region shares one mapping of it: four
// QPs to one peer region add one mapping to this process, not four (a thousand
// QPs each mapping a 64 MiB region made bench/compare's many-connection rows
// collapse to 1% of one QP's bandwidth). Each QP still makes its own checks,
// and each serves its accesses directly.
TEST_P(shm_direct, qps_mapping_the_same_region_share_one_mapping) {
  if (manual()) GTEST_SKIP() << "the extra connections are driven by engine threads";
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto region = alloc_target(64 * KiB, all_rights, 0x6c00);
  ASSERT_TRUE(region);
  const std::size_t before = region_map_perms().size();
  ASSERT_TRUE(map_it(region.remote()));
  const std::size_t one = region_map_perms().size();
  EXPECT_EQ(one, before + 1) << "the first QP's mapping";

  constexpr int extra = 3;
  const std::string addr = "@cvt-share-" + std::to_string(::getpid());
  auto lis = conveyor::listener::bind(tgt.dev, addr);
  CVT_ASSERT_OK(lis);
  auto cq = init.dev.create_cq({.depth = 64});
  CVT_ASSERT_OK(cq);
  auto tcq = tgt.dev.create_cq({.depth = 64});
  CVT_ASSERT_OK(tcq);
  auto sink = make_region(init.pd, 8, access::local_write, 0);
  CVT_ASSERT_OK(sink);
  std::vector<conveyor::queue_pair> qps, tqps;
  for (int k = 0; k < extra; ++k) {
    ASSERT_TRUE(add_extra_pair(*lis, addr, *cq, *tcq, qps, tqps)) << "extra QP " << k;
    auto* qp = &qps.back();
    // READs until this QP serves one through its mapping (the first asks for it).
    bool direct = false;
    for (int i = 0; i < 200 && !direct; ++i) {
      CVT_ASSERT_POST_OK(qp->post_read(sink->sge(0, 8), region.remote().slice(0, 8), i));
      conveyor::work_completion wc;
      auto got = cq->wait(std::span(&wc, 1), op_timeout(8));
      ASSERT_TRUE(got && *got == 1 && wc.status == conveyor::wc_status::success);
      direct = qp->counters().shm.value().direct_ops > 0;
      if (!direct) std::this_thread::sleep_for(milliseconds(1));
    }
    ASSERT_TRUE(direct) << "extra QP " << k << " never mapped the region";
    EXPECT_TRUE(ok(check_pattern(std::span<const std::byte>(sink->data(), 8), 0x6c00)));
  }
  EXPECT_EQ(region_map_perms().size(), one)
      << extra << " more QPs mapping the same region added mappings of it";
}

TEST_P(shm_direct, direct_mapping_off_keeps_every_access_in_the_targets_engine) {
  ::setenv("CONVEYOR_SHM_DIRECT", "off", 1);
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  EXPECT_FALSE(init.qp.connection()->shm.value().direct_mapping);
  auto region = alloc_target(4096, all_rights, 0x6900);
  ASSERT_TRUE(region);
  auto sink = make_region(init.pd, 4096, access::local_write, 0);
  CVT_ASSERT_OK(sink);
  for (int i = 0; i < 20; ++i) {
    CVT_ASSERT_POST_OK(init.qp.post_read(sink->sge(0, 4096), region.remote(), i));
    ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(4096)));
  }
  EXPECT_EQ(init.qp.counters().shm.value().direct_ops, 0u);
  EXPECT_EQ(tgt.qp.counters().reads_served, 20u);
  EXPECT_TRUE(ok(check_pattern(sink->bytes(), 0x6900)));
}

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

std::vector<provider_param> shm_params() {
  return {{"shm", conveyor::progress_mode::thread}, {"shm", conveyor::progress_mode::manual}};
}

INSTANTIATE_TEST_SUITE_P(shm, shm_only, testing::ValuesIn(shm_params()), param_name);
INSTANTIATE_TEST_SUITE_P(shm, shm_direct, testing::ValuesIn(shm_params()), param_name);
INSTANTIATE_TEST_SUITE_P(shm, shm_process, testing::ValuesIn(shm_params()), param_name);

}  // namespace
}  // namespace cvt
