// What only the shm provider promises about moving data: which bulk data path
// a connection uses (cross-memory attach, or staging through the rings when
// forced), that both move the right bytes, that nothing is left in any
// filesystem, and which addresses it listens on. The rest of the shm-only
// promises: shm_engine_test.cpp (engine atomics, wake-ups, idle CPU, cold
// QPs), shm_direct_test.cpp (direct mapping), shm_parity_test.cpp (a peer that
// refuses cross-memory attach; soft/shm parity).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"
#include "shm_fixture.hpp"

namespace cvt {
namespace {

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

}  // namespace
}  // namespace cvt
