// Unix stream sockets for the shm provider (unix_socket.hpp).
#include "providers/shm/net/unix_socket.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace conveyor::shm::net {

namespace {

int ms_left(clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

std::string seconds_text(std::chrono::milliseconds ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return b;
}

int new_socket() {
  return ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
}

// Keeps the descriptors a message passed in the entries of fds that are -1,
// in order, and closes any others.
void take_fds(msghdr& mh, std::span<int> fds) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < k; ++i) {
      int pfd;
      std::memcpy(&pfd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      auto slot = std::find(fds.begin(), fds.end(), -1);
      if (slot != fds.end())
        *slot = pfd;
      else
        ::close(pfd);  // unexpected extra descriptors are not kept
    }
  }
}

// One recvmsg into p[*off, n) with room for four descriptors.
ssize_t recv_once(int fd, void* p, std::size_t n, std::size_t* off, std::span<int> fds) {
  iovec iov{static_cast<char*>(p) + *off, n - *off};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)]{};
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  const ssize_t r = ::recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (r > 0) {
    take_fds(mh, fds);
    *off += static_cast<std::size_t>(r);
  }
  return r;
}

}  // namespace

fd_holder& fd_holder::operator=(fd_holder&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void fd_holder::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

result<unix_address> parse_address(std::string_view address) {
  unix_address a;
  a.sa.sun_family = AF_UNIX;
  if (address.empty() || address.size() >= sizeof a.sa.sun_path ||
      address.find(':') != std::string_view::npos)
    return make_error(errc::address_error,
                      "shm address \"" + std::string(address) +
                          "\": expected \"@abstract-name\" or a socket path (under " +
                          std::to_string(sizeof a.sa.sun_path) + " bytes)");
  std::memcpy(a.sa.sun_path, address.data(), address.size());
  if (address[0] == '@') a.sa.sun_path[0] = '\0';  // abstract: nothing in the filesystem
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  return a;
}

result<fd_holder> listen(const unix_address* address, int backlog, std::string* bound,
                         const std::string& where) {
  unix_address autobind;  // the family alone: the kernel picks a name
  autobind.sa.sun_family = AF_UNIX;
  autobind.len = sizeof(sa_family_t);
  const unix_address& a = address != nullptr ? *address : autobind;
  fd_holder fd(new_socket());
  if (!fd) return make_error(errc::resource_exhausted, "listen on " + where + ": socket", errno);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a.sa), a.len) != 0)
    return make_error(errc::address_error, "listen on " + where + ": bind", errno);
  std::string name = where;
  if (address == nullptr) {  // the name the kernel chose, in shm's syntax ("@name")
    sockaddr_un got{};
    socklen_t got_len = sizeof got;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &got_len) != 0)
      return make_error(errc::address_error, "listen on " + where + ": getsockname", errno);
    const std::size_t n = got_len - offsetof(sockaddr_un, sun_path);
    if (n < 2 || got.sun_path[0] != '\0')
      return make_error(errc::address_error, "listen on " + where + ": the kernel bound no name");
    name = "@" + std::string(got.sun_path + 1, n - 1);
    if (bound != nullptr) *bound = name;
  }
  if (::listen(fd.get(), backlog) != 0)
    return make_error(errc::address_error, "listen on " + name + ": listen", errno);
  return fd;
}

result<fd_holder> connect(const unix_address& address, clock::time_point deadline,
                          const std::string& where, const std::string& peer) {
  fd_holder s(new_socket());
  if (!s) return make_error(errc::resource_exhausted, where + ": socket", errno);
  for (;;) {
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&address.sa), address.len) == 0)
      return s;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {  // the listener's backlog is full: retry until the deadline
      if (ms_left(deadline) == 0)
        return make_error(errc::timed_out, where + ": the listener's backlog stayed full");
      ::usleep(1000);
      continue;
    }
    if (errno == ECONNREFUSED || errno == ENOENT)
      return make_error(errc::connection_refused, where + ": nothing listens at " + peer, errno);
    return make_error(errc::io_error, where, errno);
  }
}

result<void> send_with_fds(int fd, const void* p, std::size_t n, std::span<const int> fds,
                           clock::time_point deadline, const std::string& what) {
  const auto* bytes = static_cast<const char*>(p);
  std::size_t off = 0;
  if (fds.size() > 4) return make_error(errc::invalid_argument, what + ": too many descriptors");
  bool fds_sent = fds.empty();
  while (off < n) {
    iovec iov{const_cast<char*>(bytes + off), n - off};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)]{};
    if (!fds_sent) {
      mh.msg_control = ctl;
      mh.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      if (c == nullptr)
        return make_error(errc::resource_exhausted, what + ": no room for the descriptors");
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
    }
    const ssize_t r = ::sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      off += static_cast<std::size_t>(r);
      fds_sent = true;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd pf{fd, POLLOUT, 0};
      if (ms_left(deadline) == 0) return make_error(errc::timed_out, what + ": timed out");
      ::poll(&pf, 1, ms_left(deadline));
      continue;
    }
    return make_error(
        errno == EPIPE || errno == ECONNRESET ? errc::connection_reset : errc::io_error, what,
        errno);
  }
  return {};
}

result<void> recv_with_fds(int fd, void* p, std::size_t n, std::span<int> fds,
                           clock::time_point deadline, std::chrono::milliseconds timeout,
                           const std::string& what) {
  std::size_t off = 0;
  while (off < n) {
    const ssize_t r = recv_once(fd, p, n, &off, fds);
    if (r > 0) continue;
    if (r == 0)
      return make_error(errc::connection_reset, what + ": the peer closed the connection");
    if (errno == EAGAIN || errno == EINTR) {
      if (ms_left(deadline) == 0)
        return make_error(errc::timed_out, what + " timed out after " + seconds_text(timeout));
      pollfd pf{fd, POLLIN, 0};
      ::poll(&pf, 1, std::min(ms_left(deadline), 1000));
      continue;
    }
    return make_error(errno == ECONNRESET ? errc::connection_reset : errc::io_error, what, errno);
  }
  return {};
}

recv_step recv_some_with_fds(int fd, void* p, std::size_t n, std::size_t* off, std::span<int> fds) {
  while (*off < n) {
    const ssize_t r = recv_once(fd, p, n, off, fds);
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return recv_step::more;
    return recv_step::closed;
  }
  return recv_step::done;
}

pid_t peer_pid(int fd) {
  ucred cr{};
  socklen_t len = sizeof cr;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return 0;
  return cr.pid;
}

void ring(int fd) noexcept {
  const char b = 1;
  [[maybe_unused]] auto r = ::send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

bool drain(int fd) noexcept {
  char buf[64];
  for (;;) {
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      if (r < static_cast<ssize_t>(sizeof buf)) return true;
      continue;
    }
    return !(r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR));
  }
}

void hang_up(int fd) noexcept {
  ::shutdown(fd, SHUT_RDWR);
}

}  // namespace conveyor::shm::net
