// conveyor-fi-bench — libfabric's RMA over its public API, for bench/compare
// (Debian ships no fabtests). Reliable-datagram endpoints (FI_EP_RDM: `tcp`
// is then libfabric's tcp provider under its rxm layer; `shm` is native).
//
//   conveyor-fi-bench --server [--bind ADDR:PORT] [--cpu N]
//   conveyor-fi-bench ADDR:PORT --provider tcp|shm --test write|read --mode bw|lat|rate
//                     --size N[,N...] [--duration S] [--iters N] [--src IP] [--cpu N]
//
// A plain TCP connection (the control socket, never timed) carries the test's
// parameters, the endpoints' addresses and memory keys, start/stop marks and
// the server's CPU time. The server opens the provider the client names, one
// connection at a time.
//   bw:   --size-byte fi_write/fi_read, 16 outstanding (at most 32 MiB), for --duration; a write
//         stream ends with an 8-byte fi_read so that every byte is placed.
//   rate: 8-byte fi_write, 128 outstanding, for --duration (Mops/s).
//   lat write: ib_write_lat style ping-pong: each side fi_writes --size bytes
//         into the other's buffer, the counter in the last 8 bytes, and spins
//         on its own memory (reading the CQ to drive progress); one sample per
//         round trip.
//   lat read: one fi_read of --size bytes at a time, round trip to completion.
// Every loop busy-polls fi_cq_read; the passive side does too, so that
// providers with manual progress serve the RMA. Latency loops sched_yield()
// when a poll finds nothing (as conveyor-baseline's busy TCP ping-pong does),
// so that client and server can share one core. CPU: getrusage of both
// processes between the start and stop marks.
#include "common.hpp"

#include <CLI/CLI.hpp>

#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <atomic>
#include <memory>

using namespace bench;

namespace {

constexpr std::size_t max_size = 8u << 20;
constexpr std::size_t half =
    max_size;  // the region: [0,half) local source/sink, [half,2*half) peer's target

struct header {
  char provider[16];
  std::uint32_t write;  // 1 write, 0 read
  std::uint32_t mode;   // 0 bw, 1 lat, 2 rate
  std::uint64_t size;
};
struct ep_info {
  std::uint8_t addr[256];
  std::uint64_t addrlen;
  std::uint64_t base;  // remote address of the region (0 if the provider wants offsets)
  std::uint64_t key;
};
struct cpu_reply {
  double user, sys;
};

void check(int rc, const char* what) {
  if (rc != 0) fail(std::string(what) + ": " + fi_strerror(-rc));
}

struct fabric {
  fi_info* info = nullptr;
  fid_fabric* fab = nullptr;
  fid_domain* dom = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  char* region = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  ep_info remote{};
  std::uint64_t outstanding = 0, completed = 0;
  fi_context ctx{};

  fabric(const std::string& prov, const std::string& src) {
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->fabric_attr->prov_name = ::strdup(prov.c_str());
    const bool use_src = !src.empty() && prov != "shm";
    int rc = fi_getinfo(FI_VERSION(1, 17), use_src ? src.c_str() : nullptr, nullptr,
                        use_src ? FI_SOURCE : 0, hints, &info);
    fi_freeinfo(hints);
    if (rc != 0) fail("fi_getinfo(provider " + prov + ", RDM, RMA): " + fi_strerror(-rc));
    check(fi_fabric(info->fabric_attr, &fab, nullptr), "fi_fabric");
    check(fi_domain(fab, info, &dom, nullptr), "fi_domain");
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    check(fi_av_open(dom, &av_attr, &av, nullptr), "fi_av_open");
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    cq_attr.size = 1024;
    check(fi_cq_open(dom, &cq_attr, &cq, nullptr), "fi_cq_open");
    check(fi_endpoint(dom, info, &ep, nullptr), "fi_endpoint");
    check(fi_ep_bind(ep, &av->fid, 0), "fi_ep_bind av");
    check(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
    check(fi_enable(ep), "fi_enable");
    region = static_cast<char*>(::aligned_alloc(4096, 2 * half));
    std::memset(region, 0, 2 * half);
    check(fi_mr_reg(dom, region, 2 * half, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                    0, 0, &mr, nullptr),
          "fi_mr_reg");
    if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
      check(fi_mr_bind(mr, &ep->fid, 0), "fi_mr_bind");
      check(fi_mr_enable(mr), "fi_mr_enable");
    }
    desc = fi_mr_desc(mr);
  }
  ~fabric() {
    if (mr) fi_close(&mr->fid);
    if (ep) fi_close(&ep->fid);
    if (cq) fi_close(&cq->fid);
    if (av) fi_close(&av->fid);
    if (dom) fi_close(&dom->fid);
    if (fab) fi_close(&fab->fid);
    if (info) fi_freeinfo(info);
    std::free(region);
  }
  fabric(const fabric&) = delete;
  fabric& operator=(const fabric&) = delete;

  std::string name() const { return info->fabric_attr->prov_name; }

  ep_info local() const {
    ep_info e{};
    std::size_t len = sizeof e.addr;
    check(fi_getname(&ep->fid, e.addr, &len), "fi_getname");
    e.addrlen = len;
    e.base = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
                 ? reinterpret_cast<std::uintptr_t>(region)
                 : 0;
    e.key = fi_mr_key(mr);
    return e;
  }
  void connect(int ctl) {
    send_pod(ctl, local());
    remote = recv_pod<ep_info>(ctl);
    if (fi_av_insert(av, remote.addr, 1, &peer, 0, nullptr) != 1)
      fail("fi_av_insert: the peer's address");
  }

  // Reaps completions; returns how many.
  std::size_t reap() {
    fi_cq_entry e[64];
    ssize_t n = fi_cq_read(cq, e, 64);
    if (n > 0) {
      completed += static_cast<std::uint64_t>(n);
      outstanding -= static_cast<std::uint64_t>(n);
      return static_cast<std::size_t>(n);
    }
    if (n == -FI_EAGAIN) return 0;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(cq, &err, 0);
      fail(std::string("completion error: ") + fi_strerror(err.err) + " (" +
           fi_cq_strerror(cq, err.prov_errno, err.err_data, nullptr, 0) + ")");
    }
    fail(std::string("fi_cq_read: ") + fi_strerror(static_cast<int>(-n)));
  }
  // Posts one RMA (local [loff, loff+len) <-> peer's target half + roff),
  // retrying while the provider says EAGAIN.
  void post(bool write, std::size_t loff, std::size_t roff, std::size_t len) {
    auto t0 = clock_type::now();
    for (;;) {
      ssize_t rc = write ? fi_write(ep, region + loff, len, desc, peer, remote.base + half + roff,
                                    remote.key, &ctx)
                         : fi_read(ep, region + loff, len, desc, peer, remote.base + half + roff,
                                   remote.key, &ctx);
      if (rc == 0) break;
      if (rc != -FI_EAGAIN)
        fail(std::string(write ? "fi_write: " : "fi_read: ") + fi_strerror(static_cast<int>(-rc)));
      reap();
      if (seconds_since(t0) > 10) fail("no progress for 10 s posting an RMA");
    }
    ++outstanding;
  }
  void drain() {
    auto t0 = clock_type::now();
    while (outstanding > 0) {
      if (reap() == 0 && seconds_since(t0) > 10)
        fail("no progress for 10 s waiting for completions");
    }
  }
  // Read while the peer's RMA write may be landing (libfabric's provider plays
  // the NIC): a race by design, exempt from ThreadSanitizer, which also
  // refuses the fence (-Wtsan) in instrumented code.
  __attribute__((no_sanitize("thread"))) std::uint64_t target_word(std::size_t size) const {
    auto v = *reinterpret_cast<const volatile std::uint64_t*>(region + half + size - 8);
    std::atomic_thread_fence(std::memory_order_acquire);
    return v;
  }
  void set_source_word(std::size_t size, std::uint64_t v) { std::memcpy(region + size - 8, &v, 8); }
};

// -------------------------------------------------------------------- server ----
void serve_one(int ctl, const std::string& src) {
  auto h = recv_pod<header>(ctl);
  h.provider[sizeof h.provider - 1] = 0;
  fabric f(h.provider, src);
  f.connect(ctl);
  const std::size_t size = h.size;
  auto c0 = cpu_time::now();
  if (h.write && h.mode == 1) {
    // Write ping-pong: echo each new counter value; ~0 ends it.
    std::uint64_t last = 0;
    auto t0 = clock_type::now();
    for (;;) {
      const bool got = f.reap() > 0;
      std::uint64_t v = f.target_word(size);
      if (v == last) {
        if (seconds_since(t0) > 20) fail("write ping-pong: no progress for 20 s");
        if (!got) ::sched_yield();  // lets a core-sharing peer run
        continue;
      }
      last = v;
      t0 = clock_type::now();
      f.set_source_word(size, v);
      f.post(true, 0, 0, size);
      if (v == ~0ull) break;
    }
    f.drain();
  } else {
    // Passive side: drive progress until the client's stop mark; 'S' restarts the CPU clock.
    for (unsigned n = 0;; ++n) {
      if (f.reap() == 0) ::sched_yield();
      if ((n & 255) != 0) continue;
      char c;
      ssize_t k = ::recv(ctl, &c, 1, MSG_DONTWAIT);
      if (k == 1 && c == 'S')
        c0 = cpu_time::now();
      else if (k == 1 && c == 'D')
        break;
      else if (k == 0)
        fail("the client closed the control socket");
    }
  }
  auto c = cpu_time::now() - c0;
  send_pod(ctl, cpu_reply{c.user, c.sys});
  // Stay until the client has its answer and closes (its last RMA may need us).
  for (;;) {
    f.reap();
    pollfd p{ctl, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) break;
  }
}

int server(const std::string& bind, int cpu) {
  pin_cpu(cpu);
  int lfd = tcp_listen(bind);
  std::string ip = bind.substr(0, bind.rfind(':'));
  std::fprintf(stderr, "conveyor-fi-bench server: listening on %s\n", bind.c_str());
  for (;;) {
    int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      fail_errno("accept");
    }
    set_nodelay(fd);
    try {
      serve_one(fd, ip == "0.0.0.0" ? std::string() : ip);
    } catch (const failure& e) {
      std::fprintf(stderr, "conveyor-fi-bench server: %s\n", e.what());
    }
    ::close(fd);
  }
}

// -------------------------------------------------------------------- client ----
result client(const std::string& addr, const std::string& prov, const std::string& test,
              const std::string& mode, std::size_t size, double duration, std::uint64_t iters,
              const std::string& src) {
  if (size > max_size) fail("--size is at most 8 MiB");
  if (size < 8 && mode == "lat" && test == "write") fail("write latency needs --size >= 8");
  int ctl = tcp_connect(addr);
  header h{};
  std::snprintf(h.provider, sizeof h.provider, "%s", prov.c_str());
  h.write = test == "write";
  h.mode = mode == "bw" ? 0 : mode == "lat" ? 1 : 2;
  h.size = size;
  send_pod(ctl, h);
  fabric f(prov, src);
  f.connect(ctl);
  const bool wr = test == "write";
  auto r = make_result(test, mode, size);
  r.extra = ",\"provider\":\"" + f.name() + "\"";
  const auto dur =
      std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(duration));
  clock_type::time_point t0;
  cpu_time c0;
  auto start = [&] {
    if (!(wr && mode == "lat")) write_all(ctl, "S", 1, "control socket");
    t0 = clock_type::now();
    c0 = cpu_time::now();
  };

  if (mode == "lat" && wr) {
    const std::uint64_t warmup = 50;
    std::uint64_t i = 1;
    r.lat_us.reserve(iters);
    for (; i <= warmup + iters; ++i) {
      if (i == warmup + 1) start();
      auto s = clock_type::now();
      f.set_source_word(size, i);
      f.post(true, 0, 0, size);
      auto ts = clock_type::now();
      while (f.target_word(size) != i) {
        if (f.reap() == 0) ::sched_yield();  // lets a core-sharing peer run
        if (seconds_since(ts) > 10) fail("write ping-pong: no answer for 10 s");
      }
      if (i > warmup) r.lat_us.push_back(seconds_since(s) * 1e6);
      if (i > warmup && clock_type::now() - t0 > dur) break;
    }
    r.seconds = seconds_since(t0);
    r.iterations = r.lat_us.size();
    r.cpu = cpu_time::now() - c0;
    f.set_source_word(size, ~0ull);
    f.post(true, 0, 0, size);
    while (f.target_word(size) != ~0ull) f.reap();
    f.drain();
  } else if (mode == "lat") {
    const std::uint64_t warmup = 50;
    r.lat_us.reserve(iters);
    for (std::uint64_t i = 0; i < warmup + iters; ++i) {
      if (i == warmup) start();
      auto s = clock_type::now();
      f.post(false, 0, 0, size);
      while (f.outstanding > 0)
        if (f.reap() == 0) ::sched_yield();
      if (i >= warmup) r.lat_us.push_back(seconds_since(s) * 1e6);
      if (i >= warmup && clock_type::now() - t0 > dur) break;
    }
    r.seconds = seconds_since(t0);
    r.iterations = r.lat_us.size();
    r.cpu = cpu_time::now() - c0;
  } else {
    const std::size_t len = mode == "rate" ? 8 : size;
    // 16 outstanding, fewer for the largest sizes (at most 32 MiB in flight, so
    // that the final drain does not dominate a short measurement).
    const std::uint64_t window =
        mode == "rate" ? 128 : std::clamp<std::uint64_t>((32u << 20) / len, 2, 16);
    for (int i = 0; i < 16; ++i) f.post(wr, 0, 0, len);  // warm-up
    f.drain();
    start();
    std::uint64_t posted = 0;
    const std::uint64_t done0 = f.completed;
    while (clock_type::now() - t0 < dur && posted < iters) {
      while (f.outstanding < window) f.post(wr, 0, 0, len), ++posted;
      f.reap();
    }
    f.drain();
    if (wr) {  // every byte placed
      f.post(false, 0, 0, 8);
      f.drain();
    }
    r.seconds = seconds_since(t0);
    r.cpu = cpu_time::now() - c0;
    r.iterations = f.completed - done0 - (wr ? 1 : 0);
    r.bytes = static_cast<double>(r.iterations * len);
    r.size = len;
  }
  if (!(wr && mode == "lat")) write_all(ctl, "D", 1, "control socket");
  auto pc = recv_pod<cpu_reply>(ctl);
  r.peer_cpu = {pc.user, pc.sys};
  if (mode == "lat") r.bytes = static_cast<double>(r.iterations * size * (wr ? 2 : 1));
  ::close(ctl);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "conveyor-fi-bench: libfabric RMA bandwidth, latency and message rate (RDM endpoints)"};
  bool is_server = false;
  std::string bind = "127.0.0.1:18517", addr, prov = "tcp", test = "write", mode = "bw",
              size_s = "8", src;
  double duration = 0.3;
  std::uint64_t iters = 1000000;
  int cpu = -1;
  app.add_flag("--server", is_server, "serve measurements (one client connection at a time)");
  app.add_option("--bind", bind,
                 "server: control ADDR:PORT (its IP is also the fabric source address)")
      ->capture_default_str();
  app.add_option("address", addr, "client: the server's control ADDR:PORT");
  app.add_option("--provider", prov, "libfabric provider (tcp, shm, ...)")->capture_default_str();
  app.add_option("--test", test, "write or read")
      ->check(CLI::IsMember({"write", "read"}))
      ->capture_default_str();
  app.add_option("--mode", mode, "bw, lat or rate")
      ->check(CLI::IsMember({"bw", "lat", "rate"}))
      ->capture_default_str();
  app.add_option("--size", size_s,
                 "bytes (K/M suffixes), at most 8M; a comma-separated list runs each")
      ->capture_default_str();
  app.add_option("--duration", duration, "seconds per measurement (at most)")
      ->capture_default_str();
  app.add_option("--iters", iters, "operations / round trips (at most)")->capture_default_str();
  app.add_option("--src", src, "client: fabric source IP address");
  app.add_option("--cpu", cpu, "pin to this CPU");
  CLI11_PARSE(app, argc, argv);
  try {
    if (is_server) return server(bind, cpu);
    if (addr.empty()) fail("give the server's ADDR:PORT, or --server");
    auto sizes = parse_sizes(size_s);
    pin_cpu(cpu);
    // One process for a list of sizes (libfabric's start-up costs ~0.4 s): one
    // control connection and one fresh set of fabric resources per size.
    for (auto size : sizes) print_json(client(addr, prov, test, mode, size, duration, iters, src));
  } catch (const failure& e) {
    std::fprintf(stderr, "conveyor-fi-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
