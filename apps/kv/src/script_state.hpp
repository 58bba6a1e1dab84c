// What script.cpp (the engine: state, sandbox, cache, running, time) and
// script_lua.cpp (the redis.* library and the conversions) share. Internal to
// scripting (script.hpp).
//
// Lua 5.1 reports errors with longjmp: a C function Lua may unwind through
// holds no object with a destructor (what outlives a call lives here), and no
// C++ exception crosses a Lua frame (they are caught where they arise).
#pragma once

#include <lua.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "commands.hpp"
#include "resp.hpp"
#include "script.hpp"

namespace conveyor::kv {

struct scripting::state {
  explicit state(executor& e) : ex(e) {}
  executor& ex;
  lua_State* L = nullptr;
  std::size_t used = 0;   // bytes the allocator has given Lua
  std::size_t limit = 0;  // and at most this (server_config::lua_memory)

  struct entry {
    std::string body;
    bool loaded = false;                      // by SCRIPT LOAD: kept until SCRIPT FLUSH
    bool shebang = false, no_writes = false;  // "#!lua flags=no-writes" (Redis 7)
    std::list<std::string>::iterator in_lru;  // EVAL-only scripts, oldest first
  };
  std::unordered_map<std::string, entry> cache;  // sha -> script
  std::list<std::string> eval_lru;
  int protected_ref = LUA_NOREF;  // registry: the set of read-only proxies (rawset refuses them)

  // The running script.
  bool running = false, busy = false, kill = false, wrote = false, read_only = false;
  bool shutdown_asked = false, serving = false;
  std::function<void()>* serve_others_fn = nullptr;  // scripting::serve_others
  std::chrono::steady_clock::time_point started;
  std::string sha;
  std::vector<std::string> keys,
      args;                   // copied: the request's buffer may move while others are served
  session call_sess;          // the session redis.call runs commands in
  std::size_t max_reply = 0;  // of the script's reply and of each call's
  std::vector<std::vector<std::string>> effects;  // write records, logged at the end
  std::uint64_t killed = 0;

  // redis.call's scratch (outlives a longjmp out of the call).
  std::vector<std::string> call_strs;
  std::vector<std::string_view> call_argv;
  std::string call_out;
  // What a C function wants raised once its C++ work is done.
  std::string pending_error;

  // The script's result as the client gets it (set by the runner).
  reply* out = nullptr;
  std::size_t reply_start = 0;
  bool too_large = false;
};

// script_lua.cpp
scripting::state* script_state(lua_State* L);
void open_redis_library(lua_State* L);  // the `redis` table into the real globals
void set_script_state(lua_State* L, scripting::state* s);
// Pushes {err="CODE message"} from an error reply's text (Redis's
// luaPushErrorBuff: "-CODE msg", or "msg" which gets the code ERR).
void push_error_table(lua_State* L, std::string_view text);
// The Lua value at the top of the stack as the script's reply (Redis's
// luaReplyToRedisReply with a RESP2 script client).
void lua_to_reply(lua_State* L, scripting::state& s, reply& r, int depth);

}  // namespace conveyor::kv
