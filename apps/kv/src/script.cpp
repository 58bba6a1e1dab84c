// The script engine (script.hpp): the Lua state and its sandbox, the memory
// bound, the script cache, running a script under the count hook (time,
// SCRIPT KILL, serving other clients), and logging a script's effects.
#include "script.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "command_context.hpp"
#include "script_sha1.hpp"
#include "script_state.hpp"

namespace conveyor::kv {

namespace {

using clock = std::chrono::steady_clock;
using state = scripting::state;

constexpr int hook_every = 100000;  // instructions between two looks at the clock (Redis's)
constexpr std::string_view busy_error =
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.";
constexpr std::string_view killed_error = "Script killed by user with SCRIPT KILL...";

// Lua's allocator: refuses to grow past the limit (Lua then raises "not enough
// memory" in the script); frees and shrinks always succeed, as Lua requires.
void* lua_alloc(void* ud, void* ptr, std::size_t osize, std::size_t nsize) {
  auto* s = static_cast<state*>(ud);
  if (nsize == 0) {
    std::free(ptr);
    s->used -= osize;
    return nullptr;
  }
  if (nsize > osize && s->used - osize + nsize > s->limit) return nullptr;
  void* p = std::realloc(ptr, nsize);
  if (p == nullptr) return nullptr;
  s->used = s->used - osize + nsize;
  return p;
}

// __index of the scripts' global environment: globals that exist, else an error.
int global_index(lua_State* L) {
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(1));
  if (!lua_isnil(L, -1)) return 1;
  const char* name = lua_tostring(L, 2);
  return luaL_error(L, "Script attempted to access nonexistent global variable '%s'",
                    name != nullptr ? name : "?");
}

int readonly_newindex(lua_State* L) {
  return luaL_error(L, "Attempt to modify a readonly table");
}

// rawset, except on the read-only tables.
int guarded_rawset(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  auto* s = script_state(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->protected_ref);
  lua_pushvalue(L, 1);
  lua_rawget(L, -2);
  if (!lua_isnil(L, -1)) return luaL_error(L, "Attempt to modify a readonly table");
  lua_pop(L, 2);
  luaL_checkany(L, 2);
  luaL_checkany(L, 3);
  lua_settop(L, 3);
  lua_rawset(L, 1);
  lua_pushvalue(L, 1);
  return 1;
}

// Replaces the table at the top of the stack by a read-only proxy of it
// (reads go to it, writes raise, its metatable is locked), recorded as
// protected.
void make_readonly_proxy(lua_State* L, int protected_ref, lua_CFunction index_fn) {
  const int real = lua_gettop(L);
  lua_newtable(L);  // the proxy
  lua_newtable(L);  // its metatable
  if (index_fn != nullptr) {
    lua_pushvalue(L, real);
    lua_pushcclosure(L, index_fn, 1);
  } else {
    lua_pushvalue(L, real);
  }
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, readonly_newindex);
  lua_setfield(L, -2, "__newindex");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  lua_rawgeti(L, LUA_REGISTRYINDEX, protected_ref);
  lua_pushvalue(L, -2);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  lua_replace(L, real);
}

// Builds the sandbox (in a protected call: any allocation may fail).
int init_state(lua_State* L) {
  auto* s = static_cast<state*>(lua_touserdata(L, 1));
  static const lua_CFunction libs[] = {luaopen_base, luaopen_table, luaopen_string, luaopen_math};
  for (auto open : libs) {
    lua_pushcfunction(L, open);
    lua_call(L, 0, 0);
  }
  open_redis_library(L);
  set_script_state(L, s);
  for (const char* name :
       {"dofile", "loadfile", "load", "loadstring", "getfenv", "setfenv", "print", "module",
        "require", "newproxy", "coroutine", "package", "os", "io", "debug"}) {
    lua_pushnil(L);
    lua_setglobal(L, name);
  }
  lua_newtable(L);
  s->protected_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushcfunction(L, guarded_rawset);
  lua_setglobal(L, "rawset");
  for (const char* lib : {"redis", "string", "table", "math"}) {
    lua_getglobal(L, lib);
    make_readonly_proxy(L, s->protected_ref, nullptr);
    lua_setglobal(L, lib);
  }
  // The strings' metatable stays out of reach (its __index is the real string table).
  lua_pushstring(L, "");
  lua_getmetatable(L, -1);
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);
  // The scripts' environment: an empty read-only proxy of the globals; _G is it.
  lua_pushvalue(L, LUA_GLOBALSINDEX);
  make_readonly_proxy(L, s->protected_ref, global_index);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, "conveyor_env");
  lua_setglobal(L, "_G");
  lua_newtable(L);
  lua_setfield(L, LUA_REGISTRYINDEX, "conveyor_scripts");
  return 0;
}

struct compile_args {
  state* s;
  const std::string* sha;
  const std::string* body;
  std::string* error;  // the syntax error's message
  int status = 0;
};

// Compiles a body as f_<sha> in the scripts table, in the sandbox's environment;
// on a syntax error leaves the message on the stack.
int compile_script(lua_State* L) {
  auto* a = static_cast<compile_args*>(lua_touserdata(L, 1));
  lua_settop(L, 0);
  a->status = luaL_loadbuffer(L, a->body->data(), a->body->size(), "@user_script");
  if (a->status != 0) {
    const char* e = lua_tostring(L, -1);
    try {
      *a->error = e != nullptr ? e : "not enough memory";
    } catch (const std::bad_alloc&) {  // never through Lua's frames
    }
    return 0;
  }
  lua_getfield(L, LUA_REGISTRYINDEX, "conveyor_env");
  lua_setfenv(L, -2);
  lua_getfield(L, LUA_REGISTRYINDEX, "conveyor_scripts");
  lua_pushlstring(L, a->sha->data(), a->sha->size());
  lua_pushvalue(L, -3);
  lua_rawset(L, -3);
  return 0;
}

int forget_script(lua_State* L) {
  auto* sha = static_cast<const std::string*>(lua_touserdata(L, 1));
  lua_getfield(L, LUA_REGISTRYINDEX, "conveyor_scripts");
  lua_pushlstring(L, sha->data(), sha->size());
  lua_pushnil(L);
  lua_rawset(L, -3);
  return 0;
}

// Adds where the error arose to it, as Redis's error handler: a table
// {err=..., source=..., line=...}; a message becomes {err="ERR message"}.
int error_handler(lua_State* L) {
  lua_Debug ar;
  bool where = lua_getstack(L, 1, &ar) && lua_getinfo(L, "nSl", &ar);
  if (where && std::strcmp(ar.what, "C") == 0)
    where = lua_getstack(L, 2, &ar) && lua_getinfo(L, "nSl", &ar);
  if (!lua_istable(L, 1)) {
    lua_getglobal(L, "tostring");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    lua_newtable(L);
    lua_pushstring(L, "ERR ");
    lua_pushvalue(L, -3);
    lua_concat(L, 2);
    lua_setfield(L, -2, "err");
    lua_replace(L, 1);
    lua_settop(L, 1);
  }
  if (where) {
    lua_pushstring(L, ar.source);
    lua_setfield(L, 1, "source");
    lua_pushnumber(L, ar.currentline);
    lua_setfield(L, 1, "line");
  }
  lua_settop(L, 1);
  return 1;
}

void hook(lua_State* L, lua_Debug*) {
  auto* s = script_state(L);
  if (!s->kill && !s->serving) {
    const auto threshold = std::chrono::milliseconds(s->ex.config().busy_reply_threshold_ms);
    if (clock::now() - s->started >= threshold) {
      if (!s->busy) {
        s->busy = true;
        std::fprintf(stderr,
                     "conveyor kv serve: a script (%s) is still running after %llu ms: other "
                     "clients get -BUSY until it ends or SCRIPT KILL\n",
                     s->sha.c_str(),
                     static_cast<unsigned long long>(s->ex.config().busy_reply_threshold_ms));
      }
      if (s->serve_others_fn != nullptr && *s->serve_others_fn) {
        s->serving = true;
        try {
          (*s->serve_others_fn)();
        } catch (...) {  // never through Lua's frames; the clients' own errors are theirs
        }
        s->serving = false;
      }
    }
  }
  if (s->kill) {
    // Every line from now on raises again, so a pcall in the script cannot go on.
    lua_sethook(L, hook, LUA_MASKLINE | LUA_MASKCOUNT, 1);
    push_error_table(L, killed_error);
    lua_error(L);
  }
}

// Runs the compiled script with KEYS and ARGV set and writes its reply (or its
// error) to s->out. In a protected call.
int run_script(lua_State* L) {
  auto* s = static_cast<state*>(lua_touserdata(L, 1));
  lua_settop(L, 0);
  for (auto* v : {&s->keys, &s->args}) {
    lua_createtable(L, static_cast<int>(v->size()), 0);
    for (std::size_t i = 0; i < v->size(); ++i) {
      lua_pushlstring(L, (*v)[i].data(), (*v)[i].size());
      lua_rawseti(L, -2, static_cast<int>(i + 1));
    }
    lua_setglobal(L, v == &s->keys ? "KEYS" : "ARGV");
  }
  lua_pushcfunction(L, error_handler);
  lua_getfield(L, LUA_REGISTRYINDEX, "conveyor_scripts");
  lua_pushlstring(L, s->sha.data(), s->sha.size());
  lua_rawget(L, -2);
  lua_replace(L, -2);
  lua_sethook(L, hook, LUA_MASKCOUNT, hook_every);
  const int rc = lua_pcall(L, 0, 1, 1);
  lua_sethook(L, nullptr, 0, 0);
  reply& r = *s->out;
  try {
    if (rc == 0) {
      lua_to_reply(L, *s, r, 0);
      return 0;
    }
    if (lua_istable(L, -1)) {
      // Raw reads first (no metamethod runs, nothing allocates once the strings are there).
      const int t = lua_gettop(L);
      for (const char* f : {"err", "source", "line"}) {
        lua_pushstring(L, f);
        lua_rawget(L, t);
      }
      std::string msg;
      if (lua_type(L, t + 1) == LUA_TSTRING) msg = lua_tostring(L, t + 1);
      if (lua_type(L, t + 2) == LUA_TSTRING && lua_type(L, t + 3) == LUA_TNUMBER) {
        msg += " script: " + s->sha + ", on " + lua_tostring(L, t + 2) + ":" +
               std::to_string(static_cast<long long>(lua_tonumber(L, t + 3))) + ".";
      }
      lua_settop(L, t);
      r.error(msg.empty() ? std::string("ERR unknown error") : msg);
    } else {
      // Lua's own memory and error-handler errors carry a message only.
      const char* e = lua_tostring(L, -1);
      std::string msg = "ERR Error running script (call to f_" + s->sha +
                        "): @user_script: " + std::string(e != nullptr ? e : "unknown error");
      if (rc == LUA_ERRMEM)
        msg += " (the scripts' memory limit is " + std::to_string(s->limit) + " bytes)";
      r.error(msg);
    }
  } catch (const std::bad_alloc&) {
    r.out().resize(s->reply_start);
    r.error("OOM out of memory while running the command");
  }
  return 0;
}

int clear_run_globals(lua_State* L) {
  lua_pushnil(L);
  lua_setglobal(L, "KEYS");
  lua_pushnil(L);
  lua_setglobal(L, "ARGV");
  return 0;
}

}  // namespace

scripting::scripting(executor& ex) : s_(std::make_unique<state>(ex)) {
  s_->call_sess.authenticated = true;
  s_->call_sess.script = true;
  s_->serve_others_fn = &serve_others;
}

scripting::~scripting() {
  if (s_->L != nullptr) lua_close(s_->L);
}

bool scripting::busy() const noexcept {
  return s_->running && s_->busy;
}
std::size_t scripting::cached() const noexcept {
  return s_->cache.size();
}
std::size_t scripting::memory() const noexcept {
  return s_->used;
}
std::uint64_t scripting::killed() const noexcept {
  return s_->killed;
}

bool scripting::capture(std::span<const std::string_view> argv) {
  if (!s_->running) return false;
  s_->effects.emplace_back(argv.begin(), argv.end());
  return true;
}

// Creates the Lua state on first use (and after SCRIPT FLUSH). False with the
// error replied.
static bool ensure_state(state& s, reply& r) {
  if (s.L != nullptr) return true;
  s.used = 0;
  s.limit = s.ex.config().lua_memory;
  s.L = lua_newstate(lua_alloc, &s);
  if (s.L == nullptr || lua_cpcall(s.L, init_state, &s) != 0) {
    if (s.L != nullptr) lua_close(s.L);
    s.L = nullptr;
    r.error("ERR the Lua state could not be created (lua-maxmemory too small?)");
    return false;
  }
  return true;
}

// Redis 7's shebang line, "#!lua [flags=f1,f2...]": false with the error
// replied; `skip` is where the Lua text begins (the line's newline, so that
// line numbers stay the body's).
static bool parse_shebang(std::string_view body, state::entry& e, std::size_t& skip, reply& r) {
  skip = 0;
  if (!body.starts_with("#!")) return true;
  const auto nl = body.find('\n');
  if (nl == std::string_view::npos) {
    r.error("ERR Invalid script shebang");
    return false;
  }
  e.shebang = true;
  skip = nl;
  std::string_view line = body.substr(0, nl);
  bool first = true;
  while (!line.empty()) {
    const auto sp = line.find(' ');
    const auto part = line.substr(0, sp);
    line = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
    if (part.empty()) continue;
    if (first) {
      first = false;
      if (part != "#!lua") {
        r.error("ERR Unexpected engine in script shebang: " + std::string(part.substr(0, 128)));
        return false;
      }
      continue;
    }
    if (!part.starts_with("flags=")) {
      r.error("ERR Unknown lua shebang option: " + std::string(part.substr(0, 128)));
      return false;
    }
    std::string_view flags = part.substr(6);
    while (!flags.empty()) {
      const auto comma = flags.find(',');
      const auto f = flags.substr(0, comma);
      flags = comma == std::string_view::npos ? std::string_view() : flags.substr(comma + 1);
      if (f == "no-writes") {
        e.no_writes = true;
      } else if (f != "allow-oom" && f != "allow-stale" && f != "no-cluster" &&
                 f != "allow-cross-slot-keys") {
        r.error("ERR Unexpected flag in script shebang: " + std::string(f.substr(0, 128)));
        return false;
      }
    }
  }
  return true;
}

// Puts a script in the cache (compiled). False with the error replied.
static bool cache_script(state& s, const std::string& sha, std::string_view body, bool load,
                         reply& r) {
  auto it = s.cache.find(sha);
  if (it != s.cache.end()) {
    if (load && !it->second.loaded) {
      it->second.loaded = true;
      s.eval_lru.erase(it->second.in_lru);
    } else if (!it->second.loaded) {
      s.eval_lru.splice(s.eval_lru.end(), s.eval_lru, it->second.in_lru);
    }
    return true;
  }
  state::entry en;
  std::size_t skip = 0;
  if (!parse_shebang(body, en, skip, r)) return false;
  std::string copy(body.substr(skip));
  std::string error;
  compile_args a{&s, &sha, &copy, &error};
  const int rc = lua_cpcall(s.L, compile_script, &a);
  if (rc != 0 || a.status != 0) {
    std::string msg = "ERR Error compiling script (new function): ";
    msg += error.empty() ? "not enough memory" : error;
    lua_settop(s.L, 0);
    r.error(msg);
    return false;
  }
  lua_settop(s.L, 0);
  en.body = body;
  en.loaded = load;
  if (!load) en.in_lru = s.eval_lru.insert(s.eval_lru.end(), sha);
  s.cache.emplace(sha, std::move(en));
  while (s.eval_lru.size() > scripting::eval_cache_max) {
    std::string old = s.eval_lru.front();
    s.eval_lru.pop_front();
    s.cache.erase(old);
    lua_cpcall(s.L, forget_script, &old);
    lua_settop(s.L, 0);
  }
  return true;
}

void scripting::eval(exec_context& c, bool by_sha, bool read_only) {
  state& s = *s_;
  // Never two at once: scripts cannot call EVAL and other clients are answered
  // -BUSY while one runs; this holds if a new path ever reaches here.
  if (s.running) return c.r.error(busy_error);
  std::int64_t numkeys;
  if (!to_i64(c.argv[2], numkeys)) return c.r.error(err_int);
  if (numkeys > static_cast<std::int64_t>(c.argv.size()) - 3)
    return c.r.error("ERR Number of keys can't be greater than number of args");
  if (numkeys < 0) return c.r.error("ERR Number of keys can't be negative");
  std::string sha;
  if (by_sha) {
    sha.assign(c.argv[1].substr(0, 40));
    for (auto& ch : sha)
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    if (c.argv[1].size() != 40 || !s.cache.contains(sha))
      return c.r.error("NOSCRIPT No matching script. Please use EVAL.");
  } else {
    sha = sha1_hex(c.argv[1]);
  }
  if (!ensure_state(s, c.r)) return;
  if (!by_sha && !cache_script(s, sha, c.argv[1], false, c.r)) return;
  const auto& entry = s.cache.at(sha);
  if (by_sha && !entry.loaded) s.eval_lru.splice(s.eval_lru.end(), s.eval_lru, entry.in_lru);
  if (read_only && entry.shebang && !entry.no_writes)
    return c.r.error("ERR Can not execute a script with write flag using *_ro command.");
  read_only = read_only || entry.no_writes;
  // Copies: while the script serves other clients, the request's buffer may move.
  const auto k = static_cast<std::size_t>(numkeys);
  s.keys.assign(c.argv.begin() + 3, c.argv.begin() + 3 + static_cast<std::ptrdiff_t>(k));
  s.args.assign(c.argv.begin() + 3 + static_cast<std::ptrdiff_t>(k), c.argv.end());
  s.sha = sha;
  s.running = true;
  s.busy = s.kill = s.wrote = s.shutdown_asked = s.too_large = false;
  s.read_only = read_only;
  s.effects.clear();
  s.out = &c.r;
  s.reply_start = c.reply_start;
  s.max_reply = c.sess.max_reply;
  s.call_sess.resp = 2;
  s.started = clock::now();
  if (lua_cpcall(s.L, run_script, &s) != 0) {
    // Only the set-up of KEYS/ARGV runs unprotected by the script's own pcall:
    // out of memory there.
    c.r.out().resize(c.reply_start);
    c.r.error("ERR Error running script (call to f_" + sha + "): @user_script: not enough memory");
  }
  lua_settop(s.L, 0);
  lua_cpcall(s.L, clear_run_globals, nullptr);
  lua_settop(s.L, 0);
  if (s.kill && !s.shutdown_asked) ++s.killed;
  const bool was_busy = s.busy;
  s.running = s.busy = s.kill = false;
  s.out = nullptr;
  // What the script wrote reaches the AOF as one MULTI/EXEC block (the
  // loader applies all of it or none), or inside the block of the EXEC that
  // ran it; a script abandoned by SHUTDOWN NOSAVE logs nothing.
  if (!s.shutdown_asked) c.ex.log_effects(s.effects);
  s.effects.clear();
  s.effects.shrink_to_fit();
  if (was_busy)
    std::fprintf(stderr, "conveyor kv serve: the script (%s) ended after %lld ms\n", sha.c_str(),
                 static_cast<long long>(
                     std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - s.started)
                         .count()));
  // Garbage left by a large script would count against the next one (Lua 5.1
  // does not collect before it reports an allocation failure).
  // collectgarbage('stop') in one script must not leave the next without a
  // collector.
  if (s.used > s.limit / 4) lua_gc(s.L, LUA_GCCOLLECT, 0);
  lua_gc(s.L, LUA_GCRESTART, 0);
  // SHUTDOWN NOSAVE: the same shutdown as the SHUTDOWN command's.
  if (s.shutdown_asked) c.ex.shutdown_server(true);
}

static void script_kill(state& s, reply& r) {
  if (!s.running || !s.busy) return r.error("NOTBUSY No scripts in execution right now.");
  if (s.wrote)
    return r.error(
        "UNKILLABLE Sorry the script already executed write commands against the dataset. You "
        "can either wait the script termination or kill the server in a hard way using the "
        "SHUTDOWN NOSAVE command.");
  s.kill = true;
  r.simple("OK");
}

bool scripting::answer_while_busy(std::span<const std::string_view> argv, reply& r) {
  state& s = *s_;
  const auto name = argv[0];
  for (std::string_view ok :
       {"auth", "hello", "quit", "multi", "discard", "watch", "unwatch", "reset"})
    if (iequal(name, ok)) return false;
  if (iequal(name, "script") && argv.size() >= 2 && iequal(argv[1], "kill")) {
    if (argv.size() != 2)
      r.error("ERR wrong number of arguments for 'script|kill' command");
    else
      script_kill(s, r);
    return true;
  }
  if (iequal(name, "shutdown")) {
    bool nosave = false;
    for (std::size_t i = 1; i < argv.size(); ++i) nosave = nosave || iequal(argv[i], "nosave");
    if (nosave) {
      // The script is abandoned whatever it wrote; the loop stops when it has unwound.
      s.shutdown_asked = true;
      s.kill = true;
      return true;  // no reply: the server goes away, as Redis's does
    }
  }
  r.error(busy_error);
  return true;
}

void scripting::script(exec_context& c) {
  state& s = *s_;
  const auto sub = c.argv[1];
  if (iequal(sub, "load") && c.argv.size() == 3) {
    if (!ensure_state(s, c.r)) return;
    std::string sha = sha1_hex(c.argv[2]);
    if (!cache_script(s, sha, c.argv[2], true, c.r)) return;
    return c.r.bulk(sha);
  }
  if (iequal(sub, "exists") && c.argv.size() >= 3) {
    c.r.array(c.argv.size() - 2);
    for (std::size_t i = 2; i < c.argv.size(); ++i) {
      std::string sha(c.argv[i].substr(0, 40));
      for (auto& ch : sha)
        if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
      c.r.integer(c.argv[i].size() == 40 && s.cache.contains(sha) ? 1 : 0);
    }
    return;
  }
  if (iequal(sub, "flush") && c.argv.size() <= 3) {
    if (c.argv.size() == 3 && !iequal(c.argv[2], "sync") && !iequal(c.argv[2], "async"))
      return c.r.error("ERR SCRIPT FLUSH only support SYNC|ASYNC option");
    // A new state: every compiled script and whatever scripts left behind go.
    if (s.L != nullptr) lua_close(s.L);
    s.L = nullptr;
    s.used = 0;
    s.cache.clear();
    s.eval_lru.clear();
    return c.r.simple("OK");
  }
  if (iequal(sub, "kill") && c.argv.size() == 2) return script_kill(s, c.r);
  if (iequal(sub, "help") && c.argv.size() == 2) {
    static constexpr std::string_view lines[] = {
        "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "EXISTS <sha1> [<sha1> ...]",
        "    Return information about the existence of the scripts in the script cache.",
        "FLUSH [ASYNC|SYNC]",
        "    Flush the Lua scripts cache. Very dangerous on replicas.",
        "KILL",
        "    Kill the currently executing Lua script.",
        "LOAD <script>",
        "    Load a script into the scripts cache without executing it.",
        "HELP",
        "    Print this help."};
    c.r.array(std::size(lines));
    for (auto l : lines) c.r.simple(l);
    return;
  }
  for (std::string_view known : {"load", "exists", "flush", "kill", "help", "debug"})
    if (iequal(sub, known)) {
      if (iequal(sub, "debug") && c.argv.size() == 3)
        return c.r.error("ERR SCRIPT DEBUG is not supported by conveyor-kv");
      std::string e = "ERR wrong number of arguments for 'script|";
      for (char ch : known) e.push_back(ch);
      e += "' command";
      return c.r.error(e);
    }
  std::string e = "ERR unknown subcommand '";
  e += sub.substr(0, 128);
  e += "'. Try SCRIPT HELP.";
  c.r.error(e);
}

}  // namespace conveyor::kv
