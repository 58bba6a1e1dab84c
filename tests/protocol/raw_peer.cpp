#include "raw_peer.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace cvp {

using namespace conveyor::wire;

namespace {
void set_timeouts(int fd) {
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}
}  // namespace

raw_peer& raw_peer::operator=(raw_peer&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    crc_ = o.crc_;
    o.fd_ = -1;
  }
  return *this;
}

raw_peer::~raw_peer() {
  if (fd_ >= 0) ::close(fd_);
}

raw_peer raw_peer::connect_to(std::uint16_t port, int rcvbuf, int maxseg) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  if (maxseg > 0) setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &maxseg, sizeof maxseg);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return raw_peer(-1);
  }
  set_timeouts(fd);
  return raw_peer(fd);
}

int raw_peer::mss() const {
  int m = 0;
  socklen_t l = sizeof m;
  if (getsockopt(fd_, IPPROTO_TCP, TCP_MAXSEG, &m, &l) != 0) return -1;
  return m;
}

bool raw_peer::send_all(std::span<const std::byte> b) {
  std::size_t put = 0;
  while (put < b.size()) {
    ssize_t n = ::send(fd_, b.data() + put, b.size() - put, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    put += static_cast<std::size_t>(n);
  }
  return true;
}

bool raw_peer::read_exact(std::span<std::byte> out) {
  std::size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::recv(fd_, out.data() + got, out.size() - got, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return false;
    }
    got += static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<mpa_frame> raw_peer::read_mpa(bool reply, std::vector<std::byte>* raw) {
  std::vector<std::byte> f(mpa_header_size);
  if (!read_exact(f)) return std::nullopt;
  auto pd = mpa_pd_length(f, reply);
  if (!pd) return std::nullopt;
  f.resize(mpa_header_size + *pd);
  if (!read_exact(std::span(f).subspan(mpa_header_size))) return std::nullopt;
  if (raw) *raw = f;
  auto d = decode_mpa(f, reply);
  if (!d) return std::nullopt;
  return *d;
}

std::optional<std::vector<std::byte>> raw_peer::read_fpdu() {
  std::byte len[2];
  if (!read_exact(len)) return std::nullopt;
  const std::size_t ulpdu = get_be16(len);
  std::vector<std::byte> f(fpdu_size(ulpdu));
  f[0] = len[0];
  f[1] = len[1];
  if (!read_exact(std::span(f).subspan(2))) return std::nullopt;
  return f;
}

bool raw_peer::sees_eof(std::chrono::milliseconds t) {
  const auto deadline = std::chrono::steady_clock::now() + t;
  std::byte sink[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd_, sink, sizeof sink, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;  // reset counts as closed
  }
  return false;
}

raw_listener::raw_listener(int maxseg) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (maxseg > 0) setsockopt(fd_, IPPROTO_TCP, TCP_MAXSEG, &maxseg, sizeof maxseg);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(fd_, 4);
  socklen_t l = sizeof a;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &l);
  port_ = ntohs(a.sin_port);
}

raw_listener::~raw_listener() {
  if (fd_ >= 0) ::close(fd_);
}

raw_peer raw_listener::accept_one() {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 5000) <= 0) return raw_peer(-1);
  int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (c >= 0) set_timeouts(c);
  return raw_peer(c);
}

}  // namespace cvp
