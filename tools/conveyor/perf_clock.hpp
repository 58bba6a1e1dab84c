// tools/conveyor/perf_clock.hpp — the per-round-trip clock of `conveyor perf`
// latency runs. steady_clock costs about 25 ns a read on a VM's kvm-clock, as
// much as a whole shared-memory READ; latency tools read the CPU's cycle
// counter instead (perftest's get_cycles, UCX's ucs_get_time). Ticks are turned
// into nanoseconds by the counter's rate, measured against steady_clock over
// the life of the process.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace conveyor::tool {

class tick_clock {
 public:
  // The cycle counter where it runs at a constant rate through every power
  // state (x86-64 "invariant TSC"); steady_clock's nanoseconds elsewhere.
  static bool cycles() noexcept {
#if defined(__x86_64__)
    static const bool invariant = [] {
      unsigned a = 0, b = 0, c = 0, d = 0;
      if (__get_cpuid(0x80000000u, &a, &b, &c, &d) == 0 || a < 0x80000007u) return false;
      __get_cpuid(0x80000007u, &a, &b, &c, &d);
      return (d & (1u << 8)) != 0;
    }();
    return invariant;
#else
    return false;
#endif
  }
  static std::uint64_t now() noexcept {
#if defined(__x86_64__)
    if (cycles()) return __rdtsc();
#endif
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }

  // Nanoseconds per tick: the counter's rate since the first call in this
  // process, measured against steady_clock (the longer the process has run,
  // the closer; call it once before a run to start the measurement).
  static double ns_per_tick() noexcept {
    if (!cycles()) return 1.0;
    static const auto origin = std::pair{std::chrono::steady_clock::now(), now()};
    const auto t1 = std::chrono::steady_clock::now();
    const std::uint64_t k1 = now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - origin.first).count();
    return k1 > origin.second && ns > 0 ? ns / static_cast<double>(k1 - origin.second) : 1.0;
  }
};

}  // namespace conveyor::tool
