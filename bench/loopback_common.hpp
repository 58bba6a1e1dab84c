// What conveyor-loopback-bench's two processes share (loopback_bench.cpp): the
// sizes and durations, the options, failures, stall timers, buffers, the
// control messages over the socketpair, raw TCP sockets, CPU accounting, and
// one side's Conveyor endpoint.
#pragma once

#include <conveyor/conveyor.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

namespace cvy = conveyor;

namespace loopback {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t kib = 1024, mib = 1024 * 1024;
constexpr std::size_t region_size = 16 * mib;
constexpr int lat_warmup = 200, lat_iters = 2000;
constexpr auto stream_time = 300ms;  // each bandwidth / rate measurement
constexpr auto idle_time = 2s;
constexpr std::uint32_t bw_window = 16;
constexpr std::uint32_t rate_batch = 16, rate_batches = 8;
constexpr std::uint64_t pingpong_signal_every = 64;

struct options {
  int runs = 5;
  cvy::progress_mode progress = cvy::progress_mode::thread;
  bool crc = true;
  bool json = false;
};

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& what) {
  throw failure(what);
}
[[noreturn]] inline void fail_errno(const std::string& what) {
  fail(what + ": " + std::strerror(errno));
}

template <class T>
T check(cvy::result<T> r, std::string_view what) {
  if (!r) fail(std::string(what) + ": " + r.error().to_string());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}
inline void check(cvy::status s, std::string_view what) {
  if (s != cvy::errc::ok) fail(std::string(what) + ": " + std::string(cvy::to_string(s)));
}

// Every busy loop is bounded: no progress for stall_limit is a failure that
// says where it stalled (a benchmark that hangs measures nothing).
constexpr auto stall_limit = 10s;
struct stall_timer {
  const char* what;
  clock_type::time_point last = clock_type::now();
  void progress() { last = clock_type::now(); }
  template <class Detail>
  void check(Detail&& detail) {
    if (clock_type::now() - last > stall_limit)
      fail(std::string(what) + ": no progress for 10 s (" + detail() + ")");
  }
};

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct buffer {
  explicit buffer(std::size_t n)
      : ptr(static_cast<std::byte*>(::operator new (n, std::align_val_t{4096}))), size(n) {
    std::memset(ptr, 0, n);
  }
  ~buffer() { ::operator delete (ptr, std::align_val_t{4096}); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  std::span<std::byte> span() const { return {ptr, size}; }
  // The first 8 bytes, read while a peer's RDMA WRITE may be landing in them:
  // the engine writes registered memory as a NIC would by DMA, so this read
  // races with it by design (ib_write_lat polls the same way). Exempt from
  // ThreadSanitizer, which cannot know that the engine stands for hardware.
  __attribute__((no_sanitize("thread"))) std::uint64_t load64() const {
    const std::uint64_t v = *reinterpret_cast<const volatile std::uint64_t*>(ptr);
    std::atomic_thread_fence(std::memory_order_acquire);
    return v;
  }
  void store64(std::uint64_t v) const { std::memcpy(ptr, &v, 8); }
  std::byte* ptr;
  std::size_t size;
};

// ---------------------------------------------------------------- control ----
// Fixed-size messages over the socketpair.
enum class cmd : std::uint32_t {
  write_lat = 1,
  serve,
  stop,
  tcp_pingpong,
  tcp_stream,
  idle,
  quit,
  done
};
struct ctl_msg {
  cmd op = cmd::done;
  std::uint32_t a = 0;
  std::uint64_t b = 0;
  double v = 0;
};

inline void write_all(int fd, const void* p, std::size_t n, const char* what) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail_errno(what);
    c += k;
    n -= static_cast<std::size_t>(k);
  }
}
// Reads exactly n bytes; returns false on a clean EOF before the first byte.
inline bool read_all(int fd, void* p, std::size_t n, const char* what, bool busy_poll = false) {
  auto* c = static_cast<char*>(p);
  std::size_t got = 0;
  while (got < n) {
    ssize_t k = ::recv(fd, c + got, n - got, busy_poll ? MSG_DONTWAIT : 0);
    if (k < 0 && (errno == EINTR || (busy_poll && (errno == EAGAIN || errno == EWOULDBLOCK))))
      continue;
    if (k < 0) fail_errno(what);
    if (k == 0) {
      if (got == 0) return false;
      fail(std::string(what) + ": unexpected end of stream");
    }
    got += static_cast<std::size_t>(k);
  }
  return true;
}
inline void send_ctl(int fd, ctl_msg m) {
  write_all(fd, &m, sizeof m, "control channel");
}
inline ctl_msg recv_ctl(int fd) {
  ctl_msg m;
  if (!read_all(fd, &m, sizeof m, "control channel"))
    fail("the other process closed the control channel");
  return m;
}
inline ctl_msg expect_ctl(int fd, cmd want) {
  auto m = recv_ctl(fd);
  if (m.op != want) fail("control channel: unexpected message");
  return m;
}

// ------------------------------------------------------------------ raw TCP ----
inline int tcp_listen(std::uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail_errno("socket");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) fail_errno("bind 127.0.0.1:0");
  if (::listen(fd, 8) < 0) fail_errno("listen");
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}
inline void set_nodelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) fail_errno("TCP_NODELAY");
}
inline int tcp_accept(int lfd) {
  int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) fail_errno("accept");
  set_nodelay(fd);
  return fd;
}
inline int tcp_connect(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail_errno("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) fail_errno("connect 127.0.0.1");
  set_nodelay(fd);
  return fd;
}

inline double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}
// Percent of one core used by this process while it sleeps for `d`.
inline double idle_cpu_percent(std::chrono::milliseconds d) {
  auto t0 = clock_type::now();
  double c0 = cpu_seconds();
  std::this_thread::sleep_for(d);
  return 100.0 * (cpu_seconds() - c0) / seconds_since(t0);
}

// ---------------------------------------------------------------- endpoint ----
// What both processes have: a device, one CQ, one connected QP, and buffers.
struct endpoint {
  cvy::device dev;
  cvy::protection_domain pd;
  cvy::completion_queue cq;
  buffer big{region_size}, aux{region_size}, pong{4096}, small{4096};
  cvy::memory_region big_mr, aux_mr, pong_mr, small_mr;
  cvy::queue_pair qp;
  cvy::remote_region peer_big, peer_pong;
  cvy::qp_connection_attr conn;
  bool manual = false;
  std::array<cvy::work_completion, 32> wcs;

  explicit endpoint(const options& o) {
    cvy::device_options d;
    d.progress = o.progress;
    d.software.request_crc = o.crc;
    manual = o.progress == cvy::progress_mode::manual;
    dev = check(cvy::device::open("soft", d), "open device soft");
    pd = check(dev.alloc_pd(), "alloc_pd");
    cq = check(dev.create_cq({.depth = 4096}), "create_cq");
    constexpr auto rw =
        cvy::access::local_write | cvy::access::remote_write | cvy::access::remote_read;
    big_mr = check(pd.register_memory(big.span(), rw), "register 16 MiB");
    aux_mr = check(pd.register_memory(aux.span(), cvy::access::local_write), "register 16 MiB");
    pong_mr = check(pd.register_memory(pong.span().first(64), rw), "register ping-pong buffer");
    small_mr =
        check(pd.register_memory(small.span(), cvy::access::local_write), "register scratch");
    qp = check(pd.create_qp({.send_cq = &cq, .recv_cq = &cq}), "create_qp");
  }

  // Non-blocking: reaps completions (and drives the engine in manual mode);
  // returns how many, failing on an error status.
  std::size_t reap() {
    auto n = cq.poll(wcs);
    if (!n) fail(std::string("poll: ") + std::string(cvy::to_string(n.error())));
    for (std::size_t i = 0; i < *n; ++i)
      if (wcs[i].status != cvy::wc_status::success)
        fail(std::string(cvy::to_string(wcs[i].opcode)) +
             " failed: " + std::string(cvy::to_string(wcs[i].status)));
    return *n;
  }
  std::string state() const {
    auto c = qp.counters();
    const auto iw = c.iwarp.value_or(cvy::iwarp_qp_counters{});  // soft: always there
    return "QP " + std::string(cvy::to_string(qp.state())) + ", tx/rx FPDUs " +
           std::to_string(iw.tx_fpdus) + "/" + std::to_string(iw.rx_fpdus) + ", tx/rx bytes " +
           std::to_string(c.tx_bytes) + "/" + std::to_string(c.rx_bytes) + ", writes placed " +
           std::to_string(c.writes_placed) + ", reads served " + std::to_string(c.reads_served) +
           ", ORD " + std::to_string(conn.ord);
  }
  // Lets the engine thread run while we spin (2 cores are shared by 4 threads).
  void relax() const {
    if (!manual) std::this_thread::yield();
  }
  // Blocking wait for exactly one completion.
  void wait_one(const char* what) {
    auto wc = cq.wait_one(10s);
    if (!wc) fail(std::string(what) + ": " + std::string(cvy::to_string(wc.error())));
    if (wc->status != cvy::wc_status::success)
      fail(std::string(what) + ": " + std::string(cvy::to_string(wc->status)));
  }
  // The ping-pong's write of counter value v: inline, and signaled only every
  // pingpong_signal_every-th time (to free send-queue slots), as perftest does.
  cvy::send_wr write8(std::uint64_t v, const cvy::sge& s) {
    small.store64(v);
    const bool sig = v % pingpong_signal_every == 0;
    return {.wr_id = v,
            .opcode = cvy::wr_opcode::rdma_write,
            .flags = sig ? cvy::send_flags::signaled | cvy::send_flags::inline_data
                         : cvy::send_flags::inline_data,
            .sg_list = std::span(&s, 1),
            .remote_addr = peer_pong.addr,
            .rkey = peer_pong.rkey};
  }
};

// The two processes (loopback_server.cpp, loopback_client.cpp) on their end of
// the control socketpair: the exit status; a failure throws `failure`.
int run_server(const options& o, int ctl);
int run_client(const options& o, int ctl);

}  // namespace loopback
