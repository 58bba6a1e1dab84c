// conveyor::kv::executor — runs one Redis command (argv) against the store and
// appends the RESP reply to `out`. Both front ends use it: resp_server for TCP
// clients, rdma_server for the RDMA write RPCs (whose requests and replies are
// RESP too), so both paths have one meaning and one AOF. Loop thread only.
//
// Every change is logged to the AOF (when there is one) as the command that
// redoes it with absolute expiry times (aof.hpp); the caller flushes the AOF
// before sending the replies (resp_server does it once per loop iteration).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blocking.hpp"
#include "glob.hpp"  // KEYS, SCAN MATCH and CONFIG GET match with it

namespace conveyor::kv {

class store;
class aof;

struct session {
  std::uint64_t id = 0;
  std::string name;  // CLIENT SETNAME
  bool authenticated = false;
  int resp = 2;                    // HELLO 3 switches to RESP3
  bool close_after_reply = false;  // QUIT
  // The largest reply one command may build, in bytes (the front end sets it:
  // what is left of the RESP client's output limit, the RDMA message size). A
  // command whose reply would pass it is abandoned as it is built and answers
  // "-ERR reply exceeds ..." instead; a command with side effects checks before
  // it changes anything.
  std::size_t max_reply = static_cast<std::size_t>(-1);
  // Blocking commands (BLPOP, BRPOP). The front end sets may_block when it can
  // park the client (resp_server; an RDMA RPC cannot wait: there the command
  // answers as on a timeout). A command that must wait writes no reply and
  // sets `blocked`, the keys it waits on and its deadline (ms since the epoch,
  // 0: none); the front end registers it (executor::blocking()) and runs the
  // same command again when a key is signalled, until it replies.
  bool may_block = false;
  bool blocked = false;
  std::vector<std::string> block_keys;
  std::int64_t block_deadline = 0;
};

struct server_config {
  std::string requirepass;  // empty: no AUTH needed, on either path
  // What CONFIG GET and INFO report (the server applies them; the executor only answers).
  std::string bind = "127.0.0.1";
  std::uint16_t port = 7379;
  std::string dir = ".";
  bool appendonly = false;
  std::string appendfilename = "appendonly.aof";
  std::string appendfsync = "everysec";
  std::size_t maxmemory = 0;
  std::string maxmemory_policy = "noeviction";
  std::size_t maxclients = 10000;
  unsigned timeout_s = 0;  // idle clients closed after this (0: never)
};

// Counters that INFO reports. The front ends fill theirs; the RDMA side sets the
// hooks (a function, so its counters stay its own).
struct server_stats {
  std::uint64_t commands = 0, hits = 0, misses = 0;
  std::uint64_t connections_total = 0, connections_current = 0, rejected_connections = 0;
  std::uint64_t protocol_errors = 0, timed_out_clients = 0, output_limit_closes = 0;
  std::uint64_t evicted_clients = 0;  // closed by the clients' memory bound (maxmemory-clients)
  std::uint64_t net_input_bytes = 0, net_output_bytes = 0;
  std::function<std::uint64_t()> one_sided_gets;  // GETs served by one-sided READs
  std::function<std::uint64_t()> rdma_clients;    // connected RDMA clients
  std::function<void(std::string& info)>
      rdma_info;  // appends "key:value\r\n" lines to INFO's rdma section
};

class executor {
 public:
  executor(store& s, aof* log, const server_config& cfg);
  void execute(session& sess, std::span<const std::string_view> argv, std::string& out);
  // AOF replay: applies one logged command without logging it again. False with
  // `why` if the command fails (a log the server did not write). A logged
  // expiry time already past is a deletion. Only before the front ends start:
  // replaced items are freed at once (no reader can hold them yet).
  bool replay(std::span<const std::string_view> argv, std::string& why);

  server_stats& stats() noexcept { return stats_; }
  store& data() noexcept { return store_; }
  const server_config& config() const noexcept { return cfg_; }
  std::uint64_t next_client_id() noexcept { return ++last_client_id_; }
  aof* log_file() noexcept { return aof_; }
  std::int64_t started_ms() const noexcept { return start_ms_; }
  blocking_registry& blocking() noexcept { return blocking_; }

  struct command;  // the table (commands.cpp)

 private:
  void log(std::span<const std::string_view> argv);

  store& store_;
  aof* aof_;
  const server_config& cfg_;
  server_stats stats_;
  std::uint64_t last_client_id_ = 0;
  bool replaying_ = false;
  std::int64_t start_ms_ = 0;
  blocking_registry blocking_;
  friend struct exec_context;
};

// Compares a presented password with the configured one in time that depends
// only on the presented one's length (AUTH, HELLO AUTH and the RDMA hello).
bool password_equal(std::string_view want, std::string_view presented) noexcept;

}  // namespace conveyor::kv
