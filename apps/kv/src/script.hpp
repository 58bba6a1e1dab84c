// conveyor::kv::scripting — Lua 5.1 scripts: EVAL, EVALSHA, EVAL_RO,
// EVALSHA_RO and SCRIPT LOAD|EXISTS|FLUSH|KILL, with Redis 7's meanings.
//
// - A script runs whole on the loop thread (atomic: no other command runs in
//   between). redis.call/redis.pcall go through the same executor as RESP and
//   RDMA commands (commands.hpp), with Redis's conversions both ways
//   (script_lua.cpp).
// - Sandbox: no os, io, package, require, loadfile, dofile, load, loadstring,
//   getfenv/setfenv, rawset, print; the globals, redis, string, table and math
//   are read-only ("Attempt to modify a readonly table"), and reading a global
//   that does not exist is an error, as in Redis 7.
// - Bounds: the Lua state's memory (lua_memory, its allocator refuses past it:
//   the script fails "not enough memory", the server goes on), Lua's own stack
//   limits, the reply (the session's max_reply like any command), and time:
//   past busy_reply_threshold the count hook serves the other clients in a
//   restricted mode (serve_others) — they get -BUSY except for AUTH, HELLO,
//   QUIT, SCRIPT KILL (kills a script that has not written) and SHUTDOWN NOSAVE.
// - AOF: the write commands a script runs are logged at its end as one
//   MULTI ... EXEC block (Redis 7's effects replication; executor::log_effects),
//   the same block EXEC writes, so a replay of a cut log never applies part of
//   a script (the AOF loader cuts a block without its EXEC as a torn tail,
//   aof.hpp). A script run by EXEC is part of the transaction's block.
// - Redis 7's shebang line (#!lua flags=no-writes,...): no-writes makes the
//   script read-only; EVAL_RO refuses a shebang script without it.
// - The script cache: scripts loaded with SCRIPT LOAD stay until SCRIPT FLUSH;
//   those only EVAL'd are kept up to eval_cache_max, the oldest dropped first.
//
// Thread safety: loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

namespace conveyor::kv {

class executor;
class reply;
struct exec_context;

class scripting {
 public:
  explicit scripting(executor& ex);
  ~scripting();
  scripting(const scripting&) = delete;
  scripting& operator=(const scripting&) = delete;

  // EVAL/EVAL_RO (by_sha false) and EVALSHA/EVALSHA_RO; argv as the client sent it.
  void eval(exec_context& c, bool by_sha, bool read_only);
  // SCRIPT LOAD|EXISTS|FLUSH|KILL|HELP.
  void script(exec_context& c);

  // A script is running past busy_reply_threshold (other clients are answered
  // in the restricted mode).
  bool busy() const noexcept;
  // While busy, a command of another client: answers it and returns true
  // (-BUSY, SCRIPT KILL, SHUTDOWN NOSAVE), or returns false to let it run
  // (AUTH, HELLO, QUIT and the transaction commands, Redis's allow-busy set).
  bool answer_while_busy(std::span<const std::string_view> argv, reply& r);
  // While a script runs, executor::log hands its records here (true: taken);
  // they reach the AOF as one MULTI/EXEC block when the script ends.
  bool capture(std::span<const std::string_view> argv);

  // Set by the server: runs the loop's ready clients once, without waiting
  // (server_loop::serve_ready_now), from the script's count hook.
  std::function<void()> serve_others;
  // SHUTDOWN NOSAVE during a busy script abandons it (none of its writes
  // reach the AOF) and then runs SHUTDOWN's executor::shutdown_server.

  std::size_t cached() const noexcept;    // scripts in the cache
  std::size_t memory() const noexcept;    // bytes the Lua state holds
  std::uint64_t killed() const noexcept;  // scripts ended by SCRIPT KILL

  static constexpr std::size_t eval_cache_max = 500;  // Redis 7.4's bound

  struct state;  // script.cpp, script_lua.cpp

 private:
  std::unique_ptr<state> s_;
};

}  // namespace conveyor::kv
