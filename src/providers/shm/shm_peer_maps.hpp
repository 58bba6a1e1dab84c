// Direct mapping and hints (docs/SHM.md): the mappings of peers' sealed
// memfds (regions, revocation pages, hint pages), one per file and protection
// per device, shared by every QP of the device that maps it. Each QP still
// checks for itself that its peer holds the file (the descriptor it fetched
// with pidfd_getfd is that inode, sealed, large enough): only the mmap is
// shared, so that a thousand QPs to one region cost one set of page tables,
// not a thousand.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace conveyor::shm {

class peer_mapping {
 public:
  peer_mapping(std::byte* p, std::size_t len) noexcept : p_(p), len_(len) {}
  ~peer_mapping() { ::munmap(p_, len_); }
  peer_mapping(const peer_mapping&) = delete;
  peer_mapping& operator=(const peer_mapping&) = delete;
  std::byte* data() const noexcept { return p_; }

 private:
  std::byte* p_;
  std::size_t len_;
};

class peer_mappings {
 public:
  // The device's mapping of the file `ino` (`fd`, already checked) for `len`
  // bytes with `prot`: the one another QP made, or a new one (MAP_POPULATE
  // with `populate`). Null if mmap fails.
  std::shared_ptr<peer_mapping> get(int fd, std::uint64_t ino, std::size_t len, int prot,
                                    bool populate) noexcept {
    std::lock_guard lk(mu_);
    const key k{ino, len, prot};
    if (auto it = maps_.find(k); it != maps_.end()) {
      if (auto m = it->second.lock()) return m;
      maps_.erase(it);
    }
    void* p = ::mmap(nullptr, len, prot, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) return nullptr;
    std::shared_ptr<peer_mapping> m;
    try {
      m = std::make_shared<peer_mapping>(static_cast<std::byte*>(p), len);
      // Forget the mappings no QP holds any more once the table has doubled
      // since the last sweep: amortized O(1) an addition, not a walk over
      // every mapping each time.
      if (maps_.size() >= sweep_at_) {
        for (auto it = maps_.begin(); it != maps_.end();)
          it = it->second.expired() ? maps_.erase(it) : std::next(it);
        sweep_at_ = std::max<std::size_t>(16, 2 * maps_.size());
      }
      maps_[k] = m;
    } catch (...) {
      if (!m) ::munmap(p, len);
      return m;  // still usable, just not shared
    }
    return m;
  }

 private:
  using key = std::tuple<std::uint64_t, std::size_t, int>;
  std::mutex mu_;
  std::map<key, std::weak_ptr<peer_mapping>> maps_;
  std::size_t sweep_at_ = 16;  // sweep expired entries when the table reaches this size
};

}  // namespace conveyor::shm
