// Server and connection commands (Redis's server.c, networking.c, config.c,
// acl.c): PING, ECHO, QUIT, SELECT, AUTH, HELLO, CLIENT, CONFIG, INFO, DBSIZE,
// FLUSHALL, TIME, BGREWRITEAOF; and the password comparison both front ends use.
#include <unistd.h>

#include <string>
#include <vector>

#include "aof.hpp"
#include "command_context.hpp"

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

void cmd_client(exec_context& c) {
  auto sub = c.argv[1];
  if (iequal(sub, "SETNAME") && c.argv.size() == 3) {
    for (char ch : c.argv[2])
      if (ch <= ' ' || ch > '~')
        return c.r.error("ERR Client names cannot contain spaces, newlines or special characters.");
    c.sess.name = c.argv[2];
    return c.r.simple("OK");
  }
  if (iequal(sub, "GETNAME") && c.argv.size() == 2) {
    if (c.sess.name.empty()) return c.r.null();
    return c.r.bulk(c.sess.name);
  }
  if (iequal(sub, "ID") && c.argv.size() == 2)
    return c.r.integer(static_cast<std::int64_t>(c.sess.id));
  if (iequal(sub, "SETINFO") && c.argv.size() == 4) return c.r.simple("OK");
  if (iequal(sub, "INFO") && c.argv.size() == 2) {
    std::string s = "id=" + std::to_string(c.sess.id) + " name=" + c.sess.name +
                    " db=0 resp=" + std::to_string(c.sess.resp) + "\n";
    return c.r.verbatim(s);
  }
  std::string e = "ERR unknown subcommand or wrong number of arguments for '";
  e += sub;
  e += "'. Try CLIENT HELP.";
  c.r.error(e);
}

namespace {

struct config_entry {
  std::string_view name;
  std::string value;
};

}  // namespace

void cmd_config(exec_context& c) {
  auto sub = c.argv[1];
  const auto& cfg = c.ex.config();
  if (iequal(sub, "GET") && c.argv.size() >= 3) {
    std::vector<config_entry> all = {
        {"save", ""},
        {"appendonly", cfg.appendonly ? "yes" : "no"},
        {"appendfsync", cfg.appendfsync},
        {"appendfilename", cfg.appendfilename},
        {"dir", cfg.dir},
        {"bind", cfg.bind},
        {"port", std::to_string(cfg.port)},
        {"maxmemory", std::to_string(cfg.maxmemory)},
        {"maxmemory-policy", cfg.maxmemory_policy},
        {"maxclients", std::to_string(cfg.maxclients)},
        {"timeout", std::to_string(cfg.timeout_s)},
        {"databases", "1"},
        {"requirepass", cfg.requirepass},
        {"protected-mode", "no"},
        {"cluster-enabled", "no"},
    };
    // The collections' thresholds (the start options set them; object.hpp).
    const auto& enc = c.st().encodings();
    for (auto [name, v] : {std::pair{"hash-max-listpack-entries", enc.hash_max_listpack_entries},
                           {"hash-max-listpack-value", enc.hash_max_listpack_value},
                           {"zset-max-listpack-entries", enc.zset_max_listpack_entries},
                           {"zset-max-listpack-value", enc.zset_max_listpack_value},
                           {"set-max-intset-entries", enc.set_max_intset_entries}})
      all.push_back({name, std::to_string(v)});
    std::vector<const config_entry*> hits;
    for (const auto& e : all) {
      for (std::size_t i = 2; i < c.argv.size(); ++i)
        if (glob_match(c.argv[i], e.name, true)) {
          hits.push_back(&e);
          break;
        }
    }
    c.r.map(hits.size());
    for (auto* e : hits) {
      c.r.bulk(e->name);
      c.r.bulk(e->value);
    }
    return;
  }
  if (iequal(sub, "RESETSTAT") && c.argv.size() == 2) {
    auto& s = c.ex.stats();
    s.commands = s.hits = s.misses = s.rejected_connections = s.protocol_errors = 0;
    return c.r.simple("OK");
  }
  if (iequal(sub, "SET"))
    return c.r.error(
        "ERR CONFIG SET is not supported by conveyor-kv (start options set the configuration)");
  std::string e = "ERR unknown subcommand or wrong number of arguments for '";
  e += sub;
  e += "'. Try CONFIG HELP.";
  c.r.error(e);
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

void cmd_info(exec_context& c) {
  const auto& s = c.ex.stats();
  auto ss = c.st().stats();
  auto want = [&](std::string_view section) {
    if (c.argv.size() < 2) return true;
    for (std::size_t i = 1; i < c.argv.size(); ++i)
      if (iequal(c.argv[i], section) || iequal(c.argv[i], "all") ||
          iequal(c.argv[i], "everything") || iequal(c.argv[i], "default"))
        return true;
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
  if (want("server")) {
    t += "# Server\r\n";
    line("redis_version", "7.0.15");
    line("conveyor_kv_version", "1");
    line("redis_mode", "standalone");
    line("os", "Linux");
    num("process_id", static_cast<std::uint64_t>(::getpid()));
    num("tcp_port", c.ex.config().port);
    num("uptime_in_seconds", static_cast<std::uint64_t>((c.now - c.ex.started_ms()) / 1000));
    t += "\r\n";
  }
  if (want("clients")) {
    t += "# Clients\r\n";
    num("connected_clients", s.connections_current);
    num("maxclients", c.ex.config().maxclients);
    num("rdma_connected_clients", s.rdma_clients ? s.rdma_clients() : 0);
    t += "\r\n";
  }
  if (want("memory")) {
    t += "# Memory\r\n";
    num("used_memory", ss.used_bytes);
    num("used_memory_dataset", ss.used_bytes);
    num("kv_capacity_bytes", ss.capacity_bytes);
    num("maxmemory", c.ex.config().maxmemory);
    line("maxmemory_policy", c.ex.config().maxmemory_policy);
    num("kv_retired_pending", ss.retired_pending);
    t += "\r\n";
  }
  if (want("persistence")) {
    t += "# Persistence\r\n";
    num("loading", 0);
    num("aof_enabled", c.ex.log_file() ? 1 : 0);
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
    num("rejected_connections", s.rejected_connections);
    num("total_net_input_bytes", s.net_input_bytes);
    num("total_net_output_bytes", s.net_output_bytes);
    num("expired_keys", ss.expired);
    num("evicted_keys", ss.evicted);
    num("keyspace_hits", s.hits);
    num("keyspace_misses", s.misses);
    num("protocol_errors", s.protocol_errors);
    num("timed_out_clients", s.timed_out_clients);
    num("output_limit_closes", s.output_limit_closes);
    num("evicted_clients", s.evicted_clients);
    num("one_sided_gets", s.one_sided_gets ? s.one_sided_gets() : 0);
    t += "\r\n";
  }
  if (want("rdma") && s.rdma_info) {
    t += "# Rdma\r\n";
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
  c.r.verbatim(t);
}

}  // namespace conveyor::kv
