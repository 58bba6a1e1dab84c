// Cross-memory attach permission between shm peers: the Yama ptrace
// declaration (PR_SET_PTRACER) a connection needs so its peer may serve our
// bulk requests and map our allocated regions, and the probe that tests
// whether the peer can reach this process at all.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <utility>

namespace conveyor::shm {

// A connection's declaration of its peer as a tracer ends with
// release_peer_attach; declared_ptracer() says what this process has declared
// now (0 nothing, -1 any process, else a pid).
void add_peer_attach(pid_t pid);
void release_peer_attach(pid_t pid) noexcept;
long declared_ptracer() noexcept;

// One connection's grant; released on failure unless handed to the QP.
class attach_grant {
 public:
  attach_grant() = default;
  attach_grant(const attach_grant&) = delete;
  attach_grant& operator=(const attach_grant&) = delete;
  ~attach_grant() { reset(); }
  void grant(pid_t pid) {
    reset();
    if (pid <= 0) return;
    add_peer_attach(pid);
    pid_ = pid;
  }
  void reset() {
    if (pid_ > 0) release_peer_attach(pid_);
    pid_ = 0;
  }
  pid_t release() { return std::exchange(pid_, 0); }

 private:
  pid_t pid_ = 0;
};

// A word whose address and value each side publishes so that the peer can
// test whether cross-memory attach into this process works.
std::uint64_t& probe_word();
// Reads the peer's probe word by process_vm_readv: true if it holds `value`.
bool probe_peer(pid_t pid, std::uint64_t addr, std::uint64_t value, int* err);

}  // namespace conveyor::shm
