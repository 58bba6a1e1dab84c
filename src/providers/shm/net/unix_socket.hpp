// Unix stream sockets for the shm provider: address parsing ("@abstract" or a
// path), listen (also on a name the kernel picks), connect with a deadline,
// whole messages with descriptors (SCM_RIGHTS) sent and received with a
// deadline or step by step without blocking, the peer's pid, and the one-byte
// doorbell. The net layer owns shm's sockets; it knows nothing of the
// handshake's meaning or the rings (engine/, wire/).
#pragma once

#include <conveyor/error.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

namespace conveyor::shm::net {

using clock = std::chrono::steady_clock;

class fd_holder {
 public:
  fd_holder() = default;
  explicit fd_holder(int fd) noexcept : fd_(fd) {}
  fd_holder(fd_holder&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  fd_holder& operator=(fd_holder&& o) noexcept;
  fd_holder(const fd_holder&) = delete;
  fd_holder& operator=(const fd_holder&) = delete;
  ~fd_holder() { reset(); }
  void reset() noexcept;
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct unix_address {
  sockaddr_un sa{};
  socklen_t len = 0;
};

// "@name" (abstract: nothing in the filesystem) or a socket path.
result<unix_address> parse_address(std::string_view address);

// A listening socket (non-blocking, close-on-exec) at `address`, or, when it
// is null, at an abstract name the kernel chooses (unix(7), "Autobind"),
// returned in *bound as "@name". `where` names it in errors.
result<fd_holder> listen(const unix_address* address, int backlog, std::string* bound,
                         const std::string& where);

// A connected socket (non-blocking, close-on-exec); a full backlog is retried
// until `deadline`. Errors: connection_refused (nothing listens at `peer`),
// timed_out; `where` names the attempt.
result<fd_holder> connect(const unix_address& address, clock::time_point deadline,
                          const std::string& where, const std::string& peer);

// Sends the n bytes at p whole, with the descriptors `fds` on the first byte.
result<void> send_with_fds(int fd, const void* p, std::size_t n, std::span<const int> fds,
                           clock::time_point deadline, const std::string& what);

// Receives exactly n bytes into p; descriptors that come with them fill the
// entries of fds that are -1, in order, and any beyond those are closed (a
// peer cannot make us hold more). `timeout` only words the error.
result<void> recv_with_fds(int fd, void* p, std::size_t n, std::span<int> fds,
                           clock::time_point deadline, std::chrono::milliseconds timeout,
                           const std::string& what);

// One non-blocking step of the same: reads what is there into p[*off, n).
enum class recv_step { done, more, closed };
recv_step recv_some_with_fds(int fd, void* p, std::size_t n, std::size_t* off, std::span<int> fds);

// The pid of the process that created the peer's socket (0 if unknown).
pid_t peer_pid(int fd);

// The doorbell: one byte, never blocking (a full socket already rings).
void ring(int fd) noexcept;
// Reads every pending doorbell byte; false when the peer is gone (EOF, error).
bool drain(int fd) noexcept;
// Ends the connection both ways (the peer sees EOF); the descriptor stays open.
void hang_up(int fd) noexcept;

}  // namespace conveyor::shm::net
