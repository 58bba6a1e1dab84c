// conveyor-kv's front door (conveyor_kv/server.hpp) as a program takes it:
// public headers only. serve() reports where it listens, answers RESP and the
// RDMA client on one store, and returns 0 when stopped from another thread.
#include <gtest/gtest.h>
#include <conveyor_kv/client.hpp>
#include <conveyor_kv/server.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

namespace {

// One RESP request on a fresh connection; the first reply's bytes.
std::string resp_roundtrip(std::uint16_t port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "connect failed";
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  [[maybe_unused]] auto w = ::write(fd, request.data(), request.size());
  char buf[256];
  auto n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

TEST(kv_server, serve_reports_its_ports_answers_both_front_ends_and_stops_from_another_thread) {
  conveyor::kv::server_options o;
  o.port = 0;  // any free port: on_ready says which
  o.rdma_listen = "127.0.0.1:0";
  o.data_bytes = 8u << 20;
  o.quiet = true;
  std::promise<conveyor::kv::server_ready> ready;
  o.on_ready = [&](const conveyor::kv::server_ready& r) { ready.set_value(r); };
  auto done = std::async(std::launch::async, [&] { return conveyor::kv::serve(o); });
  auto f = ready.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  const auto r = f.get();
  ASSERT_NE(r.resp_port, 0);
  ASSERT_FALSE(r.rdma_address.empty());
  EXPECT_EQ(resp_roundtrip(r.resp_port, "SET greeting hello\r\n"), "+OK\r\n");
  {
    auto c = conveyor::kv::client::connect("soft", r.rdma_address);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    auto v = (*c)->get("greeting");
    ASSERT_TRUE(v.has_value()) << v.error().to_string();
    EXPECT_EQ(v->value_or("(nil)"), "hello");
  }
  r.stop();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(done.get(), 0);
  r.stop();  // after serve() returned: does nothing
}

TEST(kv_server, options_out_of_range_are_refused_with_2_before_anything_starts) {
  conveyor::kv::server_options o;
  o.quiet = true;
  o.appendfsync = "sometimes";
  EXPECT_EQ(conveyor::kv::serve(o), 2);
  o.appendfsync = "no";
  o.maxmemory_policy = "allkeys-random";
  EXPECT_EQ(conveyor::kv::serve(o), 2);
  o.maxmemory_policy = "noeviction";
  o.data_bytes = 0;
  EXPECT_EQ(conveyor::kv::serve(o), 2);
}

}  // namespace
