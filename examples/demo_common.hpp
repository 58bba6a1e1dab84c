// What conveyor-demo's two roles share (demo.cpp): the target region's layout,
// the messages and acks, the byte pattern, failures, buffers and completions.
#pragma once

#include <conveyor/conveyor.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace cvy = conveyor;

namespace demo {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// ------------------------------------------------------------------ layout ----
// Where the initiator writes inside the target's 16 MiB buffer. Both roles
// compile the same constants, so the target knows what to expect.
constexpr std::size_t kib = 1024, mib = 1024 * 1024;
constexpr std::size_t region_size = 16 * mib;

constexpr std::size_t bulk_off = 0, bulk_size = 1 * mib, bulk_iters = 14;         // [0, 14 MiB)
constexpr std::size_t small_off = 14 * mib, small_size = 64, small_iters = 1000;  // 62.5 KiB
constexpr std::size_t imm_off = 15 * mib, imm_size = 4 * kib, imm_iters = 200;    // 800 KiB
constexpr std::size_t send_size = 4 * kib, send_iters = 200;
constexpr std::size_t send_imm_size = 256, send_imm_iters = 200;
constexpr std::size_t atomic_iters = 1000;
constexpr std::uint64_t atomic_initial = 0x1000'0000'0000'0000ull;
constexpr std::uint64_t swap_step = 0x10001;
constexpr std::uint64_t atomic_final = atomic_initial + atomic_iters + atomic_iters * swap_step;

static_assert(bulk_off + bulk_size * bulk_iters <= small_off);
static_assert(small_off + small_size * small_iters <= imm_off);
static_assert(imm_off + imm_size * imm_iters <= region_size);

// Messages (SEND payloads) start with this header; acks are just the header
// followed by a short text.
enum msg_kind : std::uint32_t {
  kind_send = 1,
  kind_send_imm = 2,
  kind_write_imm = 3,
  kind_done = 9
};
constexpr std::uint32_t msg_magic = 0x43565944;  // "CVYD"
constexpr std::uint32_t ack_magic = 0x43565941;  // "CVYA"
struct msg_header {
  std::uint32_t magic = 0;
  std::uint32_t kind = 0;
  std::uint32_t seq = 0;
  std::uint32_t status = 0;  // acks: 0 = verified, 1 = mismatch
};
constexpr std::size_t ack_size = 256;       // header + text
constexpr std::size_t recv_slot = 8 * kib;  // target receive buffers
constexpr std::size_t recv_slots = 16;

inline std::uint32_t imm_for(std::uint32_t seq) {
  return 0xC0DE0000u | seq;
}
// The done message's seq: which optional operations the initiator ran.
constexpr std::uint32_t ran_atomics = 1, ran_immediate = 2;

// The byte pattern: 64-bit words derived from their position (and a salt).
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline void fill_pattern(std::byte* p, std::size_t len, std::uint64_t first_word,
                         std::uint64_t salt) {
  for (std::size_t i = 0; i < len / 8; ++i) {
    std::uint64_t v = mix((first_word + i) ^ salt);
    std::memcpy(p + i * 8, &v, 8);
  }
}
// Offset of the first byte that differs from the pattern, or npos.
inline std::size_t check_pattern(const std::byte* p, std::size_t len, std::uint64_t first_word,
                                 std::uint64_t salt) {
  for (std::size_t i = 0; i < len / 8; ++i) {
    std::uint64_t want = mix((first_word + i) ^ salt), got;
    std::memcpy(&got, p + i * 8, 8);
    if (got != want) return i * 8;
  }
  return std::string::npos;
}
inline std::size_t first_nonzero(const std::byte* p, std::size_t len) {
  for (std::size_t i = 0; i < len; ++i)
    if (p[i] != std::byte{0}) return i;
  return std::string::npos;
}
// The region's pattern is a function of the offset inside the target buffer.
constexpr std::uint64_t region_salt = 0x5EED;
inline std::uint64_t msg_salt(std::uint32_t kind, std::uint32_t seq) {
  return (std::uint64_t{kind} << 32) | seq;
}

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& what) {
  throw failure(what);
}

template <class T>
T check(cvy::result<T> r, std::string_view what) {
  if (!r) fail(std::string(what) + ": " + r.error().to_string());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}
inline void check(cvy::status s, std::string_view what) {
  if (s != cvy::errc::ok)
    fail(std::string(what) + ": post failed: " + std::string(cvy::to_string(s)));
}

// Page-aligned, zeroed memory for registration.
struct buffer {
  explicit buffer(std::size_t n)
      : ptr(static_cast<std::byte*>(::operator new (n, std::align_val_t{4096}))), size(n) {
    std::memset(ptr, 0, n);
  }
  ~buffer() { ::operator delete (ptr, std::align_val_t{4096}); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  std::span<std::byte> span() const { return {ptr, size}; }
  std::byte* ptr;
  std::size_t size;
};

inline std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

// Waits for one completion on `cq`; a timeout or an error status is a failure.
inline cvy::work_completion wait_wc(cvy::completion_queue& cq, std::string_view what,
                                    std::chrono::nanoseconds timeout = 10s) {
  auto wc = cq.wait_one(timeout);
  if (!wc)
    fail(std::string(what) +
         ": waiting for a completion: " + std::string(cvy::to_string(wc.error())));
  if (wc->status != cvy::wc_status::success)
    fail(std::string(what) + ": completion " + std::string(cvy::to_string(wc->opcode)) + " wr_id " +
         std::to_string(wc->wr_id) + " failed: " + std::string(cvy::to_string(wc->status)) +
         " (vendor_err " + hex32(wc->vendor_err) + ")");
  return *wc;
}

inline cvy::device_options device_opts(bool crc) {
  cvy::device_options o;
  o.software.request_crc = crc;
  return o;
}

constexpr cvy::access all_rights = cvy::access::local_write | cvy::access::remote_write |
                                   cvy::access::remote_read | cvy::access::remote_atomic;

// The two roles (demo_target.cpp, demo_initiator.cpp): the process's exit
// status; a failure throws `failure`.
int run_target(const std::string& device, const std::string& address, bool crc);
int run_initiator(const std::string& device, const std::string& address, bool crc);

}  // namespace demo
