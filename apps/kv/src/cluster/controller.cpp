// Failover and fencing decisions (controller.hpp).
#include "cluster/controller.hpp"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "cluster/cluster_node.hpp"

namespace conveyor::kv::cluster {

using json = nlohmann::json;

std::string controller_key(std::string_view cluster_name) {
  return cluster_prefix(cluster_name) + "controller";
}
std::string offsets_prefix(std::string_view cluster_name) {
  return cluster_prefix(cluster_name) + "offsets/";
}

std::string to_json(const offset_report& r) {
  json j = {{"shard", r.shard},     {"primary", r.primary}, {"offset", r.offset},
            {"link_up", r.link_up}, {"synced", r.synced},   {"boot", r.boot}};
  return j.dump();
}

result<offset_report> parse_offset_report(std::string_view text) {
  auto bad = [](std::string what) {
    return make_error(errc::invalid_argument, "offset report: " + std::move(what));
  };
  if (text.size() > 1024) return bad("over 1 KiB");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad("not a JSON object");
  if (j.size() != 6) return bad("not exactly shard, primary, offset, link_up, synced, boot");
  offset_report r;
  for (const auto& [k, v] : j.items()) {
    if (k == "shard" || k == "primary") {
      if (!v.is_string() || !valid_id(v.get_ref<const std::string&>()))
        return bad(k + " is not an id");
      (k == "shard" ? r.shard : r.primary) = v.get<std::string>();
    } else if (k == "offset") {
      if (!v.is_number_unsigned()) return bad("offset is not an unsigned integer");
      r.offset = v.get<std::uint64_t>();
    } else if (k == "link_up" || k == "synced") {
      if (!v.is_boolean()) return bad(k + " is not a boolean");
      (k == "link_up" ? r.link_up : r.synced) = v.get<bool>();
    } else if (k == "boot") {
      if (!v.is_string() || !valid_boot_id(v.get_ref<const std::string&>()))
        return bad("boot is not 1..64 of [A-Za-z0-9_-]");
      r.boot = v.get<std::string>();
    } else {
      return bad("unknown field");
    }
  }
  if (r.shard.empty() || r.primary.empty()) return bad("missing shard or primary");
  return r;
}

namespace {

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// `sh` with `to` as its primary: the isr is `to` and the other members of
// `keep` (in the old order); the old primary joins the replicas, out of sync.
void promote(shard& sh, const std::string& to, std::string_view to_boot,
             const std::vector<std::string>& keep) {
  const std::string old = sh.primary;
  std::vector<std::string> isr{to};
  for (const auto& id : keep)
    if (id != to && id != old) isr.push_back(id);
  std::vector<std::string> replicas;
  for (const auto& id : sh.replicas)
    if (id != to) replicas.push_back(id);
  replicas.push_back(old);
  sh.primary = to;
  sh.primary_boot = to_boot;
  sh.isr = std::move(isr);
  sh.replicas = std::move(replicas);
}

}  // namespace

bool primary_alive(const shard& sh,
                   const std::map<std::string, node_registration, std::less<>>& live) noexcept {
  auto it = live.find(sh.primary);
  return it != live.end() && (sh.primary_boot.empty() || it->second.boot_id == sh.primary_boot);
}

std::optional<failover_decision> decide_failover(
    const shard_map& m, const std::map<std::string, node_registration, std::less<>>& live,
    const std::map<std::string, offset_report, std::less<>>& reports,
    const std::set<std::string, std::less<>>& grace_over) {
  failover_decision d;
  d.map = m;
  bool adopted = false;
  for (auto& sh : d.map.shards) {
    if (primary_alive(sh, live)) continue;
    const auto reg = live.find(sh.primary);
    if (reg != live.end() && sh.isr.size() == 1) {
      // The primary restarted and the shard has no in-sync replica: no copy
      // is more complete than what its new process holds (its AOF's, or
      // nothing), so that process takes the shard, as a restarted Redis
      // primary without replicas does.
      sh.primary_boot = reg->second.boot_id;
      adopted = true;
      continue;
    }
    std::optional<std::string> best;
    std::uint64_t best_offset = 0;
    bool waiting = false;
    std::vector<std::string> keep;  // the live isr members
    for (const auto& id : sh.isr) {
      if (id == sh.primary || !live.contains(id)) continue;
      keep.push_back(id);
      auto r = reports.find(id);
      const bool ours = r != reports.end() && r->second.shard == sh.id &&
                        r->second.primary == sh.primary &&
                        r->second.boot == live.find(id)->second.boot_id;
      if (!ours || r->second.link_up) waiting = true;  // its final offset is still to come
      if (!ours || !r->second.synced) continue;
      const auto off = r->second.offset;
      if (!best || off > best_offset || (off == best_offset && id < *best)) {
        best = id;
        best_offset = off;
      }
    }
    if (!best || (waiting && !grace_over.contains(sh.id))) continue;
    d.deposed.push_back(sh.primary);
    d.promoted.push_back(*best);
    promote(sh, *best, live.find(*best)->second.boot_id, keep);
  }
  bool moved = false;
  for (auto& n : d.map.nodes) {
    auto r = live.find(n.id);
    if (r == live.end()) continue;
    node_info now{n.id, r->second.resp, r->second.rdma, r->second.repl};
    if (now != n) {
      n = std::move(now);
      moved = true;
    }
  }
  if (d.deposed.empty() && !moved && !adopted) return std::nullopt;
  if (!validate(d.map)) return std::nullopt;
  ++d.map.epoch;
  return d;
}

result<failover_decision> manual_failover(const shard_map& m, std::string_view shard_id,
                                          std::string_view to, std::string_view to_boot) {
  failover_decision d;
  d.map = m;
  for (auto& sh : d.map.shards) {
    if (sh.id != shard_id) continue;
    if (sh.primary == to)
      return make_error(errc::invalid_argument, "the node is already the shard's primary");
    if (!contains(sh.isr, to))
      return make_error(errc::invalid_argument,
                        "the node is not in the shard's in-sync set: promoting it could lose "
                        "acknowledged writes");
    d.deposed.push_back(sh.primary);
    d.promoted.emplace_back(to);
    promote(sh, std::string(to), to_boot, sh.isr);
    ++d.map.epoch;
    return d;
  }
  return make_error(errc::not_found, "no shard with that id in the map");
}

std::optional<shard_map> add_to_isr(const shard_map& m, std::string_view primary,
                                    std::string_view replica) {
  shard_map out = m;
  for (auto& sh : out.shards) {
    if (sh.primary != primary) continue;
    if (!contains(sh.replicas, replica) || contains(sh.isr, replica)) return std::nullopt;
    sh.isr.emplace_back(replica);
    ++out.epoch;
    return out;
  }
  return std::nullopt;
}

std::optional<shard_map> remove_from_isr(const shard_map& m, std::string_view primary,
                                         std::string_view replica) {
  shard_map out = m;
  for (auto& sh : out.shards) {
    if (sh.primary != primary) continue;
    if (replica == primary) return std::nullopt;  // a primary never leaves its own isr
    auto it = std::find(sh.isr.begin(), sh.isr.end(), replica);
    if (it == sh.isr.end()) return std::nullopt;
    sh.isr.erase(it);
    ++out.epoch;
    return out;
  }
  return std::nullopt;
}

isr_change rewrite_shard_map(
    coord& c, std::string_view cluster_name, int attempts,
    const std::function<std::expected<shard_map, std::string>(const shard_map&)>& next) {
  using outcome = isr_change::outcome;
  const std::string key = config_key(cluster_name);
  auto got = c.get(key);
  if (!got) return {outcome::failed, 0, got.error().to_string()};
  std::optional<key_value> cur = std::move(*got);
  for (int i = 0; i < attempts; ++i) {
    if (!cur) return {outcome::moot, 0, "no shard map"};
    auto m = parse_shard_map(cur->value);
    if (!m) return {outcome::moot, 0, m.error().to_string()};
    auto n = next(*m);
    if (!n) return {outcome::moot, 0, std::move(n.error())};
    auto w = c.put_if(key, to_json(*n), cur->mod_revision);
    if (!w) return {outcome::failed, 0, w.error().to_string()};
    if (w->succeeded) return {outcome::written, n->epoch, {}};
    cur = std::move(w->current);  // the loser reads again: the map as it is now
  }
  return {outcome::failed, 0, "the shard map kept changing"};
}

isr_change propose_isr_change(coord& c, std::string_view cluster_name, std::string_view primary,
                              std::string_view replica, bool add, int attempts) {
  return rewrite_shard_map(
      c, cluster_name, attempts, [&](const shard_map& m) -> std::expected<shard_map, std::string> {
        auto n = add ? add_to_isr(m, primary, replica) : remove_from_isr(m, primary, replica);
        if (!n) return std::unexpected(std::string());
        return std::move(*n);
      });
}

std::string handover_prefix(std::string_view cluster_name) {
  return cluster_prefix(cluster_name) + "handover/";
}

std::string handover_request_json(std::string_view to) {
  return json{{"to", to}}.dump();
}

result<std::string> parse_handover_request(std::string_view text) {
  auto bad = [](std::string what) {
    return make_error(errc::invalid_argument, "hand-over request: " + std::move(what));
  };
  if (text.size() > 1024) return bad("over 1 KiB");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.size() != 1 || !j.contains("to")) return bad("not {\"to\": id}");
  const auto& v = j["to"];
  if (!v.is_string() || !valid_id(v.get_ref<const std::string&>())) return bad("to is not an id");
  return v.get<std::string>();
}

isr_change propose_handover(coord& c, std::string_view cluster_name, std::string_view primary,
                            std::string_view primary_boot, std::string_view to, int attempts) {
  using outcome = isr_change::outcome;
  auto reg = c.get(nodes_prefix(cluster_name) + std::string(to));
  if (!reg) return {outcome::failed, 0, reg.error().to_string()};
  if (!*reg) return {outcome::moot, 0, "the node to promote is not registered"};
  auto r = parse_node_registration((*reg)->value);
  if (!r || r->id != to) return {outcome::moot, 0, "the node to promote has no valid registration"};
  return rewrite_shard_map(
      c, cluster_name, attempts, [&](const shard_map& m) -> std::expected<shard_map, std::string> {
        auto sh = std::find_if(m.shards.begin(), m.shards.end(),
                               [&](const shard& s) { return s.primary == primary; });
        if (sh == m.shards.end() || (!sh->primary_boot.empty() && sh->primary_boot != primary_boot))
          return std::unexpected(std::string("this node is no longer the shard's primary"));
        auto d = manual_failover(m, sh->id, to, r->boot_id);
        if (!d) return std::unexpected(d.error().context);
        return std::move(d->map);
      });
}

std::chrono::milliseconds fence_margin(std::chrono::seconds ttl) noexcept {
  const auto t = std::chrono::duration_cast<std::chrono::milliseconds>(ttl);
  return std::min(std::max(t / 5, std::chrono::milliseconds(300)), t / 2);
}

std::chrono::steady_clock::time_point fence_deadline(std::chrono::steady_clock::time_point sent,
                                                     std::chrono::seconds ttl) noexcept {
  return sent + ttl - fence_margin(ttl);
}

}  // namespace conveyor::kv::cluster
