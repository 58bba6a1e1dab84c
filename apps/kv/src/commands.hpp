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
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blocking.hpp"
#include "glob.hpp"  // KEYS, SCAN MATCH and CONFIG GET match with it

namespace conveyor::kv {

namespace cluster {
struct cluster_view;
}

class store;
class aof;
class pubsub;

// Where the executor's change records go besides the AOF: a primary's
// replication stream (repl/primary.hpp). The same records, in the same order.
class record_sink {
 public:
  virtual ~record_sink() = default;
  virtual void append(std::span<const std::string_view> argv) = 0;
};
class scripting;

// Where a primary's replication stands, for the front ends that hold replies
// until it is safe to send them (repl/primary.hpp fills it; loop thread).
struct sync_point {
  std::uint64_t offset = 0;  // bytes of records written so far (master_repl_offset)
  std::uint64_t acked = 0;   // every in-sync replica has applied the records before this
  // How long a reply waits for `acked`; past it the reply is an error.
  std::int64_t timeout_ms = 5000;
  // The front end's: called when `acked` moves (and from the primary's timer).
  std::function<void()> on_advance;
  // The in-sync set's size (the primary's): WAIT's answer.
  std::function<std::size_t()> in_sync;
  bool waiting() const noexcept { return acked < offset; }
};

struct session {
  std::uint64_t id = 0;
  std::string name;  // CLIENT SETNAME
  bool authenticated = false;
  int resp = 2;                    // HELLO 3 switches to RESP3
  bool close_after_reply = false;  // QUIT
  bool readonly = false;           // READONLY: reads of a replica's slots run on it
  // The largest reply one command may build, in bytes (the front end sets it:
  // what is left of the RESP client's output limit, the RDMA message size). A
  // command whose reply would pass it is abandoned as it is built and answers
  // "-ERR reply exceeds ..." instead; a command with side effects checks before
  // it changes anything.
  std::size_t max_reply = static_cast<std::size_t>(-1);

  // MULTI/EXEC/WATCH (transaction_commands.cpp).
  bool in_multi = false;      // between MULTI and EXEC/DISCARD: commands are queued
  bool multi_failed = false;  // a command was refused while queueing: EXEC aborts
  std::vector<std::vector<std::string>> queued;
  std::size_t queued_bytes = 0;
  std::vector<std::pair<std::string, std::uint64_t>> watched;  // key, store::key_version at WATCH
  std::size_t watched_bytes = 0;
  // Pub/sub (pubsub.cpp) and MONITOR: what this connection listens to.
  std::set<std::string, std::less<>> channels, patterns;
  bool monitor = false;
  // CLIENT LIST / INFO (the front end fills them).
  std::string addr, laddr;
  std::int64_t created_ms = 0;
  std::string last_command;
  bool resp_client = false;  // a RESP connection: can receive pushes (pub/sub, MONITOR)
  bool shutdown = false;     // SHUTDOWN: the front end stops the server after this reply
  // The session a script's redis.call runs commands in (script.hpp): it is
  // never answered -BUSY, and a command that would block must answer as if
  // its timeout had passed (Redis: scripts never block).
  bool script = false;
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
  // MULTI: what one client may queue (past either bound the command is refused
  // and EXEC answers EXECABORT), and the keys it may WATCH.
  std::size_t multi_max_commands = 100000;
  std::size_t multi_max_bytes = std::size_t{512} << 20;
  std::size_t watch_max_keys = 100000;
  // Pub/sub: channels and patterns one client may hold, and their longest name
  // (a pattern is compiled: about 70 bytes per element).
  std::size_t pubsub_max_subscriptions = 100000;
  std::size_t pubsub_max_name = 64u << 10;
  // CONFIG SET-able (config in admin_commands.cpp).
  bool protected_mode = true;
  std::int64_t slowlog_log_slower_than = 10000;  // microseconds; < 0: never
  std::size_t slowlog_max_len = 128;
  // client-output-buffer-limit pubsub: hard, soft bytes and soft seconds.
  std::size_t pubsub_hard = std::size_t{32} << 20, pubsub_soft = std::size_t{8} << 20;
  unsigned pubsub_soft_s = 60;
  std::string run_id;  // 40 hex characters, fresh each start (INFO server)
  // Scripts (script.hpp): past this a running script serves the other
  // clients with -BUSY and can be killed (Redis's busy-reply-threshold, alias
  // lua-time-limit); the Lua state's memory bound (lua-maxmemory).
  std::uint64_t busy_reply_threshold_ms = 5000;
  std::size_t lua_memory = std::size_t{128} << 20;
  // Cluster mode (issue 35, docs/KV-CLUSTER.md): commands with keys are routed
  // (cluster/routing.hpp) and CLUSTER answers; the id is the node's.
  bool cluster_enabled = false;
  std::string cluster_my_id;
  std::string cluster_address;  // host:port this node announces
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
  // CONFIG SET requirepass reaches the RDMA front end's handshake through this
  // (empty: no RDMA front end); false: it refused the password (too long).
  std::function<bool(std::string_view)> rdma_requirepass;
  std::function<void(std::string& info)>
      rdma_info;  // appends "key:value\r\n" lines to INFO's rdma section
  // INFO's # Replication lines (Redis's field names); empty: a lone master's.
  std::function<void(std::string& info)> replication_info;
  std::uint64_t watch_aborts = 0, exec_aborts = 0;  // EXEC: null (WATCH), EXECABORT
  std::uint64_t slow_commands = 0;
};

// Per command: calls and time (INFO commandstats), by the table's index.
struct command_stat {
  std::uint64_t calls = 0, usec = 0, rejected = 0, failed = 0;
};

// What only the front end knows of a connection, for its CLIENT LIST line.
struct client_io {
  int fd = -1;
  std::size_t qbuf = 0, omem = 0;
  std::int64_t idle_s = 0;
};
// One CLIENT LIST line (Redis 7's fields), newline-terminated.
void client_line(std::string& out, const session& s, const client_io& io, std::int64_t now_ms);

struct slowlog_entry {
  std::uint64_t id;
  std::int64_t at_s;
  std::int64_t usec;
  std::vector<std::string> argv;  // at most 32 arguments of 128 bytes (Redis's)
  std::string addr, name;
};

// What the connection-level commands ask of the RESP front end (resp_server
// sets them; without one, CLIENT LIST is empty and SUBSCRIBE has no reader).
struct front_end_hooks {
  // Appends bytes to a client's output (pub/sub messages, MONITOR lines); the
  // front end enforces the client's output bounds.
  std::function<void(std::uint64_t id, std::string_view bytes)> deliver;
  // CLIENT LIST lines (client_line), of every client or (only != 0) of one.
  std::function<void(std::string& out, std::uint64_t only)> list_clients;
  // CLIENT KILL: closes the clients `match` accepts (never the caller when
  // skipme); returns how many.
  std::function<std::size_t(const std::function<bool(const session&)>& match)> kill;
  std::function<void()> shutdown;  // stops the server's loop
  std::function<std::size_t()> blocked_clients;
};

class executor {
 public:
  executor(store& s, aof* log, server_config& cfg);
  ~executor();
  void execute(session& sess, std::span<const std::string_view> argv, std::string& out);
  // AOF replay: applies one logged command without logging it again. False with
  // `why` if the command fails (a log the server did not write). A logged
  // expiry time already past is a deletion. Only before the front ends start:
  // replaced items are freed at once (no reader can hold them yet).
  bool replay(std::span<const std::string_view> argv, std::string& why);

  server_stats& stats() noexcept { return stats_; }
  store& data() noexcept { return store_; }
  const server_config& config() const noexcept { return cfg_; }
  server_config& config() noexcept { return cfg_; }
  front_end_hooks& hooks() noexcept { return hooks_; }
  pubsub& channels() noexcept { return *pubsub_; }
  std::vector<command_stat>& command_stats() noexcept { return command_stats_; }
  std::vector<slowlog_entry>& slowlog() noexcept { return slowlog_; }
  std::uint64_t& slowlog_next_id() noexcept { return slowlog_next_id_; }
  // CLIENT PAUSE: until this time (ms) no command (writes_only: no write
  // command) runs; the front end holds them back.
  void pause(std::int64_t until_ms, bool writes_only) noexcept;
  bool paused_for(const session& sess, std::span<const std::string_view> argv,
                  std::int64_t now) const;
  // The client ended (the front end calls it): its subscriptions go.
  void forget(session& sess);
  // Applies the queued commands of EXEC (transaction_commands.cpp); the AOF
  // gets them between MULTI and EXEC records.
  void run_queued(session& sess, std::string& out);
  std::uint64_t next_client_id() noexcept { return ++last_client_id_; }
  aof* log_file() noexcept { return aof_; }
  void set_log(aof* log) noexcept { aof_ = log; }  // once the AOF is open
  // A primary's replication stream (null: none). Loop thread.
  void set_replication(record_sink* s, sync_point* sp) noexcept {
    repl_ = s;
    sync_ = sp;
  }
  sync_point* sync() noexcept { return sync_; }
  // This node is a replica in the map: writes are refused (-READONLY), reads
  // of its shard's slots run with READONLY.
  bool is_replica() const noexcept;
  // A replica applies its primary's records: as replay(), but the front ends
  // are up, so what a record replaces goes through the grace time of
  // one-sided readers (no reclaim_all) and nothing is logged.
  bool apply_replicated(std::span<const std::string_view> argv, std::string& why);
  // INFO's instantaneous_ops_per_sec: commands per second over the last 16
  // samples, taken every 100 ms by the server (Redis's method).
  void sample_ops(std::int64_t now_ms) noexcept;
  std::uint64_t ops_per_sec() const noexcept;
  std::int64_t started_ms() const noexcept { return start_ms_; }
  blocking_registry& blocking() noexcept { return blocking_; }
  // Cluster mode: the shard map this node acts on (null: none yet). Set on
  // the loop thread (the node's etcd thread posts each new view).
  void set_cluster(std::shared_ptr<const cluster::cluster_view> v) noexcept {
    cluster_ = std::move(v);
  }
  const cluster::cluster_view* cluster() const noexcept { return cluster_.get(); }
  // Cluster mode's fencing (cluster/controller.hpp): until this time (the
  // loop's steady clock) the node's lease in etcd is known to hold; past it
  // the node serves no key and no write (-CLUSTERDOWN) and its front ends
  // release no held reply. Starts unfenced (tests of the executor alone); the
  // server sets it to the past before it joins, so that nothing is served
  // before the first lease. Loop thread.
  void set_fence(std::chrono::steady_clock::time_point until) noexcept { fence_until_ = until; }
  bool fenced() const noexcept {
    return cfg_.cluster_enabled && std::chrono::steady_clock::now() >= fence_until_;
  }
  // "" when this node serves the command's keys (or cluster mode is off);
  // otherwise the error to answer (MOVED, CROSSSLOT, CLUSTERDOWN). For EXEC,
  // the keys of every queued command together, as Redis checks them.
  std::string route(const session& sess, std::span<const std::string_view> argv) const;
  struct command;  // the table (commands.cpp)
  std::string route(const session& sess, const command& k,
                    std::span<const std::string_view> argv) const;

  // The table's entry for a command name (any case); null if there is none.
  static const command* find(std::string_view name);
  // EVAL, EVALSHA, SCRIPT and the busy state of a long script (script.hpp).
  scripting& scripts() noexcept { return *scripts_; }
  // A script's writes when it ends (scripting captures them while it runs):
  // more than one is logged between MULTI and EXEC records, the same block
  // EXEC writes and the AOF loader applies whole or not at all (aof.hpp). A
  // script run by EXEC adds no block of its own: its records are part of the
  // transaction's.
  void log_effects(const std::vector<std::vector<std::string>>& records);
  // SHUTDOWN, and SHUTDOWN NOSAVE while a script is busy (abandon_exec): the
  // AOF written and synced, then the front end's shutdown hook. False if there
  // is no hook. abandon_exec: an EXEC running the abandoned script runs
  // nothing more of its queue and writes no EXEC record, so the loader cuts
  // its block and none of it replays (as if the process had died there).
  bool shutdown_server(bool abandon_exec = false);

 private:
  void log(std::span<const std::string_view> argv);
  void emit(std::span<const std::string_view> argv);  // to the AOF and the replication stream
  bool run_record(std::span<const std::string_view> argv, std::string& out, std::string& why,
                  std::string_view source);
  static bool replayed_ok(std::span<const std::string_view> argv, const std::string& out,
                          std::string& why);
  bool logging() const noexcept { return (aof_ != nullptr || repl_ != nullptr) && !replaying_; }

  store& store_;
  aof* aof_;
  record_sink* repl_ = nullptr;
  sync_point* sync_ = nullptr;
  server_config& cfg_;
  server_stats stats_;
  front_end_hooks hooks_;
  std::unique_ptr<pubsub> pubsub_;
  std::vector<command_stat> command_stats_;
  std::vector<slowlog_entry> slowlog_;
  std::uint64_t slowlog_next_id_ = 0;
  std::int64_t pause_until_ = 0;
  std::array<std::uint64_t, 16> ops_samples_{};
  std::size_t ops_index_ = 0;
  std::int64_t ops_last_ms_ = 0;
  std::uint64_t ops_last_commands_ = 0;
  bool pause_writes_only_ = false;
  bool in_exec_ = false, exec_logged_ = false;  // EXEC: MULTI written before its first record
  std::uint64_t last_client_id_ = 0;
  bool replaying_ = false;
  std::int64_t start_ms_ = 0;
  std::unique_ptr<scripting> scripts_;
  bool abandon_exec_ = false;
  blocking_registry blocking_;
  std::shared_ptr<const cluster::cluster_view> cluster_;
  std::chrono::steady_clock::time_point fence_until_ = std::chrono::steady_clock::time_point::max();
  mutable std::vector<std::string_view>
      route_keys_;  // route()'s scratch: no allocation per command
  friend struct exec_context;
};

// Compares a presented password with the configured one in time that depends
// only on the presented one's length (AUTH, HELLO AUTH and the RDMA hello).
bool password_equal(std::string_view want, std::string_view presented) noexcept;

}  // namespace conveyor::kv
