// conveyor-loopback-bench's client process (loopback_bench.cpp): drives every
// measurement, --runs times each, and prints the table or the JSON.
#include <conveyor/conveyor.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "loopback_common.hpp"

namespace loopback {

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

}  // namespace loopback
