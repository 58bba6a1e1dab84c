// conveyor::kv::cluster::cluster_node — a server's membership in a cluster
// (issue 35): its id, its registration in etcd on a lease kept alive, and the
// shard map it watches, handed to the server as cluster_views.
//
//   node_options o;
//   o.endpoints = {"127.0.0.1:2379"};
//   o.cluster_name = "default";
//   o.dir = "/var/lib/kv";                     // holds cluster-node.id
//   o.resp = "10.0.0.1:7001";
//   o.on_view = [&](std::shared_ptr<const cluster_view> v) { loop.post(...); };
//   auto n = cluster_node::start(std::move(o));  // id loaded or created; thread started
//   ...
//   (*n)->stop();                                // revokes the lease: the registration goes
//
// The keys, under /conveyor-kv/<cluster name>/:
//   nodes/<id>  node_registration JSON (shard_map.hpp), bound to the node's lease
//   config      the shard map JSON, written by `conveyor kv cluster create` (and
//               later by the controller) with compare-and-swap
//
// Two background threads do everything with etcd, each call bounded in time
// (etcd.hpp). The node's thread grants a lease of lease_ttl, puts the
// registration on it, and long-polls the cluster's keys (at most 500 ms per
// poll, so stop() returns within about two seconds); the keeper thread, with
// its own client, renews the lease every quarter of its TTL, each request
// bounded by that quarter, so that no slow call of the other delays a
// renewal (the fence, below, depends on them). When the lease is found gone (expired while etcd was
// unreachable, or revoked) it registers again with a new lease, same id. When etcd cannot be
// reached it retries every 500 ms and logs an error when its kind changes.
//
// Every config value is hostile: parse_shard_map + slot_table::build validate
// it; an invalid one is logged and ignored (the last good view stays). Views
// are delivered in revision order, each once, from the node's thread, through
// on_view: the callee hands it to whichever thread uses it.
//
// A manual failover: `conveyor kv cluster failover` puts a request under
// handover/<shard id>; the shard's primary fences itself, waits until the
// replica to promote holds every record, and writes the map that promotes it
// (on_handover, write_handover).
//
// The controller role (controller.hpp): every node with `controller` set
// tries to create the `controller` key on its lease (only if absent); the
// holder watches registrations and offset reports and writes the failover
// decisions by CAS. When the holder dies, its lease and the key go, and
// another node takes the key.
//
// Thread safety: start/stop/id from one owning thread; report_offset,
// request_isr_add and request_isr_remove from any; on_view, on_lease and log run on the node's
// thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/error.hpp>

#include "cluster/controller.hpp"
#include "cluster/coord.hpp"
#include "cluster/routing.hpp"

namespace conveyor::kv::cluster {

// 1..64 of [A-Za-z0-9_.-]: the cluster name is part of every etcd key.
bool valid_cluster_name(std::string_view name) noexcept;
std::string cluster_prefix(std::string_view name);  // "/conveyor-kv/<name>/"
std::string config_key(std::string_view name);      // ".../config"
std::string nodes_prefix(std::string_view name);    // ".../nodes/"

// The registrations in `kvs` (a range of `prefix`, nodes_prefix(name)) that
// validate and sit under their own id's key, in key order; `bad`, when given,
// counts the others.
std::vector<node_registration> registrations_in(const std::vector<key_value>& kvs,
                                                std::string_view prefix,
                                                std::size_t* bad = nullptr);

// The node id kept in `dir`/cluster-node.id (Redis keeps its id in
// nodes.conf the same way): read when the file exists (it must hold 40
// lowercase hex characters and at most a newline), otherwise 20 bytes from the
// kernel's CSPRNG (getrandom) written there first (temporary file, fsync,
// rename), so a restart keeps the id.
result<std::string> load_or_create_node_id(const std::string& dir);
inline constexpr std::string_view node_id_file = "cluster-node.id";

// 40 lowercase hex characters from the kernel's CSPRNG (node and shard ids).
std::string random_id();

struct node_options {
  std::vector<std::string> endpoints;  // etcd: host:port, at least one
  std::string cluster_name = "default";
  std::string dir = ".";  // where the node id is kept
  std::string resp;       // host:port clients are sent to (registrations, MOVED)
  std::string rdma;       // host:port of the RDMA front end; empty: none
  std::string repl;       // host:port of the replication listener; empty: none
  std::chrono::seconds lease_ttl{5};
  std::chrono::milliseconds request_timeout{1000};  // each etcd call but the watch
  std::function<void(std::shared_ptr<const cluster_view>)> on_view;
  // Fencing (controller.hpp): after each lease grant or renewal, the time
  // until which this node may acknowledge and serve (its steady clock). After
  // a (re)registration it comes only once the map was read again, after
  // on_view's delivery of it; when the lease is found gone, time_point::min().
  // Called on the node's thread, in order with on_view.
  std::function<void(std::chrono::steady_clock::time_point)> on_lease;
  // A manual failover (controller.hpp's handover request): called when a
  // request for this node's shard arrives while the map names this process
  // its primary, with the node to promote (an id; not yet checked against
  // the map). The callee fences the node, waits for that replica to hold
  // every record, then calls write_handover. Each request once.
  std::function<void(const std::string& to)> on_handover;
  // write_handover's outcome: written (the map names `to` now), or why not.
  std::function<void(bool written, const std::string& why)> on_handover_done;
  // Whether this node may take the controller role (failover).
  bool controller = true;
  // How long the controller waits for every live in-sync replica's report
  // before it promotes the best of those that reported.
  std::chrono::milliseconds failover_grace{4000};
  std::function<void(const std::string&)> log;  // one line, no newline; null: silent
};

class cluster_node {
 public:
  // Checks the options, loads or creates the id, opens the etcd client and
  // starts the thread (which registers: etcd need not be up yet). Errors:
  // invalid_argument (options), or the id file's error.
  static result<std::unique_ptr<cluster_node>> start(node_options opts);
  ~cluster_node();  // stop()
  cluster_node(const cluster_node&) = delete;
  cluster_node& operator=(const cluster_node&) = delete;

  const std::string& id() const noexcept;
  // Thread-safe, from any thread; done by the node's thread, asynchronously.
  // Publish this replica's offset report (offsets/<id> on the lease; the
  // latest one wins).
  void report_offset(offset_report r);
  // report_offset, then wait until that report (or a later one) is in etcd,
  // at most `timeout`: true when it is. From any thread but the node's.
  bool publish_offset(offset_report r, std::chrono::milliseconds timeout);
  // As a primary: add `replica` to this node's shard's isr by a map CAS
  // (retried while the map still names this node its primary and the
  // replica outside the isr).
  void request_isr_add(std::string replica);
  // As a primary: remove `replica` from this node's shard's isr by a map CAS
  // (the shrink: it did not acknowledge within its bound). Written only while
  // this node's lease holds and the map read names it the primary; retried
  // while etcd does not answer. A later request for the same replica (an add
  // after it caught up again) replaces a pending one.
  void request_isr_remove(std::string replica);
  // The hand-over's CAS (propose_handover: this node's shard to `to`), by
  // the node's thread while its lease holds; the outcome goes to
  // on_handover_done. Thread-safe.
  void write_handover(std::string to);
  // True while this node holds the controller key (for tests and INFO).
  bool is_controller() const noexcept;
  // Ends the thread (bounded: one etcd call's timeout) and revokes the lease.
  // Idempotent.
  void stop();

  struct state;

 private:
  explicit cluster_node(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace conveyor::kv::cluster
