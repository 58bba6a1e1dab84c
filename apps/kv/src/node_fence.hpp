// conveyor::kv::node_fence — a cluster node's fence as its loop applies it
// (issue 35, docs/KV-CLUSTER.md "Failover and fencing"): the deadline of its
// lease (cluster_node's on_lease), unless a manual failover's hand-over holds
// the node fenced while the replica it promotes catches up and the map that
// promotes it is written.
//
//   node_fence f(exec, rdma.get());
//   f.lease(until);                          // each renewal (loop thread)
//   f.begin_handover(to, now + 5s);          // fenced from now on
//   if (f.handing_over() && role.replica_caught_up(f.to())) node.write_handover(...);
//   f.end_handover();                        // the lease's fence again
//
// Fenced means, everywhere at once: the executor serves no key and no write
// (-CLUSTERDOWN) and turns held replies into errors, the RDMA front end closes
// its connections and takes none, and the index header's valid_until word is
// 0, so one-sided readers stop trusting the store.
//
// Thread safety: loop thread only.
#pragma once

#include <chrono>
#include <string>

#include "commands.hpp"
#include "rdma_server.hpp"

namespace conveyor::kv {

class node_fence {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  node_fence(executor& exec, rdma_server* rdma) : exec_(exec), rdma_(rdma) {}

  // The lease vouches until `until` (time_point::min(): not at all).
  void lease(time_point until);
  // A hand-over to node `to` begins: fenced until end_handover; the
  // replica must catch up by `deadline`.
  void begin_handover(std::string to, time_point deadline);
  void end_handover();
  bool handing_over() const noexcept { return handing_over_; }
  const std::string& to() const noexcept { return to_; }
  time_point deadline() const noexcept { return deadline_; }
  // Whether the hand-over's CAS was asked for (then it ends only with its
  // outcome or a map that names another primary, never by the deadline).
  bool cas_asked() const noexcept { return cas_asked_; }
  void set_cas_asked() noexcept { cas_asked_ = true; }

 private:
  void apply();
  executor& exec_;
  rdma_server* rdma_;
  time_point lease_ = time_point::min();
  bool handing_over_ = false, cas_asked_ = false;
  std::string to_;
  time_point deadline_{};
};

// A steady-clock deadline as CLOCK_REALTIME milliseconds, for the index
// header's valid_until word (one-sided readers compare it with their own
// clock); 0 for none (time_point::min(): fenced).
std::int64_t realtime_ms_at(std::chrono::steady_clock::time_point until);

}  // namespace conveyor::kv
