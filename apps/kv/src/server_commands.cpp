// Server and connection commands (Redis's server.c, networking.c, config.c,
// acl.c): PING, ECHO, QUIT, SELECT, AUTH, HELLO, CLIENT, CONFIG, INFO, DBSIZE,
// FLUSHALL, TIME, BGREWRITEAOF; and the password comparison both front ends use.
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <string>
#include <vector>

#include "aof.hpp"
#include "command_context.hpp"
#include "pubsub.hpp"

namespace conveyor::kv {

bool password_equal(std::string_view want, std::string_view presented) noexcept {
  // Every byte of the presented password is compared (against the configured
  // one, cyclically), so the time says nothing about how much of it was right.
  unsigned diff = static_cast<unsigned>(want.size() ^ presented.size());
  if (want.empty()) return presented.empty();
  for (std::size_t i = 0; i < presented.size(); ++i)
    diff |= static_cast<unsigned char>(presented[i]) ^
            static_cast<unsigned char>(want[i % want.size()]);
  return diff == 0;
}

// ---- connection and server commands ------------------------------------------

void cmd_ping(exec_context& c) {
  if (c.argv.size() > 2) return c.wrong_args();
  if (c.sess.resp == 2 && (!c.sess.channels.empty() || !c.sess.patterns.empty())) {
    // Subscribed (RESP2): a pong frame, as Redis sends it there.
    c.r.array(2);
    c.r.bulk("pong");
    return c.r.bulk(c.argv.size() == 2 ? c.argv[1] : "");
  }
  if (c.argv.size() == 2)
    c.r.bulk(c.argv[1]);
  else
    c.r.simple("PONG");
}

void cmd_echo(exec_context& c) {
  c.r.bulk(c.argv[1]);
}

void cmd_quit(exec_context& c) {
  c.sess.close_after_reply = true;
  c.r.simple("OK");
}

void cmd_select(exec_context& c) {
  std::int64_t db;
  if (!to_i64(c.argv[1], db)) return c.r.error(err_int);
  if (db != 0) return c.r.error("ERR DB index is out of range");
  c.r.simple("OK");
}

namespace {

bool check_password(exec_context& c, std::string_view user, std::string_view pass) {
  if (c.ex.config().requirepass.empty()) {
    c.r.error(
        "ERR AUTH <password> called without any password configured for the default user. Are you "
        "sure your configuration is correct?");
    return false;
  }
  const bool same = password_equal(c.ex.config().requirepass, pass);
  if (!iequal(user, "default") || !same) {
    c.r.error("WRONGPASS invalid username-password pair or user is disabled.");
    return false;
  }
  c.sess.authenticated = true;
  return true;
}

}  // namespace

void cmd_auth(exec_context& c) {
  if (c.argv.size() > 3) return c.r.error(err_syntax);
  bool ok = c.argv.size() == 2 ? check_password(c, "default", c.argv[1])
                               : check_password(c, c.argv[1], c.argv[2]);
  if (ok) c.r.simple("OK");
}

void cmd_hello(exec_context& c) {
  int proto = c.sess.resp;
  std::size_t i = 1;
  if (c.argv.size() >= 2) {
    std::int64_t v;
    if (!to_i64(c.argv[1], v))
      return c.r.error("ERR Protocol version is not an integer or out of range");
    if (v != 2 && v != 3) return c.r.error("NOPROTO unsupported protocol version");
    proto = static_cast<int>(v);
    i = 2;
  }
  std::string_view name;
  bool has_name = false;
  for (; i < c.argv.size(); ++i) {
    if (iequal(c.argv[i], "AUTH") && i + 2 < c.argv.size()) {
      if (!check_password(c, c.argv[i + 1], c.argv[i + 2])) return;
      i += 2;
    } else if (iequal(c.argv[i], "SETNAME") && i + 1 < c.argv.size()) {
      name = c.argv[++i];
      has_name = true;
    } else {
      std::string e = "ERR Syntax error in HELLO option '";
      e += c.argv[i];
      e += "'";
      return c.r.error(e);
    }
  }
  if (!c.ex.config().requirepass.empty() && !c.sess.authenticated)
    return c.r.error(
        "NOAUTH HELLO must be called with the client already authenticated, otherwise the "
        "HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and "
        "select the RESP protocol version at the same time");
  if (has_name) c.sess.name = name;
  c.sess.resp = proto;
  reply r(c.r.out(), proto);
  r.map(7);
  r.bulk("server");
  r.bulk("redis");
  r.bulk("version");
  r.bulk("7.0.15");
  r.bulk("proto");
  r.integer(proto);
  r.bulk("id");
  r.integer(static_cast<std::int64_t>(c.sess.id));
  r.bulk("mode");
  r.bulk("standalone");
  r.bulk("role");
  r.bulk("master");
  r.bulk("modules");
  r.array(0);
}

void cmd_dbsize(exec_context& c) {
  c.r.integer(static_cast<std::int64_t>(c.st().size()));
}

void cmd_flushall(exec_context& c) {
  if (c.argv.size() > 2 ||
      (c.argv.size() == 2 && !iequal(c.argv[1], "SYNC") && !iequal(c.argv[1], "ASYNC")))
    return c.r.error(err_syntax);
  c.st().clear();
  c.log({"FLUSHALL"});
  c.r.simple("OK");
}

// WAIT numreplicas timeout. Replication here is synchronous: when WAIT runs,
// every write acknowledged to this connection is on every in-sync replica,
// and WAIT's own reply is held like any other until they have applied what
// came before it. So it answers at once with the in-sync set's size (0 on a
// node that replicates to nobody) and never blocks for more replicas: one
// joins the in-sync set by a shard-map change, not within a WAIT
// (docs/KV-CLUSTER.md).
void cmd_wait(exec_context& c) {
  std::int64_t want = 0, timeout = 0;
  if (!to_i64(c.argv[1], want)) return c.r.error(err_int);  // Redis 7.0's order
  if (!to_i64(c.argv[2], timeout))
    return c.r.error("ERR timeout is not an integer or out of range");
  if (timeout < 0) return c.r.error("ERR timeout is negative");
  const sync_point* sp = c.ex.sync();
  c.r.integer(sp != nullptr && sp->in_sync ? static_cast<std::int64_t>(sp->in_sync()) : 0);
}

void cmd_time(exec_context& c) {
  auto ms = now_ms();
  c.r.array(2);
  c.r.bulk(i64_str(ms / 1000));
  c.r.bulk(i64_str((ms % 1000) * 1000));
}

void cmd_bgrewriteaof(exec_context& c) {
  if (c.ex.log_file() == nullptr)
    return c.r.error("ERR the server runs without an append-only file (--appendonly no)");
  std::string why;
  c.ex.log_file()->flush();
  if (!c.ex.log_file()->rewrite(c.st(), why)) return c.r.error("ERR AOF rewrite failed: " + why);
  c.r.simple("Background append only file rewriting started");
}

void executor::sample_ops(std::int64_t now) noexcept {
  if (ops_last_ms_ != 0 && now > ops_last_ms_) {
    const auto done =
        stats_.commands >= ops_last_commands_ ? stats_.commands - ops_last_commands_ : 0;
    ops_samples_[ops_index_++ % ops_samples_.size()] =
        done * 1000 / static_cast<std::uint64_t>(now - ops_last_ms_);
  }
  ops_last_ms_ = now;
  ops_last_commands_ = stats_.commands;
}

std::uint64_t executor::ops_per_sec() const noexcept {
  const std::size_t n = std::min(ops_index_, ops_samples_.size());
  if (n == 0) return 0;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += ops_samples_[i];
  return sum / n;
}

namespace {

// Resident bytes, from /proc/self/statm (its second field, in pages).
std::uint64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, rss = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &rss);
  std::fclose(f);
  return got == 2 ? rss * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

std::string human(std::uint64_t b) {
  char tmp[32];
  if (b < 1024) {
    std::snprintf(tmp, sizeof tmp, "%lluB", static_cast<unsigned long long>(b));
  } else {
    const char* units = "KMGTPE";
    double v = static_cast<double>(b) / 1024;
    int i = 0;
    while (v >= 1024 && i < 5) {
      v /= 1024;
      ++i;
    }
    std::snprintf(tmp, sizeof tmp, "%.2f%c", v, units[i]);
  }
  return tmp;
}

std::string seconds(const timeval& tv) {
  char tmp[32];
  std::snprintf(tmp, sizeof tmp, "%ld.%06ld", static_cast<long>(tv.tv_sec),
                static_cast<long>(tv.tv_usec));
  return tmp;
}

}  // namespace

void cmd_info(exec_context& c) {
  const auto& s = c.ex.stats();
  const auto& cfg = c.ex.config();
  auto ss = c.st().stats();
  // INFO with no argument, "default", "all", "everything": Redis's sections;
  // commandstats only when asked for (or all/everything), as Redis.
  auto want = [&](std::string_view section) {
    if (c.argv.size() < 2) return section != "commandstats";
    for (std::size_t i = 1; i < c.argv.size(); ++i) {
      if (iequal(c.argv[i], section) || iequal(c.argv[i], "all") || iequal(c.argv[i], "everything"))
        return true;
      if (iequal(c.argv[i], "default") && section != "commandstats") return true;
    }
    return false;
  };
  std::string t;
  auto line = [&](std::string_view k, const std::string& v) {
    t += k;
    t += ':';
    t += v;
    t += "\r\n";
  };
  auto num = [&](std::string_view k, std::uint64_t v) { line(k, std::to_string(v)); };
  const auto uptime_s = static_cast<std::uint64_t>((c.now - c.ex.started_ms()) / 1000);
  if (want("server")) {
    t += "# Server\r\n";
    line("redis_version", "7.0.15");  // the Redis whose protocol and commands are followed
    line("conveyor_kv_version", "1");
    line("redis_mode", "standalone");
    line("os", "Linux");
    line("multiplexing_api", "epoll");
    num("process_id", static_cast<std::uint64_t>(::getpid()));
    line("run_id", cfg.run_id);
    num("tcp_port", cfg.port);
    num("uptime_in_seconds", uptime_s);
    num("uptime_in_days", uptime_s / 86400);
    num("hz", 10);
    t += "\r\n";
  }
  if (want("clients")) {
    t += "# Clients\r\n";
    num("connected_clients", s.connections_current);
    num("maxclients", cfg.maxclients);
    num("blocked_clients", c.ex.hooks().blocked_clients ? c.ex.hooks().blocked_clients() : 0);
    num("rdma_connected_clients", s.rdma_clients ? s.rdma_clients() : 0);
    t += "\r\n";
  }
  if (want("memory")) {
    const std::uint64_t rss = resident_bytes();
    t += "# Memory\r\n";
    num("used_memory", ss.used_bytes);
    line("used_memory_human", human(ss.used_bytes));
    num("used_memory_rss", rss);
    line("used_memory_rss_human", human(rss));
    num("used_memory_dataset", ss.used_bytes);
    num("kv_capacity_bytes", ss.capacity_bytes);
    num("maxmemory", cfg.maxmemory);
    line("maxmemory_human", human(cfg.maxmemory));
    line("maxmemory_policy", cfg.maxmemory_policy);
    num("kv_retired_pending", ss.retired_pending);
    num("kv_retired_bytes", ss.retired_bytes);
    t += "\r\n";
  }
  if (want("persistence")) {
    t += "# Persistence\r\n";
    num("loading", 0);
    num("async_loading", 0);
    num("rdb_changes_since_last_save", 0);
    num("rdb_bgsave_in_progress", 0);
    num("aof_enabled", c.ex.log_file() ? 1 : 0);
    num("aof_rewrite_in_progress", 0);
    num("aof_rewrite_scheduled", 0);
    if (c.ex.log_file()) {
      num("aof_current_size", c.ex.log_file()->size());
      num("aof_rewrites", c.ex.log_file()->rewrites());
      line("aof_last_write_status", c.ex.log_file()->healthy() ? "ok" : "err");
      line("appendfsync", std::string(to_string(c.ex.log_file()->options().fsync)));
    }
    t += "\r\n";
  }
  if (want("stats")) {
    t += "# Stats\r\n";
    num("total_connections_received", s.connections_total);
    num("total_commands_processed", s.commands);
    num("instantaneous_ops_per_sec", c.ex.ops_per_sec());
    num("total_net_input_bytes", s.net_input_bytes);
    num("total_net_output_bytes", s.net_output_bytes);
    num("rejected_connections", s.rejected_connections);
    num("expired_keys", ss.expired);
    num("evicted_keys", ss.evicted);
    // Commands the server ran (GET, MGET, GETDEL over RESP and RPC); a
    // one-sided GET never reaches this process's threads (INFO conveyor).
    num("keyspace_hits", s.hits);
    num("keyspace_misses", s.misses);
    num("pubsub_channels", c.ex.channels().active_channels("*", true).size());
    num("pubsub_patterns", c.ex.channels().patterns());
    num("protocol_errors", s.protocol_errors);
    num("timed_out_clients", s.timed_out_clients);
    num("output_limit_closes", s.output_limit_closes);
    num("evicted_clients", s.evicted_clients);
    num("watch_aborted_execs", s.watch_aborts);
    num("execabort_execs", s.exec_aborts);
    num("slowlog_entries_total", s.slow_commands);
    if (s.one_sided_gets) num("one_sided_gets", s.one_sided_gets());
    t += "\r\n";
  }
  if (want("replication")) {
    t += "# Replication\r\n";
    if (s.replication_info) {
      s.replication_info(t);  // a cluster node's role, links, offsets (repl/)
    } else {
      line("role", "master");
      num("connected_slaves", 0);
      line("master_replid", cfg.run_id);
      num("master_repl_offset", 0);
    }
    t += "\r\n";
  }
  if (want("cpu")) {
    rusage self{};
    ::getrusage(RUSAGE_SELF, &self);
    t += "# CPU\r\n";
    line("used_cpu_sys", seconds(self.ru_stime));
    line("used_cpu_user", seconds(self.ru_utime));
    t += "\r\n";
  }
  if (want("commandstats")) {
    t += "# Commandstats\r\n";
    auto table = command_table();
    const auto& cs = c.ex.command_stats();
    for (std::size_t i = 0; i < table.size() && i < cs.size(); ++i) {
      if (cs[i].calls == 0 && cs[i].rejected == 0) continue;
      char per[32];
      std::snprintf(
          per, sizeof per, "%.2f",
          cs[i].calls ? static_cast<double>(cs[i].usec) / static_cast<double>(cs[i].calls) : 0.0);
      line("cmdstat_" + std::string(table[i].name),
           "calls=" + std::to_string(cs[i].calls) + ",usec=" + std::to_string(cs[i].usec) +
               ",usec_per_call=" + per + ",rejected_calls=" + std::to_string(cs[i].rejected) +
               ",failed_calls=" + std::to_string(cs[i].failed));
    }
    t += "\r\n";
  }
  if (want("cluster")) {
    t += "# Cluster\r\n";
    num("cluster_enabled", c.ex.config().cluster_enabled ? 1 : 0);
    t += "\r\n";
  }
  if (want("conveyor") && s.rdma_info) {
    t += "# Conveyor\r\n";
    s.rdma_info(t);
    t += "\r\n";
  }
  if (want("keyspace")) {
    t += "# Keyspace\r\n";
    if (ss.keys != 0)
      line("db0", "keys=" + std::to_string(ss.keys) + ",expires=" + std::to_string(ss.expires) +
                      ",avg_ttl=0");
    t += "\r\n";
  }
  // Sections are separated by a blank line, and the last has none after it (Redis).
  if (t.ends_with("\r\n\r\n")) t.resize(t.size() - 2);
  c.r.verbatim(t);
}

}  // namespace conveyor::kv
