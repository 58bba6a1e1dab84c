// What only the shm provider promises: which bulk data path a connection uses
// (cross-memory attach, or staging through the rings when forced or refused),
// that both move the right bytes, that nothing is left in any filesystem, that
// engine atomics are atomic against the region owner's own atomics, and that an
// idle engine burns no CPU.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
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
  EXPECT_EQ(c->data_path, "cma");
  EXPECT_EQ(tgt.qp.connection()->data_path, "cma");
  bulk_round_trip();
  EXPECT_GT(tgt.qp.counters().reads_served, 0u);
}

TEST_P(shm_only, forced_staging_is_reported_and_moves_the_right_bytes) {
  ::setenv("CONVEYOR_SHM_CMA", "off", 1);
  ASSERT_NO_FATAL_FAILURE(connect_pair(big()));
  auto c = init.qp.connection();
  CVT_ASSERT_OK(c);
  EXPECT_EQ(c->data_path, "staged");
  EXPECT_EQ(tgt.qp.connection()->data_path, "staged");
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
  auto result = make_region(init.pd, 8, access::local_write, 0x5400);
  CVT_ASSERT_OK(result);
  auto* word = reinterpret_cast<std::uint64_t*>(tgt_main.bytes().data() + 64);
  std::atomic_ref<std::uint64_t>(*word).store(0);
  constexpr int n = 2000;
  std::thread owner([&] {
    std::atomic_ref<std::uint64_t> w(*word);
    for (int i = 0; i < n; ++i) w.fetch_add(1);
  });
  for (int i = 0; i < n; ++i) {
    CVT_ASSERT_POST_OK(init.qp.post_fetch_add(result->sge(0, 8), tgt_main.remote(64, 8), 1, i));
    ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(8)));
  }
  owner.join();
  EXPECT_EQ(std::atomic_ref<std::uint64_t>(*word).load(), 2u * n) << "an increment was lost";
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
  EXPECT_TRUE(ok(check_wc(iw[0], conveyor::wc_status::rnr_retry_exc_err,
                          conveyor::wc_opcode::send, 0x7a)));
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(milliseconds(5000))));
  EXPECT_TRUE(wait_state(tgt.qp, qp_state::error, scaled(milliseconds(5000))));
}

INSTANTIATE_TEST_SUITE_P(providers, parity, testing::ValuesIn(all_params()), param_name);

std::vector<provider_param> shm_params() {
  return {{"shm", conveyor::progress_mode::thread}, {"shm", conveyor::progress_mode::manual}};
}

INSTANTIATE_TEST_SUITE_P(shm, shm_only, testing::ValuesIn(shm_params()), param_name);
INSTANTIATE_TEST_SUITE_P(shm, shm_process, testing::ValuesIn(shm_params()), param_name);

}  // namespace
}  // namespace cvt
