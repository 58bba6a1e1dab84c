// conveyor-kv's RDMA RPCs through the real executor: a reply larger than one
// message is refused before anything changes (GETDEL, GETSET, SET ... GET keep
// the value), replies are bounded as they are built (MGET), and the password
// rules match the RESP side's.
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <array>
#include <atomic>
#include <future>
#include <thread>

#include <unistd.h>

#include "commands.hpp"
#include "conveyor_kv/client.hpp"
#include "rdma_server_fixture.hpp"
#include "store_layout.hpp"

namespace kv = conveyor::kv;
using namespace std::chrono_literals;

namespace {

using kvtest::must;
using kvtest::server;

std::unique_ptr<kv::client> connect(server& s) {
  auto c = kv::client::connect("soft:kvc", s.rdma->address(), {});
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().to_string());
  return c ? std::move(*c) : nullptr;
}

std::string rpc(kv::client& c, std::initializer_list<std::string_view> argv) {
  std::vector<std::string_view> a(argv);
  auto r = c.command(a);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().to_string());
  return r ? *r : std::string();
}

}  // namespace

TEST(kv_rdma_limits, a_value_the_reply_cannot_carry_is_not_lost) {
  kv::rdma_server_options ro;
  ro.max_message = 64u << 10;
  server s("soft", kvtest::small_store(), ro, kvtest::rpcs::executor);
  // Larger than one message (written straight to the store, as a RESP client could).
  const std::string big(200u << 10, 'B');
  s.on_loop([&] { ASSERT_EQ(s.st->put("big", big, {}, kv::now_ms()), kv::put_status::stored); });
  auto c = connect(s);
  ASSERT_TRUE(c);
  EXPECT_TRUE(rpc(*c, {"GETDEL", "big"}).starts_with("-ERR reply exceeds"));
  EXPECT_TRUE(rpc(*c, {"GETSET", "big", "small"}).starts_with("-ERR reply exceeds"));
  EXPECT_TRUE(rpc(*c, {"SET", "big", "small", "GET"}).starts_with("-ERR reply exceeds"));
  EXPECT_TRUE(rpc(*c, {"GET", "big"}).starts_with("-ERR reply exceeds"));
  // Still there, unchanged: a one-sided GET reads it whole.
  const auto still = c->get("big").value();
  ASSERT_TRUE(still);
  EXPECT_TRUE(*still == big) << "value now " << still->size() << " bytes: " << still->substr(0, 16);
  // A value that fits goes the usual way.
  ASSERT_TRUE(c->set("k", "v"));
  EXPECT_EQ(rpc(*c, {"GETDEL", "k"}), "$1\r\nv\r\n");
  EXPECT_FALSE(c->get("k").value());
}

TEST(kv_rdma_limits, mget_stops_at_the_message_size) {
  kv::rdma_server_options ro;
  ro.max_message = 64u << 10;
  server s("soft", kvtest::small_store(), ro, kvtest::rpcs::executor);
  auto c = connect(s);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("v", std::string(16u << 10, 'v')));
  EXPECT_TRUE(rpc(*c, {"MGET", "v", "v", "v", "v", "v", "v"}).starts_with("-ERR reply exceeds"));
  EXPECT_TRUE(rpc(*c, {"MGET", "v", "v", "v"}).starts_with("*3\r\n"));
  EXPECT_EQ(rpc(*c, {"PING"}), "+PONG\r\n");
}

TEST(kv_rdma_limits, passwords_are_limited_as_on_resp) {
  kv::rdma_server_options ro;
  ro.requirepass = std::string(kv::layout::max_password + 1, 'p');
  conveyor::device dev = must(conveyor::device::open("soft:kvs"));
  auto pd = must(dev.alloc_pd());
  kv::store_options so;
  so.index_buckets = 4096;
  so.data_bytes = 1u << 20;
  auto st = must(kv::store::create(pd, so));
  kv::server_loop loop;
  auto r = kv::rdma_server::start(
      dev, pd, *st, loop, [](kv::session&, std::span<const std::string_view>, std::string&) {}, ro);
  ASSERT_FALSE(r);  // refused at start, not a lock-out of every client later
  EXPECT_EQ(r.error().code, conveyor::errc::invalid_argument);
  // The longest accepted password works, and one byte off anywhere does not.
  ro.requirepass = std::string(kv::layout::max_password, 'p');
  server s("soft", kvtest::small_store(), ro, kvtest::rpcs::executor);
  auto ok = kv::client::connect("soft:kvc", s.rdma->address(), {.password = ro.requirepass});
  ASSERT_TRUE(ok) << ok.error().to_string();
  auto wrong = ro.requirepass;
  wrong.back() = 'q';
  EXPECT_FALSE(kv::client::connect("soft:kvc", s.rdma->address(), {.password = wrong}));
}

// The acceptor thread describes the store (its generation included) to each
// new client while FLUSHALL bumps the generation on the loop thread: under
// ThreadSanitizer a plain read of it is a data race.
TEST(kv_rdma_limits, clients_connect_while_flushall_runs) {
  server s("soft", kvtest::small_store(), {}, kvtest::rpcs::executor);
  auto flusher = connect(s);
  ASSERT_TRUE(flusher);
  std::atomic<bool> done{false};
  std::thread t([&] {
    while (!done.load()) {
      std::array<std::string_view, 1> flush{"FLUSHALL"};
      if (!flusher->command(flush)) break;
    }
  });
  for (int i = 0; i < 10; ++i) {
    auto c = connect(s);
    ASSERT_TRUE(c);
    EXPECT_TRUE(c->set("k", "v"));
  }
  done = true;
  t.join();
}
