#include "common/buffer.hpp"

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

conveyor::result<test_region> make_region(conveyor::protection_domain& pd, std::size_t size,
                                          conveyor::access rights, std::uint64_t seed,
                                          std::size_t reg_len) {
  test_region r;
  r.buf = aligned_buffer(size == 0 ? 1 : size);
  fill_pattern(r.buf.bytes(), seed);
  std::size_t len = reg_len == 0 ? r.buf.size() : reg_len;
  auto mr = pd.register_memory(std::span<std::byte>(r.buf.data(), len), rights);
  if (!mr) return std::unexpected(mr.error());
  r.mr = std::move(*mr);
  return r;
}

}  // namespace cvt
