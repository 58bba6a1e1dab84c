#include "common/buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "common/pattern.hpp"

namespace cvt {

aligned_buffer::aligned_buffer(std::size_t size) : size_(size) {
  constexpr std::size_t page = 4096;
  capacity_ = size == 0 ? page : (size + page - 1) / page * page;
  void* p = std::aligned_alloc(page, capacity_);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, capacity_);
  p_.reset(static_cast<std::byte*>(p));
}

aligned_buffer aligned_buffer::view(std::byte* p, std::size_t size, std::size_t capacity) {
  aligned_buffer b;
  b.p_ = std::unique_ptr<std::byte, free_deleter>(p, free_deleter{false});
  b.size_ = size;
  b.capacity_ = capacity;
  return b;
}

bool allocate_regions() {
  const char* v = std::getenv("CONVEYOR_TEST_ALLOCATE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

conveyor::result<test_region> make_region(conveyor::protection_domain& pd, std::size_t size,
                                          conveyor::access rights, std::uint64_t seed,
                                          std::size_t reg_len) {
  test_region r;
  if (allocate_regions() && (reg_len == 0 || reg_len == size)) {
    const std::size_t n = size == 0 ? 1 : size;
    auto mr = pd.allocate_memory(n, rights);
    if (!mr) return std::unexpected(mr.error());
    r.buf = aligned_buffer::view(mr->data(), n, (n + 4095) / 4096 * 4096);
    fill_pattern(r.buf.bytes(), seed);
    r.mr = std::move(*mr);
    return r;
  }
  r.buf = aligned_buffer(size == 0 ? 1 : size);
  fill_pattern(r.buf.bytes(), seed);
  std::size_t len = reg_len == 0 ? r.buf.size() : reg_len;
  auto mr = pd.register_memory(std::span<std::byte>(r.buf.data(), len), rights);
  if (!mr) return std::unexpected(mr.error());
  r.mr = std::move(*mr);
  return r;
}

}  // namespace cvt
