// conveyor::kv::repl::node_role — what a cluster node does for replication,
// decided from each shard map it acts on (issue 35, docs/KV-CLUSTER.md): the
// primary of a shard streams to the shard's replicas and waits for its
// in-sync ones; a replica keeps one link to its shard's primary; a node in no
// shard does neither. It owns the primary (its listener is up from the start,
// so its address can be registered) and the replica link, and answers INFO's
// # Replication.
//
// Thread safety: loop thread only.
#pragma once

#include <conveyor/conveyor.hpp>

#include <memory>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "repl/primary.hpp"
#include "repl/replica.hpp"

namespace conveyor::kv {
class server_loop;
namespace cluster {
struct cluster_view;
struct offset_report;
}  // namespace cluster
}  // namespace conveyor::kv

namespace conveyor::kv::repl {

struct role_options {
  primary_options primary;  // the listener's address, bounds, log
  parser_limits limits;     // a replica's record bounds
  std::function<void(const std::string&)> log;
  // As a replica: each time the link to the primary goes up or down, what
  // to publish for the controller (cluster_node::report_offset). Null: none.
  std::function<void(const cluster::offset_report&)> report;
  // As a replica, once connected to the primary and before the link is
  // used (replica_options::before_link): publish this report and wait
  // (bounded) until it is in etcd (cluster_node's publish_offset); false:
  // not published, the link is dropped. Null: none (the link is used at once).
  std::function<bool(const cluster::offset_report&)> publish;
};

class node_role {
 public:
  // Starts the primary's listener and installs it as the executor's record
  // sink and sync point.
  static result<std::unique_ptr<node_role>> start(device& dev, protection_domain& pd,
                                                  server_loop& loop, executor& exec,
                                                  role_options opts);
  ~node_role();
  // The replication listener's address (what the node registers as `repl`).
  std::string address() const;
  // A new shard map (after executor::set_cluster).
  void set_view(const cluster::cluster_view& v);
  void info(std::string& out) const;
  // As a primary: whether `replica` acknowledged every record streamed so far.
  bool replica_caught_up(std::string_view replica) const;

 private:
  node_role(device& dev, protection_domain& pd, server_loop& loop, executor& exec,
            role_options opts);
  device& dev_;
  protection_domain& pd_;
  server_loop& loop_;
  executor& exec_;
  role_options opts_;
  std::unique_ptr<primary> primary_;
  std::unique_ptr<replica> replica_;
};

}  // namespace conveyor::kv::repl
