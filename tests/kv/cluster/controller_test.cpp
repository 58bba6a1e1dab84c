// Failover and fencing as pure functions (apps/kv/src/cluster/controller.*):
// which replica the controller promotes (and when it must wait or do
// nothing), the isr's re-entry, manual failover, the offset reports'
// hostile-input checks, and the fencing deadline's arithmetic.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "cluster/controller.hpp"
#include "three_shards.hpp"

namespace controller_test {

using namespace conveyor::kv::cluster;
using namespace std::chrono_literals;

using kvtest::hex_id;

using live_set = std::map<std::string, node_registration, std::less<>>;
using report_map = std::map<std::string, offset_report, std::less<>>;
using shard_set = std::set<std::string, std::less<>>;

// Shard 'b' (primary '1') gets replicas '7' and '8', both in sync.
shard_map with_replicas() {
  auto m = kvtest::three_shards();
  m.nodes.push_back({hex_id('7'), "127.0.0.1:7007", "", "127.0.0.1:27007"});
  m.nodes.push_back({hex_id('8'), "127.0.0.1:7008", "", "127.0.0.1:27008"});
  m.shards[1].replicas = {hex_id('7'), hex_id('8')};
  m.shards[1].isr = {hex_id('1'), hex_id('7'), hex_id('8')};
  return m;
}

// Every node of the map registered with the map's addresses, less `dead`.
live_set alive(const shard_map& m, std::string_view dead = {}) {
  live_set l;
  for (const auto& n : m.nodes)
    if (n.id != dead) l[n.id] = {n.id, n.resp, n.rdma, "boot", n.repl};
  return l;
}

offset_report down(std::uint64_t offset, bool synced = true, char primary = '1') {
  return {hex_id('b'), hex_id(primary), offset, false, synced};
}

TEST(controller, nothing_changes_while_every_primary_is_registered) {
  const auto m = with_replicas();
  EXPECT_FALSE(decide_failover(m, alive(m), {}, {}));
  // Reports alone (a replica's link flapped) change nothing either.
  EXPECT_FALSE(decide_failover(m, alive(m), {{hex_id('7'), down(10)}}, {}));
}

TEST(controller, promotes_the_in_sync_replica_with_the_highest_offset_and_bumps_the_epoch) {
  const auto m = with_replicas();
  const report_map r{{hex_id('7'), down(100)}, {hex_id('8'), down(250)}};
  auto d = decide_failover(m, alive(m, hex_id('1')), r, {});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.epoch, m.epoch + 1);
  EXPECT_EQ(d->deposed, std::vector<std::string>{hex_id('1')});
  EXPECT_EQ(d->promoted, std::vector<std::string>{hex_id('8')});
  const auto& sh = d->map.shards[1];
  EXPECT_EQ(sh.primary, hex_id('8'));
  EXPECT_EQ(sh.isr, (std::vector<std::string>{hex_id('8'), hex_id('7')}));
  // The old primary stays a replica, out of sync until it catches up.
  EXPECT_EQ(sh.replicas, (std::vector<std::string>{hex_id('7'), hex_id('1')}));
  EXPECT_EQ(sh.slots, m.shards[1].slots);
  EXPECT_TRUE(validate(d->map));
  // The other shards are untouched.
  EXPECT_EQ(d->map.shards[0], m.shards[0]);
  EXPECT_EQ(d->map.shards[2], m.shards[2]);
  // Equal offsets: the lower id, so every controller decides the same.
  auto e = decide_failover(m, alive(m, hex_id('1')),
                           {{hex_id('7'), down(5)}, {hex_id('8'), down(5)}}, {});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->map.shards[1].primary, hex_id('7'));
}

TEST(controller, waits_for_every_live_in_sync_replica_to_report_until_the_grace_is_over) {
  const auto m = with_replicas();
  const report_map r{{hex_id('7'), down(100)}};  // '8' has not reported (its link is up)
  EXPECT_FALSE(decide_failover(m, alive(m, hex_id('1')), r, {}));
  // A report with the link up is no report of the final offset either.
  report_map up = r;
  up[hex_id('8')] = {hex_id('b'), hex_id('1'), 0, true, false};
  EXPECT_FALSE(decide_failover(m, alive(m, hex_id('1')), up, {}));
  auto d = decide_failover(m, alive(m, hex_id('1')), r, {hex_id('b')});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('7'));
  // '8' is live and in the isr: it stays there (the new primary resyncs it).
  EXPECT_EQ(d->map.shards[1].isr, (std::vector<std::string>{hex_id('7'), hex_id('8')}));
  // After the grace, a link still up with its snapshot applied counts (its
  // keyspace is whole), at its snapshot's offset.
  report_map synced_up{{hex_id('7'), down(100)},
                       {hex_id('8'), {hex_id('b'), hex_id('1'), 500, true, true}}};
  EXPECT_FALSE(decide_failover(m, alive(m, hex_id('1')), synced_up, {}));
  auto e = decide_failover(m, alive(m, hex_id('1')), synced_up, {hex_id('b')});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->map.shards[1].primary, hex_id('8'));
}

TEST(controller, never_promotes_a_replica_that_is_out_of_sync_dead_or_reporting_another_primary) {
  auto m = with_replicas();
  const auto gone = alive(m, hex_id('1'));
  // Out of the isr: it may miss acknowledged writes.
  auto out = m;
  out.shards[1].isr = {hex_id('1'), hex_id('8')};
  EXPECT_FALSE(
      decide_failover(out, alive(out, hex_id('1')), {{hex_id('7'), down(999)}}, {hex_id('b')}));
  // In the middle of a snapshot when its link broke: its keyspace is partial.
  EXPECT_FALSE(decide_failover(
      m, gone, {{hex_id('7'), down(999, false)}, {hex_id('8'), down(1, false)}}, {hex_id('b')}));
  // Its offset counts in another primary's stream (an older report).
  EXPECT_FALSE(decide_failover(m, gone, {{hex_id('7'), down(999, true, '2')}}, {hex_id('b')}));
  // Not registered: not a candidate (and not kept in the isr).
  auto l = gone;
  l.erase(hex_id('8'));
  auto d = decide_failover(m, l, {{hex_id('7'), down(1)}, {hex_id('8'), down(999)}}, {});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('7'));
  EXPECT_EQ(d->map.shards[1].isr, std::vector<std::string>{hex_id('7')});
  // A shard with no replica at all: nothing to do (it stays down).
  EXPECT_FALSE(decide_failover(m, alive(m, hex_id('0')), {}, {hex_id('a')}));
}

TEST(controller, refreshes_a_node_whose_registration_gives_new_addresses) {
  const auto m = with_replicas();
  auto l = alive(m);
  l[hex_id('7')].repl = "127.0.0.1:30000";
  auto d = decide_failover(m, l, {}, {});
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->deposed.empty());
  EXPECT_EQ(d->map.epoch, m.epoch + 1);
  EXPECT_EQ(find_node(d->map, hex_id('7'))->repl, "127.0.0.1:30000");
  EXPECT_EQ(d->map.shards, m.shards);
}

TEST(controller, a_caught_up_replica_rejoins_the_isr_only_of_the_primary_that_asked) {
  auto m = with_replicas();
  m.shards[1].isr = {hex_id('1'), hex_id('8')};
  auto n = add_to_isr(m, hex_id('1'), hex_id('7'));
  ASSERT_TRUE(n);
  EXPECT_EQ(n->epoch, m.epoch + 1);
  EXPECT_EQ(n->shards[1].isr, (std::vector<std::string>{hex_id('1'), hex_id('8'), hex_id('7')}));
  EXPECT_FALSE(add_to_isr(*n, hex_id('1'), hex_id('7')));  // already in
  EXPECT_FALSE(add_to_isr(m, hex_id('2'), hex_id('7')));   // not its primary (deposed)
  EXPECT_FALSE(add_to_isr(m, hex_id('1'), hex_id('2')));   // not its replica
}

TEST(controller, manual_failover_takes_only_an_in_sync_replica) {
  auto m = with_replicas();
  auto d = manual_failover(m, hex_id('b'), hex_id('8'));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('8'));
  EXPECT_EQ(d->map.shards[1].isr, (std::vector<std::string>{hex_id('8'), hex_id('7')}));
  EXPECT_TRUE(validate(d->map));
  m.shards[1].isr = {hex_id('1')};
  EXPECT_FALSE(manual_failover(m, hex_id('b'), hex_id('8')));
  EXPECT_FALSE(manual_failover(m, hex_id('b'), hex_id('1')));
  EXPECT_FALSE(manual_failover(m, hex_id('f'), hex_id('8')));
}

TEST(controller, offset_reports_round_trip_and_hostile_ones_are_refused) {
  const offset_report r{hex_id('b'), hex_id('1'), 12345678901234ULL, false, true};
  EXPECT_EQ(parse_offset_report(to_json(r)).value(), r);
  for (
      const char* bad : {
          "",
          "[]",
          "{}",
          "nul",
          R"({"shard":"x","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":-1,"link_up":false,"synced":true})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1.5,"link_up":false,"synced":true})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":0,"synced":true})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"extra":true})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true,"x":1})",
      })
    EXPECT_FALSE(parse_offset_report(bad)) << bad;
  EXPECT_FALSE(parse_offset_report(std::string(2000, ' ') + to_json(r)));
}

TEST(controller, the_fence_falls_before_the_lease_could_expire_in_etcd) {
  using clk = std::chrono::steady_clock;
  const clk::time_point sent{100s};
  // The lease cannot expire before sent + ttl; the node stops earlier by the margin.
  for (auto ttl : {1s, 2s, 5s, 60s}) {
    const auto d = fence_deadline(sent, ttl);
    EXPECT_LT(d, sent + ttl) << ttl.count();
    EXPECT_EQ(sent + ttl - d, fence_margin(ttl));
    // Room for a 1 % clock rate difference and a loop iteration, and still
    // most of the lease to serve in.
    EXPECT_GE(fence_margin(ttl),
              std::chrono::duration_cast<std::chrono::milliseconds>(ttl) / 100 + 100ms);
    EXPECT_LE(fence_margin(ttl), std::chrono::duration_cast<std::chrono::milliseconds>(ttl) / 2);
  }
  EXPECT_EQ(fence_margin(2s), 400ms);
  EXPECT_EQ(fence_margin(1s), 300ms);
  EXPECT_EQ(fence_margin(10s), 2000ms);
}

}  // namespace controller_test
