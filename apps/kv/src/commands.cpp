// The command table, its lookup, COMMAND, and the executor that dispatches
// (commands.hpp). The commands themselves: server_commands.cpp,
// string_commands.cpp, keyspace_commands.cpp. Replies and error texts follow
// Redis 7 so that clients that match on them keep working.
#include "commands.hpp"

#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "aof.hpp"
#include "command_context.hpp"

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

}  // namespace

executor::executor(store& s, aof* log, const server_config& cfg)
    : store_(s), aof_(log), cfg_(cfg), start_ms_(now_ms()) {}

void executor::log(std::span<const std::string_view> argv) {
  if (aof_ != nullptr && !replaying_) aof_->append(argv);
}

void executor::execute(session& sess, std::span<const std::string_view> argv, std::string& out) {
  reply r(out, sess.resp);
  if (argv.empty()) return;
  ++stats_.commands;
  const command* k = lookup(argv[0]);
  bool noauth_ok = k != nullptr && k->flags.find("noauth") != std::string_view::npos;
  if (!cfg_.requirepass.empty() && !sess.authenticated && !replaying_ && !noauth_ok)
    return r.error("NOAUTH Authentication required.");
  if (k == nullptr) {
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
  if ((k->arity > 0 && argv.size() != static_cast<std::size_t>(k->arity)) ||
      (k->arity < 0 && argv.size() < static_cast<std::size_t>(-k->arity)))
    return c.wrong_args();
  if (k->write && aof_ != nullptr && !aof_->healthy() && !replaying_)
    return r.error("MISCONF Errors writing to the AOF file: " + aof_->last_error());
  try {
    k->fn(c);
  } catch (const std::bad_alloc&) {
    // An allocation the command needed failed: this command fails, the server
    // and every other client go on (the reply so far is dropped; shrinking
    // allocates nothing).
    out.resize(start);
    r.error("OOM out of memory while running the command");
    return;
  }
  // Commands without a bound of their own (GETRANGE, ECHO, INFO...) have
  // replies no larger than what they were sent or a value: checked once here.
  if (out.size() - start > sess.max_reply) c.reply_too_large();
}

bool executor::replay(std::span<const std::string_view> argv, std::string& why) {
  if (argv.empty()) return true;
  const command* k = lookup(argv[0]);
  if (k == nullptr || !k->write) {
    why = "not a logged command: " + std::string(argv[0].substr(0, 64));
    return false;
  }
  session sess;
  sess.authenticated = true;
  std::string out;
  replaying_ = true;
  execute(sess, argv, out);
  replaying_ = false;
  --stats_.commands;
  // No reader exists before the front ends start: what this command replaced
  // is freed now, not a grace time later (back to back, the overwrites of a
  // log would otherwise all be in grace at once and run the store out).
  store_.reclaim_all();
  if (!out.empty() && out[0] == '-') {
    why = "replaying " + std::string(argv[0].substr(0, 64)) + ": " +
          out.substr(1, out.find('\r') - 1);
    return false;
  }
  return true;
}

}  // namespace conveyor::kv
