// conveyor::kv::resp_server::impl — the TCP front end's state (resp_server.hpp
// states its bounds), private to its sources:
//   resp_server.cpp      listening and accepting (maxclients, protected mode,
//                        out of descriptors), the loop's events, its
//                        per-iteration sends and closes, and its timers;
//   resp_connection.cpp  one connection: reads, sends, the output pause, its
//                        buffers and the budget all clients share, closing;
//   resp_pipeline.cpp    running a client's commands in order: the output
//                        pause, CLIENT PAUSE's held commands, BLPOP/BRPOP's
//                        parked clients;
//   resp_sync.cpp        replies held until the writes before them are
//                        replicated (sync_point, repl/primary.hpp);
//   resp_hooks.cpp       what the commands ask of the front end
//                        (front_end_hooks): pub/sub and MONITOR delivery and
//                        their output limits, CLIENT LIST, CLIENT KILL.
// Thread safety: loop thread only.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "commands.hpp"
#include "resp.hpp"
#include "resp_server.hpp"
#include "server_loop.hpp"

namespace conveyor::kv {

struct resp_server::impl {
  using clock = std::chrono::steady_clock;

  struct client {
    int fd = -1;
    session sess;
    request_parser parser;
    std::string out;
    std::size_t out_pos = 0;
    clock::time_point last_active;
    clock::time_point partial_since;
    bool partial = false;
    bool reading = true;            // EPOLLIN wanted
    bool want_out = false;          // EPOLLOUT wanted
    bool closing = false;           // close once the output is sent
    bool pending = false;           // in the pending-write list
    bool paused = false;            // complete commands held back by the output bound
    std::vector<std::string> held;  // a command held back by CLIENT PAUSE
    clock::time_point soft_since;   // pubsub: above the soft output limit since then
    bool over_soft = false;
    std::size_t mem = 0;  // buffer bytes counted in impl::client_mem
    // Parked by BLPOP/BRPOP (executor::blocking()): the command runs again when a
    // key it waits on is pushed to; the pipeline after it waits.
    bool blocked = false;
    std::vector<std::string> blocked_argv;
    // Synchronous replication (resp_sync.cpp): the output from `at` (counted
    // in every byte ever put in `out`, out_base being out[0]'s) waits until
    // the records up to `need` are acknowledged, or its deadline passes.
    struct gate {
      std::uint64_t at = 0, need = 0;
      clock::time_point deadline;
    };
    std::deque<gate> gates;
    std::uint64_t out_base = 0;
    explicit client(const parser_limits& l) : parser(l) {}
    std::size_t unsent() const { return out.size() - out_pos; }
  };

  server_loop& loop;
  executor& exec;
  // The executor's AOF (set once it is open: the ports are bound before the replay).
  aof* log() { return exec.log_file(); }
  resp_server_options opts;
  int listen_fd = -1;
  std::uint16_t bound_port = 0;
  std::unordered_map<std::uint64_t, std::unique_ptr<client>> clients;
  std::vector<std::uint64_t> pending;
  std::vector<std::uint64_t>
      doomed;                     // closed at the next before_wait (killed, over a pubsub limit)
  std::set<std::uint64_t> held;   // clients with a command held by CLIENT PAUSE
  std::set<std::uint64_t> gated;  // clients with replies waiting for replication
  std::vector<std::string_view> argv;
  // The client whose command is executing (0: none). A long script serves the
  // other clients from inside it (server_loop::serve_ready_now): this one is
  // neither read, sent to nor closed until its command returns, and commands
  // run meanwhile parse into their own argv.
  std::uint64_t running = 0;
  std::size_t client_mem = 0;  // every client's query and output buffers
  // Kept open so that a connection arriving while the process is out of file
  // descriptors can still be accepted, told why, and closed.
  int spare_fd = -1;
  bool accept_paused = false;
  clock::time_point accept_resume;
  bool serving_blocked = false;  // inside serve_blocked: a nested call leaves it to the outer
  // What listen() gave the loop (before_wait, timers): cancelled by ~resp_server,
  // so a loop that outlives this server never calls into it.
  std::vector<server_loop::callback_id> loop_callbacks;

  impl(server_loop& l, executor& e, const resp_server_options& o) : loop(l), exec(e), opts(o) {}

  // ---- accepting and the loop's events (resp_server.cpp) ----------------------
  int accept_one(sockaddr_storage* peer_out = nullptr);
  bool refuse_without_fds();
  void on_accept();
  void on_client(std::uint64_t id, unsigned events);
  void before_wait();
  void sweep();

  // ---- one connection (resp_connection.cpp) -----------------------------------
  void close_client(std::uint64_t id);
  void account(client& c);
  bool enforce_client_memory(std::uint64_t self);
  void update_events(client& c);
  void mark_pending(std::uint64_t id, client& c);
  bool send(std::uint64_t id, client& c);
  bool on_readable(std::uint64_t id, client& c);

  // ---- running commands (resp_pipeline.cpp) -----------------------------------
  void process(client& c);
  void run(client& c, std::span<const std::string_view> command);
  void park(client& c, std::span<const std::string_view> command);
  void unpark(client& c);
  void serve_blocked();
  void expire_blocked();
  void resume_held();

  // ---- replies held for replication (resp_sync.cpp) ----------------------------
  void gate(client& c, std::size_t start);
  std::size_t sendable(client& c);
  void replicated();

  // ---- what the commands ask of the front end (resp_hooks.cpp) ----------------
  void deliver(std::uint64_t id, std::string_view bytes);
  bool over_output_limit(client& c, clock::time_point now);
  void doom(std::uint64_t id, client& c);
  void list_clients(std::string& out, std::uint64_t only);
  std::size_t kill(const std::function<bool(const session&)>& match);
};

}  // namespace conveyor::kv
