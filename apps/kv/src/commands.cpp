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
    {"eval", -3, false, 0, 0, 0, "noscript stale skip_monitor may_replicate no_mandatory_keys",
     cmd_eval},
    {"evalsha", -3, false, 0, 0, 0, "noscript stale skip_monitor may_replicate no_mandatory_keys",
     cmd_evalsha},
    {"eval_ro", -3, false, 0, 0, 0, "readonly noscript stale skip_monitor no_mandatory_keys",
     cmd_eval_ro},
    {"evalsha_ro", -3, false, 0, 0, 0, "readonly noscript stale skip_monitor no_mandatory_keys",
     cmd_evalsha_ro},
    {"script", -2, false, 0, 0, 0, "noscript", cmd_script},
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
    : store_(s),
      aof_(log),
      cfg_(cfg),
      start_ms_(now_ms()),
      scripts_(std::make_unique<scripting>(*this)) {}

executor::~executor() = default;

const executor::command* executor::find(std::string_view name) {
  return lookup(name);
}

void executor::log(std::span<const std::string_view> argv) {
  if (aof_ == nullptr || replaying_) return;
  if (scripts_->capture(argv)) return;  // a script's writes: one block when it ends
  aof_->append(argv);
}

void executor::execute(session& sess, std::span<const std::string_view> argv, std::string& out) {
  reply r(out, sess.resp);
  if (argv.empty()) return;
  ++stats_.commands;
  const command* k = lookup(argv[0]);
  bool noauth_ok = k != nullptr && k->flags.find("noauth") != std::string_view::npos;
  if (!cfg_.requirepass.empty() && !sess.authenticated && !replaying_ && !noauth_ok)
    return r.error("NOAUTH Authentication required.");
  // A script running past busy-reply-threshold: other clients get -BUSY but
  // for the few commands Redis allows (script.hpp).
  if (!sess.script && scripts_->busy() && scripts_->answer_while_busy(argv, r)) return;
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
  if (replay_in_block_ || iequal(argv[0], "multi") || iequal(argv[0], "exec"))
    return replay_block(argv, why);
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

// A MULTI ... EXEC block (a script's effects): its records are checked as they
// come and applied together at EXEC; a log that ends inside a block leaves it
// unapplied (replay_block_open() says so, and the server rewrites the log).
bool executor::replay_block(std::span<const std::string_view> argv, std::string& why) {
  if (iequal(argv[0], "multi")) {
    if (replay_in_block_ || argv.size() != 1) {
      why = replay_in_block_ ? "MULTI inside a MULTI block" : "MULTI with arguments";
      return false;
    }
    replay_in_block_ = true;
    replay_queued_.clear();
    return true;
  }
  if (iequal(argv[0], "exec")) {
    if (!replay_in_block_ || argv.size() != 1) {
      why = replay_in_block_ ? "EXEC with arguments" : "EXEC without MULTI";
      return false;
    }
    replay_in_block_ = false;
    auto queued = std::move(replay_queued_);
    replay_queued_.clear();
    std::vector<std::string_view> v;
    for (const auto& rec : queued) {
      v.assign(rec.begin(), rec.end());
      if (!replay(v, why)) return false;
    }
    return true;
  }
  const command* k = lookup(argv[0]);
  if (k == nullptr || !k->write) {
    why = "not a logged command: " + std::string(argv[0].substr(0, 64));
    return false;
  }
  replay_queued_.emplace_back(argv.begin(), argv.end());
  return true;
}

}  // namespace conveyor::kv
