// Direct mapping (docs/SHM.md): mapping the peer's allocated regions through
// pidfd_getfd, serving READ/WRITE/atomics to them in the posting thread,
// revocation checks, unmapping.
#include "providers/shm/engine/shm_qp_internal.hpp"

#include "core/log.hpp"
#include "providers/shm/shm_device.hpp"
#include "providers/shm/shm_memfd.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include "providers/swnic/remote_atomic.hpp"

namespace conveyor::shm {

using namespace qp_parts;

// ------------------------------------------------------------ direct mapping ----
std::shared_ptr<peer_mapping> shm_qp::map_peer_memfd(int fd, std::uint64_t ino, std::size_t len,
                                                     int prot, bool populate) noexcept {
  if (pidfd_ < 0) {
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, peer_pid_, 0));
    if (pidfd_ < 0) return nullptr;
  }
  // The same permission as cross-memory attach (PTRACE_MODE_ATTACH).
  const int f = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd_, fd, 0));
  if (f < 0) return nullptr;
  // Only the file the peer named, sealed against shrinking and growing, and
  // large enough: then no access inside [0, len) can fault. Checked by every
  // QP for its own peer; the mapping itself is the device's, shared by every
  // QP that maps this file (populated at once when made: the pages exist, the
  // owner populated them, so the data path takes no page-table faults).
  std::shared_ptr<peer_mapping> m;
  if (sealed_memfd_ok(f, len, false, ino)) m = dev_->peer_maps().get(f, ino, len, prot, populate);
  ::close(f);
  return m;
}

void shm_qp::on_map_answer_locked(std::uint32_t rkey, const std::byte* payload) noexcept {
  map_answer a;
  std::memcpy(&a, payload, sizeof a);  // copied once: the peer may rewrite the slot
  auto it = pmaps_.find(rkey);
  if (it == pmaps_.end() || it->second.state != peer_map::st::pending) return;
  peer_map& pm = it->second;
  pm.state = peer_map::st::none;
  if (a.ok != 1 || a.word >= revocation_words || a.gen == 0 || a.len == 0 || a.len > a.map_len ||
      a.map_len > dev_->attr().max_mr_size || a.base + a.len < a.base)
    return;
  if (peer_rev_ == nullptr) {
    auto r =
        map_peer_memfd(a.rev_fd, a.rev_ino, std::size_t(revocation_words) * 8, PROT_READ, false);
    if (!r) {
      direct_ok_ = false;  // no permission after all: stop asking
      if (detail::log_enabled(detail::log_level::info))
        detail::log_line(detail::log_level::info,
                         dev_->attr().name + " QP " + std::to_string(qpn_) +
                             ": cannot map the revocation page of " + attr_.peer_address + " (" +
                             std::strerror(errno) + "); direct mapping off for this connection");
      return;
    }
    peer_rev_ = reinterpret_cast<const std::atomic<std::uint64_t>*>(r->data());
    peer_rev_map_ = std::move(r);
    peer_rev_ino_ = a.rev_ino;
  } else if (a.rev_ino != peer_rev_ino_) {
    return;
  }
  const access rights = static_cast<access>(a.rights);
  // A key without remote_write/remote_atomic is mapped read-only.
  const bool writable = has(rights, access::remote_write) || has(rights, access::remote_atomic);
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  // Populated at once only up to direct_populate_max: this runs in the engine's
  // step with the QP's lock held, and populating a multi-GiB region took
  // seconds (32 clients mapping a 3 GiB store at once on 2 CPUs stalled each
  // one's first requests past a 5 s timeout). Beyond it, pages are mapped on
  // first touch (a minor fault each, once).
  auto m = map_peer_memfd(a.fd, a.ino, a.map_len, prot, a.map_len <= direct_populate_max);
  if (!m) return;
  if (peer_rev_[a.word].load(std::memory_order_seq_cst) != a.gen) {  // revoked meanwhile
    pmaps_.erase(it);
    return;
  }
  pm.state = peer_map::st::mapped;
  pm.ptr = m->data();
  pm.hold = std::move(m);
  pm.map_len = a.map_len;
  pm.base = a.base;
  pm.len = a.len;
  pm.gen = a.gen;
  pm.rights = rights;
  pm.word = a.word;
}

const shm_qp::peer_map* shm_qp::direct_map_locked(const swqe& w) const noexcept {
  if (pmaps_.empty() || w.len == 0 ||  // zero-length requests keep the engine's semantics
      !(w.op == wr_opcode::rdma_read || w.op == wr_opcode::rdma_write || is_atomic_op(w.op)))
    return nullptr;
  const auto it = pmaps_.find(w.rkey);
  return it != pmaps_.end() && it->second.state == peer_map::st::mapped ? &it->second : nullptr;
}

bool shm_qp::try_direct_locked(swqe& w, std::uint32_t idx) noexcept {
  const peer_map* found = direct_map_locked(w);
  if (found == nullptr) return false;
  const peer_map& pm = *found;
  // Revoked (deregistered, or the slot reused): forget the mapping; the request
  // goes to the peer's engine, which refuses the dead key.
  if (peer_rev_[pm.word].load(std::memory_order_seq_cst) != pm.gen) {
    pmaps_.erase(w.rkey);
    return false;
  }
  const bool atomic = is_atomic_op(w.op);
  const access need = w.op == wr_opcode::rdma_read    ? access::remote_read
                      : w.op == wr_opcode::rdma_write ? access::remote_write
                                                      : access::remote_atomic;
  const std::uint64_t len = atomic ? 8 : w.len;
  // Out of bounds or without the right: the engine refuses it (rem_access_err).
  if (!has(pm.rights, need) || w.remote_addr < pm.base || w.remote_addr - pm.base > pm.len ||
      len > pm.len - (w.remote_addr - pm.base))
    return false;
  std::byte* p = pm.ptr + (w.remote_addr - pm.base);
  const sge* sg = sq_sges(idx);
  if (w.op == wr_opcode::rdma_write) {
    gather_locked(w, idx, 0, p, w.len);
    bump_locked(c_direct_tx_, w.len);
  } else if (w.op == wr_opcode::rdma_read) {
    std::uint64_t off = 0;
    for (std::uint32_t k = 0; k < w.nsge; ++k) {
      if (sg[k].length) std::memcpy(reinterpret_cast<void*>(sg[k].addr), p + off, sg[k].length);
      off += sg[k].length;
    }
    bump_locked(c_direct_rx_, w.len);
  } else {
    // On the shared pages: atomic against the peer's engine, its owner and
    // every other process mapping them.
    const std::uint64_t orig =
        detail::remote_atomic(p, w.op == wr_opcode::atomic_fetch_and_add, w.cmp_add, w.swap);
    std::memcpy(reinterpret_cast<void*>(sg[0].addr), &orig, 8);
  }
  bump_locked(c_direct_, 1);
  return true;
}

void shm_qp::unmap_peer_locked() noexcept {
  pmaps_.clear();  // the last QP holding a mapping unmaps it
  peer_rev_ = nullptr;
  peer_rev_map_.reset();
  if (pidfd_ >= 0) {
    ::close(pidfd_);
    pidfd_ = -1;
  }
}

}  // namespace conveyor::shm
