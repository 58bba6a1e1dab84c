// Direct mapping (docs/SHM.md): the initiator maps the target's regions from
// allocate_memory and serves READ, WRITE and atomics itself; rights, bounds,
// deregistration, sharing one mapping, and the switch that turns it off.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"
#include "shm_fixture.hpp"

namespace cvt {
namespace {

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
INSTANTIATE_TEST_SUITE_P(shm, shm_direct, testing::ValuesIn(shm_params()), param_name);

}  // namespace
}  // namespace cvt
