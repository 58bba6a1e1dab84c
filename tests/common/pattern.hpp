// tests/common/pattern.hpp — position-addressable pseudo-random byte patterns.
//
// Byte i of pattern `seed` depends only on (seed, i), so any slice of a
// pattern can be checked on its own: a region filled with pattern S at
// offset 0 and then partly overwritten keeps pattern S, start index k, at
// offset k.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cvt {

std::uint64_t splitmix64(std::uint64_t x) noexcept;
std::byte pattern_byte(std::uint64_t seed, std::uint64_t index) noexcept;
// out[j] = pattern_byte(seed, start + j).
void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t start = 0) noexcept;
std::vector<std::byte> make_pattern(std::size_t n, std::uint64_t seed, std::uint64_t start = 0);
// "" when data[j] == pattern_byte(seed, start + j) for all j; otherwise the first
// mismatch (offset, got, want) and how many bytes differ.
std::string check_pattern(std::span<const std::byte> data, std::uint64_t seed,
                          std::uint64_t start = 0);
// "" when equal, else the first mismatch and the number of differing bytes.
std::string check_equal(std::span<const std::byte> got, std::span<const std::byte> want);

}  // namespace cvt
