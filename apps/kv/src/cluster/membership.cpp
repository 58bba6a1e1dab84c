// conveyor::kv::cluster — see membership.hpp.
#include "cluster/membership.hpp"

#include <algorithm>

namespace conveyor::kv::cluster {

namespace {

bool in_map(const shard_map& m, std::string_view id) {
  return find_node(m, id) != nullptr;
}

std::expected<shard_map, std::string> checked(shard_map n) {
  ++n.epoch;
  if (auto v = validate(n); !v) return std::unexpected(v.error().to_string());
  return n;
}

}  // namespace

std::expected<shard_map, std::string> with_replica_added(const shard_map& m,
                                                         const node_registration& n,
                                                         std::size_t shard) {
  if (shard >= m.shards.size()) return std::unexpected("no such shard");
  if (in_map(m, n.id)) return std::unexpected("node " + n.id + " is already in the shard map");
  const auto& sh = m.shards[shard];
  if (sh.replicas.size() >= max_replicas)
    return std::unexpected("shard " + sh.id + " already has " + std::to_string(max_replicas) +
                           " replicas");
  const auto* p = find_node(m, sh.primary);
  if (p == nullptr || p->repl.empty())
    return std::unexpected("the primary of shard " + sh.id +
                           " has no replication address: it cannot have replicas");
  if (n.repl.empty())
    return std::unexpected("node " + n.id + " (" + n.resp + ") registered no replication address");
  shard_map next = m;
  next.shards[shard].replicas.push_back(n.id);
  next.nodes.push_back({n.id, n.resp, n.rdma, n.repl});
  return checked(std::move(next));
}

std::expected<shard_map, std::string> with_shard_added(const shard_map& m,
                                                       const node_registration& n,
                                                       std::string_view shard_id) {
  if (in_map(m, n.id)) return std::unexpected("node " + n.id + " is already in the shard map");
  if (m.shards.size() >= max_shards)
    return std::unexpected("the map already has " + std::to_string(max_shards) + " shards");
  shard_map next = m;
  shard sh;
  sh.id = std::string(shard_id);
  sh.primary = n.id;
  sh.primary_boot = n.boot_id;
  sh.isr = {n.id};
  next.shards.push_back(std::move(sh));
  next.nodes.push_back({n.id, n.resp, n.rdma, n.repl});
  return checked(std::move(next));
}

std::expected<shard_map, std::string> with_node_removed(const shard_map& m, std::string_view id) {
  if (!in_map(m, id))
    return std::unexpected("node " + std::string(id) + " is not in the shard map");
  shard_map next = m;
  auto drop = [](std::vector<std::string>& v, std::string_view x) {
    v.erase(std::remove(v.begin(), v.end(), x), v.end());
  };
  for (std::size_t i = 0; i < next.shards.size(); ++i) {
    auto& sh = next.shards[i];
    if (sh.primary == id) {
      if (!sh.slots.empty())
        return std::unexpected("node " + std::string(id) + " is the primary of shard " + sh.id +
                               ", which owns slots: fail the shard over to a replica first "
                               "(`conveyor kv cluster failover`), then remove the node");
      if (!sh.replicas.empty())
        return std::unexpected("node " + std::string(id) + " is the primary of shard " + sh.id +
                               ", which has replicas: remove them first");
      next.shards.erase(next.shards.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    if (std::find(sh.replicas.begin(), sh.replicas.end(), id) != sh.replicas.end()) {
      drop(sh.replicas, id);
      drop(sh.isr, id);
      break;
    }
  }
  std::erase_if(next.nodes, [&](const node_info& n) { return n.id == id; });
  return checked(std::move(next));
}

}  // namespace conveyor::kv::cluster
