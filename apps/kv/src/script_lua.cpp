// The `redis` library scripts see (call, pcall, error_reply, status_reply,
// sha1hex, log, set_repl, replicate_commands and their constants) and the
// conversions both ways, with Redis 7's rules (script_lua.c):
//   reply -> Lua: integer -> number, bulk -> string, null -> false, array ->
//     table, status -> {ok=s}, error -> {err=s} (redis.call raises it);
//   Lua -> reply: string -> bulk, number -> integer (truncated), true -> 1,
//     false and nil -> null, {ok=s} -> status, {err=s} -> error, table ->
//     array of t[1], t[2]... up to the first nil.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "command_context.hpp"
#include "script_sha1.hpp"
#include "script_state.hpp"

namespace conveyor::kv {

namespace {

const char state_key = 0;  // its address keys the state in the registry

// Commands a script may not call whatever their table flags say (Redis marks
// them noscript): transactions, pub/sub, scripts, monitoring, shutdown.
bool refused_in_scripts(std::string_view name) {
  static constexpr std::string_view names[] = {
      "multi",      "exec",        "discard",      "watch",      "unwatch",      "subscribe",
      "psubscribe", "unsubscribe", "punsubscribe", "ssubscribe", "sunsubscribe", "monitor",
      "shutdown",   "eval",        "evalsha",      "eval_ro",    "evalsha_ro",   "script",
      "function",   "fcall",       "fcall_ro",     "sync",       "psync",        "reset"};
  for (auto n : names)
    if (iequal(name, n)) return true;
  return false;
}

// Pushes the RESP2 value at p as a Lua value (Redis's redisProtocolToLuaType);
// false on bytes that are not a reply. Only pointers live in this frame (a
// memory error longjmps through it).
bool push_reply(lua_State* L, const char*& p, const char* e, int depth) {
  if (p >= e || !lua_checkstack(L, 4) || depth > 1000) return false;
  const char* nl = static_cast<const char*>(std::memchr(p, '\r', static_cast<std::size_t>(e - p)));
  if (nl == nullptr || nl + 1 >= e) return false;
  const char type = *p;
  const char* body = p + 1;
  const std::size_t blen = static_cast<std::size_t>(nl - body);
  p = nl + 2;
  auto number = [&](std::int64_t& v) {
    auto [q, ec] = std::from_chars(body, body + blen, v);
    return ec == std::errc{} && q == body + blen;
  };
  std::int64_t n = 0;
  switch (type) {
    case '+':
      lua_newtable(L);
      lua_pushlstring(L, body, blen);
      lua_setfield(L, -2, "ok");
      return true;
    case '-':
      lua_newtable(L);
      lua_pushlstring(L, body, blen);
      lua_setfield(L, -2, "err");
      return true;
    case ':':
      if (!number(n)) return false;
      lua_pushnumber(L, static_cast<lua_Number>(n));
      return true;
    case '$':
      if (!number(n)) return false;
      if (n < 0) {
        lua_pushboolean(L, 0);
        return true;
      }
      if (static_cast<std::uint64_t>(e - p) < static_cast<std::uint64_t>(n) + 2) return false;
      lua_pushlstring(L, p, static_cast<std::size_t>(n));
      p += n + 2;
      return true;
    case '*':
      if (!number(n)) return false;
      if (n < 0) {
        lua_pushboolean(L, 0);
        return true;
      }
      lua_createtable(L, n > 1024 ? 1024 : static_cast<int>(n), 0);
      for (std::int64_t i = 1; i <= n; ++i) {
        if (!push_reply(L, p, e, depth + 1)) return false;
        lua_rawseti(L, -2, static_cast<int>(i));
      }
      return true;
    default:
      return false;
  }
}

// redis.call (raise) and redis.pcall.
int call(lua_State* L, bool raise) {
  auto& s = *script_state(L);
  const int argc = lua_gettop(L);
  const char* err = nullptr;
  if (argc == 0) err = "Please specify at least one argument for this redis lib call";
  for (int i = 1; i <= argc && err == nullptr; ++i) {
    const int t = lua_type(L, i);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      err = "Lua redis lib command arguments must be strings or integers";
  }
  const executor::command* k = nullptr;
  if (err == nullptr) {
    try {
      s.call_strs.clear();
      s.call_argv.clear();
      s.call_strs.reserve(static_cast<std::size_t>(argc));  // views into them stay put
      for (int i = 1; i <= argc; ++i) {
        if (lua_type(L, i) == LUA_TNUMBER) {
          // Shortest round-trip text, as Redis's fpconv_dtoa (3 -> "3", 0.5 -> "0.5").
          char buf[32];
          auto [q, ec] =
              std::to_chars(buf, buf + sizeof buf, static_cast<double>(lua_tonumber(L, i)));
          s.call_strs.emplace_back(buf, ec == std::errc{} ? q : buf);
          s.call_argv.emplace_back(s.call_strs.back());
        } else {
          std::size_t len = 0;
          const char* str = lua_tolstring(L, i, &len);  // a string: no conversion, no allocation
          s.call_argv.emplace_back(str, len);
        }
      }
      k = executor::find(s.call_argv[0]);
      if (k == nullptr)
        err = "Unknown Redis command called from script";
      else if ((k->arity > 0 && s.call_argv.size() != static_cast<std::size_t>(k->arity)) ||
               (k->arity < 0 && s.call_argv.size() < static_cast<std::size_t>(-k->arity)))
        err = "Wrong number of args calling Redis command from script";
      else if (k->flags.find("noscript") != std::string_view::npos || refused_in_scripts(k->name))
        err = "This Redis command is not allowed from script";
      else if (k->write && s.read_only)
        err = "Write commands are not allowed from read-only scripts.";
      if (err == nullptr) {
        if (k->write) s.wrote = true;  // from here on SCRIPT KILL cannot undo it
        s.call_out.clear();
        s.call_sess.max_reply = s.max_reply;
        s.ex.execute(s.call_sess, s.call_argv, s.call_out);
      }
    } catch (const std::bad_alloc&) {
      err = "-OOM out of memory while running the command";
    }
  }
  if (err != nullptr) {
    push_error_table(L, err);
    if (raise) return lua_error(L);
    return 1;
  }
  const char* p = s.call_out.data();
  const char* e = p + s.call_out.size();
  if (!push_reply(L, p, e, 0)) {
    push_error_table(L, "ERR the command's reply could not be read");
    if (raise) return lua_error(L);
    return 1;
  }
  if (raise && !s.call_out.empty() && s.call_out[0] == '-') return lua_error(L);
  return 1;
}

int redis_call(lua_State* L) {
  return call(L, true);
}
int redis_pcall(lua_State* L) {
  return call(L, false);
}

int redis_error_reply(lua_State* L) {
  if (lua_gettop(L) != 1 || lua_type(L, 1) != LUA_TSTRING) {
    push_error_table(L, "wrong number or type of arguments");
    return lua_error(L);
  }
  std::size_t len = 0;
  const char* msg = lua_tolstring(L, 1, &len);
  std::string_view v(msg, len);
  if (v.empty() || v[0] != '-') {
    // "msg" gets the code ERR; "-CODE msg" keeps its code.
    lua_pushfstring(L, "-%s", msg);
    len = 0;
    msg = lua_tolstring(L, -1, &len);
    v = std::string_view(msg, len);
  }
  push_error_table(L, v);
  return 1;
}

int redis_status_reply(lua_State* L) {
  if (lua_gettop(L) != 1 || lua_type(L, 1) != LUA_TSTRING) {
    push_error_table(L, "wrong number or type of arguments");
    return lua_error(L);
  }
  lua_newtable(L);
  lua_pushvalue(L, 1);
  lua_setfield(L, -2, "ok");
  return 1;
}

int redis_sha1hex(lua_State* L) {
  if (lua_gettop(L) != 1) {
    push_error_table(L, "wrong number of arguments");
    return lua_error(L);
  }
  std::size_t len = 0;
  const char* str = lua_tolstring(L, 1, &len);
  char hex[41] = {};
  try {
    auto h = sha1_hex(str != nullptr ? std::string_view(str, len) : std::string_view());
    std::memcpy(hex, h.data(), 40);
  } catch (const std::bad_alloc&) {
    push_error_table(L, "-OOM out of memory");
    return lua_error(L);
  }
  lua_pushlstring(L, hex, 40);
  return 1;
}

// redis.log(level, message...): NOTICE and WARNING go to stderr (Redis's
// default verbosity), one line, at most 1 KiB of message.
int redis_log(lua_State* L) {
  const int argc = lua_gettop(L);
  if (argc < 2) {
    push_error_table(L, "redis.log() requires two arguments or more.");
    return lua_error(L);
  }
  if (lua_type(L, 1) != LUA_TNUMBER) {
    push_error_table(L, "First argument must be a number (log level).");
    return lua_error(L);
  }
  const lua_Number level = lua_tonumber(L, 1);
  if (level < 0 || level > 3) {
    push_error_table(L, "Invalid debug level.");
    return lua_error(L);
  }
  if (level < 2) return 0;
  char line[1024];
  std::size_t used = 0;
  for (int i = 2; i <= argc; ++i) {
    if (lua_type(L, i) != LUA_TSTRING && lua_type(L, i) != LUA_TNUMBER) continue;
    std::size_t len = 0;
    const char* str = lua_tolstring(L, i, &len);
    for (std::size_t j = 0; j < len && used + 1 < sizeof line; ++j)
      line[used++] = str[j] == '\n' || str[j] == '\r' ? ' ' : str[j];
    if (i != argc && used + 1 < sizeof line) line[used++] = ' ';
  }
  std::fprintf(stderr, "conveyor kv serve: script: %.*s\n", static_cast<int>(used), line);
  return 0;
}

// Redis 7 always replicates a script's effects: these remain for old scripts.
int redis_set_repl(lua_State* L) {
  if (lua_gettop(L) != 1 || lua_type(L, 1) != LUA_TNUMBER) {
    push_error_table(L, "redis.set_repl() requires one argument.");
    return lua_error(L);
  }
  return 0;
}
int redis_replicate_commands(lua_State* L) {
  lua_pushboolean(L, 1);
  return 1;
}

}  // namespace

scripting::state* script_state(lua_State* L) {
  lua_pushlightuserdata(L, const_cast<char*>(&state_key));
  lua_rawget(L, LUA_REGISTRYINDEX);
  auto* s = static_cast<scripting::state*>(lua_touserdata(L, -1));
  lua_pop(L, 1);
  return s;
}

void open_redis_library(lua_State* L) {
  lua_pushlightuserdata(L, const_cast<char*>(&state_key));
  lua_pushlightuserdata(L, nullptr);  // replaced by the engine (script.cpp) right after
  lua_rawset(L, LUA_REGISTRYINDEX);
  static const luaL_Reg fns[] = {{"call", redis_call},
                                 {"pcall", redis_pcall},
                                 {"error_reply", redis_error_reply},
                                 {"status_reply", redis_status_reply},
                                 {"sha1hex", redis_sha1hex},
                                 {"log", redis_log},
                                 {"set_repl", redis_set_repl},
                                 {"replicate_commands", redis_replicate_commands},
                                 {nullptr, nullptr}};
  lua_newtable(L);
  luaL_register(L, nullptr, fns);
  static const std::pair<const char*, int> constants[] = {
      {"LOG_DEBUG", 0},   {"LOG_VERBOSE", 1},  {"LOG_NOTICE", 2},
      {"LOG_WARNING", 3}, {"REPL_NONE", 0},    {"REPL_AOF", 1},
      {"REPL_SLAVE", 2},  {"REPL_REPLICA", 2}, {"REPL_ALL", 3}};
  for (auto [name, v] : constants) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, name);
  }
  lua_setglobal(L, "redis");
}

void set_script_state(lua_State* L, scripting::state* s) {
  lua_pushlightuserdata(L, const_cast<char*>(&state_key));
  lua_pushlightuserdata(L, s);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

void push_error_table(lua_State* L, std::string_view text) {
  std::string_view code = "ERR", msg = text;
  if (!text.empty() && text[0] == '-') {
    auto sp = text.find(' ');
    if (sp == std::string_view::npos) {
      msg = text.substr(1);
    } else {
      code = text.substr(1, sp - 1);
      msg = text.substr(sp + 1);
    }
  }
  while (!msg.empty() && (msg.back() == '\r' || msg.back() == '\n')) msg.remove_suffix(1);
  while (!msg.empty() && (msg.front() == '\r' || msg.front() == '\n')) msg.remove_prefix(1);
  lua_newtable(L);
  lua_pushlstring(L, code.data(), code.size());
  lua_pushlstring(L, " ", 1);
  lua_pushlstring(L, msg.data(), msg.size());
  lua_concat(L, 3);
  lua_setfield(L, -2, "err");
}

void lua_to_reply(lua_State* L, scripting::state& s, reply& r, int depth) {
  if (s.too_large) return;
  auto fits = [&](std::size_t bytes) {
    const std::size_t used = r.out().size() - s.reply_start;
    if (used <= s.max_reply && bytes <= s.max_reply - used) return true;
    r.out().resize(s.reply_start);
    r.error(err_reply_too_large);
    s.too_large = true;
    return false;
  };
  if (!lua_checkstack(L, 4)) {
    if (fits(64)) r.error("ERR reached lua stack limit");
    return;
  }
  switch (lua_type(L, -1)) {
    case LUA_TSTRING: {
      std::size_t len = 0;
      const char* str = lua_tolstring(L, -1, &len);
      if (fits(bulk_bytes(len))) r.bulk(std::string_view(str, len));
      return;
    }
    case LUA_TBOOLEAN:
      if (!fits(8)) return;
      if (lua_toboolean(L, -1))
        r.integer(1);
      else
        r.null();
      return;
    case LUA_TNUMBER: {
      if (!fits(24)) return;
      // (long long) of the number, as x86 gives it: out of range and NaN are INT64_MIN.
      const double d = static_cast<double>(lua_tonumber(L, -1));
      const bool in_range = d >= -9223372036854775808.0 && d < 9223372036854775808.0;
      r.integer(in_range ? static_cast<std::int64_t>(d) : INT64_MIN);
      return;
    }
    case LUA_TTABLE: {
      lua_pushstring(L, "err");
      lua_rawget(L, -2);
      if (lua_type(L, -1) == LUA_TSTRING) {
        std::size_t len = 0;
        const char* str = lua_tolstring(L, -1, &len);
        if (fits(len + 8)) r.error(std::string_view(str, len));
        lua_pop(L, 1);
        return;
      }
      lua_pop(L, 1);
      lua_pushstring(L, "ok");
      lua_rawget(L, -2);
      if (lua_type(L, -1) == LUA_TSTRING) {
        std::size_t len = 0;
        const char* str = lua_tolstring(L, -1, &len);
        if (fits(len + 8)) {
          r.out().push_back('+');
          for (std::size_t i = 0; i < len; ++i)
            r.out().push_back(str[i] == '\r' || str[i] == '\n' ? ' ' : str[i]);
          r.out().append("\r\n", 2);
        }
        lua_pop(L, 1);
        return;
      }
      lua_pop(L, 1);
      std::size_t n = 0;
      for (;; ++n) {
        lua_rawgeti(L, -1, static_cast<int>(n + 1));
        const bool nil = lua_isnil(L, -1);
        lua_pop(L, 1);
        if (nil || n + 1 >= static_cast<std::size_t>(INT32_MAX)) break;
      }
      if (!fits(24)) return;
      r.array(n);
      for (std::size_t i = 1; i <= n && !s.too_large; ++i) {
        lua_rawgeti(L, -1, static_cast<int>(i));
        lua_to_reply(L, s, r, depth + 1);
        lua_pop(L, 1);
      }
      return;
    }
    default:
      if (fits(8)) r.null();
      return;
  }
}

}  // namespace conveyor::kv
