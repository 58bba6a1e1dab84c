// Redis Cluster's routing rule (apps/kv/src/cluster/routing.*): which keys a
// node serves, and the exact MOVED / CROSSSLOT / CLUSTERDOWN replies Redis
// gives for the others.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cluster/routing.hpp"
#include "cluster/slots.hpp"
#include "three_shards.hpp"

namespace routing_test {

using namespace conveyor::kv::cluster;

using kvtest::hex_id;
using kvtest::key_in;
using kvtest::three_shards;

std::string route(std::vector<std::string> keys, const cluster_view* v, bool replica_read = false) {
  std::vector<std::string_view> sv(keys.begin(), keys.end());
  return route_keys(sv, v, replica_read);
}

TEST(routing, a_replica_serves_its_shards_reads_only_when_asked_and_redirects_the_rest) {
  auto m = three_shards();
  m.nodes.push_back({hex_id('7'), "127.0.0.1:7007", "", "127.0.0.1:27007"});
  m.shards[1].replicas = {hex_id('7')};
  m.shards[1].isr = {hex_id('1'), hex_id('7')};
  auto v = make_view(m, hex_id('7')).value();
  const auto k = key_in(5461, 10922);
  const auto moved = "MOVED " + std::to_string(slot_of(k)) + " 127.0.0.1:7002";
  EXPECT_EQ(route({k}, v.get()), moved);     // a write, or a read without READONLY
  EXPECT_EQ(route({k}, v.get(), true), "");  // READONLY's read
  EXPECT_EQ(route({key_in(10923, 16383)}, v.get(), true),
            "MOVED " + std::to_string(slot_of(key_in(10923, 16383))) + " 127.0.0.1:7003");
  ASSERT_NE(replica_of(*v), nullptr);
  EXPECT_EQ(replica_of(*v)->id, hex_id('b'));
  EXPECT_EQ(primary_of(*v), nullptr);
  auto p = make_view(m, hex_id('1')).value();
  EXPECT_EQ(replica_of(*p), nullptr);
  ASSERT_NE(primary_of(*p), nullptr);
  EXPECT_EQ(primary_of(*p)->replicas, std::vector<std::string>{hex_id('7')});
}

TEST(routing, keys_of_this_nodes_slots_run_here_and_commands_without_keys_run_anywhere) {
  auto v = make_view(three_shards(), hex_id('1')).value();
  EXPECT_EQ(route({}, v.get()), "");
  EXPECT_EQ(route({}, nullptr), "");
  const auto k = key_in(5461, 10922);
  EXPECT_EQ(route({k}, v.get()), "");
  // Hash tags put several keys in one slot.
  EXPECT_EQ(route({"{" + k + "}.a", "{" + k + "}.b", k}, v.get()), "");
}

TEST(routing, a_key_of_another_shard_is_moved_to_its_primary_with_the_slot) {
  auto v = make_view(three_shards(), hex_id('1')).value();
  const auto k = key_in(10923, 16383);
  EXPECT_EQ(route({k}, v.get()), "MOVED " + std::to_string(slot_of(k)) + " 127.0.0.1:7003");
  EXPECT_EQ(route({"foo"}, v.get()), "MOVED 12182 127.0.0.1:7003");  // redis-cli's example
}

TEST(routing, keys_in_two_slots_are_crossslot_and_an_unserved_slot_is_clusterdown) {
  auto v = make_view(three_shards(), hex_id('1')).value();
  const auto mine = key_in(5461, 10922, "m"), other = key_in(10923, 16383, "o");
  EXPECT_EQ(route({mine, other}, v.get()), std::string(err_crossslot));
  EXPECT_EQ(route({other, mine}, v.get()), std::string(err_crossslot));
  const auto nobody = key_in(0, 99, "n");
  EXPECT_EQ(route({nobody}, v.get()), "CLUSTERDOWN Hash slot not served");
  // Redis answers for the first key's slot first.
  EXPECT_EQ(route({nobody, mine}, v.get()), "CLUSTERDOWN Hash slot not served");
  // No map yet: no slot is served.
  EXPECT_EQ(route({mine}, nullptr), "CLUSTERDOWN Hash slot not served");
}

TEST(routing, a_primary_restarted_under_another_boot_serves_nothing_of_its_shard) {
  auto m = three_shards();
  m.shards[1].primary_boot = "boot-1";
  const auto k = key_in(5461, 10922);
  // The process the map made primary: it serves.
  auto same = make_view(m, hex_id('1'), 0, "boot-1").value();
  EXPECT_EQ(route({k}, same.get()), "");
  EXPECT_NE(primary_of(*same), nullptr);
  EXPECT_EQ(restarted_primary_of(*same), nullptr);
  // The node restarted (same id, another boot): TRYAGAIN for its keys, not
  // a primary, not anyone's replica; other shards' keys still redirect.
  auto again = make_view(m, hex_id('1'), 0, "boot-2").value();
  EXPECT_EQ(route({k}, again.get()), err_restarted_primary);
  EXPECT_EQ(primary_of(*again), nullptr);
  EXPECT_EQ(replica_of(*again), nullptr);
  ASSERT_NE(restarted_primary_of(*again), nullptr);
  EXPECT_EQ(restarted_primary_of(*again)->id, hex_id('b'));
  const auto other = key_in(0, 5460);
  EXPECT_EQ(route({other}, again.get()),
            "MOVED " + std::to_string(slot_of(other)) + " 127.0.0.1:7001");
  // A map that records no boot, or a view that knows none, checks nothing.
  m.shards[1].primary_boot.clear();
  EXPECT_EQ(route({k}, make_view(m, hex_id('1'), 0, "boot-2").value().get()), "");
  EXPECT_EQ(route({k}, make_view(three_shards(), hex_id('1')).value().get()), "");
}

TEST(routing, a_node_in_no_shard_redirects_every_key) {
  auto v = make_view(three_shards(), hex_id('9')).value();
  EXPECT_EQ(route({"foo"}, v.get()), "MOVED 12182 127.0.0.1:7003");
}

TEST(routing, an_invalid_map_makes_no_view) {
  auto m = three_shards();
  m.shards[1].slots = {{5000, 10922}};  // overlaps shard a
  EXPECT_FALSE(make_view(m, hex_id('1')).has_value());
}

TEST(routing, split_address_takes_host_and_port_apart) {
  EXPECT_EQ(split_address("127.0.0.1:7001"),
            (std::pair<std::string_view, std::uint16_t>{"127.0.0.1", 7001}));
  EXPECT_EQ(split_address("[::1]:7001"), (std::pair<std::string_view, std::uint16_t>{"::1", 7001}));
  EXPECT_EQ(split_address("host").second, 0);
  EXPECT_EQ(split_address("host:99999").second, 0);
  EXPECT_EQ(split_address("host:7x").second, 0);
}

}  // namespace routing_test
