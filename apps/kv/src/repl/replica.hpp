// conveyor::kv::repl::replica — a replica's side of synchronous replication
// (issue 35, docs/KV-CLUSTER.md): one link to its shard's primary over
// Conveyor, the snapshot applied then the stream, each record in order, and
// the applied offset acknowledged.
//
//   auto r = replica::start(dev, pd, loop, exec, {.primary = "10.0.0.1:27001", ...});
//
// A thread connects (and, after a failure, connects again every 500 ms) with
// the hello (wire.hpp) and hands the connected link to the loop thread, which
// alone touches the store. Every message from the primary is copied once out
// of its receive buffer and checked once (wire.hpp's decode, then the order:
// snap_begin, snap_data..., snap_end, then stream messages whose offsets
// follow each other exactly); the records are parsed by the RESP parser with
// the store's bounds; MULTI ... EXEC blocks are applied whole when their EXEC
// arrives (bounded like a client's MULTI). A message that breaks a rule, a
// record the store refuses, or a failed link closes the link with a log line
// naming why; the replica connects again and starts over from a snapshot
// (snap_begin empties its keyspace).
//
// Thread safety: start, the destructor and info() on the loop thread.
#pragma once

#include <conveyor/conveyor.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "commands.hpp"
#include "resp.hpp"

namespace conveyor::kv {
class server_loop;
}

namespace conveyor::kv::repl {

struct replica_options {
  std::string primary;       // the primary's replication listener, host:port (or shm @name)
  std::string primary_resp;  // its RESP address (INFO's master_host, master_port)
  std::string node_id, shard_id;
  std::string password;  // presented to the primary: the cluster's requirepass
  parser_limits limits;  // the records' bounds (the store's key and value sizes)
  std::size_t max_block_bytes = std::size_t{512} << 20;  // one MULTI ... EXEC block
  // Also how long a map change that ends this link can wait for an attempt
  // in flight (the destructor joins the connector): a promotion waits on it.
  std::chrono::milliseconds connect_timeout{500};
  // A link that brings nothing for this long is closed (the primary pings
  // each second): a hung primary (SIGSTOP) breaks its replicas' links, so
  // they report their offsets (on_link) for the controller's failover.
  std::chrono::milliseconds silence_timeout{2000};
  // The link went up (offset 0, synced false: a snapshot replaces the
  // keyspace next), finished its snapshot (up, the snapshot's offset, synced)
  // or went down (the offset applied from this primary's stream, and whether
  // the keyspace is whole: streaming, not inside a snapshot).
  // Loop thread. Null: none.
  std::function<void(bool up, std::uint64_t offset, bool synced)> on_link;
  // After each connection is made, before the link is used (connector
  // thread): the link is adopted (and the primary's snapshot, which empties
  // the keyspace, applied) only when this returns true, i.e. once the
  // controller can no longer take this node for a replica with a whole
  // keyspace (cluster_node's publish_offset of a "link up, not synced" report
  // has reached etcd); a report from before it (synced, at a high offset)
  // would otherwise let a failover promote the half-filled replica. False:
  // the connection is dropped, the link's last down report made again (the
  // keyspace is as it was), and the next attempt comes 500 ms later. Asked
  // only with a live primary on the line, so a replica whose primary died
  // keeps reporting its final offset. Bounded by the callee. Null: always.
  std::function<bool()> before_link;
  std::function<void(const std::string&)> log;  // one line; null: silent
};

class replica {
 public:
  static result<std::unique_ptr<replica>> start(device& dev, protection_domain& pd,
                                                server_loop& loop, executor& exec,
                                                replica_options opts);
  ~replica();
  replica(const replica&) = delete;
  replica& operator=(const replica&) = delete;

  const replica_options& options() const noexcept;
  // INFO's # Replication lines as a slave (master_host, master_port,
  // master_link_status, slave_repl_offset...).
  void info(std::string& out) const;

  struct impl;

 private:
  explicit replica(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

}  // namespace conveyor::kv::repl
