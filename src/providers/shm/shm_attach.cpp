// Cross-memory attach permission between shm peers (shm_attach.hpp).
#include "providers/shm/shm_attach.hpp"

#include "core/log.hpp"

#include <sys/prctl.h>
#include <sys/uio.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>

namespace conveyor::shm {

// ------------------------------------------------------------ ptrace scope ----
// A peer serves our bulk requests by cross-memory attach and maps our allocated
// regions with pidfd_getfd: both need ptrace permission over this process.
// Under Yama ptrace_scope 1 only ancestors and the one process named with
// PR_SET_PTRACER may attach, and Yama keeps one pid per process: so while
// exactly one peer needs it, that peer's pid is declared; while two or more
// distinct peers do, no single pid can say it and PR_SET_PTRACER_ANY is the
// narrowest there is (any process of our uid); when none does, nothing is.
// Nothing is declared for a device with cross-memory attach off, nor for a
// peer that reported it could not reach us. Other scopes: 0 needs nothing,
// 2/3 cannot be helped (the probe fails and requests are staged).
namespace {
class ptracer_registry {
 public:
  static ptracer_registry& get() {
    // Never destroyed: a QP outliving static destruction may still release.
    static ptracer_registry* r = new ptracer_registry;
    return *r;
  }
  void add(pid_t pid) {
    std::lock_guard lk(mu_);
    ++peers_[pid];
    apply_locked();
  }
  void remove(pid_t pid) {
    std::lock_guard lk(mu_);
    auto it = peers_.find(pid);
    if (it == peers_.end()) return;
    if (--it->second == 0) peers_.erase(it);
    apply_locked();
  }
  long declared() {
    std::lock_guard lk(mu_);
    return declared_;
  }

 private:
  ptracer_registry() {
    std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
    int scope = -1;
    yama1_ = f >> scope && scope == 1;
  }
  void apply_locked() {
    const long want = peers_.empty()       ? 0
                      : peers_.size() == 1 ? static_cast<long>(peers_.begin()->first)
                                           : -1;
    if (want == declared_) return;
    declared_ = want;
    if (!yama1_) return;
    const unsigned long arg = want == -1 ? PR_SET_PTRACER_ANY : static_cast<unsigned long>(want);
    const int r = ::prctl(PR_SET_PTRACER, arg, 0, 0, 0);
    if (detail::log_enabled(detail::log_level::info))
      detail::log_line(detail::log_level::info,
                       std::string("shm: Yama ptrace_scope 1: tracer for cross-memory attach ") +
                           (want == 0    ? "cleared"
                            : want == -1 ? "any process (more than one peer)"
                                         : "pid " + std::to_string(want)) +
                           (r == 0 ? "" : " (prctl failed)"));
  }
  std::mutex mu_;
  std::map<pid_t, int> peers_;  // peers that may attach, and how many connections each
  long declared_ = 0;           // 0 none, -1 any, else a pid
  bool yama1_ = false;
};

}  // namespace

void add_peer_attach(pid_t pid) {
  ptracer_registry::get().add(pid);
}

void release_peer_attach(pid_t pid) noexcept {
  if (pid > 0) ptracer_registry::get().remove(pid);
}
long declared_ptracer() noexcept {
  return ptracer_registry::get().declared();
}

std::uint64_t& probe_word() {
  static std::uint64_t w = [] {
    std::random_device rd;
    return (std::uint64_t(rd()) << 32) | rd() | 1;
  }();
  return w;
}

bool probe_peer(pid_t pid, std::uint64_t addr, std::uint64_t value, int* err) {
  if (pid <= 0 || addr == 0) {
    *err = ESRCH;
    return false;
  }
  std::uint64_t got = 0;
  iovec local{&got, sizeof got};
  iovec remote{reinterpret_cast<void*>(addr), sizeof got};
  const ssize_t r = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  *err = r < 0 ? errno : 0;
  return r == sizeof got && got == value;
}

}  // namespace conveyor::shm
