// CONFIG GET, SET and RESETSTAT (Redis's config.c) for the settings that apply
// to conveyor-kv. CONFIG SET validates every pair before applying any (Redis
// 7's all-or-nothing), with Redis's error texts.
#include <cstdlib>
#include <string>
#include <vector>

#include "aof.hpp"
#include "command_context.hpp"

namespace conveyor::kv {

namespace {

struct config_entry {
  std::string_view name;
  std::string value;
};

std::string buffer_limits(const server_config& cfg) {
  return "normal 0 0 0 slave 268435456 67108864 60 pubsub " + std::to_string(cfg.pubsub_hard) +
         " " + std::to_string(cfg.pubsub_soft) + " " + std::to_string(cfg.pubsub_soft_s);
}

std::vector<config_entry> entries(const server_config& cfg) {
  return {
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
      {"protected-mode", cfg.protected_mode ? "yes" : "no"},
      {"cluster-enabled", cfg.cluster_enabled ? "yes" : "no"},
      {"slowlog-log-slower-than", std::to_string(cfg.slowlog_log_slower_than)},
      {"slowlog-max-len", std::to_string(cfg.slowlog_max_len)},
      {"client-output-buffer-limit", buffer_limits(cfg)},
      // Scripts (script.hpp): lua-time-limit is Redis 7's alias of it.
      {"busy-reply-threshold", std::to_string(cfg.busy_reply_threshold_ms)},
      {"lua-time-limit", std::to_string(cfg.busy_reply_threshold_ms)},
  };
}

// Redis's memtoull: digits with an optional unit (b, k, kb, m, mb, g, gb).
bool memory_value(std::string_view s, std::uint64_t& out) {
  std::size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0 || i > 19) return false;
  std::uint64_t v = std::strtoull(std::string(s.substr(0, i)).c_str(), nullptr, 10);
  std::string unit;
  for (char ch : s.substr(i))
    unit += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  std::uint64_t mul = 1;
  if (unit.empty() || unit == "b")
    mul = 1;
  else if (unit == "k")
    mul = 1000;
  else if (unit == "kb")
    mul = 1024;
  else if (unit == "m")
    mul = 1000 * 1000;
  else if (unit == "mb")
    mul = 1024 * 1024;
  else if (unit == "g")
    mul = 1000ull * 1000 * 1000;
  else if (unit == "gb")
    mul = 1024ull * 1024 * 1024;
  else
    return false;
  if (v > ~0ull / mul) return false;
  out = v * mul;
  return true;
}

bool int_in(std::string_view s, std::int64_t lo, std::int64_t hi, std::int64_t& v,
            std::string& why) {
  if (!to_i64(s, v)) {
    why = "argument couldn't be parsed into an integer";
    return false;
  }
  if (v < lo || v > hi) {
    why = "argument must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
          " inclusive";
    return false;
  }
  return true;
}

// Validates one pair into `next`; false with Redis's reason.
bool set_one(server_config& next, std::string_view name, std::string_view v, std::string& why) {
  std::int64_t n;
  if (name == "timeout") {
    if (!int_in(v, 0, 2147483647, n, why)) return false;
    next.timeout_s = static_cast<unsigned>(n);
  } else if (name == "requirepass") {
    if (v.size() > 200) {
      why = "a password of at most 200 bytes (RDMA clients present it in their connection request)";
      return false;
    }
    next.requirepass = std::string(v);
  } else if (name == "appendfsync") {
    fsync_policy p;
    if (!parse_fsync_policy(v, p)) {
      why = "argument(s) must be one of the following: everysec, always, no";
      return false;
    }
    next.appendfsync = std::string(to_string(p));
  } else if (name == "maxmemory") {
    std::uint64_t m;
    if (!memory_value(v, m)) {
      why = "argument must be a memory value";
      return false;
    }
    next.maxmemory = m;
  } else if (name == "maxmemory-policy") {
    if (iequal(v, "noeviction"))
      next.maxmemory_policy = "noeviction";
    else if (iequal(v, "allkeys-lru"))
      next.maxmemory_policy = "allkeys-lru";
    else {
      why =
          "argument(s) must be one of the following: noeviction, allkeys-lru (the policies "
          "conveyor-kv has)";
      return false;
    }
  } else if (name == "slowlog-log-slower-than") {
    if (!int_in(v, -1, INT64_MAX, n, why)) return false;
    next.slowlog_log_slower_than = n;
  } else if (name == "slowlog-max-len") {
    // Bounded: each entry holds up to 32 arguments of 128 bytes.
    if (!int_in(v, 0, 10000, n, why)) return false;
    next.slowlog_max_len = static_cast<std::size_t>(n);
  } else if (name == "busy-reply-threshold" || name == "lua-time-limit") {
    if (!int_in(v, 0, INT64_MAX, n, why)) return false;
    next.busy_reply_threshold_ms = static_cast<std::uint64_t>(n);
  } else if (name == "protected-mode") {
    if (iequal(v, "yes"))
      next.protected_mode = true;
    else if (iequal(v, "no"))
      next.protected_mode = false;
    else {
      why = "argument must be 'yes' or 'no'";
      return false;
    }
  } else if (name == "client-output-buffer-limit") {
    std::vector<std::string> f;
    if (!split_inline(v, f) || f.size() % 4 != 0) {
      why = "Wrong number of arguments in buffer limit configuration.";
      return false;
    }
    for (std::size_t i = 0; i < f.size(); i += 4) {
      std::uint64_t hard, soft;
      std::int64_t secs;
      if (!memory_value(f[i + 1], hard) || !memory_value(f[i + 2], soft) ||
          !to_i64(f[i + 3], secs) || secs < 0 || secs > 2147483647) {
        why = "Error in hard, soft or soft_seconds setting in buffer limit configuration.";
        return false;
      }
      if (iequal(f[i], "pubsub")) {
        next.pubsub_hard = hard;
        next.pubsub_soft = soft;
        next.pubsub_soft_s = static_cast<unsigned>(secs);
      } else if (iequal(f[i], "normal") || iequal(f[i], "slave") || iequal(f[i], "replica")) {
        const bool same = iequal(f[i], "normal")
                              ? hard == 0 && soft == 0 && secs == 0
                              : hard == 268435456 && soft == 67108864 && secs == 60;
        if (!same) {
          why =
              "only the pubsub class can be changed in conveyor-kv (normal clients have "
              "fixed output bounds, docs/KV.md)";
          return false;
        }
      } else {
        why = "Invalid client class specified in buffer limit configuration.";
        return false;
      }
    }
  } else {
    return false;
  }
  return true;
}

}  // namespace

void cmd_config(exec_context& c) {
  auto sub = c.argv[1];
  auto& cfg = c.ex.config();
  if (iequal(sub, "GET") && c.argv.size() >= 3) {
    auto all = entries(cfg);
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
  if (iequal(sub, "SET")) {
    if (c.argv.size() < 4 || c.argv.size() % 2 != 0)
      return c.r.error("ERR wrong number of arguments for 'config|set' command");
    server_config next = cfg;
    std::vector<std::string> seen;
    for (std::size_t i = 2; i + 1 < c.argv.size(); i += 2) {
      std::string name;
      for (char ch : c.argv[i].substr(0, 64))
        name += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
      for (auto& s : seen)
        if (s == name)
          return c.r.error("ERR CONFIG SET failed (possibly related to argument '" + name +
                           "') - duplicate parameter");
      seen.push_back(name);
      std::string why;
      if (!set_one(next, name, c.argv[i + 1], why)) {
        if (why.empty())
          return c.r.error("ERR Unknown option or number of arguments for CONFIG SET - '" +
                           std::string(c.argv[i].substr(0, 128)) + "'");
        return c.r.error("ERR CONFIG SET failed (possibly related to argument '" + name + "') - " +
                         why);
      }
    }
    // Every pair is valid: apply them (the RDMA front end's password first: the
    // one that can refuse).
    if (next.requirepass != cfg.requirepass && c.ex.stats().rdma_requirepass &&
        !c.ex.stats().rdma_requirepass(next.requirepass))
      return c.r.error(
          "ERR CONFIG SET failed (possibly related to argument 'requirepass') - longer than "
          "an RDMA client's connection request carries");
    if (next.maxmemory != cfg.maxmemory || next.maxmemory_policy != cfg.maxmemory_policy)
      c.st().set_limits(next.maxmemory, next.maxmemory_policy == "allkeys-lru"
                                            ? eviction_policy::allkeys_lru
                                            : eviction_policy::noeviction);
    if (next.appendfsync != cfg.appendfsync && c.ex.log_file()) {
      fsync_policy p;
      parse_fsync_policy(next.appendfsync, p);
      c.ex.log_file()->set_fsync(p);
    }
    cfg = next;
    return c.r.simple("OK");
  }
  if (iequal(sub, "RESETSTAT") && c.argv.size() == 2) {
    auto& s = c.ex.stats();
    s.commands = s.hits = s.misses = s.rejected_connections = s.protocol_errors = 0;
    s.watch_aborts = s.exec_aborts = s.slow_commands = 0;
    for (auto& cs : c.ex.command_stats()) cs = {};
    return c.r.simple("OK");
  }
  std::string e = "ERR unknown subcommand or wrong number of arguments for '";
  e += sub.substr(0, 128);
  e += "'. Try CONFIG HELP.";
  c.r.error(e);
}

}  // namespace conveyor::kv
