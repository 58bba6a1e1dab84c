// The command table, its lookup, COMMAND, and the executor that dispatches
// (commands.hpp). The commands themselves: server_commands.cpp,
// string_commands.cpp, keyspace_commands.cpp. Replies and error texts follow
// Redis 7 so that clients that match on them keep working.
#include "commands.hpp"

#include <chrono>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "aof.hpp"
#include "command_context.hpp"
#include "pubsub.hpp"
#include "script.hpp"

namespace conveyor::kv {

namespace {

void cmd_command(exec_context& c);  // needs the table; defined below

// ---- the table -----------------------------------------------------------------

const executor::command commands[] = {
    {"ping", -1, false, 0, 0, 0, "fast", cmd_ping},
    {"echo", 2, false, 0, 0, 0, "fast", cmd_echo},
    {"quit", -1, false, 0, 0, 0, "fast noauth", cmd_quit},
    {"select", 2, false, 0, 0, 0, "loading stale fast", cmd_select},
    {"auth", -2, false, 0, 0, 0, "noscript loading stale fast noauth", cmd_auth},
    {"hello", -1, false, 0, 0, 0, "noscript loading stale fast noauth", cmd_hello},
    {"client", -2, false, 0, 0, 0, "noscript loading stale", cmd_client},
    {"command", -1, false, 0, 0, 0, "loading stale", cmd_command},
    {"config", -2, false, 0, 0, 0, "admin noscript loading stale", cmd_config},
    {"info", -1, false, 0, 0, 0, "loading stale", cmd_info},
    {"dbsize", 1, false, 0, 0, 0, "readonly fast", cmd_dbsize},
    {"flushall", -1, true, 0, 0, 0, "write", cmd_flushall},
    {"flushdb", -1, true, 0, 0, 0, "write", cmd_flushall},
    {"time", 1, false, 0, 0, 0, "loading stale fast", cmd_time},
    {"wait", 3, false, 0, 0, 0, "noscript", cmd_wait},
    {"cluster", -2, false, 0, 0, 0, "loading stale", cmd_cluster},
    {"readonly", 1, false, 0, 0, 0, "loading stale fast", cmd_cluster},
    {"readwrite", 1, false, 0, 0, 0, "loading stale fast", cmd_cluster},
    {"asking", 1, false, 0, 0, 0, "fast", cmd_cluster},
    {"bgrewriteaof", 1, false, 0, 0, 0, "admin noscript", cmd_bgrewriteaof},
    {"get", 2, false, 1, 1, 1, "readonly fast", cmd_get},
    {"set", -3, true, 1, 1, 1, "write denyoom", cmd_set},
    {"setnx", 3, true, 1, 1, 1, "write denyoom fast", cmd_setnx},
    {"setex", 4, true, 1, 1, 1, "write denyoom", cmd_setex},
    {"psetex", 4, true, 1, 1, 1, "write denyoom", cmd_psetex},
    {"getset", 3, true, 1, 1, 1, "write denyoom fast", cmd_getset},
    {"getdel", 2, true, 1, 1, 1, "write fast", cmd_getdel},
    {"del", -2, true, 1, -1, 1, "write", cmd_del},
    {"unlink", -2, true, 1, -1, 1, "write fast", cmd_del},
    {"exists", -2, false, 1, -1, 1, "readonly fast", cmd_exists},
    {"mget", -2, false, 1, -1, 1, "readonly fast", cmd_mget},
    {"mset", -3, true, 1, -1, 2, "write denyoom", cmd_mset},
    {"msetnx", -3, true, 1, -1, 2, "write denyoom", cmd_msetnx},
    {"incr", 2, true, 1, 1, 1, "write denyoom fast", cmd_incr},
    {"decr", 2, true, 1, 1, 1, "write denyoom fast", cmd_decr},
    {"incrby", 3, true, 1, 1, 1, "write denyoom fast", cmd_incrby},
    {"decrby", 3, true, 1, 1, 1, "write denyoom fast", cmd_decrby},
    {"append", 3, true, 1, 1, 1, "write denyoom", cmd_append},
    {"strlen", 2, false, 1, 1, 1, "readonly fast", cmd_strlen},
    {"getrange", 4, false, 1, 1, 1, "readonly", cmd_getrange},
    {"expire", -3, true, 1, 1, 1, "write fast", cmd_expire},
    {"pexpire", -3, true, 1, 1, 1, "write fast", cmd_pexpire},
    {"expireat", -3, true, 1, 1, 1, "write fast", cmd_expireat},
    {"pexpireat", -3, true, 1, 1, 1, "write fast", cmd_pexpireat},
    {"ttl", 2, false, 1, 1, 1, "readonly fast", cmd_ttl},
    {"pttl", 2, false, 1, 1, 1, "readonly fast", cmd_pttl},
    {"expiretime", 2, false, 1, 1, 1, "readonly fast", cmd_expiretime},
    {"pexpiretime", 2, false, 1, 1, 1, "readonly fast", cmd_pexpiretime},
    {"persist", 2, true, 1, 1, 1, "write fast", cmd_persist},
    {"type", 2, false, 1, 1, 1, "readonly fast", cmd_type},
    {"scan", -2, false, 0, 0, 0, "readonly", cmd_scan},
    {"keys", 2, false, 0, 0, 0, "readonly", cmd_keys},
    // transactions (transaction_commands.cpp)
    {"multi", 1, false, 0, 0, 0, "noscript loading stale fast", cmd_multi},
    {"exec", 1, false, 0, 0, 0, "noscript loading stale skip_slowlog", cmd_exec},
    {"discard", 1, false, 0, 0, 0, "noscript loading stale fast", cmd_discard},
    {"watch", -2, false, 1, -1, 1, "noscript loading stale fast", cmd_watch},
    {"unwatch", 1, false, 0, 0, 0, "noscript loading stale fast", cmd_unwatch},
    // pub/sub (pubsub.cpp)
    {"subscribe", -2, false, 0, 0, 0, "pubsub noscript loading stale", cmd_subscribe},
    {"unsubscribe", -1, false, 0, 0, 0, "pubsub noscript loading stale", cmd_unsubscribe},
    {"psubscribe", -2, false, 0, 0, 0, "pubsub noscript loading stale", cmd_psubscribe},
    {"punsubscribe", -1, false, 0, 0, 0, "pubsub noscript loading stale", cmd_punsubscribe},
    {"publish", 3, false, 0, 0, 0, "pubsub loading stale fast", cmd_publish},
    {"pubsub", -2, false, 0, 0, 0, "pubsub loading stale", cmd_pubsub},
    // operations (admin_commands.cpp)
    {"monitor", 1, false, 0, 0, 0, "admin noscript loading stale", cmd_monitor},
    {"slowlog", -2, false, 0, 0, 0, "admin loading stale", cmd_slowlog},
    {"shutdown", -1, false, 0, 0, 0, "admin noscript loading stale", cmd_shutdown},
    {"reset", 1, false, 0, 0, 0, "noscript loading stale fast noauth", cmd_reset},
    // scripts (script_commands.cpp)
    {"eval", -3, false, 0, 0, 0, "noscript stale skip_monitor may_replicate no_mandatory_keys",
     cmd_eval},
    {"evalsha", -3, false, 0, 0, 0, "noscript stale skip_monitor may_replicate no_mandatory_keys",
     cmd_evalsha},
    {"eval_ro", -3, false, 0, 0, 0, "readonly noscript stale skip_monitor no_mandatory_keys",
     cmd_eval_ro},
    {"evalsha_ro", -3, false, 0, 0, 0, "readonly noscript stale skip_monitor no_mandatory_keys",
     cmd_evalsha_ro},
    {"script", -2, false, 0, 0, 0, "noscript", cmd_script},
    // collections (hash_, list_, set_, zset_, object_commands.cpp)
    {"hset", -4, true, 1, 1, 1, "write denyoom fast", cmd_hset},
    {"hmset", -4, true, 1, 1, 1, "write denyoom fast", cmd_hmset},
    {"hsetnx", 4, true, 1, 1, 1, "write denyoom fast", cmd_hsetnx},
    {"hget", 3, false, 1, 1, 1, "readonly fast", cmd_hget},
    {"hmget", -3, false, 1, 1, 1, "readonly fast", cmd_hmget},
    {"hgetall", 2, false, 1, 1, 1, "readonly", cmd_hgetall},
    {"hkeys", 2, false, 1, 1, 1, "readonly", cmd_hkeys},
    {"hvals", 2, false, 1, 1, 1, "readonly", cmd_hvals},
    {"hdel", -3, true, 1, 1, 1, "write fast", cmd_hdel},
    {"hlen", 2, false, 1, 1, 1, "readonly fast", cmd_hlen},
    {"hexists", 3, false, 1, 1, 1, "readonly fast", cmd_hexists},
    {"hstrlen", 3, false, 1, 1, 1, "readonly fast", cmd_hstrlen},
    {"hincrby", 4, true, 1, 1, 1, "write denyoom fast", cmd_hincrby},
    {"hincrbyfloat", 4, true, 1, 1, 1, "write denyoom fast", cmd_hincrbyfloat},
    {"hscan", -3, false, 1, 1, 1, "readonly", cmd_hscan},
    {"lpush", -3, true, 1, 1, 1, "write denyoom fast", cmd_lpush},
    {"rpush", -3, true, 1, 1, 1, "write denyoom fast", cmd_rpush},
    {"lpushx", -3, true, 1, 1, 1, "write denyoom fast", cmd_lpushx},
    {"rpushx", -3, true, 1, 1, 1, "write denyoom fast", cmd_rpushx},
    {"lpop", -2, true, 1, 1, 1, "write fast", cmd_lpop},
    {"rpop", -2, true, 1, 1, 1, "write fast", cmd_rpop},
    {"blpop", -3, true, 1, -2, 1, "write noscript", cmd_blpop},
    {"brpop", -3, true, 1, -2, 1, "write noscript", cmd_brpop},
    {"llen", 2, false, 1, 1, 1, "readonly fast", cmd_llen},
    {"lrange", 4, false, 1, 1, 1, "readonly", cmd_lrange},
    {"lindex", 3, false, 1, 1, 1, "readonly", cmd_lindex},
    {"lset", 4, true, 1, 1, 1, "write denyoom", cmd_lset},
    {"lrem", 4, true, 1, 1, 1, "write", cmd_lrem},
    {"ltrim", 4, true, 1, 1, 1, "write", cmd_ltrim},
    {"sadd", -3, true, 1, 1, 1, "write denyoom fast", cmd_sadd},
    {"srem", -3, true, 1, 1, 1, "write fast", cmd_srem},
    {"smembers", 2, false, 1, 1, 1, "readonly", cmd_smembers},
    {"sismember", 3, false, 1, 1, 1, "readonly fast", cmd_sismember},
    {"scard", 2, false, 1, 1, 1, "readonly fast", cmd_scard},
    {"spop", -2, true, 1, 1, 1, "write fast", cmd_spop},
    {"srandmember", -2, false, 1, 1, 1, "readonly", cmd_srandmember},
    {"sinter", -2, false, 1, -1, 1, "readonly", cmd_sinter},
    {"sunion", -2, false, 1, -1, 1, "readonly", cmd_sunion},
    {"sdiff", -2, false, 1, -1, 1, "readonly", cmd_sdiff},
    {"sscan", -3, false, 1, 1, 1, "readonly", cmd_sscan},
    {"zadd", -4, true, 1, 1, 1, "write denyoom fast", cmd_zadd},
    {"zincrby", 4, true, 1, 1, 1, "write denyoom fast", cmd_zincrby},
    {"zrem", -3, true, 1, 1, 1, "write fast", cmd_zrem},
    {"zscore", 3, false, 1, 1, 1, "readonly fast", cmd_zscore},
    {"zcard", 2, false, 1, 1, 1, "readonly fast", cmd_zcard},
    {"zrange", -4, false, 1, 1, 1, "readonly", cmd_zrange},
    {"zrangebyscore", -4, false, 1, 1, 1, "readonly", cmd_zrangebyscore},
    {"zrevrange", -4, false, 1, 1, 1, "readonly", cmd_zrevrange},
    {"zrank", 3, false, 1, 1, 1, "readonly fast", cmd_zrank},
    {"zrevrank", 3, false, 1, 1, 1, "readonly fast", cmd_zrevrank},
    {"zcount", 4, false, 1, 1, 1, "readonly fast", cmd_zcount},
    {"zpopmin", -2, true, 1, 1, 1, "write fast", cmd_zpopmin},
    {"zpopmax", -2, true, 1, 1, 1, "write fast", cmd_zpopmax},
    {"zscan", -3, false, 1, 1, 1, "readonly", cmd_zscan},
    {"object", -2, false, 2, 2, 1, "readonly", cmd_object},
    {"rename", 3, true, 1, 2, 1, "write", cmd_rename},
    {"renamenx", 3, true, 1, 2, 1, "write fast", cmd_renamenx},
};

const std::unordered_map<std::string_view, const executor::command*>& table() {
  static const auto t = [] {
    std::unordered_map<std::string_view, const executor::command*> m;
    for (const auto& k : commands) m.emplace(k.name, &k);
    return m;
  }();
  return t;
}

const executor::command* lookup(std::string_view name) {
  if (name.size() > 32) return nullptr;
  char low[32];
  for (std::size_t i = 0; i < name.size(); ++i) {
    char ch = name[i];
    low[i] = ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch;
  }
  auto it = table().find(std::string_view(low, name.size()));
  return it == table().end() ? nullptr : it->second;
}

void reply_command_info(exec_context& c, const executor::command& k) {
  c.r.array(6);
  c.r.bulk(k.name);
  c.r.integer(k.arity);
  std::size_t nflags = 0;
  for (std::size_t i = 0; i < k.flags.size();) {
    auto j = k.flags.find(' ', i);
    if (j == std::string_view::npos) j = k.flags.size();
    ++nflags;
    i = j + 1;
  }
  c.r.set(nflags);
  for (std::size_t i = 0; i < k.flags.size();) {
    auto j = k.flags.find(' ', i);
    if (j == std::string_view::npos) j = k.flags.size();
    c.r.simple(k.flags.substr(i, j - i));
    i = j + 1;
  }
  c.r.integer(k.first_key);
  c.r.integer(k.last_key);
  c.r.integer(k.step);
}

void cmd_command(exec_context& c) {
  if (c.argv.size() == 1) {
    c.r.array(std::size(commands));
    for (const auto& k : commands) reply_command_info(c, k);
    if (!c.fits(0)) c.reply_too_large();
    return;
  }
  auto sub = c.argv[1];
  if (iequal(sub, "COUNT") && c.argv.size() == 2)
    return c.r.integer(static_cast<std::int64_t>(std::size(commands)));
  if (iequal(sub, "INFO")) {
    if (c.argv.size() == 2) {
      c.r.array(std::size(commands));
      for (const auto& k : commands) reply_command_info(c, k);
      if (!c.fits(0)) c.reply_too_large();
      return;
    }
    // One name asked many times: checked per element, as MGET.
    c.r.array(c.argv.size() - 2);
    for (std::size_t i = 2; i < c.argv.size(); ++i) {
      if (!c.fits(256)) return c.reply_too_large();
      auto* k = lookup(c.argv[i]);
      if (k)
        reply_command_info(c, *k);
      else
        c.r.null_array();
    }
    return;
  }
  if (iequal(sub, "DOCS")) {
    // Docs are optional for clients (redis-cli asks at start and falls back to
    // its built-in help): each command gets a short summary and nothing else.
    std::vector<const executor::command*> which;
    if (c.argv.size() == 2) {
      for (const auto& k : commands) which.push_back(&k);
    } else {
      for (std::size_t i = 2; i < c.argv.size(); ++i)
        if (auto* k = lookup(c.argv[i])) which.push_back(k);
    }
    c.r.map(which.size());
    for (auto* k : which) {
      if (!c.fits(128)) return c.reply_too_large();
      c.r.bulk(k->name);
      c.r.map(2);
      c.r.bulk("summary");
      c.r.bulk(k->write ? "conveyor-kv write command" : "conveyor-kv command");
      c.r.bulk("group");
      c.r.bulk(k->first_key != 0 ? "string" : "server");
    }
    return;
  }
  if (iequal(sub, "LIST")) {
    c.r.array(std::size(commands));
    for (const auto& k : commands) c.r.bulk(k.name);
    return;
  }
  std::string e = "ERR unknown subcommand or wrong number of arguments for '";
  e += sub;
  e += "'. Try COMMAND HELP.";
  c.r.error(e);
}

bool allowed_while_subscribed(std::string_view name) {
  return name == "subscribe" || name == "unsubscribe" || name == "psubscribe" ||
         name == "punsubscribe" || name == "ping" || name == "quit" || name == "reset";
}

// Run at once inside MULTI instead of being queued (Redis's processCommand).
bool runs_in_multi(std::string_view name) {
  return name == "exec" || name == "discard" || name == "multi" || name == "watch" ||
         name == "quit" || name == "reset";
}

}  // namespace

// "client|kill" for a command with subcommands, as Redis names them in errors
// and in SLOWLOG, INFO commandstats.
std::string full_name(const executor::command& k, std::span<const std::string_view> argv) {
  std::string n(k.name);
  const bool container = k.name == "client" || k.name == "config" || k.name == "slowlog" ||
                         k.name == "pubsub" || k.name == "command";
  if (container && argv.size() >= 2 && argv[1].size() <= 32) {
    n += '|';
    for (char ch : argv[1]) n += ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch;
  }
  return n;
}

std::span<const executor::command> command_table() {
  return {commands, std::size(commands)};
}

void command_keys(const executor::command& k, argv_t argv, std::vector<std::string_view>& keys) {
  const auto argc = static_cast<std::int64_t>(argv.size());
  if (k.fn == cmd_eval || k.fn == cmd_evalsha || k.fn == cmd_eval_ro || k.fn == cmd_evalsha_ro) {
    std::int64_t n = 0;
    if (argc < 3 || !to_i64(argv[2], n) || n < 0 || n > argc - 3) return;
    for (std::int64_t i = 0; i < n; ++i) keys.push_back(argv[static_cast<std::size_t>(3 + i)]);
    return;
  }
  if (k.first_key <= 0 || k.step <= 0) return;
  const std::int64_t last = k.last_key < 0 ? argc + k.last_key : k.last_key;
  for (std::int64_t i = k.first_key; i <= last && i < argc; i += k.step)
    keys.push_back(argv[static_cast<std::size_t>(i)]);
}

executor::executor(store& s, aof* log, server_config& cfg)
    : store_(s),
      aof_(log),
      cfg_(cfg),
      pubsub_(std::make_unique<pubsub>(hooks_)),
      command_stats_(std::size(commands)),
      start_ms_(now_ms()),
      scripts_(std::make_unique<scripting>(*this)) {}

executor::~executor() = default;

const executor::command* executor::find(std::string_view name) {
  return lookup(name);
}

void executor::emit(std::span<const std::string_view> argv) {
  if (aof_ != nullptr) aof_->append(argv);
  if (repl_ != nullptr) repl_->append(argv);
}

void executor::log(std::span<const std::string_view> argv) {
  if (!logging()) return;
  if (scripts_->capture(argv)) return;  // a script's writes: logged when it ends (log_effects)
  if (in_exec_ && !exec_logged_) {      // a transaction's first record: MULTI before it
    const std::string_view begin[] = {"MULTI"};
    emit(begin);
    exec_logged_ = true;
  }
  emit(argv);
}

void executor::log_effects(const std::vector<std::vector<std::string>>& records) {
  if (!logging() || records.empty()) return;
  // Inside EXEC the transaction's MULTI/EXEC records already enclose them (a
  // block inside a block would be damage to the loader).
  const bool block = !in_exec_ && records.size() > 1;
  if (block) {
    const std::string_view begin[] = {"MULTI"};
    emit(begin);
  }
  std::vector<std::string_view> v;
  for (const auto& rec : records) {
    v.assign(rec.begin(), rec.end());
    log(v);
  }
  if (block) {
    const std::string_view end[] = {"EXEC"};
    emit(end);
  }
}

void executor::forget(session& sess) {
  pubsub_->forget(sess);
}

void executor::pause(std::int64_t until_ms, bool writes_only) noexcept {
  pause_until_ = until_ms;
  pause_writes_only_ = writes_only;
}

bool executor::paused_for(const session& sess, std::span<const std::string_view> argv,
                          std::int64_t now) const {
  if (now >= pause_until_ || argv.empty()) return false;
  const command* k = lookup(argv[0]);
  if (k == nullptr) return false;
  if (k->name == "client" || k->name == "quit" || k->name == "ping") return false;
  if (!pause_writes_only_ || k->write) return true;
  // WRITE: EXEC waits too when its queue holds a write (Redis 7).
  if (k->name == "exec")
    for (const auto& q : sess.queued)
      if (const command* w = q.empty() ? nullptr : lookup(q[0]); w != nullptr && w->write)
        return true;
  return false;
}

void executor::execute(session& sess, std::span<const std::string_view> argv, std::string& out) {
  reply r(out, sess.resp);
  if (argv.empty()) return;
  ++stats_.commands;
  const command* k = lookup(argv[0]);
  bool noauth_ok = k != nullptr && k->flags.find("noauth") != std::string_view::npos;
  if (!cfg_.requirepass.empty() && !sess.authenticated && !replaying_ && !noauth_ok) {
    if (sess.in_multi) sess.multi_failed = true;
    return r.error("NOAUTH Authentication required.");
  }
  // A script running past busy-reply-threshold: other clients get -BUSY but
  // for the few commands Redis allows (script.hpp). Refused while queueing,
  // the command aborts the transaction (Redis's rejectCommand).
  if (!sess.script && scripts_->busy() && scripts_->answer_while_busy(argv, r)) {
    if (sess.in_multi) sess.multi_failed = true;
    return;
  }
  if (k == nullptr) {
    if (sess.in_multi) sess.multi_failed = true;  // refused while queueing: EXEC aborts
    std::string e = "ERR unknown command '";
    e += argv[0].substr(0, 128);
    e += "', with args beginning with: ";
    for (std::size_t i = 1; i < argv.size() && e.size() < 1024; ++i) {
      e += '\'';
      e += argv[i].substr(0, 128);
      e += "' ";
    }
    return r.error(e);
  }
  const std::size_t start = out.size();
  exec_context c{*this, sess, argv, r, now_ms(), start};
  auto& cs = command_stats_[static_cast<std::size_t>(k - commands)];
  if ((k->arity > 0 && argv.size() != static_cast<std::size_t>(k->arity)) ||
      (k->arity < 0 && argv.size() < static_cast<std::size_t>(-k->arity))) {
    if (sess.in_multi) sess.multi_failed = true;
    ++cs.rejected;
    return c.wrong_args();
  }
  if (sess.resp == 2 && (!sess.channels.empty() || !sess.patterns.empty()) &&
      !allowed_while_subscribed(k->name)) {
    ++cs.rejected;
    return r.error("ERR Can't execute '" + full_name(*k, argv) +
                   "': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed "
                   "in this context");
  }
  // Cluster mode: a command whose keys this node does not serve is answered
  // with the redirect or the error instead (Redis's processCommand: checked
  // at queue time inside MULTI, where it aborts the transaction, and for EXEC
  // over every queued command). Not for a script's own commands (EVAL's keys
  // were checked) nor the AOF's.
  if (cfg_.cluster_enabled && !replaying_ && !sess.script) {
    if (std::string e = route(sess, *k, argv); !e.empty()) {
      ++cs.rejected;
      if (k->fn == cmd_exec && sess.in_multi)
        abort_transaction(sess);
      else if (sess.in_multi && !runs_in_multi(k->name))
        sess.multi_failed = true;
      return r.error(e);
    }
  }
  // A replica takes writes from its primary's stream only (Redis's
  // replica-read-only); keyed ones were redirected above.
  if (k->write && !replaying_ && !sess.script && is_replica()) {
    ++cs.rejected;
    if (sess.in_multi) sess.multi_failed = true;
    return r.error("READONLY You can't write against a read only replica.");
  }
  if (sess.in_multi && !runs_in_multi(k->name)) return queue_command(c);
  if (k->write && aof_ != nullptr && !aof_->healthy() && !replaying_) {
    ++cs.rejected;
    return r.error("MISCONF Errors writing to the AOF file: " + aof_->last_error());
  }
  sess.last_command = full_name(*k, argv);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    k->fn(c);
  } catch (const std::bad_alloc&) {
    // An allocation the command needed failed: this command fails, the server
    // and every other client go on (the reply so far is dropped; shrinking
    // allocates nothing).
    out.resize(start);
    r.error("OOM out of memory while running the command");
  }
  // Commands without a bound of their own (GETRANGE, ECHO, INFO...) have
  // replies no larger than what they were sent or a value: checked once here.
  if (out.size() - start > sess.max_reply) c.reply_too_large();
  if (replaying_) return;
  const auto usec =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ++cs.calls;
  cs.usec += static_cast<std::uint64_t>(usec);
  if (out.size() > start && out[start] == '-') ++cs.failed;
  after_command(c, *k, usec);
}

// One record of the AOF or of the replication stream, run as the server
// itself: no client, not counted; false (why set) for what is no write command.
bool executor::run_record(std::span<const std::string_view> argv, std::string& out,
                          std::string& why, std::string_view source) {
  const command* k = lookup(argv[0]);
  if (k == nullptr || !k->write) {
    why = "not a " + std::string(source) + " command: " + std::string(argv[0].substr(0, 64));
    return false;
  }
  session sess;
  sess.authenticated = true;
  replaying_ = true;
  execute(sess, argv, out);
  replaying_ = false;
  --stats_.commands;
  return true;
}

bool executor::replay(std::span<const std::string_view> argv, std::string& why) {
  if (argv.empty()) return true;
  std::string out;
  if (!run_record(argv, out, why, "logged")) return false;
  // No reader exists before the front ends start: what this command replaced
  // is freed now, not a grace time later (back to back, the overwrites of a
  // log would otherwise all be in grace at once and run the store out).
  store_.reclaim_all();
  return replayed_ok(argv, out, why);
}

bool executor::apply_replicated(std::span<const std::string_view> argv, std::string& why) {
  if (argv.empty()) return true;
  std::string out;
  return run_record(argv, out, why, "replicated") && replayed_ok(argv, out, why);
}

bool executor::replayed_ok(std::span<const std::string_view> argv, const std::string& out,
                           std::string& why) {
  if (!out.empty() && out[0] == '-') {
    why = "replaying " + std::string(argv[0].substr(0, 64)) + ": " +
          out.substr(1, out.find('\r') - 1);
    return false;
  }
  return true;
}

}  // namespace conveyor::kv
