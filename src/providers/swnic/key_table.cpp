#include "providers/swnic/key_table.hpp"

#include <thread>

namespace conveyor::detail {

key_table::key_table() : slots_(new slot[capacity + 1]), rng_(std::random_device{}()) {
  free_.reserve(capacity);
  for (std::uint32_t i = capacity; i >= 1; --i) free_.push_back(i);
}

result<std::uint32_t> key_table::add(std::byte* base, std::size_t len, access rights,
                                     std::uint32_t pd_id) {
  std::lock_guard lk(mu_);
  if (free_.empty())
    return make_error(errc::resource_exhausted,
                      "register_memory: all " + std::to_string(capacity) + " keys are in use");
  const std::uint32_t idx = free_.back();
  free_.pop_back();
  slot& s = slots_[idx];
  std::uint16_t r;
  do {
    r = static_cast<std::uint16_t>(rng_());
  } while (r == s.last_random);
  s.last_random = r;
  s.base = base;
  s.len = len;
  s.rights = rights;
  s.pd_id = pd_id;
  const std::uint32_t key = (idx << 16) | r;
  s.key.store(key, std::memory_order_seq_cst);
  return key;
}

void key_table::remove(std::uint32_t key) noexcept {
  const std::uint32_t idx = slot_of(key);
  if (idx == 0 || idx > capacity) return;
  slot& s = slots_[idx];
  std::uint32_t expect = key;
  if (!s.key.compare_exchange_strong(expect, 0, std::memory_order_seq_cst)) return;
  // Revoked: new acquires fail. Wait for an access already holding the key;
  // holders keep it for one non-blocking step only.
  while (s.inflight.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  std::lock_guard lk(mu_);
  free_.push_back(idx);
}

key_check key_table::invalidate_remote(std::uint32_t key, std::uint32_t pd_id) noexcept {
  const std::uint32_t idx = slot_of(key);
  if (idx == 0 || idx > capacity) return key_check::invalid_key;
  slot& s = slots_[idx];
  // Hold the slot while its fields are read, as acquire does: a concurrent
  // deregistration cannot recycle it under us.
  if (s.key.load(std::memory_order_seq_cst) != key) return key_check::invalid_key;
  s.inflight.fetch_add(1, std::memory_order_seq_cst);
  key_check rc = key_check::ok;
  if (s.key.load(std::memory_order_seq_cst) != key)
    rc = key_check::invalid_key;
  else if (s.pd_id != pd_id)
    rc = key_check::wrong_pd;
  else if (!has(s.rights, access::remote_invalidate))
    rc = key_check::no_access;
  s.inflight.fetch_sub(1, std::memory_order_seq_cst);
  if (rc == key_check::ok) remove(key);  // a racing deregistration makes this a no-op
  return rc;
}

key_table::guard& key_table::guard::operator=(guard&& o) noexcept {
  if (this != &o) {
    release();
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

void key_table::guard::release() noexcept {
  if (s_) {
    s_->inflight.fetch_sub(1, std::memory_order_seq_cst);
    s_ = nullptr;
  }
}

key_check key_table::acquire(std::uint32_t key, std::uint32_t pd_id, std::uint64_t addr,
                             std::uint64_t len, access need, guard& g, std::byte** ptr) noexcept {
  g.release();
  const std::uint32_t idx = slot_of(key);
  if (idx == 0 || idx > capacity) return key_check::invalid_key;
  slot& s = slots_[idx];
  if (s.key.load(std::memory_order_seq_cst) != key) return key_check::invalid_key;
  s.inflight.fetch_add(1, std::memory_order_seq_cst);
  if (s.key.load(std::memory_order_seq_cst) != key) {
    s.inflight.fetch_sub(1, std::memory_order_seq_cst);
    return key_check::invalid_key;
  }
  g.s_ = &s;
  key_check rc = key_check::ok;
  const auto start = reinterpret_cast<std::uint64_t>(s.base);
  if (s.pd_id != pd_id)
    rc = key_check::wrong_pd;
  else if (addr < start || len > s.len || addr - start > s.len - len)
    rc = key_check::out_of_bounds;
  else if (!has(s.rights, need))
    rc = key_check::no_access;
  if (rc != key_check::ok) {
    g.release();
    return rc;
  }
  *ptr = s.base + (addr - start);
  return rc;
}

}  // namespace conveyor::detail
