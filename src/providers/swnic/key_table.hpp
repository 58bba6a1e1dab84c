// The key table: every registered region of a device, looked up by key on
// every local and remote access. Lock-free on the lookup path; registration and
// deregistration take a mutex. Keys are (slot index << 16) | 16 random bits, so
// one key cannot be guessed from another, and a recycled slot never reuses its
// previous key. Deregistration revokes at once and then waits only for an
// access already under way (a guard is held for one bounded step).
#pragma once

#include <conveyor/error.hpp>
#include <conveyor/mr.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

namespace conveyor::detail {

enum class key_check : std::uint8_t { ok, invalid_key, wrong_pd, out_of_bounds, no_access };

class key_table {
 public:
  static constexpr std::uint32_t capacity = 65535;  // slot 0 is never used

  key_table();
  key_table(const key_table&) = delete;
  key_table& operator=(const key_table&) = delete;

  // Registers [base, base+len) with `rights` for protection domain `pd_id`.
  result<std::uint32_t> add(std::byte* base, std::size_t len, access rights, std::uint32_t pd_id);
  // Revokes `key`; returns once no access holds it.
  void remove(std::uint32_t key) noexcept;
  // A peer's Send with Invalidate: revokes `key` only if it names a live
  // region of protection domain `pd_id` registered with
  // access::remote_invalidate (as verbs allows it only for memory windows and
  // fast-registered keys, never for a plain MR); otherwise leaves the table as
  // it is and says why (invalid_key, wrong_pd, no_access).
  key_check invalidate_remote(std::uint32_t key, std::uint32_t pd_id) noexcept;
  // The slot a key names (< capacity + 1): stable for the key's lifetime.
  static constexpr std::uint32_t slot_of(std::uint32_t key) noexcept { return key >> 16; }

  struct slot;
  // RAII hold on a live key for one step of an access.
  class guard {
   public:
    guard() = default;
    guard(guard&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
    guard& operator=(guard&& o) noexcept;
    guard(const guard&) = delete;
    guard& operator=(const guard&) = delete;
    ~guard() { release(); }
    void release() noexcept;
    explicit operator bool() const noexcept { return s_ != nullptr; }

   private:
    friend class key_table;
    slot* s_ = nullptr;
  };

  // Checks key liveness, protection domain, [addr, addr+len) inside the region
  // and `need` rights; on ok, `g` holds the key and *ptr points at addr.
  key_check acquire(std::uint32_t key, std::uint32_t pd_id, std::uint64_t addr, std::uint64_t len,
                    access need, guard& g, std::byte** ptr) noexcept;

  struct slot {
    std::atomic<std::uint32_t> key{0};
    std::atomic<std::uint32_t> inflight{0};
    std::byte* base = nullptr;
    std::uint64_t len = 0;
    access rights = access::none;
    std::uint32_t pd_id = 0;
    std::uint16_t last_random = 0;
  };

 private:
  std::unique_ptr<slot[]> slots_;
  std::mutex mu_;
  std::vector<std::uint32_t> free_;
  std::mt19937_64 rng_;
};

}  // namespace conveyor::detail
