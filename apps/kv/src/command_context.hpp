// What the command files share (commands.cpp, server_commands.cpp,
// string_commands.cpp, keyspace_commands.cpp): the context a command runs in,
// the table's entry, argument helpers and the error texts, and each file's
// commands as the table names them. Internal to the executor (commands.hpp).
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "resp.hpp"
#include "store.hpp"

namespace conveyor::kv {

using argv_t = std::span<const std::string_view>;

inline bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Redis's string2ll: optional '-', digits, no leading zeros, no spaces, fits int64.
inline bool to_i64(std::string_view s, std::int64_t& v) {
  if (s.empty() || s.size() > 20) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  if (s.size() > 1 && s[0] == '-' && s[1] == '0') return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} && p == s.data() + s.size();
}

inline std::string i64_str(std::int64_t v) {
  char tmp[24];
  auto [p, ec] = std::to_chars(tmp, tmp + sizeof tmp, v);
  return std::string(tmp, p);
}

constexpr std::string_view err_syntax = "ERR syntax error";
constexpr std::string_view err_int = "ERR value is not an integer or out of range";
constexpr std::string_view err_oom = "OOM command not allowed when used memory > 'maxmemory'.";
// Short enough for the smallest RDMA message (64 bytes).
constexpr std::string_view err_reply_too_large = "ERR reply exceeds this client's reply limit";

// The bytes a bulk string of n bytes takes in a reply ($n\r\n...\r\n), at most.
constexpr std::size_t bulk_bytes(std::size_t n) {
  return n + 24;
}

struct exec_context {
  executor& ex;
  session& sess;
  argv_t argv;
  reply r;
  time_ms now;
  std::size_t reply_start;  // where this command's reply begins in r.out()
  store& st() { return ex.store_; }
  bool replaying() const { return ex.replaying_; }
  // True if `bytes` more of reply stay within the session's max_reply.
  bool fits(std::size_t bytes) {
    const std::size_t used = r.out().size() - reply_start;
    return used <= sess.max_reply && bytes <= sess.max_reply - used;
  }
  // Drops what the reply holds so far and answers the error instead.
  void reply_too_large() {
    r.out().resize(reply_start);
    r.error(err_reply_too_large);
  }
  void log(std::initializer_list<std::string_view> a) { ex.log(argv_t(a.begin(), a.size())); }
  void log(argv_t a) { ex.log(a); }
  void wrong_args() {
    std::string e = "ERR wrong number of arguments for '";
    for (char c : argv[0]) e.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
    e += "' command";
    r.error(e);
  }
};

struct executor::command {
  std::string_view name;
  int arity;  // > 0 exact, < 0 at least -arity (Redis's convention, name included)
  bool write;
  int first_key, last_key, step;  // COMMAND's key positions
  std::string_view flags;         // COMMAND's flags, space separated
  void (*fn)(exec_context&);
};

// The table (commands.cpp), and a command's name as errors and stats give it
// ("client|kill").
std::span<const executor::command> command_table();
std::string full_name(const executor::command& k, argv_t argv);
// The keys of a command (appended to `keys`): the table's first/last/step
// positions (a negative last counts from the end), EVAL's and EVALSHA's
// numkeys. A command whose key arguments are malformed has none here (it
// fails on its own).
void command_keys(const executor::command& k, argv_t argv, std::vector<std::string_view>& keys);

// ---- transactions (transaction_commands.cpp) ------------------------------------
void cmd_multi(exec_context& c);
void cmd_exec(exec_context& c);
void cmd_discard(exec_context& c);
void cmd_watch(exec_context& c);
void cmd_unwatch(exec_context& c);
void queue_command(exec_context& c);  // in MULTI: +QUEUED
void abort_transaction(session& s);   // DISCARD's effect, no reply

// ---- pub/sub (pubsub.cpp) --------------------------------------------------------
void cmd_subscribe(exec_context& c);
void cmd_unsubscribe(exec_context& c);
void cmd_psubscribe(exec_context& c);
void cmd_punsubscribe(exec_context& c);
void cmd_publish(exec_context& c);
void cmd_pubsub(exec_context& c);

// ---- operations (admin_commands.cpp) ---------------------------------------------
void cmd_monitor(exec_context& c);
void cmd_slowlog(exec_context& c);
void cmd_shutdown(exec_context& c);
void cmd_reset(exec_context& c);
// After each command: SLOWLOG, MONITOR.
void after_command(exec_context& c, const executor::command& k, std::int64_t usec);

// ---- server and connection commands (server_commands.cpp) ---------------------
void cmd_ping(exec_context& c);
void cmd_echo(exec_context& c);
void cmd_quit(exec_context& c);
void cmd_select(exec_context& c);
void cmd_auth(exec_context& c);
void cmd_hello(exec_context& c);
void cmd_client(exec_context& c);
void cmd_config(exec_context& c);
void cmd_info(exec_context& c);
void cmd_dbsize(exec_context& c);
void cmd_flushall(exec_context& c);
void cmd_time(exec_context& c);
void cmd_wait(exec_context& c);
void cmd_cluster(exec_context& c);  // CLUSTER, READONLY, READWRITE, ASKING (cluster_commands.cpp)
void cmd_bgrewriteaof(exec_context& c);

// ---- string commands (string_commands.cpp) ------------------------------------
void cmd_get(exec_context& c);
void cmd_set(exec_context& c);
void cmd_setnx(exec_context& c);
void cmd_setex(exec_context& c);
void cmd_psetex(exec_context& c);
void cmd_getset(exec_context& c);
void cmd_getdel(exec_context& c);
void cmd_mget(exec_context& c);
void cmd_mset(exec_context& c);
void cmd_msetnx(exec_context& c);
void cmd_incr(exec_context& c);
void cmd_decr(exec_context& c);
void cmd_incrby(exec_context& c);
void cmd_decrby(exec_context& c);
void cmd_append(exec_context& c);
void cmd_strlen(exec_context& c);
void cmd_getrange(exec_context& c);

// ---- keyspace and expiry (keyspace_commands.cpp) ------------------------------
void cmd_del(exec_context& c);
void cmd_exists(exec_context& c);
void cmd_type(exec_context& c);
void cmd_scan(exec_context& c);
void cmd_keys(exec_context& c);
// The live keys `keep` accepts, each once and sorted, walking the whole
// keyspace (O(keys), as KEYS). Collection stops at `limit` keys, and, when
// `bounded`, at what the keys would take in the reply: then nullopt (the
// caller answers reply_too_large), so a store of large keys never becomes an
// unbounded copy.
std::optional<std::vector<std::string>> collect_keys(
    exec_context& c, const std::function<bool(std::string_view)>& keep, std::size_t limit,
    bool bounded);
void cmd_expire(exec_context& c);
void cmd_pexpire(exec_context& c);
void cmd_expireat(exec_context& c);
void cmd_pexpireat(exec_context& c);
void cmd_ttl(exec_context& c);
void cmd_pttl(exec_context& c);
void cmd_expiretime(exec_context& c);
void cmd_pexpiretime(exec_context& c);
void cmd_persist(exec_context& c);

// ---- scripts (script_commands.cpp) ----------------------------------------------
void cmd_eval(exec_context& c);
void cmd_evalsha(exec_context& c);
void cmd_eval_ro(exec_context& c);
void cmd_evalsha_ro(exec_context& c);
void cmd_script(exec_context& c);
// ---- collections (hash_, list_, set_, zset_commands.cpp) and keys' objects
// (object_commands.cpp)
void cmd_hset(exec_context& c);
void cmd_hmset(exec_context& c);
void cmd_hsetnx(exec_context& c);
void cmd_hget(exec_context& c);
void cmd_hmget(exec_context& c);
void cmd_hgetall(exec_context& c);
void cmd_hkeys(exec_context& c);
void cmd_hvals(exec_context& c);
void cmd_hdel(exec_context& c);
void cmd_hlen(exec_context& c);
void cmd_hexists(exec_context& c);
void cmd_hstrlen(exec_context& c);
void cmd_hincrby(exec_context& c);
void cmd_hincrbyfloat(exec_context& c);
void cmd_hscan(exec_context& c);
void cmd_lpush(exec_context& c);
void cmd_rpush(exec_context& c);
void cmd_lpushx(exec_context& c);
void cmd_rpushx(exec_context& c);
void cmd_lpop(exec_context& c);
void cmd_rpop(exec_context& c);
void cmd_blpop(exec_context& c);
void cmd_brpop(exec_context& c);
void cmd_llen(exec_context& c);
void cmd_lrange(exec_context& c);
void cmd_lindex(exec_context& c);
void cmd_lset(exec_context& c);
void cmd_lrem(exec_context& c);
void cmd_ltrim(exec_context& c);
void cmd_sadd(exec_context& c);
void cmd_srem(exec_context& c);
void cmd_smembers(exec_context& c);
void cmd_sismember(exec_context& c);
void cmd_scard(exec_context& c);
void cmd_spop(exec_context& c);
void cmd_srandmember(exec_context& c);
void cmd_sinter(exec_context& c);
void cmd_sunion(exec_context& c);
void cmd_sdiff(exec_context& c);
void cmd_sscan(exec_context& c);
void cmd_zadd(exec_context& c);
void cmd_zincrby(exec_context& c);
void cmd_zrem(exec_context& c);
void cmd_zscore(exec_context& c);
void cmd_zcard(exec_context& c);
void cmd_zrange(exec_context& c);
void cmd_zrangebyscore(exec_context& c);
void cmd_zrevrange(exec_context& c);
void cmd_zrank(exec_context& c);
void cmd_zrevrank(exec_context& c);
void cmd_zcount(exec_context& c);
void cmd_zpopmin(exec_context& c);
void cmd_zpopmax(exec_context& c);
void cmd_zscan(exec_context& c);
void cmd_object(exec_context& c);
void cmd_rename(exec_context& c);
void cmd_renamenx(exec_context& c);

}  // namespace conveyor::kv
