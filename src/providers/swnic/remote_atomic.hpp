// The one place a remote atomic touches memory: fetch-add or compare-swap on
// an 8-byte aligned word of registered memory, with std::atomic_ref so that it
// is atomic against the region owner's threads, every engine, and any process
// mapping the same pages (64-bit atomics are lock-free and address-free here).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace conveyor::detail {

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

// Returns the word's original value. fetch_add adds `add_or_compare`;
// otherwise the word becomes `swap` if it equalled `add_or_compare`.
inline std::uint64_t remote_atomic(std::byte* word, bool fetch_add, std::uint64_t add_or_compare,
                                   std::uint64_t swap) noexcept {
  std::atomic_ref<std::uint64_t> w(*reinterpret_cast<std::uint64_t*>(word));
  if (fetch_add) return w.fetch_add(add_or_compare);
  std::uint64_t orig = add_or_compare;
  w.compare_exchange_strong(orig, swap);
  return orig;
}

}  // namespace conveyor::detail
