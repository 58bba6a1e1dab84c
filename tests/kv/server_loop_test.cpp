// The server loop: fds, timers, before_wait, cancel, post() and stop() from other threads.
#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kv_fixture.hpp"
#include "resp_server.hpp"
#include "server_loop.hpp"

namespace kv = conveyor::kv;
using namespace std::chrono_literals;

TEST(server_loop, post_from_other_threads_runs_everything_on_the_loop) {
  kv::server_loop loop;
  std::thread::id loop_id;
  int ran = 0;  // touched on the loop thread only
  bool all_on_loop = true;
  std::thread t([&] {
    loop_id = std::this_thread::get_id();
    loop.run();
  });
  std::thread posters[4];
  for (auto& p : posters)
    p = std::thread([&] {
      for (int i = 0; i < 1000; ++i)
        loop.post([&] {
          if (std::this_thread::get_id() != loop_id) all_on_loop = false;
          ++ran;
        });
    });
  for (auto& p : posters) p.join();
  std::atomic<bool> done{false};
  loop.post([&] { done = true; });
  for (int i = 0; i < 500 && !done; ++i) std::this_thread::sleep_for(10ms);
  loop.stop();
  t.join();
  EXPECT_TRUE(done);
  EXPECT_EQ(ran, 4000);
  EXPECT_TRUE(all_on_loop);
}

TEST(server_loop, fds_timers_and_before_wait) {
  kv::server_loop loop;
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  int reads = 0, ticks = 0, befores = 0;
  loop.add_fd(efd, EPOLLIN, [&](unsigned ev) {
    EXPECT_TRUE(ev & EPOLLIN);
    std::uint64_t v;
    ASSERT_EQ(::read(efd, &v, sizeof v), static_cast<ssize_t>(sizeof v));
    if (++reads == 3) loop.remove_fd(efd);  // removing itself from its own callback
  });
  loop.every(20ms, [&] {
    ++ticks;
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(efd, &one, sizeof one);
    if (ticks == 10) loop.stop();
  });
  loop.before_wait([&] { ++befores; });
  auto t0 = std::chrono::steady_clock::now();
  loop.run();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(ticks, 10);
  EXPECT_EQ(reads, 3);  // never called again after remove_fd
  EXPECT_GE(befores, 10);
  EXPECT_GE(took, 180ms);
  EXPECT_LT(took, 5s);
  ::close(efd);
}

TEST(server_loop, stop_from_another_thread_ends_an_idle_loop_promptly) {
  kv::server_loop loop;
  std::thread t([&] { loop.run(); });
  std::this_thread::sleep_for(50ms);
  auto t0 = std::chrono::steady_clock::now();
  loop.stop();
  t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);  // woken, not its 1 s wait
}

TEST(server_loop, a_cancelled_function_is_never_called_again) {
  kv::server_loop loop;
  int cancelled_ticks = 0, cancelled_befores = 0, self_ticks = 0, self_befores = 0, ticks = 0;
  const auto t = loop.every(1ms, [&] { ++cancelled_ticks; });
  const auto b = loop.before_wait([&] { ++cancelled_befores; });
  loop.cancel(t);  // before the loop ever ran
  loop.cancel(b);
  kv::server_loop::callback_id self_t = 0, self_b = 0;
  self_t = loop.every(1ms, [&] {
    ++self_ticks;
    loop.cancel(self_t);  // from inside itself: it finishes, and is not called again
  });
  self_b = loop.before_wait([&] {
    ++self_befores;
    loop.cancel(self_b);
  });
  // A timer cancelling a later one of the same batch: that one is skipped.
  kv::server_loop::callback_id victim = 0;
  int victim_ticks = 0;
  loop.every(1ms, [&] { loop.cancel(victim); });
  victim = loop.every(1ms, [&] { ++victim_ticks; });
  loop.every(5ms, [&] {
    if (++ticks == 10) loop.stop();
  });
  loop.run();
  EXPECT_EQ(ticks, 10);
  EXPECT_EQ(cancelled_ticks, 0);
  EXPECT_EQ(cancelled_befores, 0);
  EXPECT_EQ(self_ticks, 1);
  EXPECT_EQ(self_befores, 1);
  EXPECT_EQ(victim_ticks, 0);
}

// The RESP front end hands the executor hooks that reach into it (pub/sub
// delivery, CLIENT LIST/KILL, INFO's blocked_clients); once it is gone, none of
// them may still point at it: INFO afterwards answers from the executor alone
// (before, blocked_clients called into the freed front end: ASan saw it).
TEST(resp_front_end, leaves_no_hook_behind_when_it_is_destroyed) {
  kvtest::kv_env env;
  auto st = env.make_store();
  kv::server_config cfg;
  kv::executor ex(*st, nullptr, cfg);
  kv::server_loop loop;
  {
    kv::resp_server_options o;
    o.port = 0;
    kv::resp_server front(loop, ex, o);
    std::string why;
    ASSERT_TRUE(front.listen(why)) << why;
    ASSERT_TRUE(ex.hooks().blocked_clients);
  }
  // Nor any of the loop's functions (its before_wait, its timers): the loop
  // runs on without calling into the freed front end (ASan saw it before).
  int ticks = 0;
  loop.every(5ms, [&] {
    if (++ticks == 60) loop.stop();  // 300 ms: past its 10 ms timers and its 250 ms sweep
  });
  loop.run();
  EXPECT_EQ(ticks, 60);
  EXPECT_FALSE(ex.hooks().deliver);
  EXPECT_FALSE(ex.hooks().list_clients);
  EXPECT_FALSE(ex.hooks().kill);
  EXPECT_FALSE(ex.hooks().blocked_clients);
  kv::session s;
  std::string info = kvtest::run(ex, s, {"INFO", "clients"});
  EXPECT_NE(info.find("blocked_clients:0"), std::string::npos) << info;
}
