// conveyor::kv::serve — the whole server: opens the device, creates the store,
// replays the AOF, and runs the RESP front end (and the RDMA one) on one loop
// until SIGINT/SIGTERM. `conveyor kv serve` is a command line around it.
#pragma once

#include <conveyor/conveyor.hpp>

#include <functional>
#include <memory>
#include <string>

#include "aof.hpp"
#include "commands.hpp"
#include "resp_server.hpp"
#include "store.hpp"

namespace conveyor::kv {

struct serve_options {
  server_config cfg;  // port, bind, requirepass, appendonly, ...
  fsync_policy fsync = fsync_policy::everysec;
  store_options store;            // data_bytes, maxmemory, policy
  std::string provider = "soft";  // the device the store's memory is registered with
  std::string rdma_listen;        // the RDMA front end's address (empty: none)
  unsigned partial_timeout_s = 10;
  bool aof_skip_bad_records = false;  // replay skips records the store refuses (aof.hpp)
  // Query and output buffers of all RESP clients together (0: no bound); past
  // it the client holding the most is closed (Redis's maxmemory-clients).
  std::size_t maxmemory_clients = std::size_t{1} << 30;
  bool quiet = false;  // no start-up lines on stderr
  // Called on the loop thread once the server is listening (tests and the RDMA
  // front end hook in here); the loop can be stopped from any thread through it.
  std::function<void(class server_loop&, executor&, resp_server&)> on_ready;
};

using store_factory =
    std::function<result<std::unique_ptr<store>>(protection_domain& pd, const store_options& opts)>;

// Returns the process exit status: 0 after a signal, 1 if the server could not
// start (the reason on stderr). maxclients is fitted to the open-file limit at
// start: the soft limit is raised to maxclients + the server's own descriptors
// if the hard limit allows, else maxclients is lowered to fit (one line says so).
// A requirepass longer than the RDMA hello carries (layout::max_password) is
// refused, so that RESP and RDMA clients accept the same passwords.
int serve(const serve_options& opts, const store_factory& make_store);

}  // namespace conveyor::kv
