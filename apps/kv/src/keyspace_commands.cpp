// Keyspace and expiry commands (Redis's db.c and expire.c): DEL/UNLINK, EXISTS,
// TYPE, SCAN, KEYS; EXPIRE and its variants, TTL/PTTL, EXPIRETIME, PERSIST.
// Expiry is logged with absolute times (PEXPIREAT) so a replay means the same.
#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "command_context.hpp"

namespace conveyor::kv {

void cmd_del(exec_context& c) {
  std::int64_t n = 0;
  for (std::size_t i = 1; i < c.argv.size(); ++i)
    if (c.st().erase(c.argv[i], c.now)) {
      ++n;
      c.log({"DEL", c.argv[i]});
    }
  c.r.integer(n);
}

void cmd_exists(exec_context& c) {
  std::int64_t n = 0;
  for (std::size_t i = 1; i < c.argv.size(); ++i)
    if (c.st().contains(c.argv[i], c.now)) ++n;
  c.r.integer(n);
}

// ---- expiry -----------------------------------------------------------------

namespace {

// EXPIRE/PEXPIRE/EXPIREAT/PEXPIREAT key t [NX|XX|GT|LT]
void expire_generic(exec_context& c, bool secs, bool absolute) {
  std::int64_t v;
  if (!to_i64(c.argv[2], v)) return c.r.error(err_int);
  bool nx = false, xx = false, gt = false, lt = false;
  for (std::size_t i = 3; i < c.argv.size(); ++i) {
    auto a = c.argv[i];
    if (iequal(a, "NX"))
      nx = true;
    else if (iequal(a, "XX"))
      xx = true;
    else if (iequal(a, "GT"))
      gt = true;
    else if (iequal(a, "LT"))
      lt = true;
    else {
      std::string e = "ERR Unsupported option ";
      e += a;
      return c.r.error(e);
    }
  }
  if (nx && (xx || gt || lt))
    return c.r.error("ERR NX and XX, GT or LT options at the same time are not compatible");
  if (gt && lt) return c.r.error("ERR GT and LT options at the same time are not compatible");
  std::int64_t ms = v;
  if (secs && __builtin_mul_overflow(v, std::int64_t{1000}, &ms)) {
    // Replay: an absolute time that far before 1970 is past, not an error.
    if (!(absolute && v < 0 && c.replaying())) goto invalid;
    ms = std::numeric_limits<std::int64_t>::min();
  }
  std::int64_t at;
  if (absolute) {
    at = ms;
  } else if (__builtin_add_overflow(ms, c.now, &at)) {
    goto invalid;
  }
  {
    auto cur = c.st().expiry(c.argv[1], c.now);
    if (!cur) return c.r.integer(0);
    bool has_ttl = *cur >= 0;
    if (nx && has_ttl) return c.r.integer(0);
    if (xx && !has_ttl) return c.r.integer(0);
    // No TTL counts as an infinite one for GT/LT, as in Redis.
    if (gt && (!has_ttl || at <= *cur)) return c.r.integer(0);
    if (lt && has_ttl && at >= *cur) return c.r.integer(0);
    if (at <= c.now) {
      c.st().erase(c.argv[1], c.now);
      c.log({"DEL", c.argv[1]});
      return c.r.integer(1);
    }
    c.st().set_expiry(c.argv[1], at, c.now);
    std::string t = i64_str(at);
    c.log({"PEXPIREAT", c.argv[1], t});
    return c.r.integer(1);
  }
invalid:
  std::string e = "ERR invalid expire time in '";
  for (char ch : c.argv[0])
    e.push_back(ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch);
  e += "' command";
  c.r.error(e);
}

}  // namespace

void cmd_expire(exec_context& c) {
  expire_generic(c, true, false);
}
void cmd_pexpire(exec_context& c) {
  expire_generic(c, false, false);
}
void cmd_expireat(exec_context& c) {
  expire_generic(c, true, true);
}
void cmd_pexpireat(exec_context& c) {
  expire_generic(c, false, true);
}

namespace {

void ttl_generic(exec_context& c, bool ms, bool absolute) {
  auto e = c.st().expiry(c.argv[1], c.now);
  if (!e) return c.r.integer(-2);
  if (*e < 0) return c.r.integer(-1);
  if (absolute) return c.r.integer(ms ? *e : *e / 1000);
  std::int64_t left = *e - c.now;
  if (left < 0) left = 0;
  c.r.integer(ms ? left : (left + 500) / 1000);
}

}  // namespace

void cmd_ttl(exec_context& c) {
  ttl_generic(c, false, false);
}
void cmd_pttl(exec_context& c) {
  ttl_generic(c, true, false);
}
void cmd_expiretime(exec_context& c) {
  ttl_generic(c, false, true);
}
void cmd_pexpiretime(exec_context& c) {
  ttl_generic(c, true, true);
}

void cmd_persist(exec_context& c) {
  auto e = c.st().expiry(c.argv[1], c.now);
  if (!e || *e < 0) return c.r.integer(0);
  c.st().set_expiry(c.argv[1], std::nullopt, c.now);
  c.log({"PERSIST", c.argv[1]});
  c.r.integer(1);
}

// ---- keyspace ----------------------------------------------------------------

namespace {
std::string_view type_name(std::optional<value_type> t) {
  if (!t) return "none";
  switch (*t) {
    case value_type::string:
      return "string";
    case value_type::list:
      return "list";
    case value_type::hash:
      return "hash";
    case value_type::set:
      return "set";
    case value_type::zset:
      return "zset";
  }
  return "none";
}
}  // namespace

void cmd_type(exec_context& c) {
  c.r.simple(type_name(c.st().type_of(c.argv[1], c.now)));
}

void cmd_scan(exec_context& c) {
  std::uint64_t cursor;
  {
    auto a = c.argv[1];
    auto [p, ec] = std::from_chars(a.data(), a.data() + a.size(), cursor);
    if (ec != std::errc{} || p != a.data() + a.size()) return c.r.error("ERR invalid cursor");
  }
  std::string_view pattern;
  bool has_pattern = false;
  std::int64_t count = 10;
  std::optional<std::string_view> type;
  for (std::size_t i = 2; i < c.argv.size(); ++i) {
    bool has_next = i + 1 < c.argv.size();
    if (iequal(c.argv[i], "MATCH") && has_next) {
      pattern = c.argv[++i];
      has_pattern = !(pattern.size() == 1 && pattern[0] == '*');
    } else if (iequal(c.argv[i], "COUNT") && has_next) {
      if (!to_i64(c.argv[++i], count)) return c.r.error(err_int);
      if (count < 1) return c.r.error(err_syntax);
    } else if (iequal(c.argv[i], "TYPE") && has_next) {
      type = c.argv[++i];
    } else {
      return c.r.error(err_syntax);
    }
  }
  std::vector<std::string> keys;

  const glob_pattern glob(pattern);
  std::size_t bytes = 64;  // the reply's headers and the cursor
  bool too_large = false;
  auto next = c.st().scan(cursor, static_cast<std::size_t>(std::min<std::int64_t>(count, 1 << 20)),
                          [&](std::string_view k) {
                            if (too_large || (has_pattern && !glob.match(k))) return;
                            if (type && !iequal(*type, type_name(c.st().peek_type(k)))) return;
                            bytes += bulk_bytes(k.size());
                            if (!c.fits(bytes))
                              too_large = true;
                            else
                              keys.emplace_back(k);
                          });
  if (too_large) return c.reply_too_large();
  c.r.array(2);
  c.r.bulk(std::to_string(next));
  c.r.array(keys.size());
  for (auto& k : keys) c.r.bulk(k);
}

std::optional<std::vector<std::string>> collect_keys(
    exec_context& c, const std::function<bool(std::string_view)>& keep, std::size_t limit,
    bool bounded) {
  std::vector<std::string> keys;
  std::size_t bytes = 16;
  bool too_large = false;
  std::uint64_t cursor = 0;
  do {
    // scan reports live keys only, each once while nothing writes (a command
    // runs alone); a key is reported twice only across a resize, which no
    // command's own walk sees, but the sort below removes any repeat anyway.
    cursor = c.st().scan(cursor, 1024, [&](std::string_view k) {
      if (too_large || keys.size() >= limit || !keep(k)) return;
      bytes += bulk_bytes(k.size());
      if (bounded && !c.fits(bytes))
        too_large = true;
      else
        keys.emplace_back(k);
    });
  } while (cursor != 0 && !too_large && keys.size() < limit);
  if (too_large) return std::nullopt;
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

void cmd_keys(exec_context& c) {
  const bool all = c.argv[1] == "*";
  const glob_pattern glob(c.argv[1]);
  auto keys = collect_keys(
      c, [&](std::string_view k) { return all || glob.match(k); }, SIZE_MAX, true);
  if (!keys) return c.reply_too_large();
  c.r.array(keys->size());
  for (auto& k : *keys) c.r.bulk(k);
}

}  // namespace conveyor::kv
