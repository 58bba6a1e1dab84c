// Administering a cluster through etcd (conveyor_kv/cluster.hpp).
#include "conveyor_kv/cluster.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include "cluster/cluster_node.hpp"
#include "cluster/controller.hpp"
#include "cluster/etcd.hpp"
#include "cluster/membership.hpp"
#include "cluster/routing.hpp"
#include "cluster/shard_map.hpp"
#include "cluster/slots.hpp"

namespace conveyor::kv {

namespace {

using namespace std::chrono_literals;
using cluster::etcd_coord;

result<std::unique_ptr<etcd_coord>> open_etcd(const cluster_admin_options& a) {
  if (a.etcd.empty()) return make_error(errc::invalid_argument, "cluster: no etcd endpoint");
  if (!cluster::valid_cluster_name(a.name))
    return make_error(errc::invalid_argument,
                      "cluster name '" + a.name.substr(0, 80) + "': 1 to 64 of A-Z a-z 0-9 _ - .");
  return etcd_coord::open(
      {.endpoints = a.etcd, .connect_timeout = 500ms, .request_timeout = a.request_timeout});
}

// The registrations that validate and sit under their own id's key.
struct registrations {
  std::vector<cluster::node_registration> nodes;
  std::size_t bad = 0;
};

result<registrations> read_registrations(etcd_coord& e, const std::string& name) {
  const std::string prefix = cluster::nodes_prefix(name);
  auto r = e.range_prefix(prefix, static_cast<std::int64_t>(cluster::max_nodes));
  if (!r) return std::unexpected(r.error());
  registrations out;
  out.nodes = cluster::registrations_in(r->kvs, prefix, &out.bad);
  return out;
}

// (host, port) order, so 7001 comes before 7002 and 7010.
bool address_less(const std::string& a, const std::string& b) {
  const auto x = cluster::split_address(a), y = cluster::split_address(b);
  return x.first != y.first ? x.first < y.first : x.second < y.second;
}

result<cluster_state> state_of(etcd_coord& e, const cluster_admin_options& a) {
  cluster_state s;
  s.name = a.name;
  auto regs = read_registrations(e, a.name);
  if (!regs) return std::unexpected(regs.error());
  s.bad_registrations = regs->bad;
  auto cfg = e.get(cluster::config_key(a.name));
  if (!cfg) return std::unexpected(cfg.error());
  std::map<std::string, cluster_node_state> nodes;
  if (*cfg) {
    auto m = cluster::parse_shard_map((*cfg)->value);
    if (!m)
      return make_error(errc::invalid_argument, "the shard map in etcd (" +
                                                    cluster::config_key(a.name) +
                                                    ") is invalid: " + m.error().to_string());
    s.has_map = true;
    s.epoch = m->epoch;
    s.map_revision = (*cfg)->mod_revision;
    s.slots_served = cluster::slot_count;
    for (const auto& r : cluster::uncovered_slots(*m))
      s.slots_served -= static_cast<std::size_t>(r.last - r.first) + 1;
    for (const auto& n : m->nodes) {
      auto& ns = nodes[n.id];
      ns.id = n.id;
      ns.resp = n.resp;
      ns.rdma = n.rdma;
      ns.in_map = true;
    }
    for (const auto& sh : m->shards) {
      cluster_shard_state ss;
      ss.id = sh.id;
      for (const auto& r : sh.slots) ss.slots.emplace_back(r.first, r.last);
      ss.primary = sh.primary;
      ss.replicas = sh.replicas;
      ss.isr = sh.isr;
      s.shards.push_back(std::move(ss));
      nodes[sh.primary].role = "primary";
      nodes[sh.primary].shard = sh.id;
      for (const auto& rep : sh.replicas) {
        nodes[rep].role = "replica";
        nodes[rep].shard = sh.id;
      }
    }
  }
  for (const auto& r : regs->nodes) {
    auto& ns = nodes[r.id];
    ns.id = r.id;
    ns.resp = r.resp;
    ns.rdma = r.rdma;
    ns.alive = true;
  }
  for (auto& [id, n] : nodes) s.nodes.push_back(std::move(n));
  std::stable_sort(s.nodes.begin(), s.nodes.end(), [](const auto& x, const auto& y) {
    if (x.in_map != y.in_map) return x.in_map;
    return address_less(x.resp, y.resp);
  });
  return s;
}

std::string ranges_text(const std::vector<std::pair<std::uint16_t, std::uint16_t>>& v) {
  std::string t;
  for (const auto& [f, l] : v) {
    if (!t.empty()) t += ',';
    t += std::to_string(f);
    if (l != f) t += '-' + std::to_string(l);
  }
  return t.empty() ? "-" : t;
}

}  // namespace

result<cluster_state> read_cluster_state(const cluster_admin_options& a) {
  auto e = open_etcd(a);
  if (!e) return std::unexpected(e.error());
  return state_of(**e, a);
}

std::string to_table(const cluster_state& s) {
  std::string t = "cluster " + s.name + ": ";
  if (!s.has_map) {
    t += "no shard map yet (conveyor kv cluster create)\n";
  } else {
    t += "epoch " + std::to_string(s.epoch) + ", " + std::to_string(s.shards.size()) +
         " shard(s), " + std::to_string(s.slots_served) + " of 16384 slots served" +
         (s.slots_served == cluster::slot_count ? "" : " (CLUSTERDOWN for the rest)") + "\n";
  }
  auto addr = [&](const std::string& id) {
    for (const auto& n : s.nodes)
      if (n.id == id) return n.resp + (n.alive ? " alive" : " DOWN");
    return std::string("?");
  };
  for (const auto& sh : s.shards) {
    t += "shard " + sh.id.substr(0, 8) + "  slots " + ranges_text(sh.slots) + "  primary " +
         sh.primary.substr(0, 8) + " " + addr(sh.primary);
    for (const auto& r : sh.replicas) t += "  replica " + r.substr(0, 8) + " " + addr(r);
    t += "\n";
  }
  t += "nodes:\n";
  for (const auto& n : s.nodes) {
    t += "  " + n.id + "  " + (n.resp.empty() ? "-" : n.resp) + "  " +
         (n.alive ? "alive" : "DOWN (not registered)") + "  " +
         (n.role.empty() ? "in no shard" : n.role + " of " + n.shard.substr(0, 8));
    if (!n.rdma.empty()) t += "  rdma " + n.rdma;
    t += "\n";
  }
  if (s.nodes.empty()) t += "  (none registered)\n";
  if (s.bad_registrations)
    t += std::to_string(s.bad_registrations) + " invalid registration(s) ignored\n";
  return t;
}

std::string to_json(const cluster_state& s) {
  nlohmann::json j;
  j["name"] = s.name;
  j["has_map"] = s.has_map;
  j["epoch"] = s.epoch;
  j["map_revision"] = s.map_revision;
  j["slots_served"] = s.slots_served;
  j["shards"] = nlohmann::json::array();
  for (const auto& sh : s.shards) {
    nlohmann::json x;
    x["id"] = sh.id;
    x["slots"] = nlohmann::json::array();
    for (const auto& [f, l] : sh.slots) x["slots"].push_back({f, l});
    x["primary"] = sh.primary;
    x["replicas"] = sh.replicas;
    x["isr"] = sh.isr;
    j["shards"].push_back(std::move(x));
  }
  j["nodes"] = nlohmann::json::array();
  for (const auto& n : s.nodes)
    j["nodes"].push_back({{"id", n.id},
                          {"resp", n.resp},
                          {"rdma", n.rdma},
                          {"alive", n.alive},
                          {"in_map", n.in_map},
                          {"role", n.role},
                          {"shard", n.shard}});
  j["bad_registrations"] = s.bad_registrations;
  return j.dump(2);
}

result<cluster_state> create_cluster(const cluster_admin_options& a,
                                     const cluster_create_options& c) {
  if (c.replicas > cluster::max_replicas)
    return make_error(errc::invalid_argument, "--replicas " + std::to_string(c.replicas) +
                                                  ": 0 to " +
                                                  std::to_string(cluster::max_replicas));
  if (c.shards < 1 || c.shards > cluster::max_shards)
    return make_error(errc::invalid_argument, "--shards " + std::to_string(c.shards) + ": 1 to " +
                                                  std::to_string(cluster::max_shards));
  auto e = open_etcd(a);
  if (!e) return std::unexpected(e.error());
  etcd_coord& etcd = **e;
  const std::string key = cluster::config_key(a.name);
  auto existing = etcd.get(key);
  if (!existing) return std::unexpected(existing.error());
  if (*existing)
    return make_error(errc::invalid_argument, "cluster " + a.name + " already has a shard map (" +
                                                  key + "); `conveyor kv cluster status` shows it");
  // Each shard takes a primary and `replicas` replicas.
  const std::size_t want = c.shards * (1 + c.replicas);
  const auto deadline = std::chrono::steady_clock::now() + c.wait;
  std::size_t last_seen = static_cast<std::size_t>(-1);
  std::vector<cluster::node_registration> nodes;
  for (;;) {
    auto regs = read_registrations(etcd, a.name);
    if (!regs) return std::unexpected(regs.error());
    nodes = std::move(regs->nodes);
    if (nodes.size() != last_seen && c.progress)
      c.progress(std::to_string(nodes.size()) + " of " + std::to_string(want) +
                 " node(s) registered");
    last_seen = nodes.size();
    if (nodes.size() >= want) break;
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(errc::timed_out,
                        std::to_string(nodes.size()) + " of " + std::to_string(want) +
                            " node(s) registered in cluster " + a.name + " after " +
                            std::to_string(c.wait.count()) +
                            " s: start more with `conveyor kv serve --cluster ...`");
    std::this_thread::sleep_for(200ms);
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const auto& x, const auto& y) { return address_less(x.resp, y.resp); });
  nodes.resize(want);
  // Replicas need a replication listener to connect to on their primary.
  for (std::size_t i = 0; c.replicas > 0 && i < c.shards; ++i)
    if (nodes[i].repl.empty())
      return make_error(errc::invalid_argument,
                        "node " + nodes[i].id + " (" + nodes[i].resp +
                            ") registered no replication address: it cannot have replicas");
  cluster::shard_map m;
  m.epoch = 1;
  // Redis's split (redis-cli --cluster create): the last slot of shard i is
  // round((i + 1) * 16384 / n - 1), the last shard ends at 16383.
  const double per = static_cast<double>(cluster::slot_count) / static_cast<double>(c.shards);
  long first = 0;
  for (std::size_t i = 0; i < c.shards; ++i) {
    long last = std::lround(per * static_cast<double>(i + 1) - 1);
    if (i + 1 == c.shards || last > cluster::slot_count - 1) last = cluster::slot_count - 1;
    cluster::shard sh;
    sh.id = cluster::random_id();
    sh.slots.push_back({static_cast<std::uint16_t>(first), static_cast<std::uint16_t>(last)});
    sh.primary = nodes[i].id;
    sh.primary_boot = nodes[i].boot_id;  // the process made primary (shard_map.hpp)
    sh.isr = {nodes[i].id};
    m.nodes.push_back({nodes[i].id, nodes[i].resp, nodes[i].rdma, nodes[i].repl});
    // The nodes after the primaries, in address order, c.replicas per shard:
    // in sync from the start (they catch up before any write is acknowledged).
    for (std::size_t j = 0; j < c.replicas; ++j) {
      const auto& r = nodes[c.shards + i * c.replicas + j];
      sh.replicas.push_back(r.id);
      sh.isr.push_back(r.id);
      m.nodes.push_back({r.id, r.resp, r.rdma, r.repl});
    }
    m.shards.push_back(std::move(sh));
    first = last + 1;
  }
  if (auto v = cluster::validate(m); !v) return std::unexpected(v.error());
  auto w = etcd.put_if(key, cluster::to_json(m), 0);
  if (!w) return std::unexpected(w.error());
  if (!w->succeeded)
    return make_error(errc::invalid_argument, "cluster " + a.name +
                                                  " got a shard map from someone else meanwhile (" +
                                                  key + "): not overwritten");
  return state_of(etcd, a);
}

namespace {

// The one element of `v` that `want` names (all of it, or a prefix of at
// least 4 characters of it, by `key`); an error says which way it did not.
template <class T, class Key>
result<const T*> pick(const std::vector<T>& v, const std::string& want, Key key, const char* what) {
  const T* found = nullptr;
  for (const auto& x : v) {
    const std::string& k = key(x);
    const bool match = k == want || (want.size() >= 4 && k.starts_with(want));
    if (!match) continue;
    if (found != nullptr && k != want)
      return make_error(errc::invalid_argument,
                        std::string(what) + " '" + want + "' is ambiguous: give more of it");
    found = &x;
    if (k == want) break;
  }
  if (found == nullptr)
    return make_error(errc::invalid_argument, std::string("no ") + what + " '" + want + "'");
  return found;
}

// The node of `v` (registrations or map nodes) that `want` names: its RESP
// address, its id or a prefix of it.
template <class T>
result<const T*> find_named_node(const std::vector<T>& v, const std::string& want,
                                 const char* what) {
  for (const auto& n : v)
    if (n.resp == want) return &n;
  return pick(
      v, want, [](const T& n) -> const std::string& { return n.id; }, what);
}

// The shard `want` names: its id or a prefix of it, or its primary's id or
// RESP address.
result<const cluster::shard*> find_shard(const cluster::shard_map& m, const std::string& want) {
  for (const auto& s : m.shards) {
    const auto* n = cluster::find_node(m, s.primary);
    if (s.primary == want || (n != nullptr && n->resp == want)) return &s;
  }
  return pick(
      m.shards, want, [](const cluster::shard& s) -> const std::string& { return s.id; }, "shard");
}

// The shard map as it is now (an error when there is none).
result<cluster::shard_map> read_map(etcd_coord& etcd, const cluster_admin_options& a) {
  auto cfg = etcd.get(cluster::config_key(a.name));
  if (!cfg) return std::unexpected(cfg.error());
  if (!*cfg) return make_error(errc::invalid_argument, "cluster " + a.name + " has no shard map");
  return cluster::parse_shard_map((*cfg)->value);
}

// Writes the map `next` computes by CAS (rewrite_shard_map); its refusal is
// an invalid_argument error.
result<void> change_map(
    etcd_coord& etcd, const cluster_admin_options& a,
    const std::function<std::expected<cluster::shard_map, std::string>(const cluster::shard_map&)>&
        next) {
  const auto w = cluster::rewrite_shard_map(etcd, a.name, 5, next);
  using outcome = cluster::isr_change::outcome;
  if (w.result == outcome::written) return {};
  return make_error(w.result == outcome::moot ? errc::invalid_argument : errc::io_error, w.error);
}

}  // namespace

result<cluster_state> add_node_cluster(const cluster_admin_options& a,
                                       const cluster_add_node_options& o) {
  auto e = open_etcd(a);
  if (!e) return std::unexpected(e.error());
  etcd_coord& etcd = **e;
  auto regs = read_registrations(etcd, a.name);
  if (!regs) return std::unexpected(regs.error());
  auto n = find_named_node(regs->nodes, o.node, "registered node");
  if (!n) return std::unexpected(n.error());
  const cluster::node_registration node = **n;
  const std::string new_id = cluster::random_id();
  auto changed = change_map(
      etcd, a, [&](const cluster::shard_map& m) -> std::expected<cluster::shard_map, std::string> {
        if (o.new_shard) return cluster::with_shard_added(m, node, new_id);
        if (m.shards.empty()) return std::unexpected("the map has no shard to join");
        std::size_t at = 0;
        if (o.shard.empty()) {
          for (std::size_t i = 1; i < m.shards.size(); ++i)
            if (m.shards[i].replicas.size() < m.shards[at].replicas.size()) at = i;
        } else {
          auto sh = find_shard(m, o.shard);
          if (!sh) return std::unexpected(sh.error().to_string());
          at = static_cast<std::size_t>(*sh - m.shards.data());
        }
        return cluster::with_replica_added(m, node, at);
      });
  if (!changed) return std::unexpected(changed.error());
  const auto deadline = std::chrono::steady_clock::now() + o.wait;
  while (!o.new_shard && o.wait.count() > 0) {
    auto m = read_map(etcd, a);
    if (m)
      for (const auto& sh : m->shards)
        if (std::find(sh.isr.begin(), sh.isr.end(), node.id) != sh.isr.end())
          return state_of(etcd, a);
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(errc::timed_out,
                        "node " + node.id +
                            " is a replica in the map but not in the in-sync set "
                            "after " +
                            std::to_string(o.wait.count()) +
                            " s (still catching up? its log and its primary's say)");
    std::this_thread::sleep_for(100ms);
  }
  return state_of(etcd, a);
}

result<cluster_state> del_node_cluster(const cluster_admin_options& a,
                                       const cluster_del_node_options& o) {
  auto e = open_etcd(a);
  if (!e) return std::unexpected(e.error());
  etcd_coord& etcd = **e;
  auto changed = change_map(
      etcd, a, [&](const cluster::shard_map& m) -> std::expected<cluster::shard_map, std::string> {
        auto n = find_named_node(m.nodes, o.node, "node in the shard map");
        if (!n) return std::unexpected(n.error().to_string());
        return cluster::with_node_removed(m, (*n)->id);
      });
  if (!changed) return std::unexpected(changed.error());
  return state_of(etcd, a);
}

result<cluster_state> failover_cluster(const cluster_admin_options& a,
                                       const cluster_failover_options& f) {
  auto e = open_etcd(a);
  if (!e) return std::unexpected(e.error());
  etcd_coord& etcd = **e;
  auto m = read_map(etcd, a);
  if (!m) return std::unexpected(m.error());
  const cluster::shard* sh = nullptr;
  if (f.shard.empty()) {
    if (m->shards.size() != 1)
      return make_error(
          errc::invalid_argument,
          "the cluster has " + std::to_string(m->shards.size()) + " shards: say which (--shard)");
    sh = &m->shards[0];
  } else {
    auto p = find_shard(*m, f.shard);
    if (!p) return std::unexpected(p.error());
    sh = *p;
  }
  auto regs = read_registrations(etcd, a.name);
  if (!regs) return std::unexpected(regs.error());
  auto registered = [&](const std::string& id) {
    return std::any_of(regs->nodes.begin(), regs->nodes.end(),
                       [&](const auto& r) { return r.id == id; });
  };
  std::string to;
  if (f.to.empty()) {
    for (const auto& id : sh->isr)
      if (id != sh->primary && registered(id)) {
        to = id;
        break;
      }
    if (to.empty())
      return make_error(errc::invalid_argument,
                        "shard " + sh->id + " has no registered in-sync replica to promote");
  } else {
    std::vector<std::string> members(sh->isr.begin(), sh->isr.end());
    auto p = pick(
        members, f.to, [](const std::string& id) -> const std::string& { return id; },
        "in-sync replica of the shard");
    if (!p) return std::unexpected(p.error());
    to = **p;
    if (to == sh->primary)
      return make_error(errc::invalid_argument, "node " + to + " is already the shard's primary");
  }
  const std::string shard_id = sh->id;
  // The request lives on a lease of its own: if nobody acts on it, it goes.
  auto lease = etcd.grant_lease(f.wait + 5s);
  if (!lease) return std::unexpected(lease.error());
  auto put = etcd.put(cluster::handover_prefix(a.name) + shard_id,
                      cluster::handover_request_json(to), lease->id);
  if (!put) {
    (void)etcd.revoke_lease(lease->id);
    return std::unexpected(put.error());
  }
  const auto deadline = std::chrono::steady_clock::now() + f.wait;
  for (;;) {
    std::this_thread::sleep_for(100ms);
    if (auto now_map = read_map(etcd, a))
      for (const auto& s : now_map->shards)
        if (s.id == shard_id && s.primary == to) {
          (void)etcd.revoke_lease(lease->id);
          return state_of(etcd, a);
        }
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  (void)etcd.revoke_lease(lease->id);
  return make_error(errc::timed_out,
                    "the primary of shard " + shard_id + " did not hand over to " + to +
                        " within " + std::to_string(f.wait.count()) +
                        " s (its log says why: not alive, fenced, or the replica not caught up)");
}

}  // namespace conveyor::kv
