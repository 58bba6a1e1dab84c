// The registration cache (include/conveyor/registration_cache.hpp) on every
// provider: hits, misses, containment, bounds, reference counts, and above all
// that memory freed, unmapped, remapped, shrunk or madvise(DONTNEED)-ed under a
// cached range is never served by the old registration, also across fork.
// Transfers go through the connected pair: the cached registration is the
// source of an RDMA WRITE into the target's main region.
#include <malloc.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"

namespace cvt {
namespace {

using conveyor::access;
using conveyor::cached_registration;
using conveyor::memory_monitor;
using conveyor::registration_cache;
using conveyor::registration_cache_options;

constexpr std::size_t page = 4096;

// An anonymous private mapping, unmapped at the end unless released.
struct mapping {
  std::byte* p = nullptr;
  std::size_t len = 0;
  explicit mapping(std::size_t n, void* at = nullptr, int extra = 0) : len(n) {
    void* r = ::mmap(at, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
    p = r == MAP_FAILED ? nullptr : static_cast<std::byte*>(r);
  }
  ~mapping() {
    if (p != nullptr) ::munmap(p, len);
  }
  std::span<std::byte> bytes(std::size_t off = 0, std::size_t n = 0) const {
    return {p + off, n == 0 ? len - off : n};
  }
  void fill(std::uint8_t seed) const {
    for (std::size_t i = 0; i < len; ++i)
      p[i] = std::byte(static_cast<std::uint8_t>(i * 31 + seed));
  }
};

class registration_cache_test : public pair_test {
 protected:
  registration_cache make_cache(registration_cache_options o = {}) {
    auto c = registration_cache::create(init.pd, o);
    EXPECT_TRUE(c.has_value()) << c.error().to_string();
    return c ? std::move(*c) : registration_cache();
  }
  // Skips unless the monitor runs (it does on Linux 6.11+ with userfaultfd).
  bool monitored(const registration_cache& c) { return c.monitor() == memory_monitor::userfaultfd; }
  // WRITEs the registration's bytes into the target's main region, READs them
  // back into a fresh local region and checks that they are exactly what the
  // memory holds now. The target's memory is touched by its engine only (a
  // load or store from this thread would race with it); every call follows a
  // change of the source bytes, so a stale registration leaves other bytes.
  testing::AssertionResult moves_current_bytes(const cached_registration& r, std::uint64_t id) {
    const std::size_t n = r.size();
    if (init.qp.post_write(r.as_sge(), peer.slice(0, n), id) != conveyor::errc::ok)
      return testing::AssertionFailure() << "post_write refused";
    auto w = wait_ok(init.send_reader(), 1, op_timeout(n));
    if (!w) return w;
    auto sink = make_region(init.pd, n, access::local_write, 0x5150 + id);
    if (!sink) return testing::AssertionFailure() << sink.error().to_string();
    if (init.qp.post_read(sink->sge(0, n), peer.slice(0, n), id + 1000) != conveyor::errc::ok)
      return testing::AssertionFailure() << "post_read refused";
    auto rd = wait_ok(init.send_reader(), 1, op_timeout(n));
    if (!rd) return rd;
    if (std::memcmp(sink->data(), r.data(), n) != 0)
      return testing::AssertionFailure() << "the target got other bytes than the memory holds now";
    return testing::AssertionSuccess();
  }
};

#define CVT_REQUIRE_MONITOR(c)                                                       \
  do {                                                                               \
    if (!monitored(c)) GTEST_SKIP() << "no monitor: " << (c).stats().monitor_status; \
  } while (0)

TEST_P(registration_cache_test, second_acquire_of_a_range_is_a_hit_and_a_contained_range_too) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  mapping m(16 * page);
  ASSERT_NE(m.p, nullptr);
  auto a = cache.acquire(m.bytes(), access::local_write | access::remote_read);
  CVT_ASSERT_OK(a);
  EXPECT_TRUE(a->cached());
  auto b = cache.acquire(m.bytes(), access::local_write);  // fewer rights: a hit
  CVT_ASSERT_OK(b);
  EXPECT_EQ(b->lkey(), a->lkey());
  auto c = cache.acquire(m.bytes(100, 5000), access::remote_read);  // inside: a hit
  CVT_ASSERT_OK(c);
  EXPECT_EQ(c->lkey(), a->lkey());
  EXPECT_EQ(c->data(), m.p + 100);
  EXPECT_EQ(c->size(), 5000u);
  EXPECT_EQ(c->as_sge().addr, reinterpret_cast<std::uintptr_t>(m.p + 100));
  EXPECT_EQ(c->remote().length, 5000u);
  auto d = cache.acquire(m.bytes(), access::local_write | access::remote_write);  // more rights
  CVT_ASSERT_OK(d);
  EXPECT_NE(d->lkey(), a->lkey());
  auto st = cache.stats();
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 2u);
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.in_use, 4u);
  EXPECT_TRUE(moves_current_bytes(*c, 1));
}

TEST_P(registration_cache_test, an_entry_in_use_keeps_its_registration_until_the_last_release) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  mapping m(4 * page);
  m.fill(3);
  auto a = cache.acquire(m.bytes(), access::none);
  CVT_ASSERT_OK(a);
  auto b = cache.acquire(m.bytes(), access::none);
  CVT_ASSERT_OK(b);
  cache.flush();  // both in use: nothing goes
  EXPECT_EQ(cache.stats().entries, 1u);
  a->release();
  EXPECT_FALSE(*a);
  cache.flush();
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_TRUE(moves_current_bytes(*b, 2)) << "the registration went while a handle held it";
  b->release();
  EXPECT_EQ(cache.stats().entries, 1u) << "released entries stay cached";
  cache.flush();
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.in_use, 0u);
  EXPECT_EQ(st.evictions, 1u);
}

TEST_P(registration_cache_test, bounds_evict_the_least_recently_used_unused_entry) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache({.max_entries = 2, .max_bytes = 64 * page});
  CVT_REQUIRE_MONITOR(cache);
  mapping m(128 * page);
  for (int i = 0; i < 3; ++i) {  // 0, 1, 2: 0 is the least recently used
    auto r = cache.acquire(m.bytes(i * 8 * page, page), access::local_write);
    CVT_ASSERT_OK(r);
  }
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.evictions, 1u);
  auto again = cache.acquire(m.bytes(2 * 8 * page, page), access::local_write);  // hit
  EXPECT_EQ(cache.stats().hits, 1u);
  auto first = cache.acquire(m.bytes(0, page), access::local_write);  // evicted: a miss
  EXPECT_EQ(cache.stats().misses, 4u);
  // Over max_bytes: registered, handed out uncached, deregistered at release.
  auto big = cache.acquire(m.bytes(0, 65 * page), access::local_write);
  CVT_ASSERT_OK(big);
  EXPECT_FALSE(big->cached());
  // Every entry in use: a new range cannot evict and is uncached too.
  auto third = cache.acquire(m.bytes(100 * page, page), access::local_write);
  CVT_ASSERT_OK(third);
  EXPECT_FALSE(third->cached());
  EXPECT_LE(cache.stats().entries, 2u);
}

// The heart of it: same address, new memory, new contents.
TEST_P(registration_cache_test, memory_remapped_at_the_same_address_moves_its_new_contents) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  const std::size_t n = 64 * page;
  // Between the munmap and the new mmap another thread of the process (the
  // shm engine, ASan's allocator) may take the range: MAP_FIXED_NOREPLACE
  // then fails, and the whole cycle is tried again at a new address (ASan
  // once failed this way in a fresh clone's run; 0 in 24 reruns).
  std::optional<mapping> again;
  for (int attempt = 0; attempt < 5 && !again; ++attempt) {
    std::byte* at = nullptr;
    {
      mapping m(n);
      ASSERT_NE(m.p, nullptr);
      m.fill(1);
      at = m.p;
      auto r = cache.acquire(m.bytes(), access::none);
      CVT_ASSERT_OK(r);
      EXPECT_TRUE(moves_current_bytes(*r, 3));
    }  // released, then unmapped
    EXPECT_EQ(cache.stats().entries, 0u) << "munmap left the entry";
    again.emplace(n, at, MAP_FIXED_NOREPLACE);
    if (again->p != at) again.reset();
  }
  ASSERT_TRUE(again) << "could not map the same address again in 5 tries";
  again->fill(2);
  auto r = cache.acquire(again->bytes(), access::none);
  CVT_ASSERT_OK(r);
  EXPECT_EQ(cache.stats().hits, 0u) << "a stale entry was served";
  EXPECT_TRUE(moves_current_bytes(*r, 4));
}

// glibc: a block above M_MMAP_THRESHOLD that no free heap chunk can hold gets
// its own mapping (IS_MMAPPED in its chunk header) and free() unmaps it. A
// block served from the heap instead stays mapped across free/malloc: the same
// pages, so a hit is then right; the transfer must move the new bytes either way.
bool glibc_mmapped(const void* p) {
  return (static_cast<const std::size_t*>(p)[-1] & 2) != 0;
}

TEST_P(registration_cache_test, malloc_free_malloc_at_the_same_address_moves_the_new_contents) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  if (mallopt(M_MMAP_THRESHOLD, 128 * 1024) != 1)  // fixed: no dynamic threshold
    GTEST_SKIP() << "glibc's malloc is not the allocator here (ASan's refuses mallopt)";
  const std::size_t n = 8 * 1024 * 1024;  // larger than any free heap chunk here
  auto* p = static_cast<std::byte*>(std::malloc(n));
  ASSERT_NE(p, nullptr);
  const bool mmapped = glibc_mmapped(p);
  std::memset(p, 0x11, n);
  {
    auto r = cache.acquire({p, n / 8}, access::none);
    CVT_ASSERT_OK(r);
    EXPECT_TRUE(r->cached());
    EXPECT_TRUE(moves_current_bytes(*r, 5));
  }
  std::free(p);
  if (mmapped) {
    EXPECT_EQ(cache.stats().entries, 0u) << "free() unmapped the block, the entry stayed";
  }
  auto* q = static_cast<std::byte*>(std::malloc(n));
  ASSERT_EQ(q, p) << "malloc gave another address; the test needs the same one";
  std::memset(q, 0x22, n);
  auto r = cache.acquire({q, n / 8}, access::none);
  CVT_ASSERT_OK(r);
  if (mmapped) {
    EXPECT_EQ(cache.stats().hits, 0u) << "a stale entry was served";
  }
  EXPECT_TRUE(moves_current_bytes(*r, 6));
  r->release();
  std::free(q);
  if (!mmapped)
    GTEST_SKIP()
        << "malloc served the block from the heap (no unmap to see); the bytes moved right";
}

TEST_P(registration_cache_test, munmap_of_part_of_a_range_drops_its_entry) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  mapping m(8 * page);
  { auto r = cache.acquire(m.bytes(0, 4 * page), access::none); }
  { auto r = cache.acquire(m.bytes(4 * page, 4 * page), access::none); }
  EXPECT_EQ(cache.stats().entries, 2u);
  ASSERT_EQ(::munmap(m.p + 5 * page, page), 0);  // one page of the second range
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 1u) << "the unmapped range is still cached";
  EXPECT_EQ(st.invalidations, 1u);
  { auto r = cache.acquire(m.bytes(0, 4 * page), access::none); }
  EXPECT_EQ(cache.stats().hits, 1u) << "the untouched range was dropped too";
}

TEST_P(registration_cache_test, mremap_moved_or_shrunk_drops_the_entry) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  mapping m(32 * page);
  m.fill(5);
  { auto r = cache.acquire(m.bytes(), access::none); }
  // Shrunk in place.
  void* s = ::mremap(m.p, 32 * page, 16 * page, 0);
  ASSERT_EQ(s, m.p);
  m.len = 16 * page;
  EXPECT_EQ(cache.stats().entries, 0u) << "a shrunk range is still cached";
  { auto r = cache.acquire(m.bytes(), access::none); }
  EXPECT_EQ(cache.stats().entries, 1u);
  // Moved: the old address is empty, the new one holds the bytes.
  mapping dest(16 * page);
  ASSERT_NE(dest.p, nullptr);
  void* moved = ::mremap(m.p, 16 * page, 16 * page, MREMAP_MAYMOVE | MREMAP_FIXED, dest.p);
  ASSERT_EQ(moved, dest.p);
  m.p = nullptr;  // gone
  EXPECT_EQ(cache.stats().entries, 0u) << "a moved range is still cached";
  auto r = cache.acquire(dest.bytes(), access::none);
  CVT_ASSERT_OK(r);
  EXPECT_TRUE(moves_current_bytes(*r, 7));
}

TEST_P(registration_cache_test, madvise_dontneed_drops_the_entry) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  mapping m(16 * page);
  m.fill(9);
  { auto r = cache.acquire(m.bytes(), access::none); }
  ASSERT_EQ(::madvise(m.p + 2 * page, page, MADV_DONTNEED), 0);
  EXPECT_EQ(cache.stats().entries, 0u) << "madvise(DONTNEED) left the entry";
  m.fill(10);
  auto r = cache.acquire(m.bytes(), access::none);
  CVT_ASSERT_OK(r);
  EXPECT_EQ(cache.stats().hits, 0u);
  EXPECT_TRUE(moves_current_bytes(*r, 8));
}

TEST_P(registration_cache_test, shared_memory_is_registered_but_never_cached) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  void* p = ::mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x5a, 4 * page);
  {
    auto r = cache.acquire({static_cast<std::byte*>(p), 4 * page}, access::none);
    CVT_ASSERT_OK(r);
    EXPECT_FALSE(r->cached()) << "shared memory can change without an event";
    EXPECT_TRUE(moves_current_bytes(*r, 9));
  }
  EXPECT_EQ(cache.stats().entries, 0u);
  ::munmap(p, 4 * page);
}

TEST_P(registration_cache_test, a_disabled_cache_caches_nothing_and_says_why) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache({.enabled = false});
  EXPECT_EQ(cache.monitor(), memory_monitor::none);
  EXPECT_NE(cache.stats().monitor_status.find("disabled"), std::string::npos);
  mapping m(4 * page);
  m.fill(4);
  for (int i = 0; i < 2; ++i) {
    auto r = cache.acquire(m.bytes(), access::none);
    CVT_ASSERT_OK(r);
    EXPECT_FALSE(r->cached());
    EXPECT_TRUE(moves_current_bytes(*r, 10 + i));
  }
  auto st = cache.stats();
  EXPECT_EQ(st.hits, 0u);
  EXPECT_EQ(st.misses, 2u);
  EXPECT_EQ(st.entries, 0u);
}

TEST_P(registration_cache_test, conveyor_regcache_0_in_the_environment_disables_caching) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  ASSERT_EQ(::setenv("CONVEYOR_REGCACHE", "0", 1), 0);
  auto cache = make_cache();
  ::unsetenv("CONVEYOR_REGCACHE");
  EXPECT_EQ(cache.monitor(), memory_monitor::none);
  EXPECT_NE(cache.stats().monitor_status.find("CONVEYOR_REGCACHE=0"), std::string::npos)
      << cache.stats().monitor_status;
  mapping m(4 * page);
  { auto r = cache.acquire(m.bytes(), access::none); }
  auto r = cache.acquire(m.bytes(), access::none);
  CVT_ASSERT_OK(r);
  EXPECT_FALSE(r->cached());
  EXPECT_EQ(cache.stats().hits, 0u);
}

TEST_P(registration_cache_test, fork_leaves_the_parent_correct_and_the_child_uncached) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache();
  CVT_REQUIRE_MONITOR(cache);
  mapping m(16 * page);
  m.fill(11);
  { auto r = cache.acquire(m.bytes(), access::none); }
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: the monitor does not run here, so nothing may be served.
    int code = 0;
    if (cache.monitor() != memory_monitor::none) code |= 1;
    if (cache.stats().monitor_status.find("fork") == std::string::npos) code |= 2;
    m.fill(12);
    auto r = cache.acquire(m.bytes(), access::none);
    if (!r || r->cached() || cache.stats().hits != 0) code |= 4;
    _exit(code);
  }
  int status = 0;
  for (int i = 0; i < 1000 && ::waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the child did not finish in 10 s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child: 1 monitor, 2 status, 4 served a cached entry";
  // Parent: still monitored, the entry still valid, new bytes move.
  EXPECT_EQ(cache.monitor(), memory_monitor::userfaultfd);
  m.fill(13);
  auto r = cache.acquire(m.bytes(), access::none);
  CVT_ASSERT_OK(r);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_TRUE(moves_current_bytes(*r, 12));
  // And the monitor still sees the parent's unmaps.
  r->release();
  ::munmap(m.p + page, page);
  EXPECT_EQ(cache.stats().entries, 0u);
}

TEST_P(registration_cache_test, concurrent_acquire_release_and_unmap_stay_consistent) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache({.max_entries = 6, .max_bytes = 1 << 20});
  CVT_REQUIRE_MONITOR(cache);
  mapping shared_area(16 * page);
  std::atomic<bool> failed{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 400 && !failed; ++i) {
        std::size_t slot = rng() % 8;
        auto r = cache.acquire(shared_area.bytes(slot * 2 * page, 2 * page), access::local_write);
        if (!r || r->data() != shared_area.p + slot * 2 * page) failed = true;
      }
    });
  }
  ts.emplace_back([&] {  // churns its own mappings under the cache
    for (int i = 0; i < 100 && !failed; ++i) {
      mapping own(4 * page);
      own.fill(static_cast<std::uint8_t>(i));
      auto r = cache.acquire(own.bytes(), access::none);
      if (!r || std::memcmp(r->data(), own.p, own.len) != 0) failed = true;
    }
  });
  for (auto& t : ts) t.join();
  EXPECT_FALSE(failed);
  auto st = cache.stats();
  EXPECT_EQ(st.in_use, 0u);
  EXPECT_LE(st.entries, 6u);
  EXPECT_GT(st.hits, 0u);
}

// free() trimming the heap holds malloc's arena lock while brk() waits for the
// monitor to read the unmap event; a cache that allocated under its own lock
// (which the monitor needs) would deadlock here. A watchdog ends the process
// instead of hanging.
TEST_P(registration_cache_test, free_trimming_a_watched_heap_while_others_acquire_does_not_hang) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto cache = make_cache({.max_entries = 64, .max_bytes = 64 << 20});
  CVT_REQUIRE_MONITOR(cache);
  if (mallopt(M_MMAP_THRESHOLD, 4 << 20) != 1)  // 256 KiB blocks from the heap
    GTEST_SKIP() << "glibc's malloc is not the allocator here (ASan's refuses mallopt)";
  ASSERT_EQ(mallopt(M_TRIM_THRESHOLD, 0), 1);  // and every free at the top trims
  std::atomic<int> done{0};
  std::atomic<bool> failed{false};
  auto worker = [&](int seed, std::size_t size) {
    std::mt19937 rng(seed);
    for (int i = 0; i < 300 && !failed; ++i) {
      auto* p = static_cast<std::byte*>(std::malloc(size + rng() % 4096));
      if (p == nullptr) {
        failed = true;
        break;
      }
      std::memset(p, i, size);
      {
        auto r = cache.acquire({p, size}, access::local_write);
        if (!r) failed = true;
      }
      std::free(p);
    }
    ++done;
  };
  std::vector<std::thread> ts;
  ts.emplace_back(worker, 1, 256 * 1024);
  ts.emplace_back(worker, 2, 64);
  ts.emplace_back(worker, 3, 4096);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (done < 3) {
    std::fprintf(stderr, "registration cache: acquire/free deadlocked (watchdog)\n");
    std::_Exit(1);
  }
  for (auto& t : ts) t.join();
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  EXPECT_FALSE(failed);
  EXPECT_EQ(cache.stats().in_use, 0u);
}

INSTANTIATE_TEST_SUITE_P(providers, registration_cache_test, testing::ValuesIn(all_params()),
                         param_name);

}  // namespace
}  // namespace cvt
