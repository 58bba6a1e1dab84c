// The registration cache's /proc/self/maps reader (src/core/proc_maps.*), used
// where the kernel has no PROCMAP_QUERY (before 6.11): the line parser, the
// range check on made-up maps, and the real reader on this process's memory.
#include "core/proc_maps.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

using conveyor::detail::maps_entry;
using conveyor::detail::maps_private_anonymous;
using conveyor::detail::maps_range_check;
using conveyor::detail::parse_maps_line;

TEST(proc_maps, a_line_gives_its_range_sharing_device_and_inode) {
  maps_entry e;
  ASSERT_TRUE(
      parse_maps_line("7f0000001000-7f0000003000 rw-s 00001000 00:05 123456                     "
                      "/dev/zero (deleted)",
                      e));
  EXPECT_EQ(e.start, 0x7f0000001000u);
  EXPECT_EQ(e.end, 0x7f0000003000u);
  EXPECT_TRUE(e.shared);
  EXPECT_EQ(e.dev_major, 0u);
  EXPECT_EQ(e.dev_minor, 5u);
  EXPECT_EQ(e.inode, 123456u);
  EXPECT_FALSE(e.private_anonymous());
  ASSERT_TRUE(parse_maps_line("55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0   [heap]", e));
  EXPECT_TRUE(e.private_anonymous());
  ASSERT_TRUE(parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0", e));  // no name
  EXPECT_TRUE(e.private_anonymous());
  ASSERT_TRUE(parse_maps_line("400000-401000 r-xp 00000000 fe:01 2621 /usr/bin/x", e));
  EXPECT_EQ(e.dev_major, 0xfeu);
  EXPECT_FALSE(e.private_anonymous());
}

TEST(proc_maps, malformed_lines_are_refused) {
  maps_entry e;
  for (const char* bad :
       {"", "garbage", "1000-0800 rw-p 0 00:00 0", "1000-2000 rw-x 0 00:00 0",
        "1000-2000 rw-p 0 00-00 0", "1000-2000 rw-p 0 00:00 12a", "1000-2000 rw-p zz 00:00 0",
        "1000 rw-p 0 00:00 0", "1000-2000 rw-p 0 00:00", "1000-2000 rwp 0 00:00 0"})
    EXPECT_FALSE(parse_maps_line(bad, e)) << bad;
}

// The answer of the range check for [a, b) over made-up lines.
bool covered(const std::vector<std::string>& lines, std::uintptr_t a, std::uintptr_t b) {
  maps_range_check c(a, b);
  for (const auto& l : lines) {
    maps_entry e;
    EXPECT_TRUE(parse_maps_line(l, e)) << l;
    if (!c.feed(e)) break;
  }
  return c.ok();
}

TEST(proc_maps, a_range_must_be_covered_by_private_anonymous_mappings_without_gaps) {
  const std::vector<std::string> maps = {
      "1000-2000 r-xp 00000000 fe:01 7 /bin/a",   // file
      "2000-4000 rw-p 00000000 00:00 0",          // anonymous
      "4000-6000 rw-p 00000000 00:00 0",          // anonymous, adjacent
      "7000-8000 rw-p 00000000 00:00 0",          // after a gap
      "8000-9000 rw-s 00000000 00:01 99 /SYSV0",  // shared
  };
  EXPECT_TRUE(covered(maps, 0x2000, 0x4000));
  EXPECT_TRUE(covered(maps, 0x2800, 0x5000));  // across two mappings
  EXPECT_TRUE(covered(maps, 0x7000, 0x8000));
  EXPECT_FALSE(covered(maps, 0x1800, 0x2800));  // starts in the file mapping
  EXPECT_FALSE(covered(maps, 0x5000, 0x7800));  // over the gap
  EXPECT_FALSE(covered(maps, 0x7800, 0x8800));  // into the shared mapping
  EXPECT_FALSE(covered(maps, 0x9000, 0xa000));  // past every mapping
  EXPECT_FALSE(covered(maps, 0x0, 0x800));      // before every mapping
}

TEST(proc_maps, this_process_memory_is_told_apart_by_the_real_reader) {
  const long ps = sysconf(_SC_PAGESIZE);
  const auto at = [](void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  // Private anonymous: yes, also a part of it.
  void* anon = mmap(nullptr, 4 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anon, MAP_FAILED);
  EXPECT_TRUE(maps_private_anonymous(at(anon), at(anon) + 4 * ps));
  EXPECT_TRUE(maps_private_anonymous(at(anon) + ps, at(anon) + 2 * ps));
  // A hole punched in it: a range over the hole is not covered.
  ASSERT_EQ(munmap(static_cast<char*>(anon) + ps, ps), 0);
  EXPECT_FALSE(maps_private_anonymous(at(anon), at(anon) + 3 * ps));
  EXPECT_TRUE(maps_private_anonymous(at(anon) + 2 * ps, at(anon) + 4 * ps));
  munmap(anon, 4 * ps);
  EXPECT_FALSE(maps_private_anonymous(at(anon), at(anon) + ps));  // unmapped
  // Shared anonymous and file-backed memory: no (their changes raise no event).
  void* shared = mmap(nullptr, ps, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  EXPECT_FALSE(maps_private_anonymous(at(shared), at(shared) + ps));
  munmap(shared, ps);
  const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* file = mmap(nullptr, ps, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  ASSERT_NE(file, MAP_FAILED);
  EXPECT_FALSE(maps_private_anonymous(at(file), at(file) + ps));
  munmap(file, ps);
  // The heap and this thread's stack are private anonymous.
  std::vector<char> heap(100);
  EXPECT_TRUE(maps_private_anonymous(at(heap.data()), at(heap.data()) + heap.size()));
  char local = 0;
  EXPECT_TRUE(maps_private_anonymous(at(&local), at(&local) + 1));
  EXPECT_FALSE(maps_private_anonymous(at(&local) + 1, at(&local)));  // empty or reversed
}

}  // namespace
