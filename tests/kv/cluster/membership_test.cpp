// Adding nodes to the shard map and removing them (cluster/membership.hpp):
// the maps `conveyor kv cluster add-node|del-node` write, and every refusal.
#include <gtest/gtest.h>

#include <algorithm>

#include "cluster/membership.hpp"
#include "three_shards.hpp"

namespace cl = conveyor::kv::cluster;

namespace kv_membership_test {

// three_shards() with replication addresses, so that shards can have replicas.
cl::shard_map with_repl() {
  auto m = kvtest::three_shards();
  for (std::size_t i = 0; i < m.nodes.size(); ++i)
    m.nodes[i].repl = "127.0.0.1:" + std::to_string(27001 + i);
  return m;
}

cl::node_registration reg(char c, bool repl = true) {
  return {kvtest::hex_id(c), "127.0.0.1:7100", "", "boot-" + std::string(1, c),
          repl ? "127.0.0.1:27100" : ""};
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(kv_membership, a_replica_joins_its_shard_outside_the_isr_and_the_epoch_moves_on) {
  const auto m = with_repl();
  auto n = cl::with_replica_added(m, reg('9'), 1);
  ASSERT_TRUE(n) << n.error();
  EXPECT_EQ(n->epoch, m.epoch + 1);
  EXPECT_EQ(n->shards[1].replicas, std::vector<std::string>{kvtest::hex_id('9')});
  EXPECT_EQ(n->shards[1].isr, std::vector<std::string>{kvtest::hex_id('1')})
      << "it catches up first";
  ASSERT_NE(cl::find_node(*n, kvtest::hex_id('9')), nullptr);
  EXPECT_EQ(cl::find_node(*n, kvtest::hex_id('9'))->repl, "127.0.0.1:27100");
  EXPECT_EQ(n->shards[0], m.shards[0]);
  EXPECT_EQ(n->shards[2], m.shards[2]);
  EXPECT_TRUE(cl::validate(*n));
}

TEST(kv_membership,
     a_replica_is_refused_when_it_is_in_the_map_or_cannot_replicate_or_the_shard_is_full) {
  const auto m = with_repl();
  EXPECT_FALSE(cl::with_replica_added(m, reg('0'), 1)) << "already the primary of shard a";
  EXPECT_FALSE(cl::with_replica_added(m, reg('9'), 3)) << "no such shard";
  auto no_repl = cl::with_replica_added(m, reg('9', false), 1);
  ASSERT_FALSE(no_repl);
  EXPECT_NE(no_repl.error().find("replication address"), std::string::npos) << no_repl.error();
  auto bare = kvtest::three_shards();  // primaries without a replication listener
  EXPECT_FALSE(cl::with_replica_added(bare, reg('9'), 1));
  auto full = m;
  for (std::size_t i = 0; i < cl::max_replicas; ++i) {
    const std::string id = std::string(39, 'e') + "0123456789abcdef"[i];
    full.nodes.push_back({id, "127.0.0.1:" + std::to_string(8000 + i), "", "127.0.0.1:9000"});
    full.shards[1].replicas.push_back(id);
  }
  ASSERT_TRUE(cl::validate(full));
  auto over = cl::with_replica_added(full, reg('9'), 1);
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().find("replicas"), std::string::npos) << over.error();
}

TEST(kv_membership, a_new_shard_owns_no_slot_and_its_primary_is_the_process_registered) {
  const auto m = with_repl();
  auto n = cl::with_shard_added(m, reg('9'), kvtest::hex_id('d'));
  ASSERT_TRUE(n) << n.error();
  ASSERT_EQ(n->shards.size(), 4u);
  const auto& sh = n->shards[3];
  EXPECT_EQ(sh.id, kvtest::hex_id('d'));
  EXPECT_TRUE(sh.slots.empty());
  EXPECT_EQ(sh.primary, kvtest::hex_id('9'));
  EXPECT_EQ(sh.primary_boot, "boot-9");
  EXPECT_EQ(sh.isr, std::vector<std::string>{kvtest::hex_id('9')});
  EXPECT_EQ(cl::uncovered_slots(*n), cl::uncovered_slots(m)) << "no slot moved";
  EXPECT_FALSE(cl::with_shard_added(m, reg('1'), kvtest::hex_id('d'))) << "already in the map";
  EXPECT_FALSE(cl::with_shard_added(m, reg('9'), kvtest::hex_id('a'))) << "a shard id taken";
}

TEST(kv_membership, a_replica_leaves_its_shard_and_the_isr) {
  auto m = with_repl();
  m.nodes.push_back({kvtest::hex_id('9'), "127.0.0.1:7100", "", "127.0.0.1:27100"});
  m.shards[1].replicas = {kvtest::hex_id('9')};
  m.shards[1].isr = {kvtest::hex_id('1'), kvtest::hex_id('9')};
  ASSERT_TRUE(cl::validate(m));
  auto n = cl::with_node_removed(m, kvtest::hex_id('9'));
  ASSERT_TRUE(n) << n.error();
  EXPECT_EQ(n->epoch, m.epoch + 1);
  EXPECT_TRUE(n->shards[1].replicas.empty());
  EXPECT_EQ(n->shards[1].isr, std::vector<std::string>{kvtest::hex_id('1')});
  EXPECT_EQ(cl::find_node(*n, kvtest::hex_id('9')), nullptr);
  EXPECT_EQ(n->shards[1].slots, m.shards[1].slots);
}

TEST(kv_membership, a_primary_leaves_only_with_an_empty_shard_without_replicas) {
  auto m = with_repl();
  auto slots = cl::with_node_removed(m, kvtest::hex_id('1'));
  ASSERT_FALSE(slots) << "its shard owns slots";
  EXPECT_NE(slots.error().find("fail the shard over"), std::string::npos) << slots.error();
  auto added = cl::with_shard_added(m, reg('9'), kvtest::hex_id('d'));
  ASSERT_TRUE(added);
  auto withrep = cl::with_replica_added(*added, reg('8'), 3);
  ASSERT_TRUE(withrep) << withrep.error();
  auto reps = cl::with_node_removed(*withrep, kvtest::hex_id('9'));
  ASSERT_FALSE(reps);
  EXPECT_NE(reps.error().find("has replicas"), std::string::npos) << reps.error();
  auto no_rep = cl::with_node_removed(*withrep, kvtest::hex_id('8'));
  ASSERT_TRUE(no_rep) << no_rep.error();
  auto gone = cl::with_node_removed(*no_rep, kvtest::hex_id('9'));
  ASSERT_TRUE(gone) << gone.error();
  EXPECT_EQ(gone->shards, m.shards) << "the empty shard went with its primary";
  EXPECT_EQ(gone->nodes, m.nodes);
  EXPECT_FALSE(cl::with_node_removed(m, kvtest::hex_id('9'))) << "not in the map";
}

}  // namespace kv_membership_test
