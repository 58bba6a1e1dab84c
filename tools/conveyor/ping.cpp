// `conveyor ping`: a connectivity check in the manner of rping and
// ibv_rc_pingpong. The server registers a buffer with remote read and write
// and hands its key over in the connection's private data ("CVPG" + the
// remote_region + the number of SENDs it will echo; the client's hello is "CVPG" + the size + the
// count); the client SENDs a pattern that the server echoes back, WRITEs a second pattern into the
// server's buffer and READs it back, checks every byte, and prints what the connection negotiated
// and each round trip (with --count N each step N times, and min/median/max per step).
// A failure is one line that says what is wrong and what to try.
#include "ping.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "perf.hpp"
#include "perf_signals.hpp"

namespace conveyor::tool {

namespace {

using clk = std::chrono::steady_clock;
constexpr char magic[4] = {'C', 'V', 'P', 'G'};
// Most times a client may ask for each step (--count).
constexpr std::uint32_t max_count = 1'000'000;

void put_be32(std::span<std::byte> to, std::uint32_t v) {
  for (std::size_t i = 0; i < 4; ++i) to[i] = static_cast<std::byte>(v >> (24 - 8 * i));
}

std::uint32_t get_be32(std::span<const std::byte> from) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | std::to_integer<std::uint32_t>(from[i]);
  return v;
}

struct ping_failure {
  std::string what;
};

[[noreturn]] void fail(std::string what) {
  throw ping_failure{std::move(what)};
}

template <class T>
T check(result<T> r, const std::string& what) {
  if (!r) {
    const auto& e = r.error();
    std::string hint;
    if (e.code == errc::resource_exhausted)
      hint =
          " (on verbs this is usually the locked-memory limit: raise `ulimit -l`, RLIMIT_MEMLOCK)";
    fail(what + ": " + e.to_string() + hint);
  }
  return std::move(*r);
}

void check(status s, const std::string& what) {
  if (s != errc::ok) fail(what + ": " + std::string(to_string(s)));
}

work_completion wait(completion_queue& cq, std::chrono::milliseconds timeout,
                     const std::string& what) {
  auto wc = cq.wait_one(timeout);
  if (!wc)
    fail(what + ": " +
         (wc.error() == errc::timed_out ? "no completion within the timeout"
                                        : std::string(to_string(wc.error()))));
  if (wc->status != wc_status::success)
    fail(what + " completed with " + std::string(to_string(wc->status)));
  return *wc;
}

void fill(std::span<std::byte> buf, std::uint8_t seed) {
  for (std::size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

double us_since(clk::time_point t0) {
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}

device open_device(const ping_options& o) {
  const std::string name = o.device.empty() ? o.provider : o.device;
  auto d = device::open(name);
  if (!d) {
    std::string hint = d.error().code == errc::not_found
                           ? " (`conveyor devices` lists what this machine has)"
                           : "";
    fail("open device " + name + ": " + d.error().to_string() + hint);
  }
  return std::move(*d);
}

std::string describe(const qp_connection_attr& c, const device& dev) {
  std::string s = "provider " + dev.attr().provider + ", device " + dev.attr().name;
  if (c.shm)
    s +=
        ", data path " + (c.shm->direct_mapping ? std::string("direct mapping") : c.shm->data_path);
  if (c.iwarp)
    s += ", MPA rev " + std::to_string(c.iwarp->mpa_revision) + ", CRC " +
         (c.iwarp->crc ? "on" : "off") + ", MSS " + std::to_string(c.iwarp->mss);
  if (c.verbs)
    s += c.verbs->path_mtu != 0 ? ", path MTU " + std::to_string(c.verbs->path_mtu)
                                : ", port MTU " + std::to_string(c.verbs->port_mtu);
  s += ", IRD/ORD " + std::to_string(c.ird) + "/" + std::to_string(c.ord) + ", atomics/immediate " +
       (c.extensions ? "yes" : "no");
  return s;
}

// One client, on its own PD, CQ, QP and regions; every step bounded by
// --timeout. Failures are logged, never thrown.
void serve_client(device& dev, connect_request req, std::uint32_t size, std::uint32_t count,
                  std::chrono::milliseconds timeout) {
  const std::string peer = req.peer_address();
  try {
    auto pd = check(dev.alloc_pd(), "alloc_pd");
    auto cq = check(dev.create_cq({.depth = 16}), "create_cq");
    auto qp = check(pd.create_qp({.send_cq = &cq, .recv_cq = &cq}), "create_qp");
    const auto rights = access::local_write | access::remote_read | access::remote_write;
    auto target =
        check(pd.allocate_memory(size, rights), "allocate " + std::to_string(size) + " B");
    // Two buffers, used in turn: the receive for the client's next SEND is
    // posted before this one is echoed, and never into a buffer whose echo has
    // not completed.
    std::array<memory_region, 2> echo{
        check(pd.allocate_memory(size, access::local_write), "allocate the echo buffer"),
        check(pd.allocate_memory(size, access::local_write), "allocate the echo buffer")};
    check(qp.post_recv(echo[0].as_sge(), 1), "post the receive");
    // The reply: "CVPG", the region, and how many SENDs this server echoes (a
    // client asking for more than one knows an older server by its absence).
    std::vector<std::byte> reply(4);
    std::memcpy(reply.data(), magic, 4);
    const auto key = target.remote().encode();
    reply.insert(reply.end(), key.begin(), key.end());
    reply.resize(reply.size() + 4);
    put_be32(std::span(reply).last(4), count);
    check(req.accept(qp, reply), "accept " + peer);
    std::uint32_t received = 0, echoed = 0, len = 0;
    const auto next = [&](const char* what) {
      auto wc = wait(cq, timeout, what);
      if (wc.opcode == wc_opcode::recv) {
        ++received;
        len = wc.byte_len;
      } else {
        ++echoed;
      }
    };
    for (std::uint32_t i = 0; i < count; ++i) {
      while (received <= i) next("the client's SEND");
      while (echoed < i) next("the echo");
      if (i + 1 < count) check(qp.post_recv(echo[(i + 1) % 2].as_sge(), 1), "post the receive");
      check(qp.post_send_msg(echo[i % 2].slice(0, len), 2), "echo the SEND");
    }
    while (echoed < count) next("the echo");
    // The client WRITEs and READs on its own; it disconnects when done.
    for (auto left = timeout; qp.state() != qp_state::error && left.count() > 0;
         left -= std::chrono::milliseconds(50))
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fprintf(stderr, "conveyor ping server: %s pinged\n", peer.c_str());
  } catch (const ping_failure& f) {
    std::fprintf(stderr, "conveyor ping server: client %s: %s\n", peer.c_str(), f.what.c_str());
  }
}

// Clients served at once; one more is told the server is busy.
constexpr std::size_t max_ping_clients = 16;

int serve(const ping_options& o) {
  device dev = open_device(o);
  auto lis = check(listener::bind(dev, o.address), "listen on " + o.address);
  const bool path = dev.attr().transport_type == transport::shm && !o.address.starts_with('@');
  on_interrupt([path, address = o.address](int) {
    if (path) ::unlink(address.c_str());
  });
  std::fprintf(stderr, "conveyor ping server: listening on %s (provider %s, device %s)\n",
               lis.address().c_str(), dev.attr().provider.c_str(), dev.attr().name.c_str());
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout * 1000));
  // Each client is served on its own thread, so one that stalls (before or
  // after its handshake) holds up no other; --once serves the first one here.
  struct shared {
    std::mutex mu;
    std::size_t active = 0;
  };
  auto st = std::make_shared<shared>();
  for (;;) {
    auto req = lis.accept(std::chrono::hours(1));
    if (!req) continue;
    const std::string peer = req->peer_address();
    // The client's hello: "CVPG" and the size it will move (big-endian), at most 16 MiB.
    const auto pdata = req->private_data();
    if (pdata.size() < 8 || std::memcmp(pdata.data(), magic, 4) != 0) {
      std::fprintf(stderr, "conveyor ping server: refusing %s: not a conveyor ping client\n",
                   peer.c_str());
      (void)req->reject("this is a conveyor ping server; its clients run `conveyor ping ADDRESS`");
      continue;
    }
    const std::uint32_t size = get_be32(pdata.subspan(4, 4));
    if (size < 8 || size > (16u << 20)) {
      (void)req->reject("ping size " + std::to_string(size) + " is outside 8 .. 16 MiB");
      continue;
    }
    // Then how many times it runs each step (absent from older clients: once).
    const std::uint32_t count = pdata.size() >= 12 ? get_be32(pdata.subspan(8, 4)) : 1;
    if (count < 1 || count > max_count) {
      (void)req->reject("ping count " + std::to_string(count) + " is outside 1 .. " +
                        std::to_string(max_count));
      continue;
    }
    if (o.once) {
      serve_client(dev, std::move(*req), size, count, timeout);
      return 0;
    }
    {
      std::lock_guard lk(st->mu);
      if (st->active >= max_ping_clients) {
        const std::string busy = "server busy: " + std::to_string(max_ping_clients) +
                                 " clients are being served; try again";
        std::fprintf(stderr, "conveyor ping server: refusing %s: %s\n", peer.c_str(), busy.c_str());
        (void)req->reject(busy);
        continue;
      }
      ++st->active;
    }
    // Detached: the server runs until it is interrupted; each thread owns
    // what it uses (a handle of the device, the request, the shared count).
    std::thread([d = dev.share(), r = std::move(*req), size, count, timeout, st]() mutable {
      serve_client(d, std::move(r), size, count, timeout);
      std::lock_guard lk(st->mu);
      --st->active;
    }).detach();
  }
}

std::string connect_hint(const error& e, const ping_options& o) {
  switch (e.code) {
    case errc::connection_refused:
      return "nothing is listening at " + o.address + ": start `conveyor ping --server` there" +
             (names_shm(o.provider) ? "" : " (or check the port)");
    case errc::rejected:
      return "the peer at " + o.address + " rejected the connection: " + e.context +
             " (is it a `conveyor ping --server`?)";
    case errc::timed_out:
      return "no handshake from " + o.address +
             " in time: a firewall, a busy peer, or not a Conveyor listener";
    case errc::protocol_error:
      return "the peer at " + o.address +
             " does not speak Conveyor's MPA handshake (another provider? " +
             "a shm server takes -p shm and an @name): " + e.to_string();
    case errc::address_error:
      return e.to_string() + " (addresses: HOST, HOST:PORT, [IPv6]:PORT; shm: @name or a path)";
    default:
      return "connect to " + o.address + ": " + e.to_string();
  }
}

int ping(const ping_options& o) {
  device dev = open_device(o);
  auto pd = check(dev.alloc_pd(), "alloc_pd");
  auto cq = check(dev.create_cq({.depth = 16}), "create_cq");
  auto qp = check(pd.create_qp({.send_cq = &cq, .recv_cq = &cq}), "create_qp");
  auto out = check(pd.allocate_memory(o.size, access::local_write),
                   "allocate " + std::to_string(o.size) + " B");
  auto in = check(pd.allocate_memory(o.size, access::local_write), "allocate the receive buffer");
  auto back = check(pd.allocate_memory(o.size, access::local_write), "allocate the READ buffer");
  check(qp.post_recv(in.as_sge(), 1), "post the receive");
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout * 1000));
  const auto t_connect = clk::now();
  std::array<std::byte, 12> hello{};
  std::memcpy(hello.data(), magic, 4);
  put_be32(std::span(hello).subspan(4, 4), o.size);
  put_be32(std::span(hello).subspan(8, 4), o.count);
  auto info = connect(qp, o.address, {.private_data = hello, .timeout = timeout});
  if (!info) fail(connect_hint(info.error(), o));
  const double connect_us = us_since(t_connect);
  const auto& pdata = info->private_data;
  if (pdata.size() < 4 || std::memcmp(pdata.data(), magic, 4) != 0)
    fail("the peer at " + o.address +
         " accepted but is not a `conveyor ping --server` (no ping region in its reply)");
  auto peer = remote_region::decode(std::span(pdata).subspan(4));
  if (!peer || peer->length < o.size) fail("the peer's ping region is malformed or too small");
  const std::size_t count_at = 4 + remote_region::encoded_size;
  const std::uint32_t echoes =
      pdata.size() >= count_at + 4 ? get_be32(std::span(pdata).subspan(count_at, 4)) : 1;
  if (echoes < o.count)
    fail("the server at " + o.address + " echoes " + std::to_string(echoes) + " SEND(s), not the " +
         std::to_string(o.count) +
         " asked for: it is an older `conveyor ping --server`; update it, or ping without --count");
  const auto c = check(qp.connection(), "the connection's attributes");
  std::printf("conveyor ping: connected %s -> %s in %.0f us\n  %s\n", c.local_address.c_str(),
              c.peer_address.c_str(), connect_us, describe(c, dev).c_str());

  const std::string size = std::to_string(o.size) + " B";
  // Each step o.count times: every SEND echoed, then every WRITE followed by
  // the READ that checks it. Each sample is one post to its completion; the
  // patterns change from one round to the next, so every check is of new bytes.
  std::vector<double> send_us, write_us, read_us;
  for (std::uint32_t i = 0; i < o.count; ++i) {
    if (i > 0) check(qp.post_recv(in.as_sge(), 1), "post the receive");
    fill(std::span(out.data(), out.size()), static_cast<std::uint8_t>(0x11 + i));
    const auto t0 = clk::now();
    check(qp.post_send_msg(out.as_sge(), 10), "post the SEND");
    // The SEND's completion and the echo's receive, in whichever order they come.
    std::uint32_t echoed = 0;
    for (int seen = 0; seen < 2; ++seen) {
      auto wc = wait(cq, timeout,
                     seen == 0 ? "the SEND or its echo" : "the rest of the SEND's round trip");
      if (wc.wr_id == 1) echoed = wc.byte_len;
    }
    send_us.push_back(us_since(t0));
    if (echoed != o.size ||
        !same(std::span(in.data(), in.size()), std::span(out.data(), out.size())))
      fail("the echo of the SEND differs from what was sent");
  }
  for (std::uint32_t i = 0; i < o.count; ++i) {
    fill(std::span(out.data(), out.size()), static_cast<std::uint8_t>(0x5a + i));
    auto t0 = clk::now();
    check(qp.post_write(out.as_sge(), peer->slice(0, o.size), 11), "post the RDMA WRITE");
    wait(cq, timeout, "the RDMA WRITE");
    write_us.push_back(us_since(t0));
    t0 = clk::now();
    check(qp.post_read(back.as_sge(), peer->slice(0, o.size), 12), "post the RDMA READ");
    wait(cq, timeout, "the RDMA READ");
    read_us.push_back(us_since(t0));
    if (!same(std::span(back.data(), back.size()), std::span(out.data(), out.size())))
      fail("the RDMA READ returned other bytes than the RDMA WRITE put there");
  }
  if (o.count == 1) {
    std::printf("  SEND %s, echoed and verified: round trip %.1f us\n", size.c_str(), send_us[0]);
    std::printf("  RDMA WRITE %s: %.1f us; RDMA READ of it, verified: %.1f us\n", size.c_str(),
                write_us[0], read_us[0]);
  } else {
    std::printf("  %-30s %10s %10s %10s\n",
                (size + ", " + std::to_string(o.count) + " times each").c_str(), "min us",
                "median us", "max us");
    const auto row = [](const char* step, std::vector<double> v) {
      std::sort(v.begin(), v.end());
      const std::size_t n = v.size();
      const double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
      std::printf("  %-30s %10.1f %10.1f %10.1f\n", step, v.front(), median, v.back());
    };
    row("SEND, echoed (round trip)", send_us);
    row("RDMA WRITE", write_us);
    row("RDMA READ of it", read_us);
    std::printf("  every echo and every READ verified\n");
  }
  qp.disconnect();
  std::printf("conveyor ping: OK\n");
  return 0;
}

}  // namespace

int run_ping(const ping_options& given) {
  ping_options o = given;
  perf_options p;
  p.provider = o.provider;
  p.device = o.device;
  if (o.address.empty()) {
    if (!o.server) {
      std::fprintf(
          stderr, "conveyor ping: the server's address is missing (e.g. conveyor ping 10.0.0.2)\n");
      return 2;
    }
    o.address = names_shm(o.provider) ? "@conveyor-ping" : "0.0.0.0:18515";
  }
  std::string why;
  const std::string address = resolve_address(p, o.address, why);
  if (address.empty()) {
    std::fprintf(stderr, "conveyor ping: %s\n", why.c_str());
    return 1;
  }
  o.address = address;
  take_interrupts();
  try {
    return o.server ? serve(o) : ping(o);
  } catch (const ping_failure& f) {
    std::fprintf(stderr, "conveyor ping: %s\n", f.what.c_str());
    return 1;
  }
}

void add_ping_options(CLI::App& app, ping_options& o) {
  app.add_option("address", o.address,
                 "client: the server (HOST, HOST:PORT, @shm-name); server: where to listen");
  app.add_flag("-s,--server", o.server,
               "run the server (default 0.0.0.0:18515, shm @conveyor-ping)");
  app.add_flag("--once", o.once, "server: exit after one client");
  app.add_option("-p,--provider", o.provider, "provider: soft, shm, verbs")->default_val("soft");
  app.add_option("-d,--device", o.device, "device name (default: the provider's first)");
  app.add_option("--size", o.size, "bytes moved by each test: 8 .. 16M (units: 4K, 1M)")
      ->transform(CLI::Validator(
          [](std::string& s) -> std::string {
            auto v = parse_size(s);
            if (!v || *v < 8 || *v > (16u << 20))
              return "must be a size from 8 to 16M, not '" + s + "'";
            s = std::to_string(*v);
            return {};
          },
          "SIZE"))
      ->default_val(4096);
  app.add_option("-C,-n,--count", o.count,
                 "client: run each step this many times and print min/median/max per step")
      ->check(CLI::Range(1u, max_count))
      ->default_val(1);
  app.add_option("--timeout", o.timeout, "seconds for the connection and each step")
      ->check(CLI::Range(0.001, 3600.0))
      ->default_val(5);
}

}  // namespace conveyor::tool
