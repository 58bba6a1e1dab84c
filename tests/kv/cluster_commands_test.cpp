// The executor in cluster mode (apps/kv/src/cluster_commands.cpp and the
// routing check in commands.cpp): keys taken from the command table's
// positions and EVAL's numkeys, MOVED / CROSSSLOT / CLUSTERDOWN before a
// command runs, inside MULTI at queue time and over the whole queue at EXEC;
// the CLUSTER subcommands' replies in Redis 7.0's shapes.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "cluster/routing.hpp"
#include "cluster/slots.hpp"
#include "cluster/three_shards.hpp"
#include "kv_fixture.hpp"

namespace kv = conveyor::kv;
using namespace conveyor::kv::cluster;
using kvtest::run;

namespace cluster_commands_test {

using kvtest::hex_id;
using kvtest::key_in;
using kvtest::three_shards;

struct cluster_mode : ::testing::Test {
  kvtest::kv_env env;
  std::unique_ptr<kv::store> st = env.make_store();
  kv::server_config cfg = [] {
    kv::server_config c;
    c.cluster_enabled = true;
    c.cluster_my_id = hex_id('1');
    c.cluster_address = "127.0.0.1:7002";
    return c;
  }();
  std::unique_ptr<kv::executor> ex = std::make_unique<kv::executor>(*st, nullptr, cfg);
  kv::session s;
  std::string mine = key_in(5461, 10922, "m"), mine2 = key_in(5461, 10922, "{" + mine + "}");
  std::string other = key_in(10923, 16383, "o");
  std::string moved_other = "-MOVED " + std::to_string(slot_of(other)) + " 127.0.0.1:7003\r\n";
  void SetUp() override { ex->set_cluster(make_view(three_shards(), hex_id('1')).value()); }
  std::string r(std::initializer_list<std::string_view> a) { return run(*ex, s, a); }
};

TEST_F(cluster_mode, before_any_map_every_key_is_clusterdown_and_keyless_commands_run) {
  ex->set_cluster(nullptr);
  EXPECT_EQ(r({"GET", mine}), "-CLUSTERDOWN Hash slot not served\r\n");
  EXPECT_EQ(r({"PING"}), "+PONG\r\n");
  EXPECT_EQ(r({"CLUSTER", "MYID"}), "$40\r\n" + hex_id('1') + "\r\n");
  EXPECT_EQ(r({"CLUSTER", "SLOTS"}), "*0\r\n");
  // Redis lists itself before it knows anyone (redis-benchmark looks for `myself`).
  const std::string nodes = r({"CLUSTER", "NODES"});
  EXPECT_NE(nodes.find(hex_id('1') + " 127.0.0.1:7002@17002 myself,master - 0 0 0 connected\n"),
            std::string::npos)
      << nodes;
}

TEST_F(cluster_mode, a_node_the_map_does_not_name_lists_itself_and_redirects_every_key) {
  cfg.cluster_my_id = hex_id('9');
  ex->set_cluster(make_view(three_shards(), hex_id('9')).value());
  const std::string nodes = r({"CLUSTER", "NODES"});
  EXPECT_EQ(nodes.find("$"), 0u);
  EXPECT_NE(nodes.find(hex_id('9') + " 127.0.0.1:7002@17002 myself,master - 0 0 3 connected\n"),
            std::string::npos)
      << nodes;
  EXPECT_NE(nodes.find(hex_id('1') + " 127.0.0.1:7002@17002 master -"), std::string::npos);
  EXPECT_EQ(r({"GET", mine}), "-MOVED " + std::to_string(slot_of(mine)) + " 127.0.0.1:7002\r\n");
}

TEST_F(cluster_mode, keys_are_routed_by_the_tables_positions_and_evals_numkeys) {
  EXPECT_EQ(r({"SET", mine, "v"}), "+OK\r\n");
  EXPECT_EQ(r({"GET", mine}), "$1\r\nv\r\n");
  EXPECT_EQ(r({"GET", other}), moved_other);
  EXPECT_EQ(r({"SET", other, "v"}), moved_other);
  EXPECT_EQ(r({"MSET", mine, "1", mine2, "2"}), "+OK\r\n");
  EXPECT_EQ(r({"MSET", mine, "1", other, "2"}),
            "-CROSSSLOT Keys in request don't hash to the same slot\r\n");
  // MSET's step 2: values are not keys.
  EXPECT_EQ(r({"MSET", mine, other}), "+OK\r\n");
  // BLPOP's last key is before the timeout.
  EXPECT_EQ(r({"BLPOP", "{" + mine + "}list", "0.01"}), "*-1\r\n");
  EXPECT_EQ(r({"RENAME", mine, other}),
            "-CROSSSLOT Keys in request don't hash to the same slot\r\n");
  EXPECT_EQ(r({"EVAL", "return 1", "1", other}), moved_other);
  EXPECT_EQ(r({"EVAL", "return 1", "2", mine, mine2}), ":1\r\n");
  EXPECT_EQ(r({"EVAL", "return 1", "0", other}), ":1\r\n");  // an argument, not a key
  EXPECT_EQ(r({"OBJECT", "ENCODING", other}), moved_other);
  EXPECT_EQ(r({"GET", key_in(0, 99, "n")}), "-CLUSTERDOWN Hash slot not served\r\n");
  EXPECT_EQ(r({"DBSIZE"}), ":2\r\n");  // keyless: runs here
}

TEST_F(cluster_mode,
       inside_multi_a_redirected_command_aborts_exec_and_exec_checks_the_whole_queue) {
  EXPECT_EQ(r({"MULTI"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", other, "1"}), moved_other);
  EXPECT_EQ(r({"SET", mine, "1"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"EXEC"}), "-EXECABORT Transaction discarded because of previous errors.\r\n");
  EXPECT_EQ(r({"GET", mine}), "$-1\r\n");
  // Every queued command's own keys are served here, but not in one slot.
  const auto mine_other_slot = key_in(5461, 10922, "z");
  ASSERT_NE(slot_of(mine_other_slot), slot_of(mine));
  EXPECT_EQ(r({"MULTI"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", mine, "1"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"SET", mine_other_slot, "1"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"EXEC"}), "-CROSSSLOT Keys in request don't hash to the same slot\r\n");
  EXPECT_FALSE(s.in_multi);
  EXPECT_EQ(r({"GET", mine}), "$-1\r\n");
  EXPECT_EQ(r({"MULTI"}), "+OK\r\n");
  EXPECT_EQ(r({"SET", mine, "1"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"SET", mine2, "2"}), "+QUEUED\r\n");
  EXPECT_EQ(r({"EXEC"}), "*2\r\n+OK\r\n+OK\r\n");
}

TEST_F(cluster_mode, cluster_subcommands_answer_in_redis_shapes) {
  EXPECT_EQ(r({"CLUSTER", "KEYSLOT", "foo"}), ":12182\r\n");
  EXPECT_EQ(r({"CLUSTER", "KEYSLOT", "{user1000}.following"}),
            ":" + std::to_string(slot_of("user1000")) + "\r\n");
  EXPECT_EQ(r({"CLUSTER", "KEYSLOT"}),
            "-ERR wrong number of arguments for 'cluster|keyslot' command\r\n");
  EXPECT_EQ(r({"CLUSTER", "NOSUCH"}), "-ERR unknown subcommand 'NOSUCH'. Try CLUSTER HELP.\r\n");
  EXPECT_EQ(r({"READONLY"}), "+OK\r\n");
  EXPECT_EQ(r({"READWRITE"}), "+OK\r\n");
  EXPECT_EQ(r({"ASKING"}), "+OK\r\n");
  // SLOTS: [first, last, [host, port, id, {}]] per range, in slot order.
  const std::string slots = r({"CLUSTER", "SLOTS"});
  EXPECT_EQ(slots.substr(0, 4), "*3\r\n");
  EXPECT_NE(slots.find("*3\r\n:100\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7001\r\n$40\r\n" +
                       hex_id('0') + "\r\n*0\r\n"),
            std::string::npos)
      << slots;
  const std::string shards = r({"CLUSTER", "SHARDS"});
  EXPECT_NE(
      shards.find("$5\r\nslots\r\n*2\r\n:5461\r\n:10922\r\n$5\r\nnodes\r\n*1\r\n*14\r\n$2\r\nid"),
      std::string::npos)
      << shards;
  const std::string nodes = r({"CLUSTER", "NODES"});
  EXPECT_NE(nodes.find(hex_id('1') +
                       " 127.0.0.1:7002@17002 myself,master - 0 0 3 connected 5461-10922\n"),
            std::string::npos)
      << nodes;
  EXPECT_NE(nodes.find(hex_id('0') + " 127.0.0.1:7001@17001 master - 0 0 3 connected 100-5460\n"),
            std::string::npos);
  const std::string info = r({"CLUSTER", "INFO"});
  EXPECT_NE(info.find("cluster_state:fail\r\ncluster_slots_assigned:16284\r\n"), std::string::npos)
      << info;
  EXPECT_NE(info.find("cluster_known_nodes:3\r\ncluster_size:3\r\ncluster_current_epoch:3"),
            std::string::npos);
  EXPECT_NE(r({"INFO", "cluster"}).find("cluster_enabled:1"), std::string::npos);
  EXPECT_EQ(r({"CONFIG", "GET", "cluster-enabled"}),
            "*2\r\n$15\r\ncluster-enabled\r\n$3\r\nyes\r\n");
}

TEST_F(cluster_mode, keys_in_slot_are_counted_and_listed_up_to_count) {
  for (int i = 0; i < 5; ++i) r({"SET", "{" + mine + "}" + std::to_string(i), "v"});
  const auto slot = std::to_string(slot_of(mine));
  EXPECT_EQ(r({"CLUSTER", "COUNTKEYSINSLOT", slot}), ":5\r\n");
  EXPECT_EQ(r({"CLUSTER", "COUNTKEYSINSLOT", "0"}), ":0\r\n");
  EXPECT_EQ(r({"CLUSTER", "COUNTKEYSINSLOT", "16384"}), "-ERR Invalid slot\r\n");
  EXPECT_EQ(r({"CLUSTER", "COUNTKEYSINSLOT", "x"}),
            "-ERR value is not an integer or out of range\r\n");
  EXPECT_EQ(r({"CLUSTER", "GETKEYSINSLOT", slot, "3"}).substr(0, 4), "*3\r\n");
  EXPECT_EQ(r({"CLUSTER", "GETKEYSINSLOT", slot, "100"}).substr(0, 4), "*5\r\n");
  EXPECT_EQ(r({"CLUSTER", "GETKEYSINSLOT", slot, "-1"}), "-ERR Invalid slot or number of keys\r\n");
}

// Keys that expired but were not removed yet are still in the store's table:
// GETKEYSINSLOT and COUNTKEYSINSLOT see only live keys, and `count` counts
// live keys (with 100 expired keys met first, count 1 still finds the live one).
TEST_F(cluster_mode, getkeysinslot_counts_only_live_keys_toward_count) {
  const std::string tag = "{" + mine + "}";
  for (int i = 0; i < 100; ++i) r({"SET", tag + "gone" + std::to_string(i), "v", "PX", "1"});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // all expired, none touched
  const std::string live = tag + "live";
  r({"SET", live, "v"});
  const auto slot = std::to_string(slot_of(mine));
  EXPECT_EQ(r({"CLUSTER", "GETKEYSINSLOT", slot, "1"}),
            "*1\r\n$" + std::to_string(live.size()) + "\r\n" + live + "\r\n");
  EXPECT_EQ(r({"CLUSTER", "COUNTKEYSINSLOT", slot}), ":1\r\n");
}

TEST_F(cluster_mode, a_replica_reads_with_readonly_redirects_writes_and_refuses_keyless_ones) {
  auto m = three_shards();
  m.nodes.push_back({hex_id('7'), "127.0.0.1:7007", "", "127.0.0.1:27007"});
  m.shards[1].replicas = {hex_id('7')};
  m.shards[1].isr = {hex_id('1'), hex_id('7')};
  ex->set_cluster(make_view(m, hex_id('7')).value());
  EXPECT_TRUE(ex->is_replica());
  const std::string moved = "-MOVED " + std::to_string(slot_of(mine)) + " 127.0.0.1:7002\r\n";
  // The primary's stream writes here; a client does not.
  std::string why;
  const std::string_view set[] = {"SET", mine, "v"};
  ASSERT_TRUE(ex->apply_replicated(set, why)) << why;
  EXPECT_EQ(run(*ex, s, {"GET", mine}), moved);
  EXPECT_EQ(run(*ex, s, {"SET", mine, "w"}), moved);
  EXPECT_EQ(run(*ex, s, {"FLUSHALL"}),
            "-READONLY You can't write against a read only replica.\r\n");
  EXPECT_EQ(run(*ex, s, {"READONLY"}), "+OK\r\n");
  EXPECT_EQ(run(*ex, s, {"GET", mine}), "$1\r\nv\r\n");
  EXPECT_EQ(run(*ex, s, {"SET", mine, "w"}), moved);    // READONLY does not make writes local
  EXPECT_EQ(run(*ex, s, {"GET", other}), moved_other);  // another shard's slot
  // A transaction that only reads runs here; one with a write is redirected.
  EXPECT_EQ(run(*ex, s, {"MULTI"}), "+OK\r\n");
  EXPECT_EQ(run(*ex, s, {"GET", mine}), "+QUEUED\r\n");
  EXPECT_EQ(run(*ex, s, {"EXEC"}), "*1\r\n$1\r\nv\r\n");
  EXPECT_EQ(run(*ex, s, {"READWRITE"}), "+OK\r\n");
  EXPECT_EQ(run(*ex, s, {"GET", mine}), moved);
  // The primary of that shard is no replica and serves both.
  ex->set_cluster(make_view(m, hex_id('1')).value());
  EXPECT_FALSE(ex->is_replica());
  EXPECT_EQ(run(*ex, s, {"SET", mine, "w"}), "+OK\r\n");
}

TEST(not_a_cluster, cluster_commands_say_cluster_support_is_disabled) {
  kvtest::kv_env env;
  auto st = env.make_store();
  kv::server_config cfg;
  kv::executor ex(*st, nullptr, cfg);
  kv::session s;
  EXPECT_EQ(run(ex, s, {"CLUSTER", "INFO"}), "-ERR This instance has cluster support disabled\r\n");
  EXPECT_EQ(run(ex, s, {"READONLY"}), "-ERR This instance has cluster support disabled\r\n");
  EXPECT_EQ(run(ex, s, {"SET", "foo", "v"}), "+OK\r\n");  // no routing
}

}  // namespace cluster_commands_test
