// The cluster's shard map and node registrations (apps/kv/src/cluster/shard_map.*):
// round trips, every validation rule, slot lookup, and that garbage (truncated,
// mistyped, oversized, deeply nested, random bytes) is an error, never a crash.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cluster/shard_map.hpp"
#include "cluster/slots.hpp"

namespace {

using namespace conveyor::kv::cluster;
using conveyor::errc;

std::string hex_id(char c) {
  return std::string(40, c);
}

// Three shards of a primary and one replica each, slots split as Redis's
// create-cluster splits them.
shard_map three_shards() {
  shard_map m;
  m.epoch = 7;
  for (int i = 0; i < 6; ++i)
    m.nodes.push_back({hex_id(static_cast<char>('0' + i)), "127.0.0.1:" + std::to_string(7000 + i),
                       "127.0.0.1:" + std::to_string(17000 + i)});
  m.shards.push_back(
      {hex_id('a'), {{0, 5460}}, hex_id('0'), {hex_id('0'), hex_id('3')}, {hex_id('3')}});
  m.shards.push_back({hex_id('b'), {{5461, 10922}}, hex_id('1'), {hex_id('1')}, {hex_id('4')}});
  m.shards.push_back({hex_id('c'),
                      {{10923, 16000}, {16001, 16383}},
                      hex_id('2'),
                      {hex_id('2'), hex_id('5')},
                      {hex_id('5')}});
  return m;
}

// The error of parse_shard_map(text), which must fail with invalid_argument.
std::string parse_error(const std::string& text) {
  auto r = parse_shard_map(text);
  EXPECT_FALSE(r.has_value()) << text.substr(0, 200);
  if (r) return {};
  EXPECT_EQ(r.error().code, errc::invalid_argument);
  return r.error().context;
}

std::string validate_error(const shard_map& m) {
  auto r = validate(m);
  EXPECT_FALSE(r.has_value());
  return r ? std::string() : r.error().context;
}

TEST(cluster_shard_map, round_trips_through_json) {
  auto m = three_shards();
  ASSERT_TRUE(validate(m).has_value());
  auto text = to_json(m);
  auto back = parse_shard_map(text);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(to_json(*back), text);
}

TEST(cluster_shard_map, nodes_carry_their_replication_address) {
  auto m = three_shards();
  m.nodes[0].repl = "127.0.0.1:27001";
  auto back = parse_shard_map(to_json(m));
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->nodes[0].repl, "127.0.0.1:27001");
  EXPECT_EQ(back->nodes[1].repl, "");
  m.nodes[1].repl = "not an address";
  EXPECT_NE(validate_error(m).find("repl"), std::string::npos);
}

TEST(cluster_shard_map, shards_carry_their_primarys_boot_when_recorded) {
  auto m = three_shards();
  m.shards[1].primary_boot = "0123abcd_-Z";
  auto text = to_json(m);
  EXPECT_NE(text.find(R"("primary_boot":"0123abcd_-Z")"), std::string::npos);
  auto back = parse_shard_map(text);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->shards[1].primary_boot, "0123abcd_-Z");
  EXPECT_EQ(back->shards[0].primary_boot, "");  // not recorded: not written
  EXPECT_EQ(to_json(three_shards()).find("primary_boot"), std::string::npos);
  for (const char* bad : {"a b", "x/y", "\n"}) {
    m.shards[1].primary_boot = bad;
    EXPECT_NE(validate_error(m).find("primary_boot"), std::string::npos) << bad;
  }
  m.shards[1].primary_boot = std::string(max_boot_id_bytes + 1, 'a');
  EXPECT_NE(validate_error(m).find("primary_boot"), std::string::npos);
  // Not a string: refused by the reader.
  auto j = to_json(three_shards());
  const auto at = j.find(R"("primary":)");
  ASSERT_NE(at, std::string::npos);
  j.insert(at, R"("primary_boot":7,)");
  EXPECT_FALSE(parse_shard_map(j));
}

TEST(cluster_shard_map, reads_the_documented_shape) {
  const std::string a = hex_id('a'), n = hex_id('1');
  auto m = parse_shard_map(R"({"epoch": 3, "shards": [{"id": ")" + a + R"(", "slots": [[0, 16383]],
      "primary": ")" + n + R"(", "isr": [")" +
                           n + R"("], "replicas": []}],
      "nodes": [{"id": ")" +
                           n + R"(", "resp": "[::1]:7000"}]})");
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_EQ(m->epoch, 3u);
  ASSERT_EQ(m->shards.size(), 1u);
  EXPECT_EQ(m->shards[0].slots, (std::vector<slot_range>{{0, 16383}}));
  EXPECT_EQ(m->nodes[0].rdma, "");  // no RDMA listener
  EXPECT_TRUE(uncovered_slots(*m).empty());
  ASSERT_NE(find_node(*m, n), nullptr);
  EXPECT_EQ(find_node(*m, n)->resp, "[::1]:7000");
  EXPECT_EQ(find_node(*m, a), nullptr);
}

TEST(cluster_shard_map, slot_table_finds_each_slots_shard) {
  auto m = three_shards();
  auto t = slot_table::build(m);
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  EXPECT_EQ(t->shard_of(0), 0u);
  EXPECT_EQ(t->shard_of(5460), 0u);
  EXPECT_EQ(t->shard_of(5461), 1u);
  EXPECT_EQ(t->shard_of(10922), 1u);
  EXPECT_EQ(t->shard_of(10923), 2u);
  EXPECT_EQ(t->shard_of(16001), 2u);
  EXPECT_EQ(t->shard_of(16383), 2u);
  EXPECT_EQ(t->shard_of(16384), std::nullopt);
  EXPECT_EQ(t->shard_of(slot_of("foo")), 2u);  // 12182
  EXPECT_EQ(t->shard_of(slot_of("bar")), 0u);  // 5061
  EXPECT_EQ(slot_table{}.shard_of(0), std::nullopt);
}

TEST(cluster_shard_map, uncovered_slots_are_reported_not_refused) {
  auto m = three_shards();
  m.shards[1].slots = {{5461, 6000}, {6100, 10922}};
  m.shards[2].slots = {{10923, 16382}};
  ASSERT_TRUE(validate(m).has_value());
  EXPECT_EQ(uncovered_slots(m), (std::vector<slot_range>{{6001, 6099}, {16383, 16383}}));
  auto t = slot_table::build(m).value();
  EXPECT_EQ(t.shard_of(6050), std::nullopt);
  EXPECT_EQ(t.shard_of(6100), 1u);

  shard_map empty;
  EXPECT_TRUE(validate(empty).has_value());
  EXPECT_EQ(uncovered_slots(empty), (std::vector<slot_range>{{0, 16383}}));
}

TEST(cluster_shard_map, overlapping_or_out_of_range_slots_are_refused) {
  auto m = three_shards();
  m.shards[1].slots = {{5460, 10922}};  // 5460 is shard 0's
  EXPECT_NE(validate_error(m).find("slot 5460"), std::string::npos);
  m = three_shards();
  m.shards[2].slots = {{10923, 16383}, {16000, 16000}};  // within one shard
  EXPECT_NE(validate_error(m).find("slot 16000"), std::string::npos);
  m = three_shards();
  m.shards[2].slots = {{10923, 16384}};
  EXPECT_NE(validate_error(m).find("0..16383"), std::string::npos);
  m = three_shards();
  m.shards[2].slots = {{16383, 10923}};
  EXPECT_NE(validate_error(m).find("in order"), std::string::npos);
}

TEST(cluster_shard_map, roles_must_name_known_nodes_once) {
  auto m = three_shards();
  m.shards[0].primary = hex_id('e');  // not in nodes
  EXPECT_NE(validate_error(m).find("is not in nodes"), std::string::npos);
  m = three_shards();
  m.shards[0].replicas = {hex_id('3'), hex_id('0')};  // the primary as its own replica
  EXPECT_NE(validate_error(m).find("already serves"), std::string::npos);
  m = three_shards();
  m.shards[1].replicas = {hex_id('3')};  // shard 0's replica
  EXPECT_NE(validate_error(m).find("already serves"), std::string::npos);
  m = three_shards();
  m.nodes.push_back(m.nodes[0]);
  EXPECT_NE(validate_error(m).find("appears twice"), std::string::npos);
  m = three_shards();
  m.shards[2].id = m.shards[0].id;
  EXPECT_NE(validate_error(m).find("appears twice"), std::string::npos);
}

TEST(cluster_shard_map, isr_holds_the_primary_and_only_this_shards_replicas) {
  auto m = three_shards();
  m.shards[0].isr = {hex_id('3')};  // without the primary
  EXPECT_NE(validate_error(m).find("does not hold the primary"), std::string::npos);
  m = three_shards();
  m.shards[0].isr = {};
  EXPECT_NE(validate_error(m).find("isr is empty"), std::string::npos);
  m = three_shards();
  m.shards[0].isr = {hex_id('0'), hex_id('4')};  // shard 1's replica
  EXPECT_NE(validate_error(m).find("is not of this shard"), std::string::npos);
  m = three_shards();
  m.shards[0].isr = {hex_id('0'), hex_id('0')};
  EXPECT_NE(validate_error(m).find("twice"), std::string::npos);
}

TEST(cluster_shard_map, ids_and_addresses_are_checked) {
  EXPECT_TRUE(valid_id(hex_id('f')));
  EXPECT_FALSE(valid_id(std::string(40, 'F')));  // Redis writes lowercase
  EXPECT_FALSE(valid_id(std::string(39, 'a')));
  EXPECT_FALSE(valid_id(std::string(40, 'g')));
  for (const char* ok :
       {"127.0.0.1:7000", "[::1]:1", "[fe80::1]:65535", "node-1.example:6379", "localhost:80"})
    EXPECT_TRUE(valid_address(ok)) << ok;
  for (const char* bad : {"127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:+80",
                          "::1:7000", "[::1:7000", "[zz::1]:7000", "300.0.0.1:80", ":80", "a b:80",
                          "-a:80", "a..b:80", "a_b:80", "127.0.0.1:80x", ""})
    EXPECT_FALSE(valid_address(bad)) << bad;
  auto m = three_shards();
  m.nodes[2].resp = "127.0.0.1";
  EXPECT_NE(validate_error(m).find("resp"), std::string::npos);
  m = three_shards();
  m.nodes[2].rdma = "nowhere";
  EXPECT_NE(validate_error(m).find("rdma"), std::string::npos);
  m = three_shards();
  m.nodes[2].id = "x";
  EXPECT_NE(validate_error(m).find("40 hex"), std::string::npos);
}

TEST(cluster_shard_map, sizes_are_bounded) {
  auto m = three_shards();
  for (int i = 0; i < 17; ++i) m.shards[0].replicas.push_back(hex_id('e'));
  EXPECT_NE(validate_error(m).find("replicas (at most 16)"), std::string::npos);
  EXPECT_NE(parse_error(to_json(m)).find("more than 16"), std::string::npos);

  m = three_shards();
  m.shards[0].slots.clear();
  m.shards[1].slots.clear();
  m.shards[2].slots.clear();
  for (std::uint16_t s = 0; s < slot_count; ++s) m.shards[0].slots.push_back({s, s});
  EXPECT_TRUE(validate(m).has_value());  // one range per slot is the most there can be
  m.shards[1].slots.push_back({0, 0});
  EXPECT_NE(validate_error(m).find("more than 16384 slot ranges"), std::string::npos);

  EXPECT_NE(parse_error(std::string(max_document_bytes + 1, ' ')).find("bytes (at most"),
            std::string::npos);
}

TEST(cluster_shard_map, wrong_types_and_unknown_fields_are_refused) {
  const std::string ok = to_json(three_shards());
  auto with = [&](const std::string& from, const std::string& to) {
    auto t = ok;
    auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  EXPECT_NE(parse_error(with("\"epoch\":7", "\"epoch\":-7")).find("epoch"), std::string::npos);
  EXPECT_NE(parse_error(with("\"epoch\":7", "\"epoch\":7.5")).find("epoch"), std::string::npos);
  EXPECT_NE(parse_error(with("\"epoch\":7", "\"epoch\":\"7\"")).find("epoch"), std::string::npos);
  EXPECT_NE(parse_error(with("\"epoch\":7,", "")).find("has no epoch"), std::string::npos);
  EXPECT_NE(parse_error(with("\"epoch\":7", "\"epoch\":7,\"migrating\":{}")).find("unknown field"),
            std::string::npos);
  EXPECT_NE(parse_error(with("[0,5460]", "[0]")).find("slot range"), std::string::npos);
  EXPECT_NE(parse_error(with("[0,5460]", "[0,5460,1]")).find("slot range"), std::string::npos);
  EXPECT_NE(parse_error(with("[0,5460]", "[0,99999]")).find("slot range"), std::string::npos);
  EXPECT_NE(parse_error(with("[0,5460]", "[-1,5460]")).find("slot range"), std::string::npos);
  EXPECT_NE(parse_error(with("[0,5460]", "\"0-5460\"")).find("slot range"), std::string::npos);
  EXPECT_NE(parse_error(with("\"isr\":[", "\"isr\":[1,")).find("not a string"), std::string::npos);
  EXPECT_NE(parse_error(with("\"replicas\":[", "\"replicas\":{},\"x\":[")).find("unknown field"),
            std::string::npos);
  EXPECT_NE(parse_error(with("\"nodes\":[", "\"nodes\":[null,")).find("not an object"),
            std::string::npos);
  EXPECT_NE(parse_error("[]").find("not an object"), std::string::npos);
  EXPECT_NE(parse_error("null").find("not an object"), std::string::npos);
  EXPECT_NE(parse_error("").find("not JSON"), std::string::npos);
}

TEST(cluster_shard_map, garbage_is_an_error_never_a_crash) {
  const std::string ok = to_json(three_shards());
  // Every truncation of a valid document.
  for (std::size_t n = 0; n < ok.size(); ++n) {
    auto r = parse_shard_map(std::string_view(ok).substr(0, n));
    EXPECT_FALSE(r.has_value()) << n;
  }
  // Deep nesting, invalid UTF-8, NUL bytes, huge numbers.
  EXPECT_FALSE(parse_shard_map(std::string(200000, '[') + std::string(200000, ']')).has_value());
  EXPECT_FALSE(parse_shard_map(std::string(200000, '[')).has_value());
  EXPECT_FALSE(
      parse_shard_map("{\"epoch\":1,\"shards\":[],\"nodes\":[{\"id\":\"\xff\xfe\"}]}").has_value());
  EXPECT_FALSE(parse_shard_map(std::string("{\"epoch\":1,\0}", 13)).has_value());
  EXPECT_FALSE(parse_shard_map("{\"epoch\":1e400,\"shards\":[],\"nodes\":[]}").has_value());
  EXPECT_FALSE(
      parse_shard_map("{\"epoch\":184467440737095516150,\"shards\":[],\"nodes\":[]}").has_value());
  // Random byte flips of a valid document, and random bytes.
  std::mt19937 rng(35);
  for (int i = 0; i < 3000; ++i) {
    auto t = ok;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
      t[rng() % t.size()] = static_cast<char>(rng() % 256);
    auto r = parse_shard_map(t);
    if (r) {
      EXPECT_TRUE(validate(*r).has_value());  // what parses is valid
    }
  }
  for (int i = 0; i < 500; ++i) {
    std::string t(rng() % 64, '\0');
    for (auto& c : t) c = "{}[]\":,0123456789aeflnrstu \\"[rng() % 28];
    (void)parse_shard_map(t);
  }
}

TEST(cluster_node_registration, round_trips_and_refuses_garbage) {
  node_registration r{hex_id('9'), "10.0.0.1:7000", "10.0.0.1:17000",
                      "3b2f1c0e-9a7d-4f51-8d2e-0c1b2a394857"};
  auto text = to_json(r);
  auto back = parse_node_registration(text);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(*back, r);

  r.rdma.clear();
  back = parse_node_registration(to_json(r));
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(*back, r);

  // The replication listener's address: optional, host:port when present.
  r.repl = "10.0.0.1:27000";
  text = to_json(r);
  EXPECT_NE(text.find(R"("repl":"10.0.0.1:27000")"), std::string::npos);
  back = parse_node_registration(text);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(*back, r);
  r.repl = "10.0.0.1";
  EXPECT_FALSE(validate(r).has_value());
  EXPECT_FALSE(parse_node_registration(to_json(r)).has_value());
  r.repl.clear();

  for (std::size_t n = 0; n < text.size(); ++n)
    EXPECT_FALSE(parse_node_registration(std::string_view(text).substr(0, n)).has_value()) << n;
  auto bad = [](node_registration x) { return validate(x).has_value(); };
  EXPECT_FALSE(bad({hex_id('9'), "10.0.0.1:7000", "", ""}));  // no boot id
  EXPECT_FALSE(bad({hex_id('9'), "10.0.0.1:7000", "", std::string(65, 'a')}));
  EXPECT_FALSE(bad({hex_id('9'), "10.0.0.1:7000", "", "a b"}));
  EXPECT_FALSE(bad({hex_id('9'), "10.0.0.1", "", "b"}));
  EXPECT_FALSE(bad({"9", "10.0.0.1:7000", "", "b"}));
  EXPECT_FALSE(parse_node_registration(R"({"id":")" + hex_id('9') +
                                       R"(","resp":"10.0.0.1:7000","boot_id":"b","extra":1})")
                   .has_value());
  EXPECT_FALSE(
      parse_node_registration(R"({"id":")" + hex_id('9') + R"(","resp":7000,"boot_id":"b"})")
          .has_value());
}

}  // namespace
