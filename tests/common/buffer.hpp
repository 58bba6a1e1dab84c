// tests/common/buffer.hpp — page-aligned buffers and registered test regions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>

#include <conveyor/conveyor.hpp>

namespace cvt {

// Frees an aligned_buffer's memory unless it belongs to someone else.
struct free_deleter {
  bool owned = true;
  void operator()(std::byte* p) const noexcept {
    if (owned) std::free(p);
  }
};

// Page-aligned heap buffer (size rounded up to whole pages, at least one), zeroed.
class aligned_buffer {
 public:
  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t size);
  // Memory owned elsewhere (a region from allocate_memory): not freed here.
  static aligned_buffer view(std::byte* p, std::size_t size, std::size_t capacity);

  std::byte* data() const noexcept { return p_.get(); }
  std::size_t size() const noexcept { return size_; }
  // The whole allocation (at least size(), rounded up to pages).
  std::size_t capacity() const noexcept { return capacity_; }
  std::span<std::byte> bytes() const noexcept { return {p_.get(), size_}; }
  std::span<std::byte> all() const noexcept { return {p_.get(), capacity_}; }

 private:
  std::unique_ptr<std::byte, free_deleter> p_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

inline constexpr conveyor::access all_rights =
    conveyor::access::local_write | conveyor::access::remote_write | conveyor::access::remote_read |
    conveyor::access::remote_atomic;

// A buffer and its registration. The registration is released first (member
// order), so the provider never touches freed memory.
struct test_region {
  aligned_buffer buf;
  conveyor::memory_region mr;

  test_region() = default;
  test_region(test_region&&) noexcept = default;
  // Releases the old registration before the old buffer.
  test_region& operator=(test_region&& o) noexcept {
    mr = std::move(o.mr);
    buf = std::move(o.buf);
    return *this;
  }
  ~test_region() { mr = conveyor::memory_region(); }

  std::span<std::byte> bytes() const noexcept { return buf.bytes(); }
  std::byte* data() const noexcept { return buf.data(); }
  std::size_t size() const noexcept { return buf.size(); }
  conveyor::sge sge(std::size_t offset, std::size_t len) const noexcept {
    return mr.slice(offset, len);
  }
  conveyor::remote_region remote() const noexcept { return mr.remote(); }
  conveyor::remote_region remote(std::size_t offset, std::size_t len) const noexcept {
    return mr.remote().slice(offset, len);
  }
};

// Allocates max(size, 1) bytes, fills them with pattern `seed`, then registers
// `reg_len` bytes (default: all of them) with `rights`. Filling happens before
// registration, so the provider's engine sees the bytes (no data race).
// With CONVEYOR_TEST_ALLOCATE=1 a whole-buffer region is made with
// pd.allocate_memory instead (on shm: memory a connected peer maps directly),
// so the suites run unchanged over that path.
// Whether CONVEYOR_TEST_ALLOCATE=1 asks for allocate_memory regions.
bool allocate_regions();

conveyor::result<test_region> make_region(conveyor::protection_domain& pd, std::size_t size,
                                          conveyor::access rights, std::uint64_t seed,
                                          std::size_t reg_len = 0);

}  // namespace cvt
