#include "common/pattern.hpp"

#include <cstdio>
#include <cstring>

namespace cvt {

std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {
std::uint64_t word(std::uint64_t seed, std::uint64_t k) noexcept {
  return splitmix64(splitmix64(seed) ^ (k * 0xd1342543de82ef95ULL));
}
}  // namespace

std::byte pattern_byte(std::uint64_t seed, std::uint64_t index) noexcept {
  return static_cast<std::byte>((word(seed, index / 8) >> (8 * (index % 8))) & 0xff);
}

void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t start) noexcept {
  std::size_t j = 0;
  const std::size_t n = out.size();
  // Unaligned head.
  while (j < n && (start + j) % 8 != 0) {
    out[j] = pattern_byte(seed, start + j);
    ++j;
  }
  // Whole words (little-endian byte order of the word, as pattern_byte defines).
  while (j + 8 <= n) {
    std::uint64_t w = word(seed, (start + j) / 8);
    for (int b = 0; b < 8; ++b)
      out[j + static_cast<std::size_t>(b)] = static_cast<std::byte>((w >> (8 * b)) & 0xff);
    j += 8;
  }
  while (j < n) {
    out[j] = pattern_byte(seed, start + j);
    ++j;
  }
}

std::vector<std::byte> make_pattern(std::size_t n, std::uint64_t seed, std::uint64_t start) {
  std::vector<std::byte> v(n);
  fill_pattern(v, seed, start);
  return v;
}

namespace {
std::string mismatch_text(std::size_t first, std::byte got, std::byte want, std::size_t count,
                          std::size_t total) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "first mismatch at byte %zu (got 0x%02x, want 0x%02x); %zu of %zu bytes differ",
                first, static_cast<unsigned>(got), static_cast<unsigned>(want), count, total);
  return buf;
}
}  // namespace

std::string check_pattern(std::span<const std::byte> data, std::uint64_t seed,
                          std::uint64_t start) {
  // Compare block-wise against a generated chunk (fast path), then locate.
  constexpr std::size_t chunk = 64 * 1024;
  std::vector<std::byte> want(std::min(chunk, data.size()));
  std::size_t first = data.size(), count = 0;
  std::byte got_b{}, want_b{};
  for (std::size_t off = 0; off < data.size(); off += chunk) {
    std::size_t len = std::min(chunk, data.size() - off);
    fill_pattern(std::span(want.data(), len), seed, start + off);
    if (std::memcmp(data.data() + off, want.data(), len) == 0) continue;
    for (std::size_t j = 0; j < len; ++j) {
      if (data[off + j] != want[j]) {
        if (first == data.size()) {
          first = off + j;
          got_b = data[off + j];
          want_b = want[j];
        }
        ++count;
      }
    }
  }
  if (count == 0) return {};
  return mismatch_text(first, got_b, want_b, count, data.size());
}

std::string check_equal(std::span<const std::byte> got, std::span<const std::byte> want) {
  if (got.size() != want.size()) {
    return "size differs: got " + std::to_string(got.size()) + ", want " +
           std::to_string(want.size());
  }
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size()) == 0) return {};
  std::size_t first = got.size(), count = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    if (got[j] != want[j]) {
      if (first == got.size()) first = j;
      ++count;
    }
  }
  return mismatch_text(first, got[first], want[first], count, got.size());
}

}  // namespace cvt
