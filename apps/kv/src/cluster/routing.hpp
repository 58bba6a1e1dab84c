// conveyor::kv::cluster — which node serves a command: the map a node acts on
// (cluster_view) and Redis Cluster's routing rule as a pure function.
//
//   auto v = make_view(map, my_id);                  // validated, with its slot table
//   std::string e = route_keys(keys, v->get());      // "" or the error reply's text
//   if (!e.empty()) reply.error(e);                  // -MOVED 3999 127.0.0.1:7002 ...
//
// The rule is Redis's getNodeByQuery (cluster.c) for a primary: a command
// without keys runs anywhere; the first key's slot must be owned by some
// shard (else CLUSTERDOWN Hash slot not served), every other key must hash to
// the same slot (else CROSSSLOT), and the owner must be this node (else MOVED
// <slot> <host>:<port> of the owning shard's primary). No map yet is a slot
// nobody serves. A replica serves reads of its shard to READONLY
// connections. ASK and TRYAGAIN come with slot migration (issue 35's later
// steps).
//
// A cluster_view is immutable once built: the node's etcd thread builds one
// per valid map and hands the shared_ptr to the loop thread, which only reads
// it. Pure functions over bytes: safe from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <conveyor/error.hpp>

#include "cluster/shard_map.hpp"

namespace conveyor::kv::cluster {

struct cluster_view {
  shard_map map;
  slot_table table;           // built from `map`, positions into map.shards
  std::string my_id;          // this node's id (it may be in no shard)
  std::int64_t revision = 0;  // the config key's mod_revision in etcd (0: not from etcd)
  // This process's boot_id (its registration's); empty: not checked.
  std::string my_boot;
};

// Validates `map` and builds its slot table.
result<std::shared_ptr<const cluster_view>> make_view(shard_map map, std::string my_id,
                                                      std::int64_t revision = 0,
                                                      std::string my_boot = {});

// True when the map names this node the primary of `sh` but records another
// process's boot_id for it (shard_map.hpp's primary_boot): this process
// restarted after the map was written and holds none of the shard's
// acknowledged writes, so it serves nothing of the shard (its keys get
// err_restarted_primary, it takes no replica, its lease is withheld from its
// readers) until the controller's failover names another primary.
bool restarted_primary(const cluster_view& v, const shard& sh) noexcept;
// The shard v's node is a restarted primary of (restarted_primary), or null.
const shard* restarted_primary_of(const cluster_view& v) noexcept;

// The error replies routing gives (without the leading '-').
inline constexpr std::string_view err_crossslot =
    "CROSSSLOT Keys in request don't hash to the same slot";
inline constexpr std::string_view err_slot_not_served = "CLUSTERDOWN Hash slot not served";
// A restarted primary (restarted_primary): the write did not run; a client
// tries again (redis-py and redis-cli do on TRYAGAIN) and finds the new
// primary once the failover is written.
inline constexpr std::string_view err_restarted_primary =
    "TRYAGAIN This node restarted: its shard waits for a failover to a replica";
// A node past its fencing deadline (controller.hpp).
inline constexpr std::string_view err_fenced =
    "CLUSTERDOWN The cluster is down: this node's lease in etcd is not confirmed";

// "" when a command with these keys may run on this node; otherwise the error
// reply's text. `view` null: no map yet. replica_read: the command only
// reads and its connection asked READONLY, so a replica of the owning shard
// serves it too (Redis's rule); otherwise a replica redirects to its primary.
std::string route_keys(std::span<const std::string_view> keys, const cluster_view* view,
                       bool replica_read = false);

// The shard of which this view's node is a replica (null: none).
const shard* replica_of(const cluster_view& v) noexcept;
// The shard whose primary this view's node is (null: none; a restarted
// primary is none).
const shard* primary_of(const cluster_view& v) noexcept;

// "host:port" split at the last ':' (brackets of an IPv6 host removed); port 0
// when it does not parse. For replies that give host and port apart.
std::pair<std::string_view, std::uint16_t> split_address(std::string_view addr) noexcept;

}  // namespace conveyor::kv::cluster
