// A server's membership (apps/kv/src/cluster/cluster_node.*) against a real
// etcd: the registration on a lease under its id, the id kept across
// restarts, valid shard maps delivered in order, invalid ones ignored with
// the last good map kept, and a lost lease answered by registering again.
#include <condition_variable>
#include <mutex>

#include "cluster/cluster_node.hpp"
#include "etcd_fixture.hpp"

namespace cluster_node_test {

using namespace conveyor::kv::cluster;
using namespace std::chrono_literals;

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/cvy-node-XXXXXX";
    path = ::mkdtemp(tmpl) ? tmpl : "";
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// What the node's thread hands over, read by the test's thread.
struct views {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<const cluster_view>> got;
  std::vector<std::string> log;
  void add(std::shared_ptr<const cluster_view> v) {
    std::lock_guard lk(mu);
    got.push_back(std::move(v));
    cv.notify_all();
  }
  void line(const std::string& l) {
    std::lock_guard lk(mu);
    log.push_back(l);
    cv.notify_all();
  }
  bool wait_for_count(std::size_t n, std::chrono::milliseconds d) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, d, [&] { return got.size() >= n; });
  }
  bool wait_for_log(const std::string& needle, std::chrono::milliseconds d) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, d, [&] {
      for (const auto& l : log)
        if (l.find(needle) != std::string::npos) return true;
      return false;
    });
  }
  std::size_t count() {
    std::lock_guard lk(mu);
    return got.size();
  }
};

class cluster_node_etcd : public etcd_test {
 protected:
  std::string name() {
    static int n = 0;
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())
               .substr(0, 50) +
           "-" + std::to_string(n++);
  }
  node_options options(const std::string& cluster, const std::string& dir, views& v) {
    node_options o;
    o.endpoints = {etcd_->endpoint()};
    o.cluster_name = cluster;
    o.dir = dir;
    o.resp = "127.0.0.1:7001";
    o.lease_ttl = 2s;
    o.on_view = [&v](std::shared_ptr<const cluster_view> x) { v.add(std::move(x)); };
    o.log = [&v](const std::string& l) { v.line(l); };
    return o;
  }
  // The registration of `id`, waiting up to `d` for it to appear.
  std::optional<key_value> registration(const std::string& cluster, const std::string& id,
                                        std::chrono::milliseconds d = 5000ms) {
    const auto until = steady::now() + d;
    for (;;) {
      auto r = c_->get(nodes_prefix(cluster) + id);
      EXPECT_TRUE(r.has_value());
      if (r && r->has_value()) return **r;
      if (steady::now() >= until) return std::nullopt;
      std::this_thread::sleep_for(50ms);
    }
  }
  static shard_map one_shard(const std::string& id, std::uint64_t epoch) {
    shard_map m;
    m.epoch = epoch;
    m.nodes.push_back({id, "127.0.0.1:7001", ""});
    m.shards.push_back({std::string(40, 'a'), {{0, 16383}}, id, {id}, {}});
    return m;
  }
};

TEST_F(cluster_node_etcd, registers_on_a_lease_under_an_id_it_keeps_across_restarts) {
  temp_dir dir;
  views v;
  const auto cluster = name();
  std::string id;
  {
    auto n = cluster_node::start(options(cluster, dir.path, v));
    ASSERT_TRUE(n.has_value()) << n.error().to_string();
    id = (*n)->id();
    EXPECT_TRUE(valid_id(id));
    auto kv = registration(cluster, id);
    ASSERT_TRUE(kv.has_value());
    EXPECT_NE(kv->lease, 0);
    auto reg = parse_node_registration(kv->value);
    ASSERT_TRUE(reg.has_value());
    EXPECT_EQ(reg->id, id);
    EXPECT_EQ(reg->resp, "127.0.0.1:7001");
    (*n)->stop();  // revokes the lease: the registration goes at once
    auto gone = c_->get(nodes_prefix(cluster) + id);
    ASSERT_TRUE(gone.has_value());
    EXPECT_FALSE(gone->has_value());
  }
  auto again = cluster_node::start(options(cluster, dir.path, v));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ((*again)->id(), id);
  EXPECT_TRUE(registration(cluster, id).has_value());
}

TEST_F(cluster_node_etcd, a_damaged_id_file_refuses_the_start) {
  temp_dir dir;
  views v;
  std::ofstream(dir.path + "/cluster-node.id") << "not-an-id\n";
  auto n = cluster_node::start(options(name(), dir.path, v));
  ASSERT_FALSE(n.has_value());
  EXPECT_EQ(n.error().code, errc::invalid_argument);
  EXPECT_NE(n.error().context.find("cluster-node.id"), std::string::npos);
}

TEST_F(cluster_node_etcd, valid_maps_are_delivered_and_an_invalid_one_is_ignored) {
  temp_dir dir;
  views v;
  const auto cluster = name();
  auto n = cluster_node::start(options(cluster, dir.path, v));
  ASSERT_TRUE(n.has_value());
  const auto id = (*n)->id();
  ASSERT_TRUE(c_->put(config_key(cluster), to_json(one_shard(id, 1))).has_value());
  ASSERT_TRUE(v.wait_for_count(1, 5s));
  // Garbage, then a map that parses but breaks a rule: both ignored.
  ASSERT_TRUE(c_->put(config_key(cluster), "{\"epoch\": 2, \"shards\": [").has_value());
  ASSERT_TRUE(v.wait_for_log("ignoring the shard map", 5s));
  auto bad = one_shard(id, 3);
  bad.nodes.clear();  // the primary is not among the nodes
  ASSERT_TRUE(c_->put(config_key(cluster), to_json(bad)).has_value());
  ASSERT_TRUE(c_->put(config_key(cluster) + "-other", "x").has_value());  // not the key
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(v.count(), 1u);
  ASSERT_TRUE(c_->put(config_key(cluster), to_json(one_shard(id, 4))).has_value());
  ASSERT_TRUE(v.wait_for_count(2, 5s));
  std::lock_guard lk(v.mu);
  EXPECT_EQ(v.got[0]->map.epoch, 1u);
  EXPECT_EQ(v.got[1]->map.epoch, 4u);
  EXPECT_LT(v.got[0]->revision, v.got[1]->revision);
  EXPECT_EQ(v.got[1]->my_id, id);
  EXPECT_EQ(v.got[1]->table.shard_of(100), 0u);
}

TEST_F(cluster_node_etcd, a_map_written_before_the_node_starts_is_read_at_start) {
  temp_dir dir;
  views v;
  const auto cluster = name();
  ASSERT_TRUE(
      c_->put(config_key(cluster), to_json(one_shard(std::string(40, 'b'), 9))).has_value());
  auto n = cluster_node::start(options(cluster, dir.path, v));
  ASSERT_TRUE(n.has_value());
  ASSERT_TRUE(v.wait_for_count(1, 5s));
  std::lock_guard lk(v.mu);
  EXPECT_EQ(v.got[0]->map.epoch, 9u);
}

TEST_F(cluster_node_etcd, a_lost_lease_is_answered_by_registering_again_with_the_same_id) {
  temp_dir dir;
  views v;
  const auto cluster = name();
  auto n = cluster_node::start(options(cluster, dir.path, v));
  ASSERT_TRUE(n.has_value());
  const auto id = (*n)->id();
  auto kv = registration(cluster, id);
  ASSERT_TRUE(kv.has_value());
  const auto lease = kv->lease;
  ASSERT_TRUE(c_->revoke_lease(lease).has_value());  // as if it had expired
  const auto until = steady::now() + 5s;
  std::int64_t now_lease = lease;
  while (steady::now() < until) {
    auto r = c_->get(nodes_prefix(cluster) + id);
    if (r && *r && (*r)->lease != lease) {
      now_lease = (*r)->lease;
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(now_lease, lease) << "not registered again within 5 s";
  EXPECT_TRUE(v.wait_for_log("registering again", 1s));
}

TEST_F(cluster_node_etcd, without_etcd_the_node_starts_retries_and_stops_in_bounded_time) {
  temp_dir dir;
  views v;
  dead_port dead;
  auto o = options(name(), dir.path, v);
  o.endpoints = {dead.endpoint()};
  auto n = cluster_node::start(std::move(o));
  ASSERT_TRUE(n.has_value());
  ASSERT_TRUE(v.wait_for_log("etcd:", 3s));
  const auto t0 = steady::now();
  (*n)->stop();
  EXPECT_LT(steady::now() - t0, 3s);
}

TEST_F(cluster_node_etcd, etcd_going_away_is_logged_once_per_kind_and_stop_stays_bounded) {
  etcd_process own;  // this case stops it
  ASSERT_EQ(own.start(), "");
  temp_dir dir;
  views v;
  auto o = options(name(), dir.path, v);
  o.endpoints = {own.endpoint()};
  auto n = cluster_node::start(std::move(o));
  ASSERT_TRUE(n.has_value());
  ASSERT_TRUE(v.wait_for_log("registered as", 5s));
  own.stop();
  std::this_thread::sleep_for(3s);  // past the 2 s lease: renewals and watches keep failing
  std::size_t errors = 0;
  {
    std::lock_guard lk(v.mu);
    for (const auto& l : v.log)
      if (l.rfind("etcd: ", 0) == 0) ++errors;
  }
  EXPECT_GE(errors, 1u);
  EXPECT_LE(errors, 4u) << "an error logged at every retry";
  const auto t0 = steady::now();
  (*n)->stop();
  EXPECT_LT(steady::now() - t0, 4s);
}

}  // namespace cluster_node_test

namespace cluster = conveyor::kv::cluster;

// The registrations a range of nodes/ holds: valid ones under their own id's
// key, in key order; one under another id's key and garbage are counted as bad
// (the controller and `kv cluster status` read them the same way).
TEST(cluster_node, registrations_in_keeps_valid_ones_under_their_own_key) {
  const std::string prefix = cluster::nodes_prefix("c1");
  cluster::node_registration a{
      .id = std::string(40, 'a'), .resp = "127.0.0.1:7001", .boot_id = "b1"};
  cluster::node_registration b{
      .id = std::string(40, 'b'), .resp = "127.0.0.1:7002", .boot_id = "b2"};
  std::vector<cluster::key_value> kvs(4);
  kvs[0].key = prefix + a.id;
  kvs[0].value = cluster::to_json(a);
  kvs[1].key = prefix + std::string(40, 'c');  // b's registration under c's key
  kvs[1].value = cluster::to_json(b);
  kvs[2].key = prefix + b.id;
  kvs[2].value = cluster::to_json(b);
  kvs[3].key = prefix + std::string(40, 'd');
  kvs[3].value = "{not json";
  std::size_t bad = 0;
  auto got = cluster::registrations_in(kvs, prefix, &bad);
  EXPECT_EQ(got, (std::vector<cluster::node_registration>{a, b}));
  EXPECT_EQ(bad, 2u);
  EXPECT_TRUE(cluster::registrations_in({}, prefix).empty());
}
