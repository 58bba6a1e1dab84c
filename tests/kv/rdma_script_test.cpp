// Scripts through RDMA write RPCs (the same executor as RESP): the reply bound
// is the RPC message size, and a long script started by one RDMA client keeps
// the loop serving the other connections (-BUSY, SCRIPT KILL) from its hook.
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <future>
#include <thread>

#include "commands.hpp"
#include "conveyor_kv/client.hpp"
#include "rdma_server_fixture.hpp"
#include "script.hpp"

namespace kv = conveyor::kv;
using namespace std::chrono_literals;

namespace {

using kvtest::server;

std::unique_ptr<kv::client> script_client(server& s) {
  auto c = kv::client::connect("soft:kvc", s.rdma->address(), {});
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().to_string());
  return c ? std::move(*c) : nullptr;
}

std::string script_rpc(kv::client& c, std::initializer_list<std::string_view> argv) {
  std::vector<std::string_view> a(argv);
  auto r = c.command(a);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().to_string());
  return r ? *r : std::string();
}

}  // namespace

TEST(kv_rdma_scripts, a_script_reply_is_bounded_by_the_message_size) {
  kv::rdma_server_options ro;
  ro.max_message = 64u << 10;
  server s("soft", kvtest::small_store(), ro, kvtest::rpcs::executor);
  auto c = script_client(s);
  ASSERT_TRUE(c);
  EXPECT_EQ(script_rpc(*c, {"EVAL",
                            "redis.call('set', KEYS[1], ARGV[1]) return redis.call('get', KEYS[1])",
                            "1", "k", "v"}),
            "$1\r\nv\r\n");
  EXPECT_TRUE(script_rpc(*c, {"EVAL", "return string.rep('x', 100000)", "0"})
                  .starts_with("-ERR reply exceeds"));
  // The value a one-sided GET reads is the script's write.
  auto v = c->get("k").value();
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, "v");
}

TEST(kv_rdma_scripts, a_long_script_from_one_connection_serves_the_others_busy_and_is_killed) {
  server s("soft", kvtest::small_store(), {}, kvtest::rpcs::executor);
  s.on_loop([&] {
    s.cfg.busy_reply_threshold_ms = 100;
    s.exec->scripts().serve_others = [&s] { s.loop.serve_ready_now(); };
  });
  auto a = script_client(s);
  auto b = script_client(s);
  ASSERT_TRUE(a && b);
  auto running = std::async(std::launch::async, [&] {
    return script_rpc(*a, {"EVAL", "while true do end", "0"});
  });
  std::string got;
  for (int i = 0; i < 100; ++i) {  // until the script is past the threshold
    got = script_rpc(*b, {"GET", "x"});
    if (got.starts_with("-BUSY")) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(got,
            "-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN "
            "NOSAVE.\r\n");
  EXPECT_EQ(script_rpc(*b, {"SCRIPT", "KILL"}), "+OK\r\n");
  ASSERT_EQ(running.wait_for(10s), std::future_status::ready);
  const auto ended = running.get();
  EXPECT_TRUE(ended.starts_with("-ERR Script killed by user with SCRIPT KILL...")) << ended;
  EXPECT_EQ(script_rpc(*b, {"PING"}), "+PONG\r\n");
  EXPECT_EQ(script_rpc(*a, {"PING"}), "+PONG\r\n");
}
