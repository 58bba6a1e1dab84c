#include "crowd.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "providers/soft/wire/wire.hpp"

namespace cvh {

using clk = std::chrono::steady_clock;

std::size_t raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &rl);
    (void)::getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY ? std::size_t{1} << 20
                                      : static_cast<std::size_t>(rl.rlim_cur);
}

int start_connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int start_connect_unix(const std::string& address) {
  // A Unix stream connect does not proceed in the background (EAGAIN when the
  // backlog is full): connect blocking, bounded by a send timeout, then go
  // non-blocking.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, address.data(), std::min(address.size(), sizeof a.sun_path - 1));
  if (!address.empty() && address[0] == '@') a.sun_path[0] = '\0';
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

crowd::crowd(crowd_config c) : cfg_(c) {
  // A well-formed revision 2 request with 200 bytes of private data: 220 bytes,
  // complete only after 220 drip intervals.
  conveyor::wire::mpa_frame f;
  f.reply = false;
  f.revision = 2;
  f.flags = conveyor::wire::mpa_flag::crc;
  f.v2 = conveyor::wire::mpa_v2_words{4, 4, true, true, false, false};
  f.private_data.assign(200, std::byte{'d'});
  request_ = conveyor::wire::encode_mpa(f);
  if (!cfg_.unix_address.empty())
    request_.assign(1024, std::byte{'d'});  // never a whole shm request
  for (std::size_t i = 0; i < cfg_.idle; ++i) peers_.push_back({kind::idle});
  for (std::size_t i = 0; i < cfg_.drip; ++i) peers_.push_back({kind::drip});
  for (std::size_t i = 0; i < cfg_.junk; ++i) peers_.push_back({kind::junk});
  for (auto& p : peers_) open(p);
  thread_ = std::thread([this] { run(); });
}

crowd::~crowd() {
  stop_ = true;
  thread_.join();
  for (auto& p : peers_)
    if (p.fd >= 0) ::close(p.fd);
}

void crowd::open(peer& p) {
  p.fd =
      cfg_.unix_address.empty() ? start_connect(cfg_.port) : start_connect_unix(cfg_.unix_address);
  p.up = false;
  p.sent = 0;
}

bool crowd::wait_connected(std::chrono::milliseconds timeout) const {
  const auto end = clk::now() + timeout;
  while (established_.load() < peers_.size()) {
    if (clk::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void crowd::run() {
  std::vector<pollfd> pf(peers_.size());
  auto next_drip = clk::now() + cfg_.drip_interval;
  static const char junk[] =
      "GET / HTTP/1.1\r\nHost: conveyor\r\n\r\nnot an MPA request at all, not at all";
  while (!stop_) {
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      pf[i].fd = peers_[i].fd;
      pf[i].events = peers_[i].up ? POLLIN : POLLOUT;
      pf[i].revents = 0;
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_drip - clk::now()).count();
    (void)::poll(pf.data(), pf.size(), static_cast<int>(std::clamp<long>(wait, 0, 50)));
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      auto& p = peers_[i];
      if (p.fd < 0) continue;  // reopened at the next tick when churning
      const short ev = pf[i].revents;
      if (ev == 0) continue;
      if (!p.up) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0 || (ev & (POLLERR | POLLHUP))) {
          ::close(p.fd);
          p.fd = -1;
          continue;  // refused or reset before it was up: try again next round when churning
        }
        p.up = true;
        ++connected_;
        ++established_;
        if (p.k == kind::junk) (void)!::send(p.fd, junk, sizeof junk - 1, MSG_NOSIGNAL);
        if (p.k == kind::drip) {
          (void)!::send(p.fd, request_.data(), 1, MSG_NOSIGNAL);
          p.sent = 1;
        }
        continue;
      }
      // Connected: anything readable is the target's reject or its close.
      char buf[256];
      const ssize_t n = ::recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      ::close(p.fd);
      p.fd = -1;
      --connected_;
      ++closed_;
    }
    if (clk::now() >= next_drip) {
      next_drip += cfg_.drip_interval;
      if (cfg_.churn)
        for (auto& p : peers_)
          if (p.fd < 0) open(p);
      for (auto& p : peers_) {
        if (p.k != kind::drip || !p.up || p.fd < 0 || p.sent >= request_.size() - 1) continue;
        if (::send(p.fd, request_.data() + p.sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          ++p.sent;
          ++dripped_;
        }
      }
    }
  }
}

}  // namespace cvh
