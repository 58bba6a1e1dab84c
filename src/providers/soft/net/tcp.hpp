// TCP socket helpers for the soft provider: address parsing, listen, connect
// with a deadline, exact reads/writes with a deadline, socket options.
// The net layer owns sockets; it knows nothing of iWARP.
#pragma once

#include <conveyor/error.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/socket.h>

namespace conveyor::net {

using clock = std::chrono::steady_clock;

struct endpoint {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string to_string() const;
};

result<endpoint> parse_endpoint(std::string_view address);  // "ip:port" or "[v6]:port"
endpoint local_endpoint(int fd);
endpoint peer_endpoint(int fd);

class fd_guard {
 public:
  explicit fd_guard(int fd = -1) noexcept : fd_(fd) {}
  fd_guard(fd_guard&& o) noexcept : fd_(o.release()) {}
  fd_guard& operator=(fd_guard&& o) noexcept;
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard();
  int get() const noexcept { return fd_; }
  int release() noexcept {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_;
};

result<fd_guard> listen_tcp(const endpoint& ep, int backlog);
// Connects with a deadline; the socket is returned non-blocking.
result<fd_guard> connect_tcp(const endpoint& ep, clock::time_point deadline, std::string_view what);

// Reads exactly out.size() bytes (never more) before the deadline.
result<void> read_exact(int fd, std::span<std::byte> out, clock::time_point deadline,
                        std::string_view what);
result<void> write_all(int fd, std::span<const std::byte> in, clock::time_point deadline,
                       std::string_view what);

void set_nonblocking(int fd, bool on) noexcept;
void set_nodelay(int fd) noexcept;
std::uint32_t tcp_mss(int fd) noexcept;
// The IPv4 and IPv6 addresses of this host's interfaces that are up (where a
// listener bound to the wildcard address can be reached), loopback included.
std::vector<std::string> interface_addresses();

}  // namespace conveyor::net
