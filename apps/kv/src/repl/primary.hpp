// conveyor::kv::repl::primary — the primary's side of synchronous replication
// (issue 35, docs/KV-CLUSTER.md): a Conveyor listener its replicas connect to,
// the stream of every write's records with its offset, a full snapshot for a
// replica that (re)joins, and the acknowledged offset that the front ends
// wait for before they release replies (sync_point, commands.hpp).
//
//   auto p = primary::start(dev, pd, loop, exec, {.address = "10.0.0.1:0"}).value();
//   exec.set_replication(p.get(), &p->sync());     // every record is streamed too
//   p->set_shard(shard_id, {replica ids}, {in-sync replica ids});  // from the map
//
// An acceptor thread takes connection requests: a request whose private data
// is not a replica hello (wire.hpp) is rejected; at most max_links are
// connected at a time. The loop thread adopts a link only when the hello names
// a replica of this node's shard (else it is closed), snapshots the keyspace
// into the link (the AOF rewrite form: memory for one copy of the data,
// written on the loop thread) and sends it, then the stream from the offset
// the snapshot was taken at. Every message a replica sends is checked
// (wire.hpp's decode, then: acks only grow and never pass what was sent); a
// link that breaks a rule, fails, or falls more than max_lag bytes behind is
// closed and logged; the replica reconnects and starts over from a snapshot.
// The stream's bytes are kept until every link has sent them (and at most
// max_lag of them).
//
// A replica of the shard outside the map's isr whose link finished its
// snapshot joins the in-sync set here at once (acked stops growing until it
// reaches it); once its ack reaches acked, it holds every acknowledged write,
// and on_join asks for the map to say so. The in-sync set is the map's isr
// and these, until the node stops being the shard's primary.
//
// A member of the map's isr that stops acknowledging (dead, its link down,
// stopped, or slow) for the isr lag bound is asked out of the map's isr
// (on_leave) and its links are closed; acked moves on without it only once
// set_shard gives a map without it. It then comes back as any replica outside
// the isr does (a snapshot, then on_join).
//
// `acked` is the least offset that every replica in the in-sync set (the
// map's isr, less this node) has acknowledged, over its current link after
// its snapshot; it never goes back. With no in-sync replica it is the offset.
//
// Thread safety: start, the destructor and everything else on the loop
// thread (the destructor with the loop not running or from inside it).
#pragma once

#include <conveyor/conveyor.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"

namespace conveyor::kv {
class server_loop;
}

namespace conveyor::kv::repl {

struct primary_options {
  // The listener's address in the provider's syntax ("ip:port", port 0: any;
  // shm "@name"); empty: one the provider picks.
  std::string address;
  std::uint64_t max_lag = 64u << 20;  // stream bytes a link may be behind
  std::uint32_t max_links = 32;
  std::int64_t ack_timeout_ms = 5000;           // sync_point::timeout_ms
  std::function<void(const std::string&)> log;  // one line; null: silent
  // A replica outside the map's isr caught up (holds every acknowledged
  // write, and every reply from now on waits for it too): ask for it to be
  // added to the map's isr (cluster_node::request_isr_add). Loop thread.
  std::function<void(const std::string& node_id)> on_join;
  // The shrink (docs/KV-CLUSTER.md "The in-sync set's shrink"): a member of
  // the map's isr that has had no caught-up link, or has left stream bytes
  // unacknowledged, for isr_lag_ms (0: ack_timeout_ms / 2) has its links
  // closed and on_leave asks for it to be removed from the map's isr
  // (cluster_node::request_isr_remove). Replies keep waiting for it until the
  // map without it is delivered (set_shard). Not while the node is fenced.
  // Loop thread.
  std::int64_t isr_lag_ms = 0;
  std::function<void(const std::string& node_id)> on_leave;
};

class primary final : public record_sink {
 public:
  static result<std::unique_ptr<primary>> start(device& dev, protection_domain& pd,
                                                server_loop& loop, executor& exec,
                                                primary_options opts);
  ~primary() override;
  primary(const primary&) = delete;
  primary& operator=(const primary&) = delete;

  // record_sink: a record of the stream (the executor calls it with each).
  void append(std::span<const std::string_view> argv) override;
  // The offset and the acknowledged offset the front ends wait on.
  sync_point& sync() noexcept;
  // Whether `node_id` has a caught-up link that acknowledged every stream
  // byte so far (the manual failover's hand-over waits for it).
  bool caught_up_fully(std::string_view node_id) const;
  std::string address() const;
  // From the shard map: this node's shard, its replicas (who may connect) and
  // the in-sync ones (whose acks a reply waits for). A link of a node no
  // longer a replica is closed.
  // resp: each replica's RESP address (INFO's slaveN ip and port; a replica
  // not in it is shown with its link's address).
  void set_shard(std::string shard_id, std::vector<std::string> replicas,
                 std::vector<std::string> in_sync,
                 std::map<std::string, std::string, std::less<>> resp = {});
  // INFO's # Replication lines as a master (role, connected_slaves, slaveN, offsets).
  void info(std::string& out, const std::string& replid) const;

  struct impl;

 private:
  explicit primary(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

}  // namespace conveyor::kv::repl
