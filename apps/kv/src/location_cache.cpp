// conveyor::kv::location_cache — see location_cache.hpp.
#include "location_cache.hpp"

#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

namespace conveyor::kv {

namespace L = layout;

namespace {
std::uint64_t tag(std::uint64_t h) {
  return h | 1;  // never 0 (an empty entry)
}
std::uint64_t load(const std::uint64_t& w) {
  return std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(w))
      .load(std::memory_order_relaxed);
}
void store(std::uint64_t& w, std::uint64_t v) {
  std::atomic_ref<std::uint64_t>(w).store(v, std::memory_order_relaxed);
}
}  // namespace

void location_cache::free_deleter::operator()(entry* p) const {
  std::free(p);
}

location_cache::location_cache(std::size_t entries) {
  if (entries == 0) return;
  const std::size_t n = std::bit_floor(entries);
  slots_.reset(static_cast<entry*>(std::calloc(n, sizeof(entry))));
  if (slots_) mask_ = n - 1;
}

std::size_t location_cache::index(std::uint64_t h) const {
  return L::mix(h ^ 0x5bd1e995) & mask_;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> location_cache::find(std::uint64_t h) const {
  if (!slots_) return std::nullopt;
  const auto& e = slots_.get()[index(h)];
  const auto loc = load(e.loc);
  if (load(e.hash) != tag(h) || loc == 0) return std::nullopt;
  return std::pair{(loc & L::max_offset_units) * L::unit, (loc >> 40) * L::unit};
}

void location_cache::remember(std::uint64_t h, std::uint64_t off, std::uint64_t bytes) {
  const auto units = L::round_units(bytes);
  if (!slots_ || off % L::unit || off / L::unit > L::max_offset_units || units == 0 ||
      units >= (1u << 24))
    return;
  auto& e = slots_.get()[index(h)];
  store(e.loc, (units << 40) | (off / L::unit));
  store(e.hash, tag(h));
}

void location_cache::forget(std::uint64_t h) {
  if (!slots_) return;
  auto& e = slots_.get()[index(h)];
  if (load(e.hash) == tag(h)) store(e.loc, 0);
}

std::shared_ptr<location_cache> shared_location_cache(const L::description& d,
                                                      std::size_t entries) {
  if (entries == 0) return nullptr;
  using key = std::tuple<std::uint64_t, std::uint32_t, std::uint64_t, std::uint32_t, std::uint64_t>;
  static std::mutex mu;
  static std::map<key, std::weak_ptr<location_cache>> caches;
  const key k{d.index.addr, d.index.rkey, d.data.addr, d.data.rkey, d.seed};
  std::lock_guard lk(mu);
  std::erase_if(caches, [](const auto& kv) { return kv.second.expired(); });
  if (auto it = caches.find(k); it != caches.end())
    if (auto c = it->second.lock()) return c;
  auto c = std::make_shared<location_cache>(entries);
  caches[k] = c;
  return c;
}

}  // namespace conveyor::kv
