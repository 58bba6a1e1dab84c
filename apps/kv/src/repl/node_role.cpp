// A cluster node's replication role (node_role.hpp).
#include "repl/node_role.hpp"

#include <algorithm>

#include "cluster/controller.hpp"
#include "cluster/routing.hpp"

namespace conveyor::kv::repl {

node_role::node_role(device& dev, protection_domain& pd, server_loop& loop, executor& exec,
                     role_options opts)
    : dev_(dev), pd_(pd), loop_(loop), exec_(exec), opts_(std::move(opts)) {}

node_role::~node_role() {
  exec_.set_replication(nullptr, nullptr);
  replica_.reset();
  primary_.reset();
}

result<std::unique_ptr<node_role>> node_role::start(device& dev, protection_domain& pd,
                                                    server_loop& loop, executor& exec,
                                                    role_options opts) {
  std::unique_ptr<node_role> r(new node_role(dev, pd, loop, exec, std::move(opts)));
  auto p = primary::start(dev, pd, loop, exec, r->opts_.primary);
  if (!p) return std::unexpected(p.error());
  r->primary_ = std::move(*p);
  exec.set_replication(r->primary_.get(), &r->primary_->sync());
  return r;
}

std::string node_role::address() const {
  return primary_->address();
}

void node_role::set_view(const cluster::cluster_view& v) {
  // As a primary: who may connect, and whose acks a reply waits for.
  if (const auto* sh = cluster::primary_of(v)) {
    std::vector<std::string> in_sync;
    for (const auto& id : sh->isr)
      if (id != v.my_id) in_sync.push_back(id);
    std::map<std::string, std::string, std::less<>> resp;
    for (const auto& id : sh->replicas)
      if (const auto* n = cluster::find_node(v.map, id)) resp[id] = n->resp;
    primary_->set_shard(sh->id, sh->replicas, std::move(in_sync), std::move(resp));
  } else {
    primary_->set_shard({}, {}, {});
  }
  // As a replica: one link to the shard's primary, made again when the
  // primary or its address changes.
  const auto* sh = cluster::replica_of(v);
  const cluster::node_info* p = sh ? cluster::find_node(v.map, sh->primary) : nullptr;
  if (p == nullptr || p->repl.empty()) {
    if (sh != nullptr && opts_.log)
      opts_.log("replication: the map names no replication address for primary " +
                sh->primary.substr(0, 8) + ": not replicating");
    replica_.reset();
    return;
  }
  if (replica_ && replica_->options().primary == p->repl && replica_->options().shard_id == sh->id)
    return;
  replica_.reset();
  replica_options ro;
  ro.primary = p->repl;
  ro.primary_resp = p->resp;
  ro.node_id = v.my_id;
  ro.shard_id = sh->id;
  ro.password = exec_.config().requirepass;
  ro.limits = opts_.limits;
  ro.log = opts_.log;
  if (opts_.report)
    ro.on_link = [report = opts_.report, shard = sh->id, from = sh->primary](
                     bool up, std::uint64_t offset, bool synced) {
      report(cluster::offset_report{
          shard, from, offset, up, synced, {}});  // boot: stamped by cluster_node
    };
  if (opts_.publish)
    ro.before_link = [publish = opts_.publish, shard = sh->id, from = sh->primary] {
      // The snapshot this link brings empties the keyspace: say so first.
      return publish(cluster::offset_report{shard, from, 0, true, false, {}});
    };
  auto r = replica::start(dev_, pd_, loop_, exec_, std::move(ro));
  if (!r) {
    if (opts_.log) opts_.log("replication: " + r.error().to_string());
    return;
  }
  replica_ = std::move(*r);
}

bool node_role::replica_caught_up(std::string_view replica) const {
  return primary_->caught_up_fully(replica);
}

void node_role::info(std::string& out) const {
  if (replica_)
    replica_->info(out);
  else
    primary_->info(out, exec_.config().run_id);
}

}  // namespace conveyor::kv::repl
