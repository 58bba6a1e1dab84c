// The shm segment's rings are mapped a few slots ahead of their first use
// (seg_view::slot): a fresh ring page touched through a mapping was a page
// fault each (about 11 us to write and 5 us to read on this project's virtual
// machines), which held a connection's first lap of its rings to 1/100 of its
// speed. The mapping is checked through the page cache (mincore): populated
// pages exist, untouched ones do not; nothing is written by it.
#include "providers/shm/wire/segment.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace {

using namespace conveyor::shm;

class ring_mapping : public testing::Test {
 protected:
  void SetUp() override {
    fd_ = ::memfd_create("conveyor-seg-test", MFD_CLOEXEC);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(::ftruncate(fd_, static_cast<off_t>(seg_size)), 0);
    void* p = ::mmap(nullptr, seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    ASSERT_NE(p, MAP_FAILED);
    map_ = static_cast<std::byte*>(p);
    v_.hdr = reinterpret_cast<seg_header*>(map_);
    v_.base = map_;
  }
  void TearDown() override {
    if (map_) ::munmap(map_, seg_size);
    if (fd_ >= 0) ::close(fd_);
  }
  // Pages of slots [from, to) of ring r that exist.
  std::size_t resident(int r, std::uint32_t from, std::uint32_t to) const {
    const long pg = ::sysconf(_SC_PAGESIZE);
    std::byte* a =
        map_ + seg_data_off + std::size_t(r) * ring_bytes + std::size_t(from) * slot_size;
    const std::size_t len = std::size_t(to - from) * slot_size;
    std::vector<unsigned char> vec(len / std::size_t(pg));
    EXPECT_EQ(::mincore(a, len, vec.data()), 0);
    std::size_t n = 0;
    for (auto c : vec) n += c & 1;
    return n;
  }
  std::size_t pages(std::uint32_t slots) const {
    return std::size_t(slots) * slot_size / std::size_t(::sysconf(_SC_PAGESIZE));
  }
  int fd_ = -1;
  std::byte* map_ = nullptr;
  seg_view v_;
};

TEST_F(ring_mapping, the_first_use_of_a_ring_maps_a_few_slots_ahead_and_no_more) {
  ASSERT_EQ(resident(2, 0, ring_slots), 0u) << "a fresh memfd has no pages";
  std::byte* s0 = v_.slot(2, 0);
  EXPECT_EQ(s0, map_ + seg_data_off + 2 * ring_bytes);
  EXPECT_EQ(resident(2, 0, warm_slots), pages(warm_slots)) << "slots 0..7 were not mapped ahead";
  EXPECT_EQ(resident(2, warm_slots, ring_slots), 0u) << "mapped beyond the first chunk";
  EXPECT_EQ(resident(0, 0, ring_slots) + resident(1, 0, ring_slots) + resident(3, 0, ring_slots),
            0u)
      << "another ring was mapped";
  // Within the chunk nothing more; the next position past it maps the next chunk.
  v_.slot(2, warm_slots - 1);
  EXPECT_EQ(resident(2, warm_slots, ring_slots), 0u);
  v_.slot(2, warm_slots);
  EXPECT_EQ(resident(2, 0, 2 * warm_slots), pages(2 * warm_slots));
  EXPECT_EQ(resident(2, 2 * warm_slots, ring_slots), 0u);
}

TEST_F(ring_mapping, a_whole_lap_maps_the_ring_once_and_changes_no_byte) {
  // The peer's bytes already in the ring stay as they are.
  std::byte* ring = map_ + seg_data_off + ring_bytes;
  for (std::uint32_t i = 0; i < ring_slots; i += 37)
    std::memset(ring + std::size_t(i) * slot_size, 0x5a, 64);
  for (std::uint64_t pos = 0; pos < ring_slots; ++pos)
    EXPECT_EQ(v_.slot(1, pos), ring + std::size_t(pos) * slot_size);
  EXPECT_EQ(resident(1, 0, ring_slots), pages(ring_slots));
  EXPECT_EQ(v_.mapped[1], ~std::uint64_t(0)) << "after the first lap the check is one compare";
  for (std::uint32_t i = 0; i < ring_slots; ++i) {
    const std::byte want = i % 37 == 0 ? std::byte{0x5a} : std::byte{0};
    EXPECT_EQ(ring[std::size_t(i) * slot_size], want) << "slot " << i;
  }
  // Later laps address the same slots.
  EXPECT_EQ(v_.slot(1, ring_slots + 3), ring + 3 * slot_size);
}

TEST_F(ring_mapping, a_position_far_ahead_maps_up_to_its_chunk) {
  // A multi-slot request may start anywhere in the first lap.
  v_.slot(3, 100);
  EXPECT_EQ(resident(3, 0, 104), pages(104));
  EXPECT_EQ(resident(3, 104, ring_slots), 0u);
  // A position of a later lap (the ring went round before this side looked):
  // the rest of the ring at once.
  v_.slot(3, ring_slots + 5);
  EXPECT_EQ(resident(3, 0, ring_slots), pages(ring_slots));
  EXPECT_EQ(v_.mapped[3], ~std::uint64_t(0));
}

}  // namespace
