// Redis Cluster's routing rule (routing.hpp).
#include "cluster/routing.hpp"

#include <algorithm>
#include <charconv>

#include "cluster/slots.hpp"

namespace conveyor::kv::cluster {

result<std::shared_ptr<const cluster_view>> make_view(shard_map map, std::string my_id,
                                                      std::int64_t revision, std::string my_boot) {
  auto t = slot_table::build(map);
  if (!t) return std::unexpected(t.error());
  auto v = std::make_shared<cluster_view>();
  v->map = std::move(map);
  v->table = std::move(*t);
  v->my_id = std::move(my_id);
  v->revision = revision;
  v->my_boot = std::move(my_boot);
  return std::shared_ptr<const cluster_view>(std::move(v));
}

std::string route_keys(std::span<const std::string_view> keys, const cluster_view* view,
                       bool replica_read) {
  if (keys.empty()) return {};
  const std::uint16_t slot = slot_of(keys[0]);
  // Redis answers for the first key's slot before it looks at the others.
  if (view == nullptr) return std::string(err_slot_not_served);
  const auto owner = view->table.shard_of(slot);
  if (!owner) return std::string(err_slot_not_served);
  for (std::size_t i = 1; i < keys.size(); ++i)
    if (slot_of(keys[i]) != slot) return std::string(err_crossslot);
  const auto& sh = view->map.shards[*owner];
  if (sh.primary == view->my_id)
    return restarted_primary(*view, sh) ? std::string(err_restarted_primary) : std::string();
  if (replica_read &&
      std::find(sh.replicas.begin(), sh.replicas.end(), view->my_id) != sh.replicas.end())
    return {};
  const node_info* n = find_node(view->map, sh.primary);
  // A valid map names every primary in its nodes; an empty address would
  // still be a redirect the client can report.
  return "MOVED " + std::to_string(slot) + " " + (n ? n->resp : std::string());
}

const shard* replica_of(const cluster_view& v) noexcept {
  for (const auto& sh : v.map.shards)
    if (std::find(sh.replicas.begin(), sh.replicas.end(), v.my_id) != sh.replicas.end()) return &sh;
  return nullptr;
}

bool restarted_primary(const cluster_view& v, const shard& sh) noexcept {
  return sh.primary == v.my_id && !v.my_boot.empty() && !sh.primary_boot.empty() &&
         sh.primary_boot != v.my_boot;
}

const shard* restarted_primary_of(const cluster_view& v) noexcept {
  for (const auto& sh : v.map.shards)
    if (restarted_primary(v, sh)) return &sh;
  return nullptr;
}

const shard* primary_of(const cluster_view& v) noexcept {
  for (const auto& sh : v.map.shards)
    if (sh.primary == v.my_id) return restarted_primary(v, sh) ? nullptr : &sh;
  return nullptr;
}

std::pair<std::string_view, std::uint16_t> split_address(std::string_view addr) noexcept {
  const auto colon = addr.rfind(':');
  if (colon == std::string_view::npos) return {addr, 0};
  std::string_view host = addr.substr(0, colon), port = addr.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned v = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
  if (ec != std::errc{} || p != port.data() + port.size() || v > 65535) return {host, 0};
  return {host, static_cast<std::uint16_t>(v)};
}

}  // namespace conveyor::kv::cluster
