// A cluster node's header words and the one-sided reader's checks
// (store_layout.hpp judge, docs/KV-CLUSTER.md "What a one-sided reader
// checks"), on soft and shm: a GET is answered only while the node's lease
// vouches for its data past now plus the allowed clock skew, and only once
// every change it saw is on every in-sync replica (acked_version), a change
// being a write or a delete; a value whose own item is acknowledged is
// answered at once while other writes wait. A server that keeps no words
// costs no READ more.
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <chrono>
#include <future>
#include <string>

#include "conveyor_kv/client.hpp"
#include "rdma_server_fixture.hpp"
#include "store_layout.hpp"

namespace kv = conveyor::kv;
namespace L = kv::layout;
using namespace std::chrono_literals;
using kvtest::must;
using kvtest::server;

namespace {

kv::store_options cluster_store() {
  auto o = kvtest::small_store();
  o.cluster_header = true;
  return o;
}

class kv_cluster_words : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<kv::client> connect(server& s, std::chrono::milliseconds timeout = 5000ms,
                                      std::chrono::milliseconds skew = 100ms) {
    kv::client_options o;
    o.timeout = timeout;
    o.max_clock_skew = skew;
    o.location_cache = 0;  // each client reads the buckets: the paths are the same either way
    auto c = kv::client::connect(GetParam() + ":kvc", s.rdma->address(), o);
    EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().to_string());
    return c ? std::move(*c) : nullptr;
  }
  // The lease vouches for the next minute.
  static void vouch(server& s) { s.st->set_valid_until(L::now_ms() + 60'000); }
};

TEST_P(kv_cluster_words, a_node_whose_lease_does_not_vouch_answers_no_get) {
  server s(GetParam(), cluster_store());
  auto c = connect(s);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("k", "v"));
  // A new node is fenced until its first lease: valid_until is 0.
  auto r = c->get("k");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, conveyor::errc::rejected);
  EXPECT_NE(r.error().to_string().find("CLUSTERDOWN"), std::string::npos) << r.error().to_string();
  EXPECT_EQ(c->stats().lease_refusals, 1u);
  // Confirmed: answered, with the header READ in the same doorbell.
  vouch(s);
  auto c2 = connect(s);
  auto v = c2->get("k");
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->value_or("<nil>"), "v");
  EXPECT_GT(c2->stats().header_reads, 0u);
  EXPECT_EQ(c2->stats().header_reads, c2->stats().doorbells);
  // A lease that ends within the allowed skew does not vouch either: the
  // node's clock may be that far ahead.
  s.st->set_valid_until(L::now_ms() + 50);
  auto late = c2->get("k");
  ASSERT_FALSE(late.has_value());
  EXPECT_NE(late.error().to_string().find("CLUSTERDOWN"), std::string::npos);
  // Fenced (0), as a node whose lease was found gone.
  vouch(s);
  auto c3 = connect(s);
  ASSERT_TRUE(c3->get("k").has_value());
  s.st->set_valid_until(0);
  EXPECT_FALSE(c3->get("k").has_value());
}

TEST_P(kv_cluster_words, a_get_waits_until_the_write_it_read_is_on_every_in_sync_replica) {
  server s(GetParam(), cluster_store());
  vouch(s);
  auto c = connect(s);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("k", "old"));
  // Replicas in sync from here: acked_version moves only when told.
  s.on_loop([&] { s.st->set_acked_follows(false); });
  ASSERT_TRUE(c->set("k", "new"));
  auto pending = std::async(std::launch::async, [&] { return c->get("k"); });
  EXPECT_EQ(pending.wait_for(300ms), std::future_status::timeout)
      << "a value no replica acknowledged was returned";
  s.on_loop([&] { s.st->set_acked_version(s.st->current_version()); });
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready);
  auto v = pending.get();
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->value_or("<nil>"), "new");
  EXPECT_GT(c->stats().acked_waits, 0u);
}

TEST_P(kv_cluster_words, a_delete_is_not_seen_before_it_is_acknowledged) {
  server s(GetParam(), cluster_store());
  vouch(s);
  auto c = connect(s, 400ms);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("k", "v"));
  s.on_loop([&] { s.st->set_acked_follows(false); });
  ASSERT_TRUE(c->del("k").value());
  // The miss is not answered while the delete is unacknowledged (and the
  // old value is not answered as current either: its slot is gone): the GET
  // runs out of time.
  auto r = c->get("k");
  ASSERT_FALSE(r.has_value()) << "answered " << (r->has_value() ? **r : "a miss");
  EXPECT_EQ(r.error().code, conveyor::errc::timed_out) << r.error().to_string();
  s.on_loop([&] { s.st->set_acked_version(s.st->current_version()); });
  auto c2 = connect(s);
  auto v = c2->get("k");
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_FALSE(v->has_value());
}

TEST_P(kv_cluster_words, an_acknowledged_value_is_answered_while_other_writes_wait) {
  server s(GetParam(), cluster_store());
  vouch(s);
  auto c = connect(s);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("a", "1"));
  s.on_loop([&] { s.st->set_acked_follows(false); });
  ASSERT_TRUE(c->set("b", "2"));  // unacknowledged: acked_version < write_version
  // Read "a" through the buckets and by its remembered item alike: its own
  // item is acknowledged, so no wait.
  for (int i = 0; i < 3; ++i) {
    auto v = c->get("a");
    ASSERT_TRUE(v.has_value()) << v.error().to_string();
    EXPECT_EQ(v->value_or("<nil>"), "1");
  }
  EXPECT_EQ(c->stats().acked_waits, 0u);
  // MGET: "a" answered, "b" waits; together they wait for "b".
  auto both = std::async(std::launch::async, [&] {
    std::array<std::string_view, 2> keys{"a", "b"};
    return c->mget(keys);
  });
  EXPECT_EQ(both.wait_for(300ms), std::future_status::timeout);
  s.on_loop([&] { s.st->set_acked_version(s.st->current_version()); });
  ASSERT_EQ(both.wait_for(5s), std::future_status::ready);
  auto vs = both.get();
  ASSERT_TRUE(vs.has_value()) << vs.error().to_string();
  EXPECT_EQ((*vs)[0].value_or("<nil>"), "1");
  EXPECT_EQ((*vs)[1].value_or("<nil>"), "2");
}

TEST_P(kv_cluster_words, a_store_outside_a_cluster_costs_no_header_read) {
  server s(GetParam());
  auto c = connect(s);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("k", "v"));
  // valid_until is 0 here too: not checked, since the store keeps no words.
  auto v = c->get("k");
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(v->value_or("<nil>"), "v");
  EXPECT_EQ(c->stats().header_reads, 0u);
}

INSTANTIATE_TEST_SUITE_P(providers, kv_cluster_words, ::testing::Values("soft", "shm"),
                         [](const auto& i) { return i.param; });

}  // namespace
