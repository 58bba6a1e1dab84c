// A replica's side of replication in-process (apps/kv/src/repl/replica.hpp)
// against a real primary over the soft provider: it uses a link only once its
// before_link hook says the controller knows it resynchronises, so a
// snapshot never empties its keyspace while etcd still shows its earlier,
// synced report.
#include <gtest/gtest.h>
#include <conveyor/conveyor.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "../kv_fixture.hpp"
#include "repl/primary.hpp"
#include "repl/replica.hpp"
#include "server_loop.hpp"
#include "store.hpp"

namespace kv = conveyor::kv;
namespace repl = conveyor::kv::repl;
using namespace std::chrono_literals;

namespace replica_test {

const std::string shard_id(40, 'c'), replica_id(40, 'a');

// A store, an executor and a loop thread: a node's core.
struct core {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store();
  kv::server_config cfg;
  kv::executor ex{*st, nullptr, cfg};
  kv::server_loop loop;
  std::thread thread;
  core() {
    thread = std::thread([this] { loop.run(); });
  }
  template <class F>
  auto on_loop(F f) {
    std::packaged_task<decltype(f())()> t(std::move(f));
    auto fut = t.get_future();
    loop.post([&t] { t(); });
    return fut.get();
  }
  void stop() {
    loop.stop();
    if (thread.joinable()) thread.join();
  }
  std::string run(std::initializer_list<std::string_view> argv) {
    return on_loop([&] {
      kv::session s;
      s.authenticated = true;
      return kvtest::run(ex, s, argv);
    });
  }
};

TEST(kv_repl_replica, uses_a_link_only_once_before_link_says_the_resync_is_known) {
  core p;
  auto prim = p.on_loop([&] {
    auto r = repl::primary::start(p.env.dev, p.env.pd, p.loop, p.ex, {.address = "127.0.0.1:0"});
    EXPECT_TRUE(r.has_value());
    p.ex.set_replication(r->get(), &(*r)->sync());
    (*r)->set_shard(shard_id, {replica_id}, {replica_id});
    return std::move(*r);
  });
  EXPECT_EQ(p.run({"SET", "from-primary", "1"}), "+OK\r\n");

  core r;
  EXPECT_EQ(r.run({"SET", "mine", "1"}), "+OK\r\n");  // the replica's keyspace before
  std::atomic<bool> known{false};
  std::atomic<int> asked{0};
  std::atomic<int> links{0};
  repl::replica_options o;
  o.primary = prim->address();
  o.node_id = replica_id;
  o.shard_id = shard_id;
  o.before_link = [&] {
    ++asked;
    return known.load();
  };
  std::atomic<int> downs{0};
  o.on_link = [&](bool up, std::uint64_t, bool synced) {
    if (up) ++links;
    // Each refused link says again what the keyspace is: not a copy yet.
    if (!up && !synced) ++downs;
  };
  auto rep = r.on_loop([&] {
    auto x = repl::replica::start(r.env.dev, r.env.pd, r.loop, r.ex, o);
    EXPECT_TRUE(x.has_value());
    return std::move(*x);
  });
  // Asked at every connection (each 500 ms), the link never used while it
  // says no: the keyspace is untouched.
  for (int i = 0; i < 300 && asked.load() < 3; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(asked.load(), 3);
  EXPECT_EQ(links.load(), 0);
  for (int i = 0; i < 100 && downs.load() < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(downs.load(), 2);
  EXPECT_EQ(r.run({"GET", "mine"}), "$1\r\n1\r\n");
  EXPECT_EQ(r.run({"GET", "from-primary"}), "$-1\r\n");
  // Once it says yes: connected, the snapshot replaces the keyspace.
  known = true;
  std::string got;
  for (int i = 0; i < 300; ++i) {
    got = r.run({"GET", "from-primary"});
    if (got == "$1\r\n1\r\n") break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(got, "$1\r\n1\r\n");
  EXPECT_GE(links.load(), 1);
  EXPECT_EQ(r.run({"GET", "mine"}), "$-1\r\n");
  r.on_loop([&] { rep.reset(); });
  p.on_loop([&] {
    p.ex.set_replication(nullptr, nullptr);
    prim.reset();
  });
  r.stop();
  p.stop();
}

}  // namespace replica_test
