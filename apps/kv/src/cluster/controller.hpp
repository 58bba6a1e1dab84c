// conveyor::kv::cluster — failover and fencing as pure functions (issue 35,
// docs/KV-CLUSTER.md "Failover and fencing"): what the controller decides
// from the map, the live registrations and the replicas' offset reports; how
// a primary adds a caught-up replica back to its in-sync set; and the fencing
// deadline a node computes from its lease renewals.
//
//   auto next = decide_failover(map, live, reports, grace_over);
//   if (next) coord.put_if_absent(config, to_json(next->map), rev, next->deposed);
//
// The controller is whichever node holds the `controller` key (created only
// if absent, bound to its lease; cluster_node.cpp runs it). etcd alone decides
// who is alive (a registration is its lease) and which map holds (CAS on the
// config key's mod_revision); these functions only compute the next map.
//
// Why promoting an in-sync replica loses no acknowledged write: a primary
// acknowledges a write only once every member of its in-sync set has
// acknowledged (applied) it, and its in-sync set always contains the map's
// isr (it adds a replica locally before it asks for it to be added to the
// map, and only after that replica holds every acknowledged write). So every
// member of the map's isr holds every acknowledged write, as long as its
// keyspace is whole: a replica that broke its link while applying a snapshot
// (its keyspace was emptied) reports synced=false and is never promoted.
// Among the candidates the highest applied offset is chosen (it holds the
// most of the writes that were applied but not acknowledged, which READONLY
// readers may have seen). A promoted replica drops its link to the old
// primary before it accepts a write, so the old primary can acknowledge
// nothing more (the promoted node was in its in-sync set).
//
// Plain values and pure functions: thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/error.hpp>

#include "cluster/coord.hpp"
#include "cluster/shard_map.hpp"

namespace conveyor::kv::cluster {

std::string controller_key(std::string_view cluster_name);  // ".../controller"
std::string offsets_prefix(std::string_view cluster_name);  // ".../offsets/"

// What a replica publishes under offsets/<its id>, bound to its lease, each
// time its link to its primary goes up (link_up, synced false: its keyspace
// is about to be replaced by a snapshot), finishes its snapshot (link_up,
// synced, the snapshot's offset) or goes down (the offset it applied from
// that primary's stream, and whether its keyspace is whole: it was streaming,
// not in the middle of a snapshot).
struct offset_report {
  std::string shard;    // 40 hex
  std::string primary;  // 40 hex: the primary the offset counts in
  std::uint64_t offset = 0;
  bool link_up = false;
  bool synced = false;
  // The reporting process's boot_id (its registration's), stamped by
  // cluster_node: a report left on etcd by an earlier process of the same node
  // (its lease not yet expired) is not taken for the restarted one's, whose
  // keyspace starts empty.
  std::string boot;
  friend bool operator==(const offset_report&, const offset_report&) = default;
};
std::string to_json(const offset_report& r);
// Hostile input: exactly the fields above, ids and boot valid, at most 1 KiB.
result<offset_report> parse_offset_report(std::string_view text);

struct failover_decision {
  shard_map map;  // the next map (epoch + 1)
  // The primaries replaced. Those with no registration must still have none
  // when the map is written (a CAS condition: a primary that came back under
  // the same process, its lease renewed after a pause, is not deposed); one
  // registered by another process needs no condition (its process cannot
  // become the one the map named).
  std::vector<std::string> deposed;
  std::vector<std::string> promoted;  // one per deposed primary, same order
};

// Whether the map's primary of `sh` is alive: registered (in `live`) by the
// process the map made primary (the registration's boot_id is the shard's
// primary_boot, when the map records one). A registration under its id with
// another boot_id is the node restarted: it lost what it held (without an
// AOF, everything), so it is treated as gone.
bool primary_alive(const shard& sh,
                   const std::map<std::string, node_registration, std::less<>>& live) noexcept;

// The controller's rule. For each shard whose primary is not alive
// (primary_alive): the candidates are the live members of its isr (not the
// primary) whose report names this shard and primary, comes from the
// member's live process (boot) and has the keyspace whole. It waits (no change for that shard)
// while a live isr replica has no such report with the link down (its final offset), unless the
// shard is in `grace_over` (it waited long enough: then it chooses among the candidates, a link
// still up counting with its snapshot's offset). The chosen one (highest offset, then lowest id)
// becomes the primary (primary_boot: its registration's boot_id); the isr becomes it and the other
// live isr members; the old primary becomes a replica (not in sync: it catches up when it returns).
// A primary restarted under another boot whose shard has no in-sync replica keeps the shard: the
// map records its new boot (there is no more complete copy to promote).
// Also, a node of the map whose live registration gives other addresses (it restarted on another
// replication port) gets them. nullopt: nothing to change. `live`: the
// registrations by node id. The map must be valid; so is the result.
std::optional<failover_decision> decide_failover(
    const shard_map& m, const std::map<std::string, node_registration, std::less<>>& live,
    const std::map<std::string, offset_report, std::less<>>& reports,
    const std::set<std::string, std::less<>>& grace_over);

// A manual failover (`conveyor kv cluster failover`): the shard's primary
// replaced by `to` (a live isr member of it, registered with boot_id
// `to_boot`), epoch + 1, the old primary kept as a replica outside the isr.
// Errors name why not.
result<failover_decision> manual_failover(const shard_map& m, std::string_view shard_id,
                                          std::string_view to, std::string_view to_boot);

// A manual failover's request (`conveyor kv cluster failover`), put by the
// admin under handover/<shard id> on a lease of its own: {"to": "<node id>"}.
// Hostile input: exactly that field, a valid id, at most 1 KiB.
std::string handover_prefix(std::string_view cluster_name);  // ".../handover/"
std::string handover_request_json(std::string_view to);
result<std::string> parse_handover_request(std::string_view text);  // the `to` id

// The map with `replica` added to the isr of the shard whose primary is
// `primary` (epoch + 1), or nullopt when that is no longer so (another
// primary, not a replica of it, already in sync).
std::optional<shard_map> add_to_isr(const shard_map& m, std::string_view primary,
                                    std::string_view replica);

// The map with `replica` removed from the isr of the shard whose primary is
// `primary` (epoch + 1), or nullopt when that is no longer so (another
// primary, the replica not in its isr). The shrink (docs/KV-CLUSTER.md "The
// in-sync set's shrink"): the primary proposes it for a replica that has not
// acknowledged within its bound, and acknowledges without that replica only
// once it has the map this returns, read back from etcd.
std::optional<shard_map> remove_from_isr(const shard_map& m, std::string_view primary,
                                         std::string_view replica);

// A primary's change of its shard's isr (add: add_to_isr, else
// remove_from_isr), written to the config key of `cluster_name` by CAS on
// the mod_revision the map was read at: read, compute, put_if; a CAS that
// lost (the controller's failover, an address refresh, another change won
// on the same revision) computes again from the map as it is now, at most
// `attempts` times. The loser of a race with a failover finds that `primary`
// is no longer the primary (moot); a failover that lost to a shrink
// computes its candidates from the map without the replica.
//   written: the map changed (epoch: its new epoch);
//   moot:    nothing to change (no map, an invalid one, not this primary's
//            shard any more, the replica already in or out);
//   failed:  etcd did not answer or the map kept changing (error says
//            which): the caller tries again later, reading it afresh.
struct isr_change {
  enum class outcome : std::uint8_t { written, moot, failed };
  outcome result = outcome::moot;
  std::uint64_t epoch = 0;
  std::string error;
};
// Read the map of `cluster_name`, compute the next one, write it by CAS on
// the mod_revision read; a lost CAS computes again from the map as it is now,
// at most `attempts` times. `next`: the next map, or why there is nothing to
// change (moot, with that reason as the error). Every change of the map but
// the controller's failover and `create` goes through here.
isr_change rewrite_shard_map(
    coord& c, std::string_view cluster_name, int attempts,
    const std::function<std::expected<shard_map, std::string>(const shard_map&)>& next);

isr_change propose_isr_change(coord& c, std::string_view cluster_name, std::string_view primary,
                              std::string_view replica, bool add, int attempts = 3);

// The hand-over's CAS, written by the primary `primary` (process
// `primary_boot`) once it has fenced itself and `to` has acknowledged every
// record: manual_failover of its shard to `to`, with `to`'s boot read from its
// registration (`to` must be registered). read, compute, put_if, as
// propose_isr_change; moot when the map no longer names this process the
// primary or `to` is not an in-sync replica of its shard (error says why).
isr_change propose_handover(coord& c, std::string_view cluster_name, std::string_view primary,
                            std::string_view primary_boot, std::string_view to, int attempts = 3);

// Fencing. A node renews its lease by sending a keep-alive at `sent` (its
// monotonic clock, read before the request left); etcd restarts the lease's
// TTL when the request arrives, so the lease cannot expire before sent + ttl
// on etcd's clock. The node stops acknowledging and serving at
// sent + ttl - fence_margin(ttl): the margin covers the two clocks' rate
// difference (assumed under 1 %, NTP's slew is 0.05 %) and the time between
// the loop's check and a reply leaving (a loop iteration), with room.
std::chrono::milliseconds fence_margin(std::chrono::seconds ttl) noexcept;
std::chrono::steady_clock::time_point fence_deadline(std::chrono::steady_clock::time_point sent,
                                                     std::chrono::seconds ttl) noexcept;

}  // namespace conveyor::kv::cluster
