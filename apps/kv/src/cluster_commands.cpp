// Redis Cluster's commands on a node (issue 35, docs/KV-CLUSTER.md): CLUSTER
// SLOTS, SHARDS, NODES, INFO, KEYSLOT, MYID, COUNTKEYSINSLOT, GETKEYSINSLOT,
// READONLY, READWRITE, ASKING, and the executor's routing check. The replies'
// shapes are Redis 7.0's (compared with redis-server --cluster-enabled yes);
// what they describe is the shard map from etcd (cluster/routing.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "cluster/routing.hpp"
#include "cluster/slots.hpp"
#include "command_context.hpp"

namespace conveyor::kv {

namespace {

using cluster::cluster_view;
using cluster::shard_map;

// Every (range, shard) of the map in slot order, as Redis lists them.
std::vector<std::pair<cluster::slot_range, std::size_t>> ranges_in_order(const shard_map& m) {
  std::vector<std::pair<cluster::slot_range, std::size_t>> v;
  for (std::size_t i = 0; i < m.shards.size(); ++i)
    for (const auto& r : m.shards[i].slots) v.emplace_back(r, i);
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return a.first.first < b.first.first; });
  return v;
}

// [host, port, id, {metadata}] as CLUSTER SLOTS gives a node. The metadata
// map is where Redis 7 puts a node's hostname, for clients to ignore what
// they do not know; a node with an RDMA front end has "rdma" => host:port
// there (conveyor::kv::cluster_client discovers the one-sided path by it).
void slots_node(exec_context& c, const shard_map& m, const std::string& id) {
  const auto* n = cluster::find_node(m, id);
  const auto [host, port] = cluster::split_address(n ? std::string_view(n->resp) : "");
  c.r.array(4);
  c.r.bulk(host);
  c.r.integer(port);
  c.r.bulk(id);
  if (n != nullptr && !n->rdma.empty()) {
    c.r.map(1);
    c.r.bulk("rdma");
    c.r.bulk(n->rdma);
  } else {
    c.r.map(0);
  }
}

void cluster_slots(exec_context& c, const cluster_view* v) {
  if (v == nullptr) return c.r.array(0);
  const auto ranges = ranges_in_order(v->map);
  c.r.array(ranges.size());
  for (const auto& [r, i] : ranges) {
    if (!c.fits(1024)) return c.reply_too_large();
    const auto& sh = v->map.shards[i];
    c.r.array(3 + sh.replicas.size());
    c.r.integer(r.first);
    c.r.integer(r.last);
    slots_node(c, v->map, sh.primary);
    for (const auto& rep : sh.replicas) slots_node(c, v->map, rep);
  }
}

void shards_node(exec_context& c, const shard_map& m, const std::string& id, bool primary) {
  const auto* n = cluster::find_node(m, id);
  const auto [host, port] = cluster::split_address(n ? std::string_view(n->resp) : "");
  c.r.map(7);
  c.r.bulk("id");
  c.r.bulk(id);
  c.r.bulk("port");
  c.r.integer(port);
  c.r.bulk("ip");
  c.r.bulk(host);
  c.r.bulk("endpoint");
  c.r.bulk(host);
  c.r.bulk("role");
  c.r.bulk(primary ? "master" : "replica");
  c.r.bulk("replication-offset");
  c.r.integer(0);
  c.r.bulk("health");
  c.r.bulk("online");
}

void cluster_shards(exec_context& c, const cluster_view* v) {
  if (v == nullptr) return c.r.array(0);
  c.r.array(v->map.shards.size());
  for (const auto& sh : v->map.shards) {
    if (!c.fits(2048 + 24 * sh.slots.size())) return c.reply_too_large();
    c.r.map(2);
    c.r.bulk("slots");
    c.r.array(2 * sh.slots.size());
    for (const auto& r : sh.slots) {
      c.r.integer(r.first);
      c.r.integer(r.last);
    }
    c.r.bulk("nodes");
    c.r.array(1 + sh.replicas.size());
    shards_node(c, v->map, sh.primary, true);
    for (const auto& rep : sh.replicas) shards_node(c, v->map, rep, false);
  }
}

// One line per node of the map: <id> <ip:port@cport> <flags> <master> <ping>
// <pong> <epoch> <link> <slots...>. There is no cluster bus: cport is port +
// 10000 as Redis's default, which clients parse and do not use.
void cluster_nodes(exec_context& c, const cluster_view* v, const server_config& cfg) {
  const std::string& my_id = cfg.cluster_my_id;
  std::string t;
  // Itself first when the map does not name it (no map yet, or a spare
  // node): Redis always lists `myself`, and redis-benchmark looks for it.
  if (v == nullptr || cluster::find_node(v->map, my_id) == nullptr) {
    const auto [host, port] = cluster::split_address(cfg.cluster_address);
    t = my_id + " " + std::string(host) + ":" + std::to_string(port) + "@" +
        std::to_string(port ? port + 10000u : 0u) + " myself,master - 0 0 " +
        (v ? std::to_string(v->map.epoch) : std::string("0")) + " connected\n";
    if (v == nullptr) return c.r.verbatim(t);
  }
  const auto& m = v->map;
  for (const auto& n : m.nodes) {
    if (t.size() > c.sess.max_reply) return c.reply_too_large();
    const auto [host, port] = cluster::split_address(n.resp);
    const cluster::shard* own = nullptr;
    const cluster::shard* replica_of = nullptr;
    for (const auto& sh : m.shards) {
      if (sh.primary == n.id) own = &sh;
      if (std::find(sh.replicas.begin(), sh.replicas.end(), n.id) != sh.replicas.end())
        replica_of = &sh;
    }
    t += n.id;
    t += ' ';
    t += host;
    t += ':' + std::to_string(port) + '@' + std::to_string(port + 10000u) + ' ';
    if (n.id == my_id) t += "myself,";
    t += replica_of ? "slave " + replica_of->primary : std::string("master -");
    t += " 0 0 " + std::to_string(m.epoch) + " connected";
    if (own)
      for (const auto& r : own->slots) {
        t += ' ' + std::to_string(r.first);
        if (r.last != r.first) t += '-' + std::to_string(r.last);
      }
    t += '\n';
  }
  c.r.verbatim(t);
}

void cluster_info(exec_context& c, const cluster_view* v) {
  std::size_t assigned = 0, known = 0, size = 0;
  if (v != nullptr) {
    for (const auto& sh : v->map.shards) {
      for (const auto& r : sh.slots) assigned += static_cast<std::size_t>(r.last - r.first) + 1;
      if (!sh.slots.empty()) ++size;
    }
    known = v->map.nodes.size();
  }
  const std::string epoch = v ? std::to_string(v->map.epoch) : "0";
  std::string t;
  // ok only when every slot is served (Redis's cluster-require-full-coverage).
  t += std::string("cluster_state:") + (assigned == cluster::slot_count ? "ok" : "fail") + "\r\n";
  t += "cluster_slots_assigned:" + std::to_string(assigned) + "\r\n";
  t += "cluster_slots_ok:" + std::to_string(assigned) + "\r\n";
  t += "cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n";
  t += "cluster_known_nodes:" + std::to_string(known) + "\r\n";
  t += "cluster_size:" + std::to_string(size) + "\r\n";
  t += "cluster_current_epoch:" + epoch + "\r\n";
  t += "cluster_my_epoch:" + epoch + "\r\n";
  t += "cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n";
  t += "total_cluster_links_buffer_limit_exceeded:0\r\n";
  c.r.verbatim(t);
}

bool slot_arg(exec_context& c, std::string_view s, std::uint16_t& slot) {
  std::int64_t v = 0;
  if (!to_i64(s, v)) {
    c.r.error(err_int);
    return false;
  }
  if (v < 0 || v >= cluster::slot_count) {
    c.r.error("ERR Invalid slot");
    return false;
  }
  slot = static_cast<std::uint16_t>(v);
  return true;
}

// COUNTKEYSINSLOT and GETKEYSINSLOT walk the whole keyspace (the store keeps
// no per-slot index yet): O(keys), as one KEYS. GETKEYSINSLOT stops at
// `count` keys and stays within the reply bound.
void keys_in_slot(exec_context& c, std::uint16_t slot, std::int64_t limit, bool list) {
  auto keys = collect_keys(
      c, [&](std::string_view k) { return cluster::slot_of(k) == slot; },
      list ? static_cast<std::size_t>(limit) : SIZE_MAX, list);
  if (!keys) return c.reply_too_large();
  if (!list) return c.r.integer(static_cast<std::int64_t>(keys->size()));
  c.r.array(keys->size());
  for (const auto& k : *keys) c.r.bulk(k);
}

}  // namespace

std::string executor::route(const session& sess, std::span<const std::string_view> argv) const {
  const command* k = argv.empty() ? nullptr : find(argv[0]);
  return k == nullptr ? std::string() : route(sess, *k, argv);
}

std::string executor::route(const session& sess, const command& kc,
                            std::span<const std::string_view> argv) const {
  if (!cfg_.cluster_enabled) return {};
  const command* k = &kc;
  auto& keys = route_keys_;
  keys.clear();
  if (k->fn == cmd_exec && sess.in_multi) {
    std::vector<std::string_view> qv;
    for (const auto& q : sess.queued) {
      qv.assign(q.begin(), q.end());
      if (const command* qk = qv.empty() ? nullptr : find(qv[0])) command_keys(*qk, qv, keys);
    }
  } else {
    command_keys(*k, argv, keys);
  }
  // READONLY reads of a replica's shard run on it; a write never does.
  bool reads_only = sess.readonly && !k->write;
  if (k->fn == cmd_exec && sess.in_multi)
    for (const auto& q : sess.queued)
      if (const command* qk = q.empty() ? nullptr : find(q[0]); qk == nullptr || qk->write)
        reads_only = false;
  std::string e = cluster::route_keys(keys, cluster_.get(), reads_only);
  // A node whose lease may have expired in etcd may have been replaced: it
  // answers nothing it would serve itself (a newer map's MOVED still goes).
  if (e.empty() && (!keys.empty() || k->write) && fenced()) e = cluster::err_fenced;
  return e;
}

bool executor::is_replica() const noexcept {
  return cluster_ != nullptr && cluster::replica_of(*cluster_) != nullptr;
}

void cmd_cluster(exec_context& c) {
  const auto& cfg = c.ex.config();
  if (!cfg.cluster_enabled) return c.r.error("ERR This instance has cluster support disabled");
  // READONLY, READWRITE: whether this connection's reads may run on a
  // replica of their slot's shard. ASKING: accepted; with no slot migration
  // yet it changes nothing (issue 35's later step gives it its meaning).
  if (iequal(c.argv[0], "readonly")) c.sess.readonly = true;
  if (iequal(c.argv[0], "readwrite")) c.sess.readonly = false;
  if (!iequal(c.argv[0], "cluster")) return c.r.simple("OK");
  const cluster_view* v = c.ex.cluster();
  const auto sub = c.argv[1];
  const auto n = c.argv.size();
  auto wrong = [&] {
    std::string e = "ERR wrong number of arguments for 'cluster|";
    for (char ch : sub) e += ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch;
    c.r.error(e + "' command");
  };
  if (iequal(sub, "SLOTS")) return n == 2 ? cluster_slots(c, v) : wrong();
  if (iequal(sub, "SHARDS")) return n == 2 ? cluster_shards(c, v) : wrong();
  if (iequal(sub, "NODES")) return n == 2 ? cluster_nodes(c, v, cfg) : wrong();
  if (iequal(sub, "INFO")) return n == 2 ? cluster_info(c, v) : wrong();
  if (iequal(sub, "MYID")) return n == 2 ? c.r.bulk(cfg.cluster_my_id) : wrong();
  if (iequal(sub, "KEYSLOT")) return n == 3 ? c.r.integer(cluster::slot_of(c.argv[2])) : wrong();
  if (iequal(sub, "COUNTKEYSINSLOT")) {
    if (n != 3) return wrong();
    std::uint16_t slot = 0;
    if (!slot_arg(c, c.argv[2], slot)) return;
    return keys_in_slot(c, slot, 0, false);
  }
  if (iequal(sub, "GETKEYSINSLOT")) {
    if (n != 4) return wrong();
    std::int64_t slot = 0, count = 0;
    if (!to_i64(c.argv[2], slot) || !to_i64(c.argv[3], count)) return c.r.error(err_int);
    if (slot < 0 || slot >= cluster::slot_count || count < 0)
      return c.r.error("ERR Invalid slot or number of keys");
    return keys_in_slot(c, static_cast<std::uint16_t>(slot), count, true);
  }
  c.r.error("ERR unknown subcommand '" + std::string(sub.substr(0, 128)) + "'. Try CLUSTER HELP.");
}

}  // namespace conveyor::kv
