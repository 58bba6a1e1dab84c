#include "providers/soft/net/tcp.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace conveyor::net {

fd_guard& fd_guard::operator=(fd_guard&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}
fd_guard::~fd_guard() {
  if (fd_ >= 0) ::close(fd_);
}

std::string endpoint::to_string() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "?";
}

result<endpoint> parse_endpoint(std::string_view address) {
  const auto bad = [&](const char* why) {
    return make_error(errc::address_error,
                      "address \"" + std::string(address) + "\": " + why + " (expected ip:port)");
  };
  std::string host;
  std::string_view port_s;
  if (!address.empty() && address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() || address[close + 1] != ':')
      return bad("malformed IPv6 address");
    host = std::string(address.substr(1, close - 1));
    port_s = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string_view::npos) return bad("missing port");
    host = std::string(address.substr(0, colon));
    port_s = address.substr(colon + 1);
  }
  unsigned port = 0;
  auto [p, ec] = std::from_chars(port_s.data(), port_s.data() + port_s.size(), port);
  if (ec != std::errc{} || p != port_s.data() + port_s.size() || port > 65535 || port_s.empty())
    return bad("invalid port");
  endpoint ep;
  if (host.empty() || host == "*") host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  auto* a4 = reinterpret_cast<sockaddr_in*>(&ep.ss);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&ep.ss);
  if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<std::uint16_t>(port));
    ep.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<std::uint16_t>(port));
    ep.len = sizeof(sockaddr_in6);
  } else {
    return bad("not a numeric IPv4/IPv6 address");
  }
  return ep;
}

endpoint local_endpoint(int fd) {
  endpoint ep;
  ep.len = sizeof ep.ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ep.ss), &ep.len);
  return ep;
}
endpoint peer_endpoint(int fd) {
  endpoint ep;
  ep.len = sizeof ep.ss;
  getpeername(fd, reinterpret_cast<sockaddr*>(&ep.ss), &ep.len);
  return ep;
}

void set_nonblocking(int fd, bool on) noexcept {
  int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}
void set_nodelay(int fd) noexcept {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}
std::uint32_t tcp_mss(int fd) noexcept {
  int mss = 0;
  socklen_t l = sizeof mss;
  if (getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &l) != 0 || mss <= 0) return 1460;
  return static_cast<std::uint32_t>(mss);
}

namespace {
int remaining_ms(clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  if (left < 0) return 0;
  return left > 1'000'000 ? 1'000'000 : static_cast<int>(left);
}
// Waits for `events` on fd; false on timeout.
bool wait_fd(int fd, short events, clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // let the caller's syscall report the error
  }
}
}  // namespace

result<fd_guard> listen_tcp(const endpoint& ep, int backlog) {
  fd_guard fd(::socket(ep.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return make_error(errc::io_error, "listen on " + ep.to_string() + ": socket()", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ep.ss), ep.len) != 0)
    return make_error(errc::address_error, "listen on " + ep.to_string() + ": bind failed", errno);
  if (::listen(fd.get(), backlog) != 0)
    return make_error(errc::io_error, "listen on " + ep.to_string() + ": listen failed", errno);
  set_nonblocking(fd.get(), true);
  return fd;
}

result<fd_guard> connect_tcp(const endpoint& ep, clock::time_point deadline,
                             std::string_view what) {
  const std::string where = "connect to " + ep.to_string();
  fd_guard fd(::socket(ep.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return make_error(errc::io_error, where + ": socket()", errno);
  int r = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&ep.ss), ep.len);
  if (r != 0 && errno != EINPROGRESS) {
    int e = errno;
    if (e == ECONNREFUSED)
      return make_error(errc::connection_refused, where + ": connection refused", e);
    return make_error(errc::io_error, where + ": " + std::strerror(e), e);
  }
  if (r != 0) {
    if (!wait_fd(fd.get(), POLLOUT, deadline))
      return make_error(errc::timed_out,
                        where + ": TCP connect timed out (" + std::string(what) + ")");
    int err = 0;
    socklen_t l = sizeof err;
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &l);
    if (err == ECONNREFUSED)
      return make_error(errc::connection_refused, where + ": connection refused", err);
    if (err != 0) return make_error(errc::io_error, where + ": " + std::strerror(err), err);
  }
  set_nodelay(fd.get());
  return fd;
}

result<void> read_exact(int fd, std::span<std::byte> out, clock::time_point deadline,
                        std::string_view what) {
  std::size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::recv(fd, out.data() + got, out.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0)
      return make_error(errc::connection_reset, std::string(what) + ": peer closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      int e = errno;
      return make_error(e == ECONNRESET ? errc::connection_reset : errc::io_error,
                        std::string(what) + ": " + std::strerror(e), e);
    }
    if (!wait_fd(fd, POLLIN, deadline))
      return make_error(errc::timed_out, std::string(what) + " timed out");
  }
  return {};
}

result<void> write_all(int fd, std::span<const std::byte> in, clock::time_point deadline,
                       std::string_view what) {
  std::size_t put = 0;
  while (put < in.size()) {
    ssize_t n = ::send(fd, in.data() + put, in.size() - put, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      put += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      int e = errno;
      return make_error(e == EPIPE || e == ECONNRESET ? errc::connection_reset : errc::io_error,
                        std::string(what) + ": " + std::strerror(e), e);
    }
    if (!wait_fd(fd, POLLOUT, deadline))
      return make_error(errc::timed_out, std::string(what) + " timed out");
  }
  return {};
}

std::vector<std::string> interface_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    if (::inet_ntop(family, raw, text, sizeof text) != nullptr) out.emplace_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace conveyor::net
