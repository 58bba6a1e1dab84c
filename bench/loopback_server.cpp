// conveyor-loopback-bench's server process (loopback_bench.cpp): serves the
// client's measurements, one control command at a time.
#include <conveyor/conveyor.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "loopback_common.hpp"

namespace loopback {

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

}  // namespace loopback
