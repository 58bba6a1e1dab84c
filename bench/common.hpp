// Helpers shared by the comparison's own programs (conveyor-baseline,
// conveyor-fi-bench): CPU pinning, CPU accounting, percentiles, the
// out-of-band TCP socket, and one result record printed as a JSON line in the
// shape of `conveyor perf --json`'s "results" entries (schema conveyor-perf/2),
// so that bench/compare parses every peer the same way.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace bench {

using clock_type = std::chrono::steady_clock;

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& what) {
  throw failure(what);
}
[[noreturn]] inline void fail_errno(const std::string& what) {
  fail(what + ": " + std::strerror(errno));
}

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Pins the calling thread (and what it creates later) to one CPU; -1 = leave.
inline void pin_cpu(int cpu) {
  if (cpu < 0) return;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (::sched_setaffinity(0, sizeof s, &s) != 0)
    fail_errno("sched_setaffinity(" + std::to_string(cpu) + ")");
}

// User and system CPU seconds of this process (all threads).
struct cpu_time {
  double user = 0, sys = 0;
  static cpu_time now() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    auto tv = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
    };
    return {tv(ru.ru_utime), tv(ru.ru_stime)};
  }
  cpu_time operator-(const cpu_time& o) const { return {user - o.user, sys - o.sys}; }
};

struct result {
  std::string test, mode;
  std::size_t size = 0;
  std::uint64_t iterations = 0;
  double seconds = 0;
  double bytes = 0;            // payload bytes moved (bandwidth and rate)
  std::vector<double> lat_us;  // one sample per round trip (latency)
  cpu_time cpu, peer_cpu;
  std::string extra;  // more JSON members, each ",\"k\":v"
};

inline result make_result(std::string test, std::string mode, std::size_t size) {
  result r;
  r.test = std::move(test);
  r.mode = std::move(mode);
  r.size = size;
  return r;
}

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// One JSON line. mb_per_s is 10^6 bytes/s; mops is million operations/s.
inline void print_json(const result& r) {
  const double s = r.seconds > 0 ? r.seconds : 1e-9;
  std::printf(
      "{\"test\":\"%s\",\"mode\":\"%s\",\"size\":%zu,\"iterations\":%llu,\"seconds\":%.6f,"
      "\"mb_per_s\":%.3f,\"mops\":%.6f",
      r.test.c_str(), r.mode.c_str(), r.size, static_cast<unsigned long long>(r.iterations),
      r.seconds, r.bytes / s / 1e6, static_cast<double>(r.iterations) / s / 1e6);
  if (!r.lat_us.empty())
    std::printf(",\"lat_us\":{\"p50\":%.3f,\"p99\":%.3f,\"p999\":%.3f,\"max\":%.3f}",
                percentile(r.lat_us, 0.5), percentile(r.lat_us, 0.99), percentile(r.lat_us, 0.999),
                *std::max_element(r.lat_us.begin(), r.lat_us.end()));
  std::printf(
      ",\"cpu\":{\"user_s\":%.6f,\"sys_s\":%.6f,\"peer_user_s\":%.6f,\"peer_sys_s\":%.6f}%s}\n",
      r.cpu.user, r.cpu.sys, r.peer_cpu.user, r.peer_cpu.sys, r.extra.c_str());
  std::fflush(stdout);
}

// ------------------------------------------------------------ TCP sockets ----
inline void set_nodelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) fail_errno("TCP_NODELAY");
}

// "HOST:PORT" (IPv4 literal or name) -> sockaddr_in.
inline sockaddr_in parse_addr(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) fail("address '" + s + "' is not HOST:PORT");
  std::string host = s.substr(0, colon), port = s.substr(colon + 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int e = ::getaddrinfo(host.empty() ? "0.0.0.0" : host.c_str(), port.c_str(), &hints, &res);
      e != 0)
    fail("address '" + s + "': " + ::gai_strerror(e));
  sockaddr_in a;
  std::memcpy(&a, res->ai_addr, sizeof a);
  ::freeaddrinfo(res);
  return a;
}

inline int tcp_listen(const std::string& bind_addr) {
  auto a = parse_addr(bind_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail_errno("socket");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) fail_errno("bind " + bind_addr);
  if (::listen(fd, 1024) < 0) fail_errno("listen");
  return fd;
}

// Connects, retrying for up to 5 s while nothing listens yet (the server may
// still be starting).
inline int tcp_connect(const std::string& addr) {
  auto a = parse_addr(addr);
  auto t0 = clock_type::now();
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail_errno("socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      set_nodelay(fd);
      return fd;
    }
    int e = errno;
    ::close(fd);
    if (e != ECONNREFUSED || seconds_since(t0) > 5) {
      errno = e;
      fail_errno("connect " + addr);
    }
    ::usleep(20000);
  }
}

// One send or recv, retried on EINTR. busy_poll: the call uses MSG_DONTWAIT and
// is retried on EAGAIN, yielding between tries so that a peer sharing the core
// runs. Returns what the call returned (bytes, 0 at end of stream, or -1 with
// errno).
template <class Call>
ssize_t retry_io(bool busy_poll, Call call) {
  for (;;) {
    const ssize_t k = call(busy_poll ? MSG_DONTWAIT : 0);
    if (k >= 0) return k;
    if (errno == EINTR) continue;
    if (!busy_poll || (errno != EAGAIN && errno != EWOULDBLOCK)) return k;
    ::sched_yield();
  }
}
inline ssize_t send_some(int fd, const void* p, std::size_t n, bool busy_poll) {
  return retry_io(busy_poll, [&](int flags) { return ::send(fd, p, n, MSG_NOSIGNAL | flags); });
}
inline ssize_t recv_some(int fd, void* p, std::size_t n, bool busy_poll) {
  return retry_io(busy_poll, [&](int flags) { return ::recv(fd, p, n, flags); });
}

// Writes exactly n bytes (busy_poll: spins on MSG_DONTWAIT).
inline void write_all(int fd, const void* p, std::size_t n, const char* what,
                      bool busy_poll = false) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = send_some(fd, c, n, busy_poll);
    if (k <= 0) fail_errno(what);
    c += k;
    n -= static_cast<std::size_t>(k);
  }
}
// Reads exactly n bytes (busy_poll: spins on MSG_DONTWAIT); false on EOF
// before the first byte.
inline bool read_all(int fd, void* p, std::size_t n, const char* what, bool busy_poll = false) {
  auto* c = static_cast<char*>(p);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = recv_some(fd, c + got, n - got, busy_poll);
    if (k < 0) fail_errno(what);
    if (k == 0) {
      if (got == 0) return false;
      fail(std::string(what) + ": unexpected end of stream");
    }
    got += static_cast<std::size_t>(k);
  }
  return true;
}
template <class T>
void send_pod(int fd, const T& v) {
  write_all(fd, &v, sizeof v, "control socket");
}
template <class T>
T recv_pod(int fd) {
  T v{};
  if (!read_all(fd, &v, sizeof v, "control socket")) fail("the peer closed the control socket");
  return v;
}

// Comma-separated sizes with optional K/M suffixes (binary): "8,4K,1M".
inline std::vector<std::size_t> parse_sizes(const std::string& s) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    auto comma = s.find(',', pos);
    std::string t = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (t.empty()) fail("empty size in '" + s + "'");
    std::size_t mult = 1;
    char last = t.back();
    if (last == 'k' || last == 'K')
      mult = 1024, t.pop_back();
    else if (last == 'm' || last == 'M')
      mult = 1024 * 1024, t.pop_back();
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(t, &used);
    } catch (...) {
      used = 0;
    }
    if (used != t.size() || v == 0) fail("bad size '" + t + "' in '" + s + "'");
    out.push_back(static_cast<std::size_t>(v) * mult);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace bench
