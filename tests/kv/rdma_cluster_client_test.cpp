// conveyor::kv::cluster_client against three in-process nodes over soft
// (a map holds host:port addresses, so an shm node's @name is not in it), each an RDMA front end on
// the real executor in cluster mode with the same map (three shards, one primary each; CLUSTER
// SLOTS names each node's RDMA address): keys go to their slot's primary and nowhere else; MGET
// splits across the nodes; a map change is noticed by the epoch in a GET's
// header words (no question to the server) and by -MOVED on a write; a node
// whose lease does not vouch is retried until it does; with replica_reads,
// GETs go to the slot's replica (writes still to its primary).
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <array>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "cluster/routing.hpp"
#include "cluster/three_shards.hpp"
#include "conveyor_kv/client.hpp"
#include "rdma_server_fixture.hpp"
#include "store_layout.hpp"

namespace kv = conveyor::kv;
namespace cl = conveyor::kv::cluster;
namespace L = kv::layout;
using namespace std::chrono_literals;
using kvtest::hex_id;
using kvtest::key_in;
using kvtest::server;

namespace {

struct three_nodes {
  std::vector<std::unique_ptr<server>> s;
  cl::shard_map map;

  explicit three_nodes(const std::string& provider) {
    auto so = kvtest::small_store();
    so.cluster_header = true;
    for (int i = 0; i < 3; ++i) {
      s.push_back(std::make_unique<server>(provider, so, kv::rdma_server_options{},
                                           kvtest::rpcs::executor));
      s[i]->cfg.cluster_enabled = true;
      s[i]->cfg.cluster_my_id = hex_id(static_cast<char>('0' + i));
      s[i]->st->set_valid_until(L::now_ms() + 600'000);
    }
    map = kvtest::three_shards();
    map.shards[0].slots = {{0, 5460}};  // every slot served
    for (int i = 0; i < 3; ++i) map.nodes[i].rdma = s[i]->rdma->address();
    install(map);
  }
  // Every node takes `m` (as each node's loop takes a map from etcd).
  void install(const cl::shard_map& m) {
    for (int i = 0; i < 3; ++i) install(i, m);
  }
  void install(int i, const cl::shard_map& m) {
    auto v = cl::make_view(m, hex_id(static_cast<char>('0' + i))).value();
    s[i]->on_loop([&] {
      s[i]->exec->set_cluster(v);
      s[i]->st->set_epoch(m.epoch);
    });
  }
  std::optional<std::string> stored(int i, const std::string& key) {
    std::optional<std::string> v;
    s[i]->on_loop([&] {
      if (auto x = s[i]->st->get(key, kv::now_ms())) v = std::string(*x);
    });
    return v;
  }
  void put(int i, const std::string& key, const std::string& value) {
    s[i]->on_loop([&] { s[i]->st->put(key, value, {}, kv::now_ms()); });
  }
};

// Node i serves slots of shard i (0..5460, 5461..10922, 10923..16383).
int owner_of(const std::string& key) {
  const auto slot = cl::slot_of(key);
  return slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2;
}

class kv_cluster_client : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<kv::cluster_client> connect(three_nodes& n, int seed = 0,
                                              std::chrono::milliseconds timeout = 5000ms) {
    kv::client_options o;
    o.timeout = timeout;
    auto c = kv::cluster_client::connect(GetParam() + ":kvcc", n.s[seed]->rdma->address(), o);
    EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().to_string());
    return c ? std::move(*c) : nullptr;
  }
};

TEST_P(kv_cluster_client, keys_go_to_their_slots_primary_and_mget_spans_the_nodes) {
  three_nodes n(GetParam());
  auto c = connect(n, 1);  // discovered from any node
  ASSERT_TRUE(c);
  EXPECT_EQ(c->stats().epoch, 3u);
  std::vector<std::string> keys;
  for (int i = 0; i < 30; ++i) keys.push_back("key:" + std::to_string(i));
  std::array<int, 3> per_node{};
  for (const auto& k : keys) {
    ASSERT_TRUE(c->set(k, "v-" + k)) << k;
    const int o = owner_of(k);
    ++per_node[o];
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(n.stored(i, k).has_value(), i == o) << k << " on node " << i;
  }
  for (int i = 0; i < 3; ++i) EXPECT_GT(per_node[i], 0) << "no key landed on node " << i;
  for (const auto& k : keys) {
    auto v = c->get(k);
    ASSERT_TRUE(v.has_value()) << v.error().to_string();
    EXPECT_EQ(v->value_or("<nil>"), "v-" + k);
  }
  std::vector<std::string_view> views(keys.begin(), keys.end());
  views.push_back("absent");
  auto all = c->mget(views);
  ASSERT_TRUE(all.has_value()) << all.error().to_string();
  ASSERT_EQ(all->size(), keys.size() + 1);
  for (std::size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ((*all)[i].value_or("<nil>"), "v-" + keys[i]);
  EXPECT_FALSE(all->back().has_value());
  EXPECT_EQ(c->incr("counter", 5).value(), 5);
  EXPECT_TRUE(c->del(keys[0]).value());
  EXPECT_FALSE(c->get(keys[0]).value().has_value());
  const auto st = c->stats();
  EXPECT_EQ(st.nodes_connected, 3u);
  EXPECT_EQ(st.map_reads, 1u);
  EXPECT_EQ(st.moved + st.stale_epochs + st.retries, 0u);
}

TEST_P(kv_cluster_client, a_get_notices_a_newer_map_from_the_nodes_epoch) {
  three_nodes n(GetParam());
  auto c = connect(n);
  ASSERT_TRUE(c);
  const auto key = key_in(5461, 10922, "moving");
  ASSERT_EQ(owner_of(key), 1);
  ASSERT_TRUE(c->set(key, "at-1"));
  ASSERT_EQ(c->get(key).value().value_or("<nil>"), "at-1");
  // Shard b's slots move to node 0 (epoch 4), its data with them.
  auto m = n.map;
  m.epoch = 4;
  m.shards[0].slots = {{0, 10922}};
  m.shards.erase(m.shards.begin() + 1);
  m.nodes.erase(m.nodes.begin() + 1);  // node 1 leaves the map
  n.put(0, key, "at-0");
  n.install(0, m);
  n.install(2, m);
  // Node 1's words say epoch 4 while its data is the old one: the client's
  // GET reads it, sees epoch 4 > 3 in the same doorbell, drops the value and
  // reads the map again, from a node at epoch 4 or later: node 1's executor
  // still answers epoch 3 here (a node that has not taken the map yet), so
  // the client must ask another node.
  n.s[1]->on_loop([&] { n.s[1]->st->set_epoch(4); });
  auto v = c->get(key);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->value_or("<nil>"), "at-0");
  EXPECT_EQ(c->stats().stale_epochs, 1u);
  EXPECT_EQ(c->stats().epoch, 4u);
  EXPECT_EQ(c->stats().map_reads, 2u);
  // Later GETs go to node 0 at once.
  EXPECT_EQ(c->get(key).value().value_or("<nil>"), "at-0");
  EXPECT_EQ(c->stats().stale_epochs, 1u);
}

TEST_P(kv_cluster_client, a_write_answered_moved_goes_to_the_new_owner) {
  three_nodes n(GetParam());
  auto c = connect(n);
  ASSERT_TRUE(c);
  const auto key = key_in(10923, 16383, "w");
  ASSERT_TRUE(c->set(key, "first"));
  ASSERT_TRUE(n.stored(2, key).has_value());
  auto m = n.map;
  m.epoch = 4;
  m.shards[1].slots = {{5461, 16383}};
  m.shards.erase(m.shards.begin() + 2);
  m.nodes.erase(m.nodes.begin() + 2);
  n.install(0, m);
  n.install(1, m);
  n.install(2, m);  // node 2 is in no shard now: it redirects every key
  ASSERT_TRUE(c->set(key, "second"));
  EXPECT_EQ(n.stored(1, key).value_or("<nil>"), "second");
  EXPECT_EQ(c->stats().moved, 1u);
  EXPECT_EQ(c->stats().epoch, 4u);
}

// Issue 35's "a client holding a map two epochs old": the key's slots moved
// twice (node 1 -> node 0 at epoch 4 -> node 2 at epoch 5) while two clients
// held epoch 3. A GET at node 1 sees epoch 5 in the words read with the
// bucket, drops the value and reads the map of now; a SET at node 1 gets
// -MOVED to node 2. Neither ever sees the intermediate owner or old data.
TEST_P(kv_cluster_client, a_client_two_epochs_behind_reads_and_writes_at_the_owner_of_now) {
  three_nodes n(GetParam());
  auto reader = connect(n), writer = connect(n);
  ASSERT_TRUE(reader && writer);
  const auto key = key_in(5461, 10922, "twice");
  ASSERT_TRUE(writer->set(key, "at-1"));
  ASSERT_EQ(reader->get(key).value().value_or("<nil>"), "at-1");
  ASSERT_EQ(reader->stats().epoch, 3u);
  auto m4 = n.map;  // shard b's slots to node 0; node 1 leaves
  m4.epoch = 4;
  m4.shards[0].slots = {{0, 10922}};
  m4.shards.erase(m4.shards.begin() + 1);
  m4.nodes.erase(m4.nodes.begin() + 1);
  n.put(0, key, "at-0");
  n.install(m4);
  auto m5 = m4;  // then on to node 2
  m5.epoch = 5;
  m5.shards[0].slots = {{0, 5460}};
  m5.shards[1].slots = {{5461, 16383}};
  n.put(2, key, "at-2");
  n.install(m5);
  auto v = reader->get(key);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->value_or("<nil>"), "at-2");
  EXPECT_GE(reader->stats().stale_epochs, 1u);
  EXPECT_EQ(reader->stats().epoch, 5u);
  ASSERT_TRUE(writer->set(key, "written")) << "a write from epoch 3";
  EXPECT_EQ(n.stored(2, key).value_or("<nil>"), "written");
  EXPECT_EQ(n.stored(0, key).value_or("<nil>"), "at-0") << "the intermediate owner untouched";
  EXPECT_EQ(writer->stats().moved, 1u);
  EXPECT_EQ(writer->stats().epoch, 5u);
  EXPECT_EQ(reader->get(key).value().value_or("<nil>"), "written");
}

TEST_P(kv_cluster_client, a_node_whose_lease_does_not_vouch_is_retried_until_it_does) {
  three_nodes n(GetParam());
  auto c = connect(n);
  ASSERT_TRUE(c);
  const auto key = key_in(0, 5460, "lease");
  ASSERT_TRUE(c->set(key, "v"));
  n.s[0]->st->set_valid_until(0);  // fenced (a failover may be under way)
  auto pending = std::async(std::launch::async, [&] { return c->get(key); });
  EXPECT_EQ(pending.wait_for(300ms), std::future_status::timeout);
  n.s[0]->st->set_valid_until(L::now_ms() + 600'000);
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready);
  auto v = pending.get();
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->value_or("<nil>"), "v");
  EXPECT_GT(c->stats().retries, 0u);
  // Never vouched within the timeout: the refusal, not a value.
  n.s[0]->st->set_valid_until(0);
  auto short_c = connect(n, 0, 400ms);
  auto r = short_c->get(key);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().to_string().find("CLUSTERDOWN"), std::string::npos) << r.error().to_string();
}

TEST_P(kv_cluster_client, replica_reads_go_to_the_slots_replica_only_when_asked) {
  three_nodes n(GetParam());
  // Two shards: node 0 the primary of 0..8191 with node 1 its replica, node
  // 2 the primary of the rest.
  cl::shard_map m = n.map;
  ++m.epoch;
  m.shards[0].slots = {{0, 8191}};
  m.shards[0].replicas = {hex_id('1')};
  m.shards[0].isr = {hex_id('0'), hex_id('1')};
  m.shards[2].slots = {{8192, 16383}};
  m.shards.erase(m.shards.begin() + 1);
  n.install(m);
  const std::string k = key_in(0, 8191), other = key_in(8192, 16383);
  n.put(0, k, "at-primary");
  n.put(1, k, "at-replica");
  n.put(2, other, "only-primary");
  auto plain = connect(n);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->get(k).value().value_or("<nil>"), "at-primary");
  EXPECT_EQ(plain->stats().replica_reads, 0u);
  kv::client_options o;
  o.replica_reads = true;
  auto c = kv::cluster_client::connect(GetParam() + ":kvcc", n.s[2]->rdma->address(), o);
  ASSERT_TRUE(c.has_value()) << c.error().to_string();
  auto& rc = **c;
  EXPECT_EQ(rc.get(k).value().value_or("<nil>"), "at-replica");
  // A slot without a replica is read at its primary; writes go to the primary.
  EXPECT_EQ(rc.get(other).value().value_or("<nil>"), "only-primary");
  std::array<std::string_view, 2> both{k, other};
  auto all = rc.mget(both);
  ASSERT_TRUE(all.has_value()) << all.error().to_string();
  EXPECT_EQ((*all)[0].value_or("<nil>"), "at-replica");
  EXPECT_EQ((*all)[1].value_or("<nil>"), "only-primary");
  EXPECT_EQ(rc.stats().replica_reads, 2u);
  ASSERT_TRUE(rc.set(k, "written"));
  EXPECT_EQ(n.stored(0, k).value_or("<nil>"), "written");
  EXPECT_EQ(n.stored(1, k).value_or("<nil>"), "at-replica");
}

INSTANTIATE_TEST_SUITE_P(providers, kv_cluster_client, ::testing::Values("soft"),
                         [](const auto& i) { return i.param; });

}  // namespace
