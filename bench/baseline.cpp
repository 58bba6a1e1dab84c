// conveyor-baseline — the limits bench/compare puts next to Conveyor and its
// peers, measured by our own code in the same run. Every measurement prints one
// JSON line shaped like a `conveyor perf --json` result (see common.hpp).
//
//   conveyor-baseline tcp-server [--bind ADDR:PORT] [--cpu N]
//   conveyor-baseline tcp ADDR:PORT --test stream|pingpong [--poll busy|block]
//                     --size N [--duration S] [--iters N] [--warmup N] [--conns N] [--cpu N]
//   conveyor-baseline memcpy --size N [--duration S] [--cpu N]
//   conveyor-baseline shm-pingpong [--iters N] [--duration S] [--cpu N] [--peer-cpu N]
//   conveyor-baseline cma --test read|write --size N [--duration S] [--cpu N] [--peer-cpu N]
//
// tcp: one TCP connection per measurement (TCP_NODELAY). "stream": the client
// sends --warmup messages (16) and waits until the server has them all; then
// both clocks start and it send()s buffers of --size bytes for --duration, then
// shuts its side down; the
// server recv()s into a buffer of max(size, 1 MiB) until end of stream and
// answers with the byte count and its CPU time; the clock stops when that
// answer arrives, so every byte has been received. --poll busy: both ends spin
// on send/recv(MSG_DONTWAIT), as a polled RDMA provider's progress does;
// --poll block: blocking send/recv (the kernel wakes each side). "pingpong":
// --size bytes back and forth, busy-polling recv(MSG_DONTWAIT) or blocking in
// recv likewise; a sample per round trip. "pingpong --conns N": N connections,
// each round trip on the next one (as `conveyor perf --qps N` takes the next
// QP), the server answering whichever is readable through epoll (busy: spinning
// on epoll_wait(0)), as a server of many clients does. CPU: getrusage of
// both processes over the measurement.
// shm-pingpong: two processes (fork) bounce an 8-byte counter through one
// shared page, both spinning on it. cma: two processes (fork); the parent
// copies --size bytes from (read) or to (write) the child's buffer with
// process_vm_readv / process_vm_writev.
#include "common.hpp"

#include <CLI/CLI.hpp>

#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <memory>

using namespace bench;

namespace {

struct tcp_header {
  std::uint32_t test;  // 1 stream, 2 ping-pong
  std::uint32_t busy;  // spin on MSG_DONTWAIT instead of blocking
  std::uint64_t size;
  std::uint64_t warmup;  // stream: messages received before the clocks start
  std::uint64_t conns;   // ping-pong: connections (this one first; the others send a header too)
};
constexpr std::uint64_t max_conns = 4096;
struct tcp_reply {
  std::uint64_t bytes;
  double user, sys;
};

std::unique_ptr<char[]> make_buffer(std::size_t n) {
  auto p = std::make_unique<char[]>(n);
  std::memset(p.get(), 0x5a, n);
  return p;
}

// A ping-pong over h.conns connections: fd is the first; the rest are accepted
// from lfd. Each readable connection gets its message back; the reply goes on
// the first once every connection has ended.
std::uint64_t serve_many(int lfd, int fd, const tcp_header& h) {
  std::vector<int> fds{fd};
  struct closer {
    std::vector<int>& v;
    ~closer() {
      for (std::size_t i = 1; i < v.size(); ++i) ::close(v[i]);
    }
  } close_rest{fds};
  while (fds.size() < h.conns) {
    const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      fail_errno("accept");
    }
    fds.push_back(c);
    set_nodelay(c);
    const auto m = recv_pod<tcp_header>(c);
    if (m.test != 2 || m.size != h.size || m.conns != 0) fail("tcp-server: bad member header");
  }
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) fail_errno("epoll_create1");
  for (std::size_t i = 0; i < fds.size(); ++i) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = i;
    if (::epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &e) < 0) fail_errno("epoll_ctl");
  }
  auto buf = make_buffer(h.size);
  std::uint64_t bytes = 0;
  std::size_t open = fds.size();
  epoll_event evs[64];
  while (open > 0) {
    const int n = ::epoll_wait(ep, evs, 64, h.busy ? 0 : -1);
    if (n < 0 && errno != EINTR) fail_errno("epoll_wait");
    for (int k = 0; k < n; ++k) {
      const int c = fds[evs[k].data.u64];
      if (!read_all(c, buf.get(), h.size, "ping-pong recv", h.busy != 0)) {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, c, nullptr);
        --open;
        continue;
      }
      write_all(c, buf.get(), h.size, "ping-pong send");
      bytes += h.size;
    }
    if (n == 0) ::sched_yield();
  }
  ::close(ep);
  return bytes;
}

void serve_one(int lfd, int fd) {
  auto h = recv_pod<tcp_header>(fd);
  if (h.size == 0 || h.size > (64u << 20)) fail("tcp-server: bad size");
  if (h.conns > max_conns || (h.conns > 1 && h.test != 2)) fail("tcp-server: bad connection count");
  auto c0 = cpu_time::now();
  std::uint64_t bytes = 0;
  if (h.test == 1) {
    const std::size_t n = std::max<std::size_t>(h.size, 1u << 20);
    auto buf = make_buffer(n);
    if (h.warmup > 64) fail("tcp-server: bad warm-up");
    // The warm-up messages first (every buffer's first pass), then a byte back
    // that starts the client's clock, and this side's.
    for (std::uint64_t left = h.warmup * h.size; left > 0;) {
      const ssize_t k = recv_some(fd, buf.get(), std::min<std::uint64_t>(n, left), h.busy != 0);
      if (k <= 0) fail("tcp-server: stream ended in its warm-up");
      left -= static_cast<std::uint64_t>(k);
    }
    if (h.warmup > 0) {
      write_all(fd, "W", 1, "warm-up answer");
      c0 = cpu_time::now();
    }
    for (;;) {
      const ssize_t k = recv_some(fd, buf.get(), n, h.busy != 0);
      if (k < 0) fail_errno("recv");
      if (k == 0) break;
      bytes += static_cast<std::uint64_t>(k);
    }
  } else if (h.conns > 1) {
    bytes = serve_many(lfd, fd, h);
  } else {
    auto buf = make_buffer(h.size);
    while (read_all(fd, buf.get(), h.size, "ping-pong recv", h.busy != 0)) {
      write_all(fd, buf.get(), h.size, "ping-pong send");
      bytes += h.size;
    }
  }
  auto c = cpu_time::now() - c0;
  send_pod(fd, tcp_reply{bytes, c.user, c.sys});
}

int tcp_server(const std::string& bind, int cpu) {
  pin_cpu(cpu);
  int lfd = tcp_listen(bind);
  std::fprintf(stderr, "conveyor-baseline tcp-server: listening on %s\n", bind.c_str());
  for (;;) {
    int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      fail_errno("accept");
    }
    set_nodelay(fd);
    try {
      serve_one(lfd, fd);
    } catch (const failure& e) {
      std::fprintf(stderr, "conveyor-baseline tcp-server: %s\n", e.what());
    }
    ::close(fd);
  }
}

result tcp_client(const std::string& addr, const std::string& test, bool busy, std::size_t size,
                  double duration, std::uint64_t iters, std::uint64_t warmup, std::uint64_t conns) {
  int fd = tcp_connect(addr);
  const bool stream = test == "stream";
  if (!stream) warmup = 0;  // the ping-pong has its own
  send_pod(fd, tcp_header{stream ? 1u : 2u, busy ? 1u : 0u, size, warmup, conns});
  // The ping-pong's other connections (each round trip takes the next).
  std::vector<int> fds{fd};
  for (std::uint64_t i = 1; i < conns; ++i) {
    fds.push_back(tcp_connect(addr));
    send_pod(fds.back(), tcp_header{2u, busy ? 1u : 0u, size, 0, 0});
  }
  auto buf = make_buffer(size);
  if (warmup > 0) {
    for (std::uint64_t i = 0; i < warmup; ++i) write_all(fd, buf.get(), size, "warm-up send", busy);
    char w = 0;
    if (!read_all(fd, &w, 1, "warm-up answer", busy) || w != 'W') fail("no warm-up answer");
  }
  result r;
  r.test = stream ? (busy ? "tcp-stream-busy" : "tcp-stream-block")
           : busy ? "tcp-pingpong-busy"
                  : "tcp-pingpong-block";
  r.mode = stream ? "bw" : "lat";
  r.size = size;
  auto c0 = cpu_time::now();
  auto t0 = clock_type::now();
  const auto span =
      std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(duration));
  auto deadline = t0 + span;
  if (stream) {
    std::uint64_t n = 0;
    do {
      for (int i = 0; i < 16; ++i) write_all(fd, buf.get(), size, "stream send", busy);
      n += 16;
    } while (clock_type::now() < deadline && n < iters);
    r.iterations = n;
  } else {
    // Every connection once before the clock starts.
    const std::uint64_t pp_warmup = std::min<std::uint64_t>(100, iters / 10 + 1) + conns - 1;
    r.lat_us.reserve(iters);
    for (std::uint64_t i = 0; i < pp_warmup + iters; ++i) {
      if (i == pp_warmup) t0 = clock_type::now(), c0 = cpu_time::now(), deadline = t0 + span;
      auto s = clock_type::now();
      const int c = fds[i % fds.size()];
      write_all(c, buf.get(), size, "ping-pong send");
      if (!read_all(c, buf.get(), size, "ping-pong recv", busy))
        fail("server closed the connection");
      if (i >= pp_warmup) r.lat_us.push_back(seconds_since(s) * 1e6);
      if (i >= pp_warmup && clock_type::now() > deadline) break;
    }
    r.iterations = r.lat_us.size();
  }
  for (std::size_t i = fds.size(); i-- > 1;) {
    ::shutdown(fds[i], SHUT_WR);
    ::close(fds[i]);
  }
  ::shutdown(fd, SHUT_WR);
  auto reply = recv_pod<tcp_reply>(fd);
  r.seconds = seconds_since(t0);
  r.cpu = cpu_time::now() - c0;
  r.peer_cpu = {reply.user, reply.sys};
  r.bytes =
      stream ? static_cast<double>(reply.bytes) : static_cast<double>(r.iterations * size * 2);
  if (stream && reply.bytes != r.iterations * size)
    fail("server counted a different number of bytes");
  ::close(fd);
  return r;
}

result memcpy_bw(std::size_t size, double duration) {
  auto src = make_buffer(size), dst = make_buffer(size);
  auto r = make_result("memcpy", "bw", size);
  auto c0 = cpu_time::now();
  auto t0 = clock_type::now();
  std::uint64_t n = 0;
  const std::uint64_t batch = std::max<std::uint64_t>(1, (1u << 20) / size);
  do {
    for (std::uint64_t i = 0; i < batch; ++i) {
      std::memcpy(dst.get(), src.get(), size);
      asm volatile("" : : "r"(dst.get()) : "memory");
    }
    n += batch;
  } while (seconds_since(t0) < duration);
  r.seconds = seconds_since(t0);
  r.cpu = cpu_time::now() - c0;
  r.iterations = n;
  r.bytes = static_cast<double>(n * size);
  return r;
}

// Spins on pred; after a while yields each turn so a core-sharing peer runs.
template <class Pred>
void spin_until(Pred pred) {
  for (unsigned spins = 0; !pred(); ++spins) {
    if (spins < 2000)
      __builtin_ia32_pause();
    else
      ::sched_yield();
  }
}

struct alignas(64) line {
  std::atomic<std::uint64_t> v{0};
};
struct shared_page {
  line ping, pong, go;
  std::atomic<std::uint64_t> child_addr{0};
  double child_user = 0, child_sys = 0;
};

shared_page* map_shared() {
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail_errno("mmap shared");
  return new (p) shared_page;
}

void wait_child(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail("the child process failed");
}

result shm_pingpong(std::uint64_t iters, double duration, int cpu, int peer_cpu) {
  auto* sp = map_shared();
  const std::uint64_t warmup = 1000;
  pid_t pid = ::fork();
  if (pid < 0) fail_errno("fork");
  if (pid == 0) {
    pin_cpu(peer_cpu);
    auto c0 = cpu_time::now();
    for (std::uint64_t i = 1;; ++i) {
      spin_until([&] { return sp->ping.v.load(std::memory_order_acquire) >= i; });
      std::uint64_t got = sp->ping.v.load(std::memory_order_acquire);
      if (got == ~0ull) break;
      sp->pong.v.store(got, std::memory_order_release);
      if (got == ~0ull - 1) {  // the parent's mark: measurement starts; reset the CPU clock
        c0 = cpu_time::now();
        i = 0;
        sp->ping.v.store(0, std::memory_order_relaxed);
      }
    }
    auto c = cpu_time::now() - c0;
    sp->child_user = c.user;
    sp->child_sys = c.sys;
    ::_exit(0);
  }
  pin_cpu(cpu);
  auto r = make_result("shm-pingpong", "lat", 8);
  for (std::uint64_t i = 1; i <= warmup; ++i) {
    sp->ping.v.store(i, std::memory_order_release);
    spin_until([&] { return sp->pong.v.load(std::memory_order_acquire) == i; });
  }
  // Restart the child's count (and CPU clock) from 0.
  sp->ping.v.store(~0ull - 1, std::memory_order_release);
  spin_until([&] { return sp->pong.v.load(std::memory_order_acquire) == ~0ull - 1; });
  spin_until([&] { return sp->ping.v.load(std::memory_order_acquire) == 0; });
  auto c0 = cpu_time::now();
  auto t0 = clock_type::now();
  r.lat_us.reserve(iters);
  for (std::uint64_t i = 1; i <= iters; ++i) {
    auto s = clock_type::now();
    sp->ping.v.store(i, std::memory_order_release);
    spin_until([&] { return sp->pong.v.load(std::memory_order_acquire) == i; });
    r.lat_us.push_back(seconds_since(s) * 1e6);
    if ((i & 255) == 0 && seconds_since(t0) > duration) break;
  }
  r.seconds = seconds_since(t0);
  r.cpu = cpu_time::now() - c0;
  r.iterations = r.lat_us.size();
  sp->ping.v.store(~0ull, std::memory_order_release);
  wait_child(pid);
  r.peer_cpu = {sp->child_user, sp->child_sys};
  return r;
}

result cma_bw(const std::string& test, std::size_t size, double duration, int cpu, int peer_cpu) {
  auto* sp = map_shared();
  int pipefd[2];
  if (::pipe(pipefd) != 0) fail_errno("pipe");
  pid_t pid = ::fork();
  if (pid < 0) fail_errno("fork");
  if (pid == 0) {
    pin_cpu(peer_cpu);
    ::close(pipefd[1]);
    auto buf = make_buffer(size);
    sp->child_addr.store(reinterpret_cast<std::uintptr_t>(buf.get()), std::memory_order_release);
    auto c0 = cpu_time::now();
    char c;
    while (::read(pipefd[0], &c, 1) < 0 && errno == EINTR) {
    }
    auto d = cpu_time::now() - c0;
    sp->child_user = d.user;
    sp->child_sys = d.sys;
    ::_exit(0);
  }
  pin_cpu(cpu);
  ::close(pipefd[0]);
  spin_until([&] { return sp->child_addr.load(std::memory_order_acquire) != 0; });
  auto buf = make_buffer(size);
  iovec local{buf.get(), size};
  iovec remote{reinterpret_cast<void*>(sp->child_addr.load()), size};
  const bool rd = test == "read";
  auto once = [&] {
    ssize_t k = rd ? ::process_vm_readv(pid, &local, 1, &remote, 1, 0)
                   : ::process_vm_writev(pid, &local, 1, &remote, 1, 0);
    if (k < 0) fail_errno(rd ? "process_vm_readv" : "process_vm_writev");
    if (static_cast<std::size_t>(k) != size) fail("cross-memory attach: short copy");
  };
  once();  // warm-up, and the first fault-in of the child's pages
  auto r = make_result(rd ? "cma-read" : "cma-write", "bw", size);
  auto c0 = cpu_time::now();
  auto t0 = clock_type::now();
  std::uint64_t n = 0;
  const std::uint64_t batch = std::max<std::uint64_t>(1, (1u << 20) / size);
  do {
    for (std::uint64_t i = 0; i < batch; ++i) once();
    n += batch;
  } while (seconds_since(t0) < duration);
  r.seconds = seconds_since(t0);
  r.cpu = cpu_time::now() - c0;
  r.iterations = n;
  r.bytes = static_cast<double>(n * size);
  ::close(pipefd[1]);
  wait_child(pid);
  r.peer_cpu = {sp->child_user, sp->child_sys};
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"conveyor-baseline: raw TCP, memcpy, shared-memory and cross-memory-attach limits"};
  app.require_subcommand(1);
  std::string bind = "127.0.0.1:18515", addr, test, poll = "busy";
  std::string size_s = "8";
  double duration = 0.3;
  std::uint64_t iters = 1000000, warmup = 16, conns = 1;
  int cpu = -1, peer_cpu = -1;

  auto* srv =
      app.add_subcommand("tcp-server", "serve raw-TCP measurements, one connection at a time");
  srv->add_option("--bind", bind, "ADDR:PORT to listen on")->capture_default_str();
  srv->add_option("--cpu", cpu, "pin to this CPU");

  auto* cli = app.add_subcommand("tcp", "raw-TCP client: stream or ping-pong against tcp-server");
  cli->add_option("address", addr, "server ADDR:PORT")->required();
  cli->add_option("--test", test, "stream or pingpong")
      ->required()
      ->check(CLI::IsMember({"stream", "pingpong"}));
  cli->add_option("--poll", poll, "busy (spin on MSG_DONTWAIT) or block")
      ->check(CLI::IsMember({"busy", "block"}))
      ->capture_default_str();
  cli->add_option("--warmup", warmup,
                  "stream: messages sent and received before the clocks start (as "
                  "conveyor-fi-bench's 16 posts): a buffer's first pass is not the stream's speed")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cli->add_option("--conns", conns,
                  "pingpong: connections, each round trip on the next (the server answers "
                  "through epoll)")
      ->check(CLI::Range(std::uint64_t{1}, max_conns))
      ->capture_default_str();

  auto* mc = app.add_subcommand("memcpy", "single-thread memcpy bandwidth");
  auto* spp =
      app.add_subcommand("shm-pingpong", "8-byte shared-memory ping-pong between two processes");
  auto* cma = app.add_subcommand(
      "cma", "process_vm_readv / process_vm_writev bandwidth between two processes");
  cma->add_option("--test", test, "read or write")
      ->required()
      ->check(CLI::IsMember({"read", "write"}));

  for (auto* sc : {cli, mc, cma})
    sc->add_option("--size", size_s, "bytes (K/M suffixes)")->capture_default_str();
  for (auto* sc : {cli, mc, spp, cma}) {
    sc->add_option("--duration", duration, "seconds per measurement (at most)")
        ->capture_default_str();
    sc->add_option("--cpu", cpu, "pin to this CPU");
  }
  for (auto* sc : {cli, spp})
    sc->add_option("--iters", iters, "round trips / writes (at most)")->capture_default_str();
  for (auto* sc : {spp, cma})
    sc->add_option("--peer-cpu", peer_cpu, "pin the second process to this CPU");

  CLI11_PARSE(app, argc, argv);
  try {
    auto sizes = parse_sizes(size_s);
    if (sizes.size() != 1) fail("--size takes one size");
    const std::size_t size = sizes[0];
    if (*srv) return tcp_server(bind, cpu);
    pin_cpu(cpu);
    if (*cli) {
      if (conns > 1 && test != "pingpong") fail("--conns is for --test pingpong");
      print_json(tcp_client(addr, test, poll == "busy", size, duration, iters, warmup, conns));
    } else if (*mc)
      print_json(memcpy_bw(size, duration));
    else if (*spp)
      print_json(shm_pingpong(iters, duration, cpu, peer_cpu));
    else if (*cma)
      print_json(cma_bw(test, size, duration, cpu, peer_cpu));
  } catch (const failure& e) {
    std::fprintf(stderr, "conveyor-baseline: %s\n", e.what());
    return 1;
  }
  return 0;
}
