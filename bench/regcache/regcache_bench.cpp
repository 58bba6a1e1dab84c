// conveyor-regcache-bench — what a registration cache hit saves: for each size
// (4 KiB .. 64 MiB) and provider, the time of register_memory + deregister
// next to registration_cache::acquire + release of a cached range (a hit), and
// of acquire + release with the cache disabled (the pass-through cost).
//
//   conveyor-regcache-bench [--providers soft,shm] [--runs 5] [--ms 50]
//
// Each cell is the median over --runs runs of the mean time per operation in a
// run of about --ms milliseconds (at least 10 operations). The buffer is an
// anonymous mapping touched before the first run.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

template <class F>
double ns_per_op(F&& op, double ms) {
  const auto budget = std::chrono::duration<double, std::milli>(ms);
  std::size_t n = 0;
  const auto t0 = clock_type::now();
  auto t = t0;
  while (n < 10 || t - t0 < budget) {
    op();
    ++n;
    if ((n & 7) == 0 || n < 10) t = clock_type::now();
  }
  t = clock_type::now();
  return std::chrono::duration<double, std::nano>(t - t0).count() / static_cast<double>(n);
}

template <class F>
double median_ns(F&& op, int runs, double ms) {
  std::vector<double> v;
  for (int i = 0; i < runs; ++i) v.push_back(ns_per_op(op, ms));
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string human(std::size_t n) {
  if (n >= (1u << 20)) return std::to_string(n >> 20) + " MiB";
  return std::to_string(n >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> providers{"soft", "shm"};
  int runs = 5;
  double ms = 50;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--providers" && i + 1 < argc) {
      providers.clear();
      std::string list = argv[++i];
      for (std::size_t at = 0; at <= list.size();) {
        std::size_t c = list.find(',', at);
        if (c == std::string::npos) c = list.size();
        if (c > at) providers.push_back(list.substr(at, c - at));
        at = c + 1;
      }
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--ms" && i + 1 < argc) {
      ms = std::max(1.0, std::atof(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--providers soft,shm] [--runs N] [--ms MS]\n", argv[0]);
      return 2;
    }
  }
  const std::size_t max_size = std::size_t(64) << 20;
  void* mem = ::mmap(nullptr, max_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  std::memset(mem, 1, max_size);
  auto* base = static_cast<std::byte*>(mem);
  using conveyor::access;
  const access rights = access::local_write | access::remote_read | access::remote_write;

  std::printf("%-8s %-8s %14s %14s %14s %9s  monitor\n", "provider", "size", "reg+dereg ns",
              "cache hit ns", "uncached ns", "speedup");
  for (const auto& prov : providers) {
    auto dev = conveyor::device::open(prov);
    if (!dev) {
      std::fprintf(stderr, "%s: %s\n", prov.c_str(), dev.error().to_string().c_str());
      continue;
    }
    auto pd = dev->alloc_pd().value();
    auto cache = conveyor::registration_cache::create(pd).value();
    auto off = conveyor::registration_cache::create(pd, {.enabled = false}).value();
    for (std::size_t size = 4096; size <= max_size; size *= 4) {
      std::span<std::byte> buf(base, size);
      const double reg = median_ns(
          [&] {
            auto mr = pd.register_memory(buf, rights);
            if (!mr) std::abort();
          },
          runs, ms);
      { auto warm = cache.acquire(buf, rights).value(); }
      const double hit = median_ns(
          [&] {
            auto r = cache.acquire(buf, rights);
            if (!r) std::abort();
          },
          runs, ms);
      const double pass = median_ns(
          [&] {
            auto r = off.acquire(buf, rights);
            if (!r) std::abort();
          },
          runs, ms);
      std::printf("%-8s %-8s %14.0f %14.0f %14.0f %8.1fx  %s\n", prov.c_str(), human(size).c_str(),
                  reg, hit, pass, reg / hit, conveyor::to_string(cache.monitor()));
    }
    auto st = cache.stats();
    std::printf(
        "%-8s stats: hits %llu misses %llu uncached %llu entries %zu monitor %s\n", prov.c_str(),
        static_cast<unsigned long long>(st.hits), static_cast<unsigned long long>(st.misses),
        static_cast<unsigned long long>(st.uncached), st.entries, st.monitor_status.c_str());
  }
  ::munmap(mem, max_size);
  return 0;
}
