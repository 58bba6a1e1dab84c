// Failover and fencing as pure functions (apps/kv/src/cluster/controller.*):
// which replica the controller promotes (and when it must wait or do
// nothing), the isr's re-entry and shrink (and the shrink's CAS racing the
// controller's failover CAS on one map revision, over an in-memory coord),
// manual failover, the offset reports' hostile-input checks, and the fencing
// deadline's arithmetic.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>

#include "cluster/cluster_node.hpp"
#include "cluster/controller.hpp"
#include "three_shards.hpp"

namespace controller_test {

using namespace conveyor::kv::cluster;
using namespace std::chrono_literals;

using conveyor::result;
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
  return {hex_id('b'), hex_id(primary), offset, false, synced, "boot"};
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
  up[hex_id('8')] = {hex_id('b'), hex_id('1'), 0, true, false, "boot"};
  EXPECT_FALSE(decide_failover(m, alive(m, hex_id('1')), up, {}));
  auto d = decide_failover(m, alive(m, hex_id('1')), r, {hex_id('b')});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('7'));
  // '8' is live and in the isr: it stays there (the new primary resyncs it).
  EXPECT_EQ(d->map.shards[1].isr, (std::vector<std::string>{hex_id('7'), hex_id('8')}));
  // After the grace, a link still up with its snapshot applied counts (its
  // keyspace is whole), at its snapshot's offset.
  report_map synced_up{{hex_id('7'), down(100)},
                       {hex_id('8'), {hex_id('b'), hex_id('1'), 500, true, true, "boot"}}};
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

TEST(controller, a_primary_registered_by_another_process_is_gone_and_the_new_one_is_recorded) {
  auto m = with_replicas();
  m.shards[1].primary_boot = "boot";
  const report_map r{{hex_id('7'), down(100)}, {hex_id('8'), down(250)}};
  // Registered by the process the map names: alive, nothing changes.
  EXPECT_FALSE(decide_failover(m, alive(m), r, {}));
  // The same id registered by another process (it restarted before its
  // lease expired): gone, as if unregistered.
  auto l = alive(m);
  l[hex_id('1')].boot_id = "restarted";
  l[hex_id('8')].boot_id = "boot-8";
  report_map r8 = r;
  r8[hex_id('8')].boot = "boot-8";
  auto d = decide_failover(m, l, r8, {});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->deposed, std::vector<std::string>{hex_id('1')});
  const auto& sh = d->map.shards[1];
  EXPECT_EQ(sh.primary, hex_id('8'));
  EXPECT_EQ(sh.primary_boot, "boot-8");  // the promoted process
  EXPECT_EQ(sh.replicas, (std::vector<std::string>{hex_id('7'), hex_id('1')}));
  EXPECT_EQ(std::count(sh.isr.begin(), sh.isr.end(), hex_id('1')), 0);
  EXPECT_TRUE(validate(d->map));
  EXPECT_TRUE(primary_alive(sh, l));
  EXPECT_FALSE(primary_alive(m.shards[1], l));
  // A map that records no boot for a shard does not check it.
  m.shards[1].primary_boot.clear();
  EXPECT_FALSE(decide_failover(m, l, r8, {}));
}

TEST(controller, a_restarted_primary_without_in_sync_replicas_keeps_its_shard) {
  auto m = kvtest::three_shards();  // no replicas
  m.shards[1].primary_boot = "boot-1";
  auto l = alive(m);
  l[hex_id('1')].boot_id = "boot-1";
  EXPECT_FALSE(decide_failover(m, l, {}, {}));
  l[hex_id('1')].boot_id = "boot-2";  // it restarted
  auto d = decide_failover(m, l, {}, {});
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->deposed.empty());
  EXPECT_EQ(d->map.epoch, m.epoch + 1);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('1'));
  EXPECT_EQ(d->map.shards[1].primary_boot, "boot-2");
  EXPECT_TRUE(primary_alive(d->map.shards[1], l));
  // With an in-sync replica, even a dead one, it does not: that replica may
  // hold acknowledged writes the new process lacks.
  auto r = with_replicas();
  r.shards[1].primary_boot = "boot-1";
  auto lr = alive(r, hex_id('7'));
  lr.erase(hex_id('8'));
  lr[hex_id('1')].boot_id = "boot-2";
  EXPECT_FALSE(decide_failover(r, lr, {}, {hex_id('b')}));
}

TEST(controller, a_report_left_by_an_earlier_process_of_a_replica_is_not_its_own) {
  const auto m = with_replicas();
  auto l = alive(m, hex_id('1'));
  l[hex_id('8')].boot_id = "restarted";  // '8' restarted: its keyspace is new
  // '8''s report is its earlier process's (still on etcd until that lease
  // expires): the highest offset, but not a candidate's.
  const report_map r{{hex_id('7'), down(100)}, {hex_id('8'), down(999)}};
  EXPECT_FALSE(decide_failover(m, l, r, {}));  // waits for '8''s own report
  auto d = decide_failover(m, l, r, {hex_id('b')});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('7'));
  // Alone, it is never promoted.
  EXPECT_FALSE(decide_failover(m, l, {{hex_id('8'), down(999)}}, {hex_id('b')}));
  // Its own report (after its snapshot) makes it one.
  report_map own = r;
  own[hex_id('8')].boot = "restarted";
  auto e = decide_failover(m, l, own, {});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->map.shards[1].primary, hex_id('8'));
  EXPECT_EQ(e->map.shards[1].primary_boot, "restarted");
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

TEST(controller, a_replica_leaves_only_the_isr_of_the_primary_that_asked) {
  const auto m = with_replicas();
  auto n = remove_from_isr(m, hex_id('1'), hex_id('7'));
  ASSERT_TRUE(n);
  EXPECT_EQ(n->epoch, m.epoch + 1);
  EXPECT_EQ(n->shards[1].isr, (std::vector<std::string>{hex_id('1'), hex_id('8')}));
  // Still a replica (it follows and catches up), just not in sync.
  EXPECT_EQ(n->shards[1].replicas, m.shards[1].replicas);
  EXPECT_EQ(n->shards[0], m.shards[0]);
  EXPECT_EQ(n->shards[2], m.shards[2]);
  EXPECT_TRUE(validate(*n));
  EXPECT_FALSE(remove_from_isr(*n, hex_id('1'), hex_id('7')));  // already out
  EXPECT_FALSE(remove_from_isr(m, hex_id('2'), hex_id('7')));   // not its primary (deposed)
  EXPECT_FALSE(remove_from_isr(m, hex_id('1'), hex_id('1')));   // the primary itself
  // Out, then back in by the existing path once it caught up.
  auto back = add_to_isr(*n, hex_id('1'), hex_id('7'));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->epoch, m.epoch + 2);
  EXPECT_EQ(back->shards[1].isr, (std::vector<std::string>{hex_id('1'), hex_id('8'), hex_id('7')}));
  // A removed replica is no failover candidate: with the primary gone and
  // only '8' left in the isr, '8' is promoted whatever '7' reports.
  auto d = decide_failover(*n, alive(*n, hex_id('1')),
                           {{hex_id('7'), down(999)}, {hex_id('8'), down(1)}}, {});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('8'));
  EXPECT_EQ(d->map.shards[1].isr, std::vector<std::string>{hex_id('8')});
}

// An in-memory coord with etcd's revision rules (get, range, put, put_if,
// put_if_absent, del); `before_cas`, when set, runs once just before the next
// CAS compares, as another writer's CAS landing between a read and a write.
auto unreachable() {
  return conveyor::make_error(conveyor::errc::connection_refused, "memory_coord: down");
}

class memory_coord final : public coord {
 public:
  std::map<std::string, key_value, std::less<>> keys;
  std::int64_t rev = 1;
  std::function<void()> before_cas;
  bool down = false;  // every call fails (etcd unreachable)

  result<std::optional<key_value>> get(std::string_view key) override {
    if (down) return unreachable();
    auto it = keys.find(key);
    if (it == keys.end()) return std::optional<key_value>{};
    return std::optional<key_value>{it->second};
  }
  result<range_result> range_prefix(std::string_view prefix, std::int64_t) override {
    if (down) return unreachable();
    range_result r;
    for (const auto& [k, v] : keys)
      if (k.starts_with(prefix)) r.kvs.push_back(v);
    r.revision = rev;
    return r;
  }
  result<std::int64_t> put(std::string_view key, std::string_view value, std::int64_t) override {
    if (down) return unreachable();
    auto& kv = keys[std::string(key)];
    kv.key = key;
    kv.value = value;
    kv.mod_revision = ++rev;
    return rev;
  }
  result<cas_result> put_if(std::string_view key, std::string_view value, std::int64_t expected,
                            std::int64_t) override {
    return put_if_absent(key, value, expected, {});
  }
  result<cas_result> put_if_absent(std::string_view key, std::string_view value,
                                   std::int64_t expected,
                                   const std::vector<std::string>& absent) override {
    if (down) return unreachable();
    if (auto f = std::exchange(before_cas, nullptr)) f();
    ++cas_calls;
    cas_result r;
    auto it = keys.find(key);
    const std::int64_t now = it == keys.end() ? 0 : it->second.mod_revision;
    bool ok = now == expected;
    for (const auto& a : absent) ok = ok && !keys.contains(a);
    if (!ok) {
      r.revision = rev;
      if (it != keys.end()) r.current = it->second;
      return r;
    }
    (void)put(key, value, 0);
    r.succeeded = true;
    r.revision = rev;
    return r;
  }
  result<std::int64_t> del(std::string_view key) override {
    if (down) return unreachable();
    return static_cast<std::int64_t>(keys.erase(std::string(key)));
  }
  result<lease_grant> grant_lease(std::chrono::seconds) override { return unreachable(); }
  result<std::chrono::seconds> keep_alive(std::int64_t) override { return unreachable(); }
  result<void> revoke_lease(std::int64_t) override { return unreachable(); }
  result<watch_result> watch_prefix(std::string_view, std::int64_t,
                                    std::chrono::milliseconds) override {
    return unreachable();
  }
  int cas_calls = 0;
};

// Shard 'b': primary '1', one replica '7' in sync (the process test's shape).
shard_map one_replica() {
  auto m = kvtest::three_shards();
  m.nodes.push_back({hex_id('7'), "127.0.0.1:7007", "", "127.0.0.1:27007"});
  m.shards[1].replicas = {hex_id('7')};
  m.shards[1].isr = {hex_id('1'), hex_id('7')};
  return m;
}

constexpr std::string_view cluster = "c1";

shard_map map_in(memory_coord& c) {
  auto kv = c.get(config_key(cluster));
  EXPECT_TRUE(kv && *kv);
  auto m = parse_shard_map((*kv)->value);
  EXPECT_TRUE(m);
  return *m;
}

// The controller's failover write as cluster_node.cpp's control() makes it:
// decided from the map read at `rev`, CAS on `rev` and on the deposed
// primaries' registrations being absent.
bool write_failover(memory_coord& c, const failover_decision& d, std::int64_t rev) {
  std::vector<std::string> absent;
  for (const auto& p : d.deposed) absent.push_back(nodes_prefix(cluster) + p);
  auto w = c.put_if_absent(config_key(cluster), to_json(d.map), rev, absent);
  return w && w->succeeded;
}

TEST(controller, a_shrink_that_wins_the_race_leaves_the_failover_no_candidate) {
  // The primary '1' asks '7' out at the moment its own lease expires (its
  // registration is gone); the controller decided a failover from the same
  // map revision. The shrink's CAS lands first.
  memory_coord c;
  const auto m = one_replica();
  (void)c.put(config_key(cluster), to_json(m), 0);
  const auto rev = c.keys[config_key(cluster)].mod_revision;
  const auto live = alive(m, hex_id('1'));
  const report_map reports{{hex_id('7'), down(500)}};
  auto d = decide_failover(m, live, reports, {});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->promoted, std::vector<std::string>{hex_id('7')});

  const auto s = propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), /*add=*/false);
  EXPECT_EQ(s.result, isr_change::outcome::written) << s.error;
  EXPECT_EQ(s.epoch, m.epoch + 1);
  // The failover's CAS on the old revision loses; the controller reads again
  // and, from the map without '7', has no candidate: the shard stays down
  // rather than promote a replica the primary stopped waiting for.
  EXPECT_FALSE(write_failover(c, *d, rev));
  const auto now = map_in(c);
  EXPECT_EQ(now.shards[1].primary, hex_id('1'));
  EXPECT_EQ(now.shards[1].isr, std::vector<std::string>{hex_id('1')});
  EXPECT_FALSE(decide_failover(now, live, reports, {hex_id('b')}));
}

TEST(controller, a_shrink_that_loses_the_race_to_a_failover_changes_nothing) {
  // Both read the same revision; the failover's CAS lands between the
  // shrink's read and its CAS. The shrink reads again: '1' is no longer the
  // primary, so it writes nothing (a deposed primary never shrinks).
  memory_coord c;
  const auto m = one_replica();
  (void)c.put(config_key(cluster), to_json(m), 0);
  const auto rev = c.keys[config_key(cluster)].mod_revision;
  auto d = decide_failover(m, alive(m, hex_id('1')), {{hex_id('7'), down(500)}}, {});
  ASSERT_TRUE(d);
  bool failed_over = false;
  c.before_cas = [&] { failed_over = write_failover(c, *d, rev); };
  const auto s = propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), /*add=*/false);
  EXPECT_TRUE(failed_over);
  EXPECT_EQ(s.result, isr_change::outcome::moot) << s.error;
  EXPECT_EQ(c.cas_calls, 2);  // the failover's, then the shrink's (lost); no third
  const auto now = map_in(c);
  EXPECT_EQ(now, d->map);
  EXPECT_EQ(now.shards[1].primary, hex_id('7'));
}

TEST(controller, a_shrink_that_loses_to_another_change_reads_again_and_writes) {
  // An address refresh (the controller) lands between the shrink's read and
  // its CAS: the primary is still the primary, so the shrink is computed
  // again from the new map and written on its revision, keeping the refresh.
  memory_coord c;
  const auto m = one_replica();
  (void)c.put(config_key(cluster), to_json(m), 0);
  auto refreshed = m;
  refreshed.nodes.back().repl = "127.0.0.1:30000";
  ++refreshed.epoch;
  c.before_cas = [&] { (void)c.put(config_key(cluster), to_json(refreshed), 0); };
  const auto s = propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), /*add=*/false);
  EXPECT_EQ(s.result, isr_change::outcome::written) << s.error;
  const auto now = map_in(c);
  EXPECT_EQ(now.epoch, m.epoch + 2);
  EXPECT_EQ(now.shards[1].isr, std::vector<std::string>{hex_id('1')});
  EXPECT_EQ(find_node(now, hex_id('7'))->repl, "127.0.0.1:30000");
  // Asked again (a retry after an unknown outcome): nothing to do.
  EXPECT_EQ(propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), false).result,
            isr_change::outcome::moot);
  // The replica caught up: the same path adds it back.
  const auto a = propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), /*add=*/true);
  EXPECT_EQ(a.result, isr_change::outcome::written) << a.error;
  EXPECT_EQ(map_in(c).shards[1].isr, (std::vector<std::string>{hex_id('1'), hex_id('7')}));
}

TEST(controller, a_shrink_is_not_written_without_etcd_or_a_valid_map) {
  memory_coord c;
  // No map: nothing to change.
  EXPECT_EQ(propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), false).result,
            isr_change::outcome::moot);
  // An invalid map: nothing written over it.
  (void)c.put(config_key(cluster), "{\"epoch\": 1}", 0);
  EXPECT_EQ(propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), false).result,
            isr_change::outcome::moot);
  EXPECT_EQ(c.keys[config_key(cluster)].value, "{\"epoch\": 1}");
  // etcd away: failed (the node tries again), nothing assumed.
  (void)c.put(config_key(cluster), to_json(one_replica()), 0);
  c.down = true;
  const auto s = propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), false);
  EXPECT_EQ(s.result, isr_change::outcome::failed);
  EXPECT_FALSE(s.error.empty());
  c.down = false;
  EXPECT_EQ(map_in(c).shards[1].isr, (std::vector<std::string>{hex_id('1'), hex_id('7')}));
  // A map that never stops changing: bounded attempts, then failed.
  int changes = 0;
  std::function<void()> churn = [&] {
    auto m = map_in(c);
    ++m.epoch;
    (void)c.put(config_key(cluster), to_json(m), 0);
    ++changes;
    c.before_cas = churn;
  };
  c.before_cas = churn;
  EXPECT_EQ(propose_isr_change(c, cluster, hex_id('1'), hex_id('7'), false, 3).result,
            isr_change::outcome::failed);
  EXPECT_EQ(changes, 3);
}

TEST(controller, the_hand_over_promotes_a_registered_in_sync_replica_by_cas) {
  memory_coord c;
  auto m = one_replica();
  m.shards[1].primary_boot = "boot-1";
  (void)c.put(config_key(cluster), to_json(m), 0);
  // '7' is not registered: nothing written.
  auto s = propose_handover(c, cluster, hex_id('1'), "boot-1", hex_id('7'));
  EXPECT_EQ(s.result, isr_change::outcome::moot);
  EXPECT_NE(s.error.find("not registered"), std::string::npos) << s.error;
  (void)c.put(nodes_prefix(cluster) + hex_id('7'),
              to_json(node_registration{hex_id('7'), "127.0.0.1:7007", "", "boot-7", ""}), 0);
  // Another process of '1' (it restarted) may not hand the shard over.
  EXPECT_EQ(propose_handover(c, cluster, hex_id('1'), "boot-other", hex_id('7')).result,
            isr_change::outcome::moot);
  // Not an in-sync replica of the shard: refused.
  EXPECT_EQ(propose_handover(c, cluster, hex_id('1'), "boot-1", hex_id('2')).result,
            isr_change::outcome::moot);
  // A CAS that loses to another change computes again from the new map.
  c.before_cas = [&] {
    auto again = map_in(c);
    ++again.epoch;
    (void)c.put(config_key(cluster), to_json(again), 0);
  };
  s = propose_handover(c, cluster, hex_id('1'), "boot-1", hex_id('7'));
  ASSERT_EQ(s.result, isr_change::outcome::written) << s.error;
  const auto now = map_in(c);
  EXPECT_EQ(s.epoch, m.epoch + 2);
  EXPECT_EQ(now.shards[1].primary, hex_id('7'));
  EXPECT_EQ(now.shards[1].primary_boot, "boot-7");
  EXPECT_EQ(now.shards[1].isr, std::vector<std::string>{hex_id('7')});
  // Done: the old primary is no longer one; asking again changes nothing.
  EXPECT_EQ(propose_handover(c, cluster, hex_id('1'), "boot-1", hex_id('7')).result,
            isr_change::outcome::moot);
}

TEST(controller, hand_over_requests_are_exactly_one_node_id) {
  EXPECT_EQ(parse_handover_request(handover_request_json(hex_id('7'))).value(), hex_id('7'));
  for (const char* bad : {"", "{}", "[]", R"({"to":"x"})", R"({"to":7})",
                          R"({"to":"7777777777777777777777777777777777777777","x":1})"})
    EXPECT_FALSE(parse_handover_request(bad)) << bad;
  EXPECT_FALSE(parse_handover_request(std::string(2000, ' ') + handover_request_json(hex_id('7'))));
}

TEST(controller, manual_failover_takes_only_an_in_sync_replica) {
  auto m = with_replicas();
  auto d = manual_failover(m, hex_id('b'), hex_id('8'), "boot-8");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->map.shards[1].primary, hex_id('8'));
  EXPECT_EQ(d->map.shards[1].primary_boot, "boot-8");
  EXPECT_EQ(d->map.shards[1].isr, (std::vector<std::string>{hex_id('8'), hex_id('7')}));
  EXPECT_TRUE(validate(d->map));
  m.shards[1].isr = {hex_id('1')};
  EXPECT_FALSE(manual_failover(m, hex_id('b'), hex_id('8'), "boot-8"));
  EXPECT_FALSE(manual_failover(m, hex_id('b'), hex_id('1'), "boot-8"));
  EXPECT_FALSE(manual_failover(m, hex_id('f'), hex_id('8'), "boot-8"));
}

TEST(controller, offset_reports_round_trip_and_hostile_ones_are_refused) {
  const offset_report r{hex_id('b'), hex_id('1'), 12345678901234ULL, false, true, "b1"};
  EXPECT_EQ(parse_offset_report(to_json(r)).value(), r);
  // The same report without its boot is not one.
  auto no_boot = r;
  no_boot.boot.clear();
  EXPECT_FALSE(parse_offset_report(to_json(no_boot)));
  for (
      const char* bad : {
          "",
          "[]",
          "{}",
          "nul",
          R"({"shard":"x","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true,"boot":"b1"})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":-1,"link_up":false,"synced":true,"boot":"b1"})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1.5,"link_up":false,"synced":true,"boot":"b1"})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":0,"synced":true,"boot":"b1"})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"extra":true,"boot":"b1"})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true,"x":1,"boot":"b1"})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true,"boot":""})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true,"boot":"a b"})",
          R"({"shard":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","primary":"1111111111111111111111111111111111111111","offset":1,"link_up":false,"synced":true,"boot":7})",
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
