// conveyor::kv::rdma_server — the RDMA front end. GETs need nothing from it
// once a client is connected: the client READs the store's exported regions
// (the device's engine serves them; no server thread runs). Writes are RPCs:
// the client SENDs a RESP array, the loop thread runs it through the handler
// (the executor) and SENDs the RESP reply.
//
// An acceptor thread takes connection requests, checks the password the client
// presents in its private data (layout::encode_hello), makes the QP and its
// buffers and hands the connection to the loop thread with post(). Each
// connection holds a bounded set of resources: rpc_slots receive buffers of
// max_message bytes, as many reply buffers, one CQ (its fd on the loop). A
// connection that fails (the client died, even mid-batch) is torn down on the
// loop thread and leaves nothing. Each connection's session carries
// max_reply = max_message, so the handler (the executor) bounds a reply as it
// builds it, and commands with side effects (GETDEL, GETSET, SET ... GET)
// refuse before changing anything when their reply could not be sent. The
// password in the hello is compared in constant time; start() refuses a
// requirepass longer than a hello carries (layout::max_password).
//
// Thread safety: construct and destroy on the thread that runs the loop, with
// the loop not running or from inside it; stats() from any thread.
#pragma once

#include <conveyor/conveyor.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "commands.hpp"

namespace conveyor::kv {

class store;
class server_loop;

struct rdma_server_options {
  // In the provider's syntax ("ip:port", port 0: any; shm "@name"); empty: an
  // ephemeral one the provider picks (listener::bind(dev): soft 127.0.0.1).
  std::string address;
  std::string requirepass;                 // empty: anyone may connect
  std::uint32_t rpc_slots = 4;             // outstanding RPCs per connection
  std::uint32_t max_message = 256u << 10;  // largest request and reply, bytes
  std::uint32_t max_connections = 64;
  // Bind now, accept only after start_accepting() (kv serve binds both ports
  // before it replays the AOF, and serves once the data is loaded).
  bool accept_later = false;
};

struct rdma_server_stats {
  std::uint64_t connections_current = 0, connections_total = 0, rejected = 0;
  std::uint64_t rpcs = 0, rpc_errors = 0;  // rpc_errors: malformed or oversized requests
};

// What the device served to one-sided READs of the store (INFO's conveyor
// section), from the QPs' counters (conveyor/qp.hpp, qp_counters): soft's
// engine counts every READ it answers; on shm a client that maps the regions
// reads them with its own loads, which no counter of this side sees; verbs QPs
// keep no counters (the NIC serves READs) and report zeros.
struct rdma_served {
  std::uint64_t reads_served = 0, read_bytes = 0;
};

// Runs one command on the loop thread: argv in, RESP reply appended to out. The
// handler makes the change durable before returning when the server promises it
// (appendfsync always): the reply is sent as soon as it returns.
using rpc_handler = std::function<void(session&, std::span<const std::string_view>, std::string&)>;

class rdma_server {
 public:
  // Binds the listener and starts the acceptor thread.
  static result<std::unique_ptr<rdma_server>> start(device& dev, protection_domain& pd, store& st,
                                                    server_loop& loop, rpc_handler handler,
                                                    const rdma_server_options& opts);
  virtual ~rdma_server() = default;  // stops the acceptor; closes every connection
  virtual std::string address() const = 0;
  virtual rdma_server_stats stats() const = 0;
  virtual void start_accepting() = 0;
  // CONFIG SET requirepass: connection requests from now on must present this
  // password (empty: none); connections already accepted stay, as in Redis.
  // Any thread; at most layout::max_password bytes (longer: false, unchanged).
  virtual bool set_requirepass(std::string_view pass) = 0;
  // Loop thread only.
  virtual rdma_served served() const = 0;
  // Synchronous replication (sync_point, commands.hpp; null: none): a reply
  // waits until every in-sync replica has acknowledged the records written
  // up to its request's execution, as a RESP reply does; past the sync
  // point's timeout it becomes -NOREPLICAS. replicated() (loop thread) sends
  // what may go now; the server calls it when the sync point moves.
  virtual void set_sync(sync_point* sp) = 0;
  virtual void replicated() = 0;
  // Cluster fencing (cluster/controller.hpp). set_fence: from `until` (the
  // steady clock) on, connection requests are refused (the acceptor checks
  // the clock itself, so none slips in before the loop notices); starts
  // unfenced. close_all: every connection closed, its QP disconnected
  // (one-sided READs fail from then on, held replies are never sent); the
  // server calls it when the fence falls. Loop thread.
  virtual void set_fence(std::chrono::steady_clock::time_point until) = 0;
  virtual void close_all() = 0;
};

// Parses one RESP array of bulk strings that fills `msg` exactly (the RPC request
// format); false if it is anything else. The views point into msg.
bool parse_rpc_request(std::string_view msg, std::vector<std::string_view>& argv,
                       std::size_t max_args);

}  // namespace conveyor::kv
