// Socket calls for the stateful fuzz targets that survive libFuzzer's signals.
// libFuzzer's timers (SIGALRM for -timeout, -max_total_time) interrupt a
// blocking connect() or send() with EINTR; a connect that the listener's full
// backlog holds back is one such call. An interrupted connect goes on in the
// kernel, so it is finished by waiting for the socket to be writable and
// reading its error, not by calling connect() again.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <span>

namespace conveyor::fuzz {

// 0, or the negative errno of the failed connect. Waits at most `limit`.
inline int connect_within(int fd, const sockaddr* a, socklen_t len,
                          std::chrono::milliseconds limit) {
  if (::connect(fd, a, len) == 0) return 0;
  if (errno != EINTR && errno != EINPROGRESS) return -errno;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return -ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -ETIMEDOUT;
    int err = 0;
    socklen_t el = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) return -errno;
    return -err;
  }
}

// Sends every byte (retrying EINTR); false on any other failure.
inline bool send_all(int fd, std::span<const std::byte> b, int flags = MSG_NOSIGNAL) {
  while (!b.empty()) {
    const ssize_t n = ::send(fd, b.data(), b.size(), flags);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    b = b.subspan(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace conveyor::fuzz
