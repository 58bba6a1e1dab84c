#include "common/raw_tcp.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cvt {

namespace {

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

}  // namespace

std::vector<std::byte> garbage_bytes(std::size_t n) {
  static const char text[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = i < sizeof text - 1 ? static_cast<std::byte>(text[i])
                               : static_cast<std::byte>((i * 131 + 17) & 0xff);
  }
  return v;
}

raw_server::raw_server(behaviour b) : b_(b) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    error_ = std::string("socket: ") + std::strerror(errno);
    return;
  }
  int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  auto a = loopback(0);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) {
    error_ = std::string("bind/listen: ") + std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    return;
  }
  socklen_t len = sizeof a;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { run(); });
}

raw_server::~raw_server() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void raw_server::run() {
  std::vector<int> conns;
  std::vector<bool> answered;
  while (!stop_.load()) {
    std::vector<pollfd> pfds;
    pfds.push_back({fd_, POLLIN, 0});
    for (int c : conns) pfds.push_back({c, POLLIN, 0});
    int r = ::poll(pfds.data(), pfds.size(), 20);
    if (r <= 0) continue;
    // Connections polled this round (one accepted below joins the next round).
    const std::size_t polled = pfds.size() - 1;
    if ((pfds[0].revents & POLLIN) != 0) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        accepted_.fetch_add(1);
        conns.push_back(c);
        answered.push_back(false);
      }
    }
    for (std::size_t i = 0; i < polled; ++i) {
      if (conns[i] < 0 || (pfds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      ssize_t n = ::recv(conns[i], buf, sizeof buf, 0);
      if (n <= 0) {
        ::close(conns[i]);
        conns[i] = -1;
        continue;
      }
      received_.fetch_add(static_cast<std::size_t>(n));
      if (answered[i]) continue;
      if (b_ == behaviour::garbage_reply) {
        auto g = garbage_bytes(64);
        (void)::send(conns[i], g.data(), g.size(), MSG_NOSIGNAL);
        answered[i] = true;
      } else if (b_ == behaviour::close_at_once) {
        ::close(conns[i]);
        conns[i] = -1;
      }
    }
  }
  for (int c : conns) {
    if (c >= 0) ::close(c);
  }
}

int raw_connect(std::uint16_t port, std::string& why) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  auto a = loopback(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    why = std::string("connect: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool raw_send_all(int fd, const std::vector<std::byte>& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

std::uint16_t unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  auto a = loopback(0);
  std::uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace cvt
