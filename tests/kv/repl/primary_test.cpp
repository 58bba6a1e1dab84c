// The primary's side of replication in-process (apps/kv/src/repl/primary.hpp)
// against a replica played by the test over the soft provider: the snapshot,
// the stream and its offsets, the acknowledged offset the front ends wait on;
// the in-sync set's shrink (a silent or unlinked replica asked out, replies
// released only by the map without it, never by a fenced node); and hostile
// peers (a foreign hello, a node that is no replica, garbage,
// acks past what was sent, credits never given) that lose their link and
// leave the primary serving the next one.
#include <gtest/gtest.h>
#include <conveyor/conveyor.hpp>

#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "../kv_fixture.hpp"
#include "repl/primary.hpp"
#include "repl/wire.hpp"
#include "server_loop.hpp"

namespace kv = conveyor::kv;
namespace repl = conveyor::kv::repl;
using namespace std::chrono_literals;

namespace {

const std::string shard_id(40, 'c'), replica_id(40, 'a'), stranger_id(40, 'b');

// A server's loop thread with a store, an executor and a primary on it.
struct node {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store();
  kv::server_config cfg;
  kv::executor ex{*st, nullptr, cfg};
  kv::server_loop loop;
  std::unique_ptr<repl::primary> p;
  std::thread thread;

  std::vector<std::string> joins;   // on_join's calls (loop thread)
  std::vector<std::string> leaves;  // on_leave's calls (loop thread)

  // in_sync: the replica is in the map's isr (else it must catch up and join).
  // isr_lag_ms: the shrink's bound (0: half of the 5 s ack timeout).
  explicit node(bool in_sync = true, std::int64_t isr_lag_ms = 0) {
    repl::primary_options o{.address = "127.0.0.1:0"};
    o.on_join = [this](const std::string& id) { joins.push_back(id); };
    o.isr_lag_ms = isr_lag_ms;
    o.on_leave = [this](const std::string& id) { leaves.push_back(id); };
    p = repl::primary::start(env.dev, env.pd, loop, ex, o).value();
    ex.set_replication(p.get(), &p->sync());
    p->set_shard(shard_id, {replica_id},
                 in_sync ? std::vector<std::string>{replica_id} : std::vector<std::string>{});
    thread = std::thread([this] { loop.run(); });
  }
  template <class F>
  auto on_loop(F f) {
    std::packaged_task<decltype(f())()> t(std::move(f));
    auto fut = t.get_future();
    loop.post([&t] { t(); });
    return fut.get();
  }
  ~node() {
    on_loop([this] { p.reset(); });
    loop.stop();
    thread.join();
  }
  std::string run(std::initializer_list<std::string_view> argv) {
    return on_loop([&] {
      kv::session s;
      s.authenticated = true;
      return kvtest::run(ex, s, argv);
    });
  }
  kv::sync_point sync() {
    return on_loop([this] { return p->sync(); });
  }
  std::string info() {
    return on_loop([this] {
      std::string t;
      p->info(t, "x");
      return t;
    });
  }
};

// The test's side: one QP with the replica's receive buffers.
struct fake_replica {
  conveyor::device dev = conveyor::device::open("soft").value();
  conveyor::protection_domain pd = dev.alloc_pd().value();
  conveyor::completion_queue cq = dev.create_cq({.depth = 64}).value();
  conveyor::queue_pair qp;
  conveyor::memory_region recv =
      pd.allocate_memory(std::size_t{repl::replica_slots} * repl::max_message,
                         conveyor::access::local_write)
          .value();
  conveyor::memory_region send = pd.allocate_memory(4096, conveyor::access::local_write).value();
  std::uint32_t returned = 0;

  fake_replica() {
    conveyor::qp_init_attr qa{.send_cq = &cq, .recv_cq = &cq};
    qa.cap.max_send_wr = 16;
    qa.cap.max_recv_wr = repl::replica_slots;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    qp = pd.create_qp(qa).value();
    for (std::uint32_t i = 0; i < repl::replica_slots; ++i)
      EXPECT_EQ(qp.post_recv(recv.slice(std::size_t{i} * repl::max_message, repl::max_message), i),
                conveyor::errc::ok);
  }
  conveyor::result<conveyor::connection_info> connect(const std::string& addr,
                                                      std::span<const std::byte> hello) {
    return conveyor::connect(qp, addr, {.private_data = hello, .timeout = 3s});
  }
  conveyor::result<conveyor::connection_info> connect(const std::string& addr,
                                                      const std::string& id = replica_id) {
    const auto h = repl::encode_hello({id, shard_id});
    return connect(addr, h);
  }
  // The next message from the primary (its buffer posted again), or nullopt
  // when the link failed or nothing came within the wait.
  std::optional<std::pair<repl::header, std::string>> next(std::chrono::milliseconds wait = 3s) {
    for (;;) {
      auto wc = cq.wait_one(wait);
      if (!wc || wc->status != conveyor::wc_status::success) return std::nullopt;
      if (wc->opcode != conveyor::wc_opcode::recv) continue;  // our sends
      const auto slot = static_cast<std::uint32_t>(wc->wr_id);
      const auto* p = recv.data() + std::size_t{slot} * repl::max_message;
      std::string why;
      auto h =
          repl::decode(std::span<const std::byte>(p, wc->byte_len), repl::reader::replica, why);
      EXPECT_TRUE(h.has_value()) << why;
      if (!h) return std::nullopt;
      std::string payload(reinterpret_cast<const char*>(p) + repl::header_bytes, h->len);
      EXPECT_EQ(
          qp.post_recv(recv.slice(std::size_t{slot} * repl::max_message, repl::max_message), slot),
          conveyor::errc::ok);
      ++returned;
      return std::pair(*h, std::move(payload));
    }
  }
  void send_raw(std::span<const std::byte> bytes) {
    std::memcpy(send.data(), bytes.data(), bytes.size());
    EXPECT_EQ(qp.post_send_msg(send.slice(0, bytes.size()), 1), conveyor::errc::ok);
  }
  void ack(std::uint64_t offset, std::uint32_t credits) {
    std::array<std::byte, repl::header_bytes> m;
    repl::encode({repl::msg_type::ack, credits, 0, offset}, m);
    send_raw(m);
  }
  // True once the primary has dropped the link (a flushed or failed completion).
  bool dropped(std::chrono::milliseconds wait = 3s) {
    const auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until) {
      auto wc = cq.wait_one(100ms);
      if (wc && wc->status != conveyor::wc_status::success) return true;
    }
    return false;
  }
};

// Reads snap_begin .. snap_end; returns the snapshot's offset and bytes.
std::pair<std::uint64_t, std::string> read_snapshot(fake_replica& r) {
  auto b = r.next();
  EXPECT_TRUE(b && b->first.type == repl::msg_type::snap_begin);
  std::string bytes;
  for (;;) {
    auto m = r.next();
    EXPECT_TRUE(m.has_value());
    if (!m) return {0, bytes};
    if (m->first.type == repl::msg_type::snap_end) {
      EXPECT_EQ(m->first.offset, b->first.offset);
      return {m->first.offset, bytes};
    }
    EXPECT_EQ(m->first.type, repl::msg_type::snap_data);
    bytes += m->second;
  }
}

}  // namespace

TEST(kv_repl_primary, snapshot_then_stream_and_the_acked_offset_waits_for_the_replica) {
  node n;
  EXPECT_EQ(n.run({"SET", "before", "1"}), "+OK\r\n");
  EXPECT_TRUE(n.sync().waiting());  // the in-sync replica has acknowledged nothing
  fake_replica r;
  ASSERT_TRUE(r.connect(n.p->address()));
  auto [snap_offset, snap] = read_snapshot(r);
  EXPECT_EQ(snap_offset, n.sync().offset);
  EXPECT_NE(snap.find("before"), std::string::npos);
  r.ack(snap_offset, std::exchange(r.returned, 0));
  // A write after the snapshot: streamed from the snapshot's offset on.
  EXPECT_EQ(n.run({"SET", "after", "2"}), "+OK\r\n");
  auto m = r.next();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.type, repl::msg_type::stream);
  EXPECT_EQ(m->first.offset, snap_offset);
  EXPECT_EQ(m->second, "*3\r\n$3\r\nSET\r\n$5\r\nafter\r\n$1\r\n2\r\n");
  const auto end = snap_offset + m->second.size();
  EXPECT_EQ(n.sync().offset, end);
  EXPECT_LT(n.sync().acked, end);
  r.ack(end, std::exchange(r.returned, 0));
  for (int i = 0; i < 100 && n.sync().acked < end; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(n.sync().acked, end);
  EXPECT_NE(n.info().find("state=online,offset=" + std::to_string(end)), std::string::npos);
  // A transaction's records arrive as one MULTI ... EXEC block.
  kv::session s;
  s.authenticated = true;
  n.on_loop([&] {
    kvtest::run(n.ex, s, {"MULTI"});
    kvtest::run(n.ex, s, {"SET", "t", "1"});
    kvtest::run(n.ex, s, {"INCR", "u"});
    return kvtest::run(n.ex, s, {"EXEC"});
  });
  m = r.next();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.offset, end);
  EXPECT_EQ(m->second.rfind("*1\r\n$5\r\nMULTI\r\n", 0), 0u);
  EXPECT_NE(m->second.find("*1\r\n$4\r\nEXEC\r\n"), std::string::npos);
}

// Failover's isr re-entry: a replica outside the isr that applied its
// snapshot is waited for at once, and asked into the map's isr only once it
// holds every write acknowledged so far.
TEST(kv_repl_primary, a_caught_up_replica_joins_the_in_sync_set_before_it_is_asked_into_the_map) {
  node n(false);
  EXPECT_EQ(n.run({"SET", "before", "1"}), "+OK\r\n");
  EXPECT_FALSE(n.sync().waiting());  // no in-sync replica: acknowledged at once
  fake_replica r;
  ASSERT_TRUE(r.connect(n.p->address()));
  auto [snap_offset, snap] = read_snapshot(r);
  // Acknowledged without the replica: it is not in sync yet.
  EXPECT_EQ(n.run({"SET", "during", "2"}), "+OK\r\n");
  const auto acked = n.sync().acked;
  EXPECT_GT(acked, snap_offset);
  EXPECT_FALSE(n.sync().waiting());
  r.ack(snap_offset, std::exchange(r.returned, 0));
  // Its snapshot applied, it joins here: the next write waits for it...
  for (int i = 0; i < 300 && n.info().find("repl_in_sync_replicas:1") == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_NE(n.info().find("repl_in_sync_replicas:1"), std::string::npos);
  EXPECT_EQ(n.run({"SET", "after", "3"}), "+OK\r\n");
  EXPECT_TRUE(n.sync().waiting());
  // ...but it does not hold "during" yet: not asked into the map.
  EXPECT_TRUE(n.on_loop([&] { return n.joins.empty(); }));
  std::uint64_t end = snap_offset;
  while (end < n.sync().offset) {
    auto m = r.next();
    ASSERT_TRUE(m);
    end = m->first.offset + m->second.size();
  }
  r.ack(end, std::exchange(r.returned, 0));
  for (int i = 0; i < 100 && n.sync().acked < end; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(n.sync().acked, end);
  EXPECT_EQ(n.on_loop([&] { return n.joins; }), std::vector<std::string>{replica_id});
  // The map saying so changes nothing; a map without it as a replica ends it.
  n.on_loop([&] {
    n.p->set_shard(shard_id, {replica_id}, {replica_id});
    return 0;
  });
  EXPECT_EQ(n.on_loop([&] { return n.joins.size(); }), 1u);
}

TEST(kv_repl_primary, a_foreign_hello_is_rejected_and_a_stranger_is_dropped) {
  node n;
  fake_replica foreign;
  std::array<std::byte, 16> junk{};
  auto c = foreign.connect(n.p->address(), junk);
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().to_string().find("not a conveyor-kv replica hello"), std::string::npos)
      << c.error().to_string();
  fake_replica stranger;  // a well-formed hello from a node the map does not name
  ASSERT_TRUE(stranger.connect(n.p->address(), stranger_id));
  EXPECT_TRUE(stranger.dropped());
  EXPECT_NE(n.info().find("connected_slaves:0"), std::string::npos);
}

TEST(kv_repl_primary, a_replica_without_the_clusters_password_is_dropped) {
  node n;
  n.on_loop([&] {
    n.cfg.requirepass = "sekrit";
    return 0;
  });
  fake_replica wrong;
  const auto h = repl::encode_hello({replica_id, shard_id, "guess"});
  ASSERT_TRUE(wrong.connect(n.p->address(), h));
  EXPECT_TRUE(wrong.dropped());
  fake_replica right;
  const auto g = repl::encode_hello({replica_id, shard_id, "sekrit"});
  ASSERT_TRUE(right.connect(n.p->address(), g));
  auto m = right.next();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.type, repl::msg_type::snap_begin);
}

TEST(kv_repl_primary, protocol_violations_close_the_link_and_the_next_replica_is_served) {
  node n;
  EXPECT_EQ(n.run({"SET", "k", "v"}), "+OK\r\n");
  auto violate = [&](const std::function<void(fake_replica&, std::uint64_t)>& bad) {
    fake_replica r;
    EXPECT_TRUE(r.connect(n.p->address()));
    auto [off, snap] = read_snapshot(r);
    bad(r, off);
    EXPECT_TRUE(r.dropped());
  };
  violate([](fake_replica& r, std::uint64_t) {
    std::array<std::byte, 40> g;
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<std::byte>(i * 37);
    r.send_raw(g);  // not a message
  });
  violate([](fake_replica& r, std::uint64_t off) { r.ack(off + 1000, 0); });  // past what was sent
  violate([](fake_replica& r, std::uint64_t off) {
    r.ack(off, repl::replica_slots);  // credits for messages never sent
  });
  violate([](fake_replica& r, std::uint64_t off) {
    r.ack(off, 0);
    r.ack(off > 0 ? off - 1 : 0, 0);  // an ack that goes back
    if (off == 0) r.ack(1, 0);        // (or, at 0, one past what was sent)
  });
  // The primary is whole: a good replica gets its snapshot and the stream.
  fake_replica good;
  ASSERT_TRUE(good.connect(n.p->address()));
  auto [off, snap] = read_snapshot(good);
  EXPECT_NE(snap.find("$1\r\nk\r\n"), std::string::npos);
  good.ack(off, std::exchange(good.returned, 0));
  EXPECT_EQ(n.run({"SET", "k2", "v"}), "+OK\r\n");
  auto m = good.next();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->first.offset, off);
}

// The shrink: an in-sync replica that leaves a write unacknowledged past the
// bound is asked out (its link closed), but the write stays unacknowledged
// until the map without it comes; then it is released. The replica comes back
// by the usual path: a snapshot, then asked into the map again.
TEST(kv_repl_primary, a_silent_in_sync_replica_is_asked_out_and_waited_for_until_the_map_drops_it) {
  node n(true, 300);
  fake_replica r;
  ASSERT_TRUE(r.connect(n.p->address()));
  auto [snap_offset, snap] = read_snapshot(r);
  r.ack(snap_offset, std::exchange(r.returned, 0));
  for (int i = 0; i < 300 && n.sync().acked < snap_offset; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(n.sync().acked, snap_offset);
  // Acknowledging in time: nothing happens.
  EXPECT_EQ(n.run({"SET", "a", "1"}), "+OK\r\n");
  auto m = r.next();
  ASSERT_TRUE(m);
  r.ack(m->first.offset + m->second.size(), std::exchange(r.returned, 0));
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(n.on_loop([&] { return n.leaves.empty(); }));
  EXPECT_FALSE(n.sync().waiting());
  // Silent: asked out after the bound (not before), its link closed.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(n.run({"SET", "b", "2"}), "+OK\r\n");
  EXPECT_TRUE(n.sync().waiting());
  while (n.on_loop([&] { return n.leaves.empty(); }) && std::chrono::steady_clock::now() - t0 < 3s)
    std::this_thread::sleep_for(10ms);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
  EXPECT_EQ(n.on_loop([&] { return n.leaves; }), std::vector<std::string>{replica_id});
  EXPECT_TRUE(r.dropped());
  // Asked once, and still waited for: the map has not dropped it yet.
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(n.on_loop([&] { return n.leaves.size(); }), 1u);
  EXPECT_TRUE(n.sync().waiting());
  EXPECT_NE(n.info().find("repl_in_sync_replicas:1"), std::string::npos);
  // The map without it in the isr (still a replica): released.
  n.on_loop([&] {
    n.p->set_shard(shard_id, {replica_id}, {});
    return 0;
  });
  EXPECT_FALSE(n.sync().waiting());
  EXPECT_NE(n.info().find("repl_in_sync_replicas:0"), std::string::npos);
  EXPECT_EQ(n.run({"SET", "after-shrink", "3"}), "+OK\r\n");
  EXPECT_FALSE(n.sync().waiting());
  // It connects again, applies a snapshot and is asked back into the map.
  fake_replica again;
  ASSERT_TRUE(again.connect(n.p->address()));
  auto [off2, snap2] = read_snapshot(again);
  EXPECT_NE(snap2.find("after-shrink"), std::string::npos);
  again.ack(off2, std::exchange(again.returned, 0));
  for (int i = 0; i < 300 && n.on_loop([&] { return n.joins.empty(); }); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(n.on_loop([&] { return n.joins; }), std::vector<std::string>{replica_id});
  // Back in the map's isr: not asked out while it acknowledges.
  n.on_loop([&] {
    n.p->set_shard(shard_id, {replica_id}, {replica_id});
    return 0;
  });
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(n.on_loop([&] { return n.leaves.size(); }), 1u);
}

// A replica in the map's isr with no link at all is asked out after the
// bound, even with no write waiting; a fenced node asks nothing (it may have
// been replaced), whatever its replicas do.
TEST(kv_repl_primary, an_unlinked_in_sync_replica_is_asked_out_unless_the_node_is_fenced) {
  {
    node n(true, 200);
    const auto t0 = std::chrono::steady_clock::now();
    while (n.on_loop([&] { return n.leaves.empty(); }) &&
           std::chrono::steady_clock::now() - t0 < 3s)
      std::this_thread::sleep_for(10ms);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 200ms);
    EXPECT_EQ(n.on_loop([&] { return n.leaves; }), std::vector<std::string>{replica_id});
  }
  {
    node n(true, 200);
    n.on_loop([&] {
      n.cfg.cluster_enabled = true;
      n.ex.set_fence(std::chrono::steady_clock::time_point::min());
      return 0;
    });
    std::this_thread::sleep_for(700ms);
    EXPECT_TRUE(n.on_loop([&] { return n.leaves.empty(); }));
    // Unfenced again (its lease renewed): it asks.
    n.on_loop([&] {
      n.ex.set_fence(std::chrono::steady_clock::time_point::max());
      return 0;
    });
    for (int i = 0; i < 300 && n.on_loop([&] { return n.leaves.empty(); }); ++i)
      std::this_thread::sleep_for(10ms);
    EXPECT_EQ(n.on_loop([&] { return n.leaves; }), std::vector<std::string>{replica_id});
  }
}
