// conveyor-kv over RDMA (soft): a peer that stops in the middle of its
// connection handshake holds no one up. It sends a valid MPA request with the
// kv hello (no password needed when requirepass is unset) and never sends its
// MPA RTR; the server's single acceptor thread must not wait for that RTR
// (connect_request::accept returns once the Reply is sent), so a real client
// behind such peers connects and GETs in a fraction of the handshake timeout.
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "conveyor_kv/client.hpp"
#include "providers/soft/wire/wire.hpp"
#include "rdma_server_fixture.hpp"
#include "store_layout.hpp"

namespace kv = conveyor::kv;
namespace L = kv::layout;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

// A TCP connection to 127.0.0.1:port that sends a kv client's MPA request,
// reads the server's Reply (accept() has answered it) and never sends its
// RTR; -1 on failure.
int no_rtr_peer(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // MPA Request revision 2 (RFC 5044, RFC 6581): key, flags (CRC, enhanced),
  // revision, private data length; IRD/ORD 4/4, peer-to-peer, Write RTR; then
  // the kv hello. (The codec is not exported by the shared library.)
  namespace w = conveyor::wire;
  const auto hello = L::encode_hello("");
  std::vector<std::byte> req(w::mpa_header_size + 4);
  std::memcpy(req.data(), w::mpa_req_key.data(), 16);
  req[16] = std::byte(w::mpa_flag::crc | w::mpa_flag::enhanced);
  req[17] = std::byte{2};
  const std::size_t pdlen = 4 + hello.size();
  req[18] = std::byte(pdlen >> 8);
  req[19] = std::byte(pdlen & 0xff);
  const std::uint16_t ird = 4 | w::mpa_v2::peer2peer, ord = 4 | w::mpa_v2::write_rtr;
  req[20] = std::byte(ird >> 8);
  req[21] = std::byte(ird & 0xff);
  req[22] = std::byte(ord >> 8);
  req[23] = std::byte(ord & 0xff);
  req.insert(req.end(), hello.begin(), hello.end());
  std::byte reply[20];
  std::size_t got = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return -1;
  }
  const auto until = clk::now() + 10s;
  while (got < sizeof reply && clk::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    const ssize_t n = ::recv(fd, reply + got, sizeof reply - got, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got < sizeof reply) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(kv_rdma_handshake, peers_that_never_send_their_rtr_do_not_hold_the_acceptor) {
  kvtest::server s("soft");
  const auto addr = s.rdma->address();
  const auto port = static_cast<std::uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
  {
    auto c = kv::client::connect("soft:kvc", addr, {});
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    ASSERT_TRUE((*c)->set("k", "hello"));
  }
  const auto t0 = clk::now();
  std::vector<int> silent;
  for (int i = 0; i < 3; ++i) {
    const int fd = no_rtr_peer(port);
    ASSERT_GE(fd, 0) << "peer " << i << " got no MPA Reply in time";
    silent.push_back(fd);
  }
  auto c = kv::client::connect("soft:kvc", addr, {});
  ASSERT_TRUE(c.has_value()) << c.error().to_string();
  auto v = (*c)->get("k");
  const auto took = clk::now() - t0;
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(*v, "hello");
  // The handshake timeout is 5 s: serial handshakes cost one per silent peer.
  EXPECT_LT(took, 2500ms) << "the acceptor waited for RTRs that never came";
  for (int fd : silent) ::close(fd);
}

}  // namespace
