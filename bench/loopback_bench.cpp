// conveyor-loopback-bench — Conveyor's soft provider next to raw TCP, over
// 127.0.0.1, in one run.
//
//   conveyor-loopback-bench [--runs N] [--progress thread|manual] [--crc on|off] [--json]
//
// The program forks right after parsing its arguments: the parent is the client
// (it drives every measurement and prints the results), the child is the server.
// They are two processes, each with its own device, connected by one Conveyor
// connection, by plain TCP sockets for the raw-TCP baselines, and by a Unix
// socketpair that carries only control messages (never timed).
//
// Measurements (each repeated --runs times; the table shows median [min-max]):
//   - 8 B RDMA WRITE ping-pong round trip (ib_write_lat style: each side writes
//     into the other's buffer and spins on its own memory for the new value;
//     inline writes, one in 64 signaled);
//   - 8 B RDMA READ round trip (post, spin on poll() for the completion);
//   - raw TCP 8 B ping-pong with TCP_NODELAY (blocking send/recv);
//   - 64 KiB and 1 MiB RDMA WRITE and READ bandwidth, 16 requests outstanding,
//     next to raw TCP streaming with writes of the same size;
//   - 8 B RDMA WRITE message rate (batches of 16 inline, unsignaled writes, the
//     last of each batch signaled, 8 batches outstanding) next to 8-byte TCP
//     send() calls;
//   - CPU used by each idle process (connection open, nothing to do) over 2 s.
// Busy loops use completion_queue::poll(); blocking waits use wait().
#include <CLI/CLI.hpp>
#include <conveyor/conveyor.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace cvy = conveyor;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

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
[[noreturn]] void fail(const std::string& what) {
  throw failure(what);
}
[[noreturn]] void fail_errno(const std::string& what) {
  fail(what + ": " + std::strerror(errno));
}

template <class T>
T check(cvy::result<T> r, std::string_view what) {
  if (!r) fail(std::string(what) + ": " + r.error().to_string());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}
void check(cvy::status s, std::string_view what) {
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

double seconds_since(clock_type::time_point t0) {
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

void write_all(int fd, const void* p, std::size_t n, const char* what) {
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
bool read_all(int fd, void* p, std::size_t n, const char* what, bool busy_poll = false) {
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
void send_ctl(int fd, ctl_msg m) {
  write_all(fd, &m, sizeof m, "control channel");
}
ctl_msg recv_ctl(int fd) {
  ctl_msg m;
  if (!read_all(fd, &m, sizeof m, "control channel"))
    fail("the other process closed the control channel");
  return m;
}
ctl_msg expect_ctl(int fd, cmd want) {
  auto m = recv_ctl(fd);
  if (m.op != want) fail("control channel: unexpected message");
  return m;
}

// ------------------------------------------------------------------ raw TCP ----
int tcp_listen(std::uint16_t& port) {
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
void set_nodelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) fail_errno("TCP_NODELAY");
}
int tcp_accept(int lfd) {
  int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) fail_errno("accept");
  set_nodelay(fd);
  return fd;
}
int tcp_connect(std::uint16_t port) {
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

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}
// Percent of one core used by this process while it sleeps for `d`.
double idle_cpu_percent(std::chrono::milliseconds d) {
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
    d.request_crc = o.crc;
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

// ------------------------------------------------------------------ server ----
int serve_commands(endpoint& ep, int ctl, int tcp_lfd);

int run_server(const options& o, int ctl) {
  endpoint ep(o);
  auto lis = check(cvy::listener::bind(ep.dev, "127.0.0.1:0"), "listen");
  std::uint16_t tcp_port = 0;
  int tcp_lfd = tcp_listen(tcp_port);
  send_ctl(ctl, {cmd::done, lis.port(), tcp_port, 0});

  auto req = check(lis.accept(30s), "accept");
  ep.peer_pong = check(cvy::remote_region::decode(req.private_data()), "client's key");
  std::array<std::byte, 2 * cvy::remote_region::encoded_size> pdata{};
  ep.big_mr.remote().encode_to(std::span(pdata).first<cvy::remote_region::encoded_size>());
  ep.pong_mr.remote().encode_to(std::span(pdata).last<cvy::remote_region::encoded_size>());
  ep.conn = check(req.accept(ep.qp, pdata), "accept").attr;

  try {
    return serve_commands(ep, ctl, tcp_lfd);
  } catch (const failure&) {
    std::fprintf(stderr, "conveyor-loopback-bench server: %s\n", ep.state().c_str());
    throw;
  }
}

int serve_commands(endpoint& ep, int ctl, int tcp_lfd) {
  std::vector<std::byte> sink(4 * mib);
  for (;;) {
    auto m = recv_ctl(ctl);
    switch (m.op) {
      case cmd::write_lat: {  // the responder of the ping-pong
        auto s = ep.small_mr.slice(0, 8);
        std::uint64_t reaped = 0;
        stall_timer st{"server: WRITE ping-pong"};
        for (std::uint64_t i = 1; i <= m.b; ++i) {
          while (ep.pong.load64() != i) {
            reaped += ep.reap();
            ep.relax();
            st.check([&] {
              return "waiting for " + std::to_string(i) + ", memory holds " +
                     std::to_string(ep.pong.load64()) + "; " + ep.state();
            });
          }
          st.progress();
          auto wr = ep.write8(i, s);
          check(ep.qp.post_send(wr), "post RDMA WRITE");
        }
        while (reaped < m.b / pingpong_signal_every) {
          reaped += ep.reap();
          st.check(
              [&] { return "reaped " + std::to_string(reaped) + " completions; " + ep.state(); });
        }
        send_ctl(ctl, {cmd::done, 0, 0, 0});
        break;
      }
      case cmd::serve: {  // one-sided traffic: the engine serves it
        if (!ep.manual) {
          expect_ctl(ctl, cmd::stop);
        } else {  // nobody else drives progress: poll the CQ and watch for "stop"
          pollfd p{ctl, POLLIN, 0};
          for (unsigned n = 0;; ++n) {
            ep.reap();
            if (n % 64 == 0 && ::poll(&p, 1, 0) > 0) break;
          }  // (bounded by the client, whose loops are)
          expect_ctl(ctl, cmd::stop);
        }
        send_ctl(ctl, {cmd::done, 0, 0, 0});
        break;
      }
      case cmd::tcp_pingpong: {  // m.a != 0: busy-poll (MSG_DONTWAIT), like a polling RDMA stack
        int fd = tcp_accept(tcp_lfd);
        std::uint64_t v;
        while (read_all(fd, &v, 8, "TCP ping-pong", m.a != 0))
          write_all(fd, &v, 8, "TCP ping-pong");
        ::close(fd);
        break;
      }
      case cmd::tcp_stream: {
        int fd = tcp_accept(tcp_lfd);
        std::uint64_t total = 0;
        for (;;) {
          ssize_t k = ::recv(fd, sink.data(), sink.size(), 0);
          if (k < 0 && errno == EINTR) continue;
          if (k < 0) fail_errno("TCP stream");
          if (k == 0) break;
          total += static_cast<std::uint64_t>(k);
        }
        write_all(fd, &total, 8, "TCP stream");
        ::close(fd);
        break;
      }
      case cmd::idle:
        send_ctl(ctl, {cmd::done, 0, 0, idle_cpu_percent(idle_time)});
        break;
      case cmd::quit:
        ::close(tcp_lfd);
        return 0;
      default:
        fail("server: unexpected control message");
    }
  }
}

// ------------------------------------------------------------------ client ----
struct series {
  std::vector<double> v;
  double median() const {
    auto s = v;
    std::sort(s.begin(), s.end());
    if (s.empty()) return 0;
    return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
  }
  double min() const { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
  double max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
};

struct client {
  const options& o;
  int ctl;
  std::uint16_t tcp_port = 0;
  endpoint ep;

  client(const options& opt, int c) : o(opt), ctl(c), ep(opt) {}

  void connect() {
    auto hello = expect_ctl(ctl, cmd::done);
    tcp_port = static_cast<std::uint16_t>(hello.b);
    auto pong_key = ep.pong_mr.remote().encode();
    auto info = check(
        cvy::connect(ep.qp, "127.0.0.1:" + std::to_string(hello.a), {.private_data = pong_key}),
        "connect");
    std::span<const std::byte> pd(info.private_data);
    if (pd.size() < 2 * cvy::remote_region::encoded_size) fail("server's private data too short");
    ep.peer_big =
        check(cvy::remote_region::decode(pd.first(cvy::remote_region::encoded_size)), "key");
    ep.peer_pong =
        check(cvy::remote_region::decode(pd.subspan(cvy::remote_region::encoded_size)), "key");
    ep.conn = info.attr;
  }

  // 8 B WRITE ping-pong: median round trip in µs.
  double write_pingpong() {
    send_ctl(ctl, {cmd::write_lat, 0, static_cast<std::uint64_t>(lat_warmup + lat_iters), 0});
    std::vector<double> rtt;
    rtt.reserve(lat_iters);
    auto s = ep.small_mr.slice(0, 8);
    constexpr std::uint64_t total = lat_warmup + lat_iters;
    std::uint64_t reaped = 0;
    stall_timer st{"client: WRITE ping-pong"};
    for (std::uint64_t i = 1; i <= total; ++i) {
      auto t0 = clock_type::now();
      auto wr = ep.write8(i, s);
      check(ep.qp.post_send(wr), "post RDMA WRITE");
      while (ep.pong.load64() != i) {
        reaped += ep.reap();
        ep.relax();
        st.check([&] {
          return "waiting for " + std::to_string(i) + ", memory holds " +
                 std::to_string(ep.pong.load64()) + "; " + ep.state();
        });
      }
      st.progress();
      if (i > lat_warmup)
        rtt.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    while (reaped < total / pingpong_signal_every) {
      reaped += ep.reap();
      st.check([&] { return "reaped " + std::to_string(reaped) + " completions; " + ep.state(); });
    }
    expect_ctl(ctl, cmd::done);
    return series{rtt}.median();
  }

  void serve_begin() { send_ctl(ctl, {cmd::serve, 0, 0, 0}); }
  void serve_end() {
    send_ctl(ctl, {cmd::stop, 0, 0, 0});
    expect_ctl(ctl, cmd::done);
  }

  // 8 B READ: median round trip in µs (post, spin on poll for the completion).
  double read_rtt() {
    serve_begin();
    std::vector<double> rtt;
    rtt.reserve(lat_iters);
    auto local = ep.small_mr.slice(64, 8);
    for (int i = 0; i < lat_warmup + lat_iters; ++i) {
      auto t0 = clock_type::now();
      check(ep.qp.post_read(local, ep.peer_big.slice(0, 8), 1), "post RDMA READ");
      stall_timer st{"client: READ round trip"};
      while (ep.reap() == 0) {
        ep.relax();
        st.check([&] { return "READ #" + std::to_string(i) + "; " + ep.state(); });
      }
      if (i >= lat_warmup)
        rtt.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    serve_end();
    return series{rtt}.median();
  }

  double tcp_pingpong(bool busy_poll) {
    send_ctl(ctl, {cmd::tcp_pingpong, busy_poll ? 1u : 0u, 0, 0});
    int fd = tcp_connect(tcp_port);
    std::vector<double> rtt;
    rtt.reserve(lat_iters);
    for (std::uint64_t i = 1; i <= lat_warmup + lat_iters; ++i) {
      auto t0 = clock_type::now();
      std::uint64_t v = i, back = 0;
      write_all(fd, &v, 8, "TCP ping-pong");
      if (!read_all(fd, &back, 8, "TCP ping-pong", busy_poll) || back != i)
        fail("TCP ping-pong: wrong echo");
      if (i > lat_warmup)
        rtt.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    ::close(fd);
    return series{rtt}.median();
  }

  // RDMA WRITE or READ of `size` bytes, bw_window outstanding, for stream_time;
  // returns MB/s. A WRITE stream ends with an 8-byte READ, so all writes have
  // been placed at the server when the clock stops.
  double rdma_bandwidth(cvy::wr_opcode op, std::size_t size) {
    std::uint32_t window = bw_window;
    if (op == cvy::wr_opcode::rdma_read) window = std::min(window, std::max(1u, ep.conn.ord));
    serve_begin();
    std::uint64_t posted = 0, completed = 0, outstanding = 0;
    const auto t0 = clock_type::now();
    const auto deadline = t0 + stream_time;
    stall_timer st{"client: bandwidth"};
    for (;;) {
      bool more = clock_type::now() < deadline;
      while (more && outstanding < window) {
        std::size_t off = (posted % bw_window) * size;
        auto local = (op == cvy::wr_opcode::rdma_write ? ep.big_mr : ep.aux_mr).slice(off, size);
        cvy::send_wr wr{.wr_id = posted,
                        .opcode = op,
                        .sg_list = std::span(&local, 1),
                        .remote_addr = ep.peer_big.addr + off,
                        .rkey = ep.peer_big.rkey};
        check(ep.qp.post_send(wr), "post");
        ++posted;
        ++outstanding;
      }
      auto n = ep.reap();
      completed += n;
      outstanding -= n;
      if (!more && outstanding == 0) break;
      if (n == 0) {
        ep.relax();
        st.check([&] {
          return std::to_string(outstanding) + " of " + std::to_string(posted) +
                 " requests outstanding; " + ep.state();
        });
      } else {
        st.progress();
      }
    }
    if (op == cvy::wr_opcode::rdma_write) {
      check(ep.qp.post_read(ep.small_mr.slice(64, 8), ep.peer_big.slice(0, 8), 1),
            "post flush READ");
      ep.wait_one("flush READ");
    }
    double secs = seconds_since(t0);
    serve_end();
    return static_cast<double>(completed * size) / secs / 1e6;
  }

  // Raw TCP: streams writes of `chunk` bytes for stream_time; MB/s (or, with
  // chunk == 8, millions of send() calls per second).
  double tcp_stream(std::size_t chunk, bool rate) {
    send_ctl(ctl, {cmd::tcp_stream, 0, 0, 0});
    int fd = tcp_connect(tcp_port);
    const std::byte* src = ep.big.ptr;
    std::uint64_t sent = 0, calls = 0;
    const auto t0 = clock_type::now();
    const auto deadline = t0 + stream_time;
    while (clock_type::now() < deadline) {
      write_all(fd, src, chunk, "TCP stream");
      sent += chunk;
      ++calls;
    }
    ::shutdown(fd, SHUT_WR);
    std::uint64_t total = 0;
    if (!read_all(fd, &total, 8, "TCP stream") || total != sent)
      fail("TCP stream: byte count mismatch");
    double secs = seconds_since(t0);
    ::close(fd);
    return rate ? static_cast<double>(calls) / secs / 1e6 : static_cast<double>(sent) / secs / 1e6;
  }

  // 8 B WRITE message rate in Mops/s.
  double write_rate() {
    serve_begin();
    auto s = ep.big_mr.slice(0, 8);
    std::array<cvy::send_wr, rate_batch> batch;
    for (std::uint32_t i = 0; i < rate_batch; ++i)
      batch[i] = {.wr_id = 0,
                  .opcode = cvy::wr_opcode::rdma_write,
                  .flags = i + 1 == rate_batch
                               ? cvy::send_flags::signaled | cvy::send_flags::inline_data
                               : cvy::send_flags::inline_data,
                  .sg_list = std::span(&s, 1),
                  .remote_addr = ep.peer_big.addr + i * 8,
                  .rkey = ep.peer_big.rkey};
    std::uint64_t posted = 0, outstanding = 0;
    const auto t0 = clock_type::now();
    const auto deadline = t0 + stream_time;
    stall_timer st{"client: message rate"};
    for (;;) {
      bool more = clock_type::now() < deadline;
      while (more && outstanding < rate_batches) {
        std::size_t bad = 0;
        auto rc = ep.qp.post_send(batch, &bad);
        if (rc == cvy::errc::again && bad == 0) break;  // send queue full: reap first
        check(rc, "post batch of RDMA WRITEs");
        posted += rate_batch;
        ++outstanding;
      }
      auto n = ep.reap();
      outstanding -= n;
      if (!more && outstanding == 0) break;
      if (n == 0) {
        ep.relax();
        st.check([&] {
          return std::to_string(outstanding) + " batches outstanding of " +
                 std::to_string(posted / rate_batch) + "; " + ep.state();
        });
      } else {
        st.progress();
      }
    }
    check(ep.qp.post_read(ep.small_mr.slice(64, 8), ep.peer_big.slice(0, 8), 1), "post flush READ");
    ep.wait_one("flush READ");
    double secs = seconds_since(t0);
    serve_end();
    return static_cast<double>(posted) / secs / 1e6;
  }

  std::pair<double, double> idle() {
    send_ctl(ctl, {cmd::idle, 0, 0, 0});
    double mine = idle_cpu_percent(idle_time);
    auto m = expect_ctl(ctl, cmd::done);
    return {mine, m.v};
  }
};

struct result_row {
  const char* name;
  const char* unit;
  series conveyor;
  series* tcp;  // the baseline (may be shared by rows), or null
  bool higher_is_better;
};

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
  return b;
}
std::string cell(const series& s) {
  return fmt(s.median()) + " [" + fmt(s.min()) + "-" + fmt(s.max()) + "]";
}

int run_client(const options& o, int ctl) {
  client c(o, ctl);
  c.connect();
  // Latency baseline: a TCP ping-pong in the same polling mode as Conveyor's
  // loops (both ends busy-poll recv with MSG_DONTWAIT); the blocking ping-pong
  // is shown as a reference row.
  series tcp_rtt, tcp_64k, tcp_1m, tcp_rate;
  std::vector<result_row> rows = {
      {"8 B RDMA WRITE ping-pong round trip", "us", {}, &tcp_rtt, false},
      {"8 B RDMA READ round trip", "us", {}, &tcp_rtt, false},
      {"raw TCP 8 B ping-pong, blocking recv", "us", {}, nullptr, false},
      {"64 KiB RDMA WRITE bandwidth", "MB/s", {}, &tcp_64k, true},
      {"64 KiB RDMA READ bandwidth", "MB/s", {}, &tcp_64k, true},
      {"1 MiB RDMA WRITE bandwidth", "MB/s", {}, &tcp_1m, true},
      {"1 MiB RDMA READ bandwidth", "MB/s", {}, &tcp_1m, true},
      {"8 B RDMA WRITE message rate", "Mops/s", {}, &tcp_rate, true},
      {"idle CPU, client process, 2 s", "% core", {}, nullptr, false},
      {"idle CPU, server process, 2 s", "% core", {}, nullptr, false},
  };
  for (int r = 0; r < o.runs; ++r) {
    if (!o.json) std::fprintf(stderr, "run %d/%d...\n", r + 1, o.runs);
    rows[0].conveyor.v.push_back(c.write_pingpong());
    rows[1].conveyor.v.push_back(c.read_rtt());
    tcp_rtt.v.push_back(c.tcp_pingpong(true));
    rows[2].conveyor.v.push_back(c.tcp_pingpong(false));
    rows[3].conveyor.v.push_back(c.rdma_bandwidth(cvy::wr_opcode::rdma_write, 64 * kib));
    rows[4].conveyor.v.push_back(c.rdma_bandwidth(cvy::wr_opcode::rdma_read, 64 * kib));
    tcp_64k.v.push_back(c.tcp_stream(64 * kib, false));
    rows[5].conveyor.v.push_back(c.rdma_bandwidth(cvy::wr_opcode::rdma_write, mib));
    rows[6].conveyor.v.push_back(c.rdma_bandwidth(cvy::wr_opcode::rdma_read, mib));
    tcp_1m.v.push_back(c.tcp_stream(mib, false));
    rows[7].conveyor.v.push_back(c.write_rate());
    tcp_rate.v.push_back(c.tcp_stream(8, true));
    auto [client_idle, server_idle] = c.idle();
    rows[8].conveyor.v.push_back(client_idle);
    rows[9].conveyor.v.push_back(server_idle);
  }
  send_ctl(ctl, {cmd::quit, 0, 0, 0});

  const char* progress = o.progress == cvy::progress_mode::thread ? "thread" : "manual";
  const auto iw = c.ep.conn.iwarp.value_or(cvy::iwarp_connection_attr{});  // soft: always there
  if (o.json) {
    std::printf(
        "{\"runs\": %d, \"progress\": \"%s\", \"crc\": %s, \"processes\": 2, \"results\": [",
        o.runs, progress, iw.crc ? "true" : "false");
    auto arr = [](const series& s) {
      std::string a = "[";
      for (std::size_t i = 0; i < s.v.size(); ++i) a += (i ? ", " : "") + fmt(s.v[i]);
      return a + "]";
    };
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& row = rows[i];
      std::printf(
          "%s\n  {\"name\": \"%s\", \"unit\": \"%s\", \"conveyor\": {\"median\": %s, \"min\": %s, "
          "\"max\": %s, \"runs\": %s}",
          i ? "," : "", row.name, row.unit, fmt(row.conveyor.median()).c_str(),
          fmt(row.conveyor.min()).c_str(), fmt(row.conveyor.max()).c_str(),
          arr(row.conveyor).c_str());
      if (row.tcp)
        std::printf(
            ", \"tcp\": {\"median\": %s, \"min\": %s, \"max\": %s, \"runs\": %s}, \"ratio\": %.3f",
            fmt(row.tcp->median()).c_str(), fmt(row.tcp->min()).c_str(),
            fmt(row.tcp->max()).c_str(), arr(*row.tcp).c_str(),
            row.conveyor.median() / row.tcp->median());
      std::printf("}");
    }
    std::printf("\n]}\n");
    return 0;
  }

  std::printf(
      "conveyor-loopback-bench %s: %d runs, progress=%s, CRC %s, MSS %u, max FPDU %u, ORD %u\n",
      cvy::version_string, o.runs, progress, iw.crc ? "on" : "off", iw.mss, iw.max_fpdu,
      c.ep.conn.ord);
  std::printf(
      "client and server: two processes (fork) over 127.0.0.1; median [min-max] of the runs\n\n");
  std::printf("%-36s %-7s %-26s %-26s %s\n", "measurement", "unit", "conveyor", "raw TCP",
              "conveyor/TCP");
  for (const auto& row : rows) {
    std::string tcp = row.tcp ? cell(*row.tcp) : "-";
    std::string ratio = row.tcp ? fmt(row.conveyor.median() / row.tcp->median()) + "x" : "-";
    std::printf("%-36s %-7s %-26s %-26s %s\n", row.name, row.unit, cell(row.conveyor).c_str(),
                tcp.c_str(), ratio.c_str());
  }
  std::printf(
      "\nraw TCP baselines: 8 B ping-pong with TCP_NODELAY, both ends busy-polling recv "
      "(MSG_DONTWAIT),\n"
      "as Conveyor's loops poll (the blocking ping-pong is the reference row); streams of 64 KiB\n"
      "and 1 MiB send() calls; 8-byte send() calls for the rate (Mops/s = million calls/s).\n"
      "Latency: lower is better; bandwidth and rate: higher is better.\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  std::string progress = "thread", crc = "on";
  CLI::App app{
      "Conveyor loopback benchmark: the soft provider next to raw TCP, measured by the "
      "same program in the same run (client and server are two processes).",
      "conveyor-loopback-bench"};
  app.add_option("--runs", o.runs, "runs of every measurement (medians are reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--progress", progress, "engine progress: a thread per device, or manual (poll)")
      ->check(CLI::IsMember({"thread", "manual"}))
      ->capture_default_str();
  app.add_option("--crc", crc, "ask the peer for MPA CRC32c")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_flag("--json", o.json, "print JSON instead of the table");
  CLI11_PARSE(app, argc, argv);
  o.progress = progress == "manual" ? cvy::progress_mode::manual : cvy::progress_mode::thread;
  o.crc = crc == "on";

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    std::perror("socketpair");
    return 1;
  }
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {  // the server
    ::close(sv[0]);
    int rc = 1;
    try {
      rc = run_server(o, sv[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "conveyor-loopback-bench server: FAILED: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  ::close(sv[1]);
  int rc = 1;
  try {
    rc = run_client(o, sv[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "conveyor-loopback-bench client: FAILED: %s\n", e.what());
  }
  ::close(sv[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    std::fprintf(stderr, "conveyor-loopback-bench: the server process failed\n");
    rc = 1;
  }
  return rc;
}
