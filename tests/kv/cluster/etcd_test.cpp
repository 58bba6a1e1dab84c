// The coordination client (apps/kv/src/cluster/etcd.*) against a real etcd:
// the pure helpers, then every call against Debian's etcd started by the
// suite (etcd_fixture.hpp).
#include "etcd_fixture.hpp"

namespace {
// ---------------------------------------------------------------- pure helpers

TEST(etcd_codec, base64_round_trips_every_length_and_byte) {
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    auto enc = base64_encode(bytes);
    EXPECT_EQ(enc.size(), (bytes.size() + 2) / 3 * 4);
    auto dec = base64_decode(enc);
    ASSERT_TRUE(dec.has_value()) << enc;
    EXPECT_EQ(*dec, bytes);
    bytes.push_back(static_cast<char>(i * 37));
  }
  EXPECT_EQ(base64_encode("foo"), "Zm9v");  // the gateway docs' examples
  EXPECT_EQ(base64_encode("bar"), "YmFy");
  EXPECT_EQ(base64_encode("1"), "MQ==");
}

TEST(etcd_codec, base64_refuses_what_is_not_base64) {
  for (const char* bad :
       {"Y", "YQ=", "Y===", "====", "Y!==", "YQ==YQ==", "Zm9v\n", "Zm 9", "Zm9v====", "-_-_"})
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
  EXPECT_EQ(base64_decode("").value(), "");
}

// Found by fuzz_etcd_reply: "0canceH=" decoded, to the bytes of "0canceE=",
// though only canonical base64 is accepted (the bits past the last byte are 0).
TEST(etcd_codec, base64_refuses_bits_past_the_last_byte) {
  for (const char* bad : {"0canceH=", "YR==", "YQ=x", "Zm9=", "Zm+=", "QR==", "Qf=="})
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
  for (const char* good : {"0cancQ==", "YQ==", "Zm8=", "Zm+8", "QQ==", "Qg=="}) {
    auto d = base64_decode(good);
    ASSERT_TRUE(d.has_value()) << good;
    EXPECT_EQ(base64_encode(*d), good);
  }
}

TEST(etcd_codec, prefix_end_is_the_first_key_after_the_prefix) {
  EXPECT_EQ(prefix_end("ab"), "ac");
  EXPECT_EQ(prefix_end("a\xff"), "b");
  EXPECT_EQ(prefix_end("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
}

TEST(etcd_codec, open_checks_endpoints) {
  EXPECT_FALSE(etcd_coord::open({}).has_value());
  for (const char* bad : {"127.0.0.1", "ftp://127.0.0.1:1", "127.0.0.1:0", "127.0.0.1:99999",
                          ":2379", "a b:1", "user@host:1", "::1:2379"}) {
    auto c = etcd_coord::open({.endpoints = {bad}});
    ASSERT_FALSE(c.has_value()) << bad;
    EXPECT_EQ(c.error().code, errc::invalid_argument);
  }
  for (const char* ok :
       {"127.0.0.1:2379", "http://127.0.0.1:2379/", "https://etcd.example:2379", "[::1]:2379"})
    EXPECT_TRUE(etcd_coord::open({.endpoints = {ok}}).has_value()) << ok;
}

// ---------------------------------------------------------------- against etcd

TEST_F(etcd_test, binary_keys_and_values_round_trip) {
  std::string value;
  for (int i = 0; i < 256; ++i) value.push_back(static_cast<char>(i));
  const std::string k = key(std::string("bin\0\xff\n/\x80", 8));
  auto rev = c_->put(k, value);
  ASSERT_TRUE(rev.has_value()) << rev.error().to_string();
  auto got = c_->get(k);
  ASSERT_TRUE(got.has_value()) << got.error().to_string();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key, k);
  EXPECT_EQ((*got)->value, value);
  EXPECT_EQ((*got)->mod_revision, *rev);
  EXPECT_EQ((*got)->create_revision, *rev);
  EXPECT_EQ((*got)->version, 1);
  EXPECT_EQ((*got)->lease, 0);

  auto empty = c_->put(k, "");  // an empty value is left out of the reply's JSON
  ASSERT_TRUE(empty.has_value());
  got = c_->get(k);
  ASSERT_TRUE(got.has_value() && got->has_value());
  EXPECT_EQ((*got)->value, "");
  EXPECT_EQ((*got)->version, 2);
  EXPECT_GT((*got)->mod_revision, *rev);

  auto missing = c_->get(key("missing"));
  ASSERT_TRUE(missing.has_value()) << missing.error().to_string();
  EXPECT_FALSE(missing->has_value());

  auto d = c_->del(k);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, 1);
  EXPECT_EQ(c_->del(k).value(), 0);
  EXPECT_FALSE(c_->get(k).value().has_value());
}

TEST_F(etcd_test, range_by_prefix_returns_exactly_the_prefix) {
  for (const std::string& k :
       std::vector<std::string>{"p/a", "p/b", "p/\xff", "p/\xff\xff", "p0", "p", "q/a"})
    ASSERT_TRUE(c_->put(key(k), "v:" + k).has_value());
  auto r = c_->range_prefix(key("p/"));
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  ASSERT_EQ(r->kvs.size(), 4u);
  EXPECT_EQ(r->kvs[0].key, key("p/a"));
  EXPECT_EQ(r->kvs[1].key, key("p/b"));
  EXPECT_EQ(r->kvs[2].key, key("p/\xff"));
  EXPECT_EQ(r->kvs[3].key, key("p/\xff\xff"));
  EXPECT_EQ(r->kvs[3].value, "v:p/\xff\xff");
  EXPECT_FALSE(r->more);
  EXPECT_GT(r->revision, 0);

  auto tail = c_->range_prefix(key("p/\xff"));
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ(tail->kvs.size(), 2u);

  auto limited = c_->range_prefix(key("p/"), 2);
  ASSERT_TRUE(limited.has_value());
  EXPECT_EQ(limited->kvs.size(), 2u);
  EXPECT_TRUE(limited->more);

  auto none = c_->range_prefix(key("nothing/"));
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->kvs.empty());
}

TEST_F(etcd_test, put_if_succeeds_only_with_the_current_mod_revision) {
  const auto k = key("config");
  auto first = c_->put_if(k, "v1", 0);  // create if absent
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  ASSERT_TRUE(first->succeeded);
  EXPECT_FALSE(first->current.has_value());

  auto again = c_->put_if(k, "v1b", 0);  // it exists now
  ASSERT_TRUE(again.has_value());
  EXPECT_FALSE(again->succeeded);
  ASSERT_TRUE(again->current.has_value());
  EXPECT_EQ(again->current->value, "v1");
  EXPECT_EQ(again->current->mod_revision, first->revision);

  auto stale = c_->put_if(k, "v2", first->revision - 1);
  ASSERT_TRUE(stale.has_value());
  EXPECT_FALSE(stale->succeeded);

  auto second = c_->put_if(k, "v2", first->revision);
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(second->succeeded);
  EXPECT_GT(second->revision, first->revision);
  auto now = c_->get(k).value();
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->value, "v2");
  EXPECT_EQ(now->mod_revision, second->revision);

  auto replay = c_->put_if(k, "v3", first->revision);  // the old guard again
  ASSERT_TRUE(replay.has_value());
  EXPECT_FALSE(replay->succeeded);
  EXPECT_EQ(replay->current->value, "v2");
}

// The controller's failover CAS: the map changes only while the deposed
// primary's registration is still absent.
TEST_F(etcd_test, put_if_absent_fails_when_another_key_exists) {
  const auto k = key("config"), reg = key("nodes/p"), other = key("nodes/q");
  auto first = c_->put_if(k, "v1", 0).value();
  ASSERT_TRUE(first.succeeded);
  ASSERT_TRUE(c_->put(reg, "back").has_value());
  auto blocked = c_->put_if_absent(k, "v2", first.revision, {reg});
  ASSERT_TRUE(blocked.has_value()) << blocked.error().to_string();
  EXPECT_FALSE(blocked->succeeded);
  ASSERT_TRUE(blocked->current.has_value());
  EXPECT_EQ(blocked->current->value, "v1");
  ASSERT_EQ(c_->del(reg).value(), 1);
  auto stale = c_->put_if_absent(k, "v2", first.revision - 1, {reg, other});
  ASSERT_TRUE(stale.has_value());
  EXPECT_FALSE(stale->succeeded);
  auto ok = c_->put_if_absent(k, "v2", first.revision, {reg, other});
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->succeeded);
  EXPECT_EQ(c_->get(k).value()->value, "v2");
}

TEST_F(etcd_test, of_two_concurrent_put_ifs_exactly_one_wins) {
  const auto k = key("contended");
  for (int round = 0; round < 10; ++round) {
    auto cur = c_->get(k).value();
    const std::int64_t guard = cur ? cur->mod_revision : 0;
    std::latch go(3);
    std::vector<conveyor::result<cas_result>> results(2, conveyor::result<cas_result>{});
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        go.arrive_and_wait();
        results[static_cast<std::size_t>(t)] =
            c_->put_if(k, "round " + std::to_string(round) + " thread " + std::to_string(t), guard);
      });
    go.arrive_and_wait();
    for (auto& th : threads) th.join();
    ASSERT_TRUE(results[0].has_value()) << results[0].error().to_string();
    ASSERT_TRUE(results[1].has_value()) << results[1].error().to_string();
    EXPECT_NE(results[0]->succeeded, results[1]->succeeded) << "round " << round;
    const auto& loser = results[0]->succeeded ? *results[1] : *results[0];
    const auto& winner = results[0]->succeeded ? *results[0] : *results[1];
    ASSERT_TRUE(loser.current.has_value());
    EXPECT_EQ(loser.current->mod_revision, winner.revision);
  }
}

TEST_F(etcd_test, a_lease_reports_the_ttl_etcd_chose_and_keep_alive_renews_it) {
  auto g = c_->grant_lease(2s);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  EXPECT_NE(g->id, 0);
  EXPECT_GE(g->ttl, 2s);
  auto ka = c_->keep_alive(g->id);
  ASSERT_TRUE(ka.has_value()) << ka.error().to_string();
  EXPECT_EQ(*ka, g->ttl);
  ASSERT_TRUE(c_->revoke_lease(g->id).has_value());
  auto gone = c_->keep_alive(g->id);
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code, errc::not_found) << gone.error().to_string();
  auto twice = c_->revoke_lease(g->id);
  ASSERT_FALSE(twice.has_value());
  EXPECT_EQ(twice.error().code, errc::not_found) << twice.error().to_string();
  auto put = c_->put(key("late"), "v", g->id);
  ASSERT_FALSE(put.has_value());
  EXPECT_EQ(put.error().code, errc::not_found) << put.error().to_string();
  EXPECT_FALSE(c_->grant_lease(0s).has_value());
}

TEST_F(etcd_test, a_key_on_a_lease_without_keep_alive_goes_when_it_expires) {
  auto g = c_->grant_lease(1s);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  const auto k = key("ephemeral");
  ASSERT_TRUE(c_->put(k, "here", g->id).has_value());
  auto got = c_->get(k).value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->lease, g->id);
  const auto start = steady::now();
  // etcd checks expiries every 500 ms: TTL + 3 s is a generous bound.
  const auto until = start + g->ttl + 3s;
  bool present = true;
  while (present && steady::now() < until) {
    std::this_thread::sleep_for(100ms);
    present = c_->get(k).value().has_value();
  }
  EXPECT_FALSE(present) << "still there after " << (g->ttl + 3s).count() << " s";
  EXPECT_GE(steady::now() - start, g->ttl - 100ms);  // not before its TTL
  EXPECT_EQ(code_of(c_->keep_alive(g->id)), errc::not_found);
}

TEST_F(etcd_test, keep_alive_keeps_a_key_and_revoke_removes_it_at_once) {
  auto g = c_->grant_lease(1s);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  const auto k = key("held");
  ASSERT_TRUE(c_->put(k, "here", g->id).has_value());
  // Three TTLs (at least 3 s) with a keep-alive every TTL/4.
  const auto until = steady::now() + 3 * g->ttl;
  while (steady::now() < until) {
    auto ka = c_->keep_alive(g->id);
    ASSERT_TRUE(ka.has_value()) << ka.error().to_string();
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::milliseconds>(g->ttl) / 4);
    ASSERT_TRUE(c_->get(k).value().has_value());
  }
  ASSERT_TRUE(c_->revoke_lease(g->id).has_value());
  EXPECT_FALSE(c_->get(k).value().has_value());
}

TEST_F(etcd_test, create_if_absent_on_a_lease_is_a_controller_election) {
  const auto k = key("controller");
  auto a = c_->grant_lease(2s).value(), b = c_->grant_lease(2s).value();
  auto ra = c_->put_if(k, "node-a", 0, a.id).value();
  auto rb = c_->put_if(k, "node-b", 0, b.id).value();
  EXPECT_TRUE(ra.succeeded);
  EXPECT_FALSE(rb.succeeded);
  ASSERT_TRUE(rb.current.has_value());
  EXPECT_EQ(rb.current->value, "node-a");
  EXPECT_EQ(rb.current->lease, a.id);
  ASSERT_TRUE(c_->revoke_lease(a.id).has_value());  // the controller goes
  auto rb2 = c_->put_if(k, "node-b", 0, b.id).value();
  EXPECT_TRUE(rb2.succeeded);
  ASSERT_TRUE(c_->revoke_lease(b.id).has_value());
}

TEST_F(etcd_test, watch_sees_puts_and_deletes_from_a_revision) {
  const auto from = revision_now(*c_) + 1;
  ASSERT_TRUE(c_->put(key("w/a"), "1").has_value());
  ASSERT_TRUE(c_->put(key("other"), "x").has_value());  // outside the prefix
  ASSERT_TRUE(c_->put(key("w/a"), "2").has_value());
  ASSERT_TRUE(c_->del(key("w/a")).has_value());
  std::vector<watch_event> seen;
  std::int64_t next = from;
  const auto until = steady::now() + 5s;
  while (seen.size() < 3 && steady::now() < until) {
    auto w = c_->watch_prefix(key("w/"), next, 1s);
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_EQ(w->compact_revision, 0);
    seen.insert(seen.end(), w->events.begin(), w->events.end());
    EXPECT_GE(w->next_revision, next);
    next = w->next_revision;
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].type, watch_event::kind::put);
  EXPECT_EQ(seen[0].kv.value, "1");
  EXPECT_EQ(seen[1].type, watch_event::kind::put);
  EXPECT_EQ(seen[1].kv.value, "2");
  EXPECT_EQ(seen[2].type, watch_event::kind::del);
  EXPECT_EQ(seen[2].kv.key, key("w/a"));
  EXPECT_LT(seen[1].kv.mod_revision, seen[2].kv.mod_revision);
  EXPECT_EQ(next, seen[2].kv.mod_revision + 1);

  // Nothing more: an empty answer after the timeout, resuming at the same place.
  const auto start = steady::now();
  auto quiet = c_->watch_prefix(key("w/"), next, 300ms);
  ASSERT_TRUE(quiet.has_value()) << quiet.error().to_string();
  EXPECT_TRUE(quiet->events.empty());
  EXPECT_EQ(quiet->next_revision, next);
  EXPECT_GE(steady::now() - start, 250ms);
  EXPECT_LT(steady::now() - start, 2s);
}

TEST_F(etcd_test, a_watch_wakes_when_a_put_happens) {
  const auto from = revision_now(*c_) + 1;
  conveyor::result<watch_result> w{};
  steady::time_point woke;
  std::thread watcher([&] {
    w = c_->watch_prefix(key("live/"), from, 5s);
    woke = steady::now();
  });
  std::this_thread::sleep_for(300ms);
  const auto put_at = steady::now();
  auto rev = c_->put(key("live/x"), "v");
  watcher.join();
  ASSERT_TRUE(rev.has_value());
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  ASSERT_EQ(w->events.size(), 1u);
  EXPECT_EQ(w->events[0].kv.key, key("live/x"));
  EXPECT_EQ(w->events[0].kv.mod_revision, *rev);
  EXPECT_EQ(w->next_revision, *rev + 1);
  EXPECT_LT(woke - put_at, 2s) << "the watch did not return when the put happened";
}

TEST_F(etcd_test, a_quiet_watch_from_now_resumes_after_the_current_revision) {
  const auto now = revision_now(*c_);
  auto w = c_->watch_prefix(key("quiet/"), 0, 300ms);
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  EXPECT_TRUE(w->events.empty());
  EXPECT_GE(w->next_revision, now + 1);
}

TEST_F(etcd_test, a_dead_first_endpoint_is_skipped) {
  dead_port dead;
  auto c = etcd_coord::open({.endpoints = {dead.endpoint(), etcd_->endpoint()}});
  ASSERT_TRUE(c.has_value());
  for (int i = 0; i < 3; ++i) {
    auto p = (*c)->put(key("failover"), "v" + std::to_string(i));  // a write: nothing was sent
    ASSERT_TRUE(p.has_value()) << p.error().to_string();
    auto g = (*c)->get(key("failover"));
    ASSERT_TRUE(g.has_value()) << g.error().to_string();
    EXPECT_EQ(g->value().value, "v" + std::to_string(i));
  }
}

}  // namespace
