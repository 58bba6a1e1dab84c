// libFuzzer target: conveyor-kv's cluster documents (apps/kv/src/cluster/
// shard_map.*), which every node reads out of etcd as another node wrote them:
// the shard map (parse_shard_map) and a node's registration
// (parse_node_registration). Input: one document, given to both parsers.
// Properties: whatever parses is valid (validate), serializes with to_json and
// parses back equal, and serializes the same again (to_json is canonical); a
// parsed map builds a slot table whose every slot is owned exactly as the
// shards' ranges say, uncovered_slots lists exactly the slots nobody owns, and
// every node a shard names is found in the map; the controller's decisions
// on a parsed map (failover with every primary gone and every replica
// reporting, an isr re-entry, a manual failover) are valid maps with the
// epoch bumped. An offset report (parse_offset_report) that parses
// serializes and parses back equal. Errors are invalid_argument
// with a context. Hash slots of the bytes (as a key) stay within 0..16383 and
// hash a part of the key. The cluster client's readers of a node's replies
// (cluster_reply.hpp: CLUSTER INFO's epoch, CLUSTER SLOTS's table): a table
// that parses names every node once, by a non-empty id, with addresses
// within bounds, and maps every slot to one of its nodes or to none; errors
// are protocol_error (or rejected, for an error reply) with a context.
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/controller.hpp"
#include "cluster/shard_map.hpp"
#include "cluster/slots.hpp"
#include "cluster_reply.hpp"
#include "fuzz_check.hpp"

namespace {

namespace cl = conveyor::kv::cluster;
using conveyor::errc;

void check_map(const cl::shard_map& m) {
  FUZZ_CHECK(cl::validate(m).has_value());

  // Round trip: to_json parses back to the same map, and to_json of that is
  // the same text.
  const std::string text = cl::to_json(m);
  auto back = cl::parse_shard_map(text);
  FUZZ_CHECK(back.has_value());
  FUZZ_CHECK(*back == m);
  FUZZ_CHECK(cl::to_json(*back) == text);

  // The slot table agrees with the ranges, slot by slot.
  auto table = cl::slot_table::build(m);
  FUZZ_CHECK(table.has_value());
  std::vector<int> owner(cl::slot_count, -1);
  for (std::size_t i = 0; i < m.shards.size(); ++i)
    for (const auto& r : m.shards[i].slots) {
      FUZZ_CHECK(r.first <= r.last && r.last < cl::slot_count);
      for (std::uint32_t s = r.first; s <= r.last; ++s) {
        FUZZ_CHECK(owner[s] == -1);  // validate refuses overlaps
        owner[s] = static_cast<int>(i);
      }
    }
  std::vector<bool> uncovered(cl::slot_count, false);
  std::uint32_t next = 0;
  for (const auto& r : cl::uncovered_slots(m)) {
    FUZZ_CHECK(r.first >= next && r.first <= r.last && r.last < cl::slot_count);
    for (std::uint32_t s = r.first; s <= r.last; ++s) uncovered[s] = true;
    next = r.last + 2u;  // in order, and adjacent runs are merged
  }
  for (std::uint32_t s = 0; s < cl::slot_count; ++s) {
    auto at = table->shard_of(static_cast<std::uint16_t>(s));
    if (owner[s] < 0) {
      FUZZ_CHECK(!at.has_value());
      FUZZ_CHECK(uncovered[s]);
    } else {
      FUZZ_CHECK(at.has_value() && *at == static_cast<std::size_t>(owner[s]));
      FUZZ_CHECK(!uncovered[s]);
    }
  }
  FUZZ_CHECK(!table->shard_of(cl::slot_count).has_value());

  // Every node a shard names is in the map, and the isr holds the primary.
  for (const auto& sh : m.shards) {
    FUZZ_CHECK(cl::find_node(m, sh.primary) != nullptr);
    for (const auto& id : sh.replicas) FUZZ_CHECK(cl::find_node(m, id) != nullptr);
    bool has_primary = false;
    for (const auto& id : sh.isr) has_primary |= id == sh.primary;
    FUZZ_CHECK(has_primary);
  }
  for (const auto& n : m.nodes) FUZZ_CHECK(cl::find_node(m, n.id) == &n);
}

// Failover's decisions on this map keep it valid and bump the epoch.
void check_decisions(const cl::shard_map& m) {
  // Every primary gone, every other node registered and reporting its link
  // down, synced, at an offset from its id.
  std::map<std::string, cl::node_registration, std::less<>> live;
  std::map<std::string, cl::offset_report, std::less<>> reports;
  std::set<std::string, std::less<>> primaries;
  for (const auto& sh : m.shards) primaries.insert(sh.primary);
  for (const auto& n : m.nodes)
    if (!primaries.contains(n.id)) live[n.id] = {n.id, n.resp, n.rdma, "b", n.repl};
  for (const auto& sh : m.shards)
    for (const auto& id : sh.replicas)
      reports[id] = {sh.id, sh.primary, static_cast<std::uint64_t>(id[0]), false, true, "b"};
  if (auto d = cl::decide_failover(m, live, reports, {})) {
    FUZZ_CHECK(cl::validate(d->map).has_value());
    FUZZ_CHECK(d->map.epoch == m.epoch + 1);
    FUZZ_CHECK(d->deposed.size() == d->promoted.size());
  }
  for (const auto& sh : m.shards)
    for (const auto& id : sh.replicas) {
      if (auto n = cl::add_to_isr(m, sh.primary, id)) {
        FUZZ_CHECK(cl::validate(*n).has_value());
        FUZZ_CHECK(n->epoch == m.epoch + 1);
      }
      if (auto f = cl::manual_failover(m, sh.id, id, "fuzzboot")) {
        FUZZ_CHECK(cl::validate(f->map).has_value());
        FUZZ_CHECK(f->map.epoch == m.epoch + 1);
      }
    }
}

void check_registration(const cl::node_registration& r) {
  FUZZ_CHECK(cl::validate(r).has_value());
  const std::string text = cl::to_json(r);
  auto back = cl::parse_node_registration(text);
  FUZZ_CHECK(back.has_value());
  FUZZ_CHECK(*back == r);
  FUZZ_CHECK(cl::to_json(*back) == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  if (auto m = cl::parse_shard_map(text)) {
    check_map(*m);
    if (m->epoch < UINT64_MAX) check_decisions(*m);
  } else
    FUZZ_CHECK(m.error().code == errc::invalid_argument && !m.error().context.empty());

  if (auto r = cl::parse_node_registration(text))
    check_registration(*r);
  else
    FUZZ_CHECK(r.error().code == errc::invalid_argument && !r.error().context.empty());

  if (auto o = cl::parse_offset_report(text)) {
    auto back = cl::parse_offset_report(cl::to_json(*o));
    FUZZ_CHECK(back.has_value() && *back == *o);
  } else {
    FUZZ_CHECK(o.error().code == errc::invalid_argument && !o.error().context.empty());
  }

  if (auto h = cl::parse_handover_request(text)) {
    FUZZ_CHECK(cl::valid_id(*h));
    FUZZ_CHECK(cl::parse_handover_request(cl::handover_request_json(*h)).value() == *h);
  } else {
    FUZZ_CHECK(h.error().code == errc::invalid_argument && !h.error().context.empty());
  }

  // The input as a node's reply to the cluster client.
  namespace cr = conveyor::kv::cluster_reply;
  if (auto t = cr::parse_slots(text)) {
    FUZZ_CHECK(t->owner.size() == cl::slot_count && t->nodes.size() <= cr::max_nodes);
    std::set<std::string> ids;
    for (const auto& n : t->nodes) {
      FUZZ_CHECK(!n.id.empty() && n.id.size() <= cr::max_address_bytes);
      FUZZ_CHECK(n.rdma.size() <= cr::max_address_bytes);
      FUZZ_CHECK(ids.insert(n.id).second);
    }
    for (auto o : t->owner) FUZZ_CHECK(o >= -1 && o < static_cast<std::int32_t>(t->nodes.size()));
  } else {
    FUZZ_CHECK((t.error().code == errc::protocol_error || t.error().code == errc::rejected) &&
               !t.error().context.empty());
  }
  if (auto e = cr::parse_info_epoch(text); !e)
    FUZZ_CHECK((e.error().code == errc::protocol_error || e.error().code == errc::rejected) &&
               !e.error().context.empty());

  // The input as a key: its slot is in range and is the slot of its hash tag.
  const auto tag = cl::hash_tag(text);
  FUZZ_CHECK(tag.data() >= text.data() && tag.data() + tag.size() <= text.data() + text.size());
  const auto slot = cl::slot_of(text);
  FUZZ_CHECK(slot < cl::slot_count && slot == (cl::crc16(tag) & (cl::slot_count - 1)));
  return 0;
}
