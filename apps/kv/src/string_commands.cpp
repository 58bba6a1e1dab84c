// String commands (Redis's t_string.c): GET, SET and its variants, GETSET,
// GETDEL, MGET, MSET, MSETNX, INCR/DECR and their BY forms, APPEND, STRLEN,
// GETRANGE. Each change is logged as the command that redoes it.
#include <algorithm>
#include <limits>
#include <string>

#include "type_commands.hpp"

namespace conveyor::kv {

namespace {

// ---- helpers shared by the string commands ----------------------------------

// Stores and replies with the store's refusal if any; true if stored.
bool put_or_error(exec_context& c, std::string_view key, std::string_view value,
                  const put_options& po, put_status* status_out = nullptr) {
  auto st = c.st().put(key, value, po, c.now);
  if (status_out) *status_out = st;
  switch (st) {
    case put_status::stored:
      return true;
    case put_status::not_stored:
      return false;
    case put_status::out_of_memory:
      c.r.error(err_oom);
      return false;
    case put_status::too_large:
      c.r.error("ERR string exceeds maximum allowed size");
      return false;
  }
  return false;
}

}  // namespace

// ---- string commands ---------------------------------------------------------

namespace {
// A read of argv[1] that counts in INFO's keyspace hits and misses.
auto get_counted(exec_context& c) {
  auto v = c.st().get(c.argv[1], c.now);
  ++(v ? c.ex.stats().hits : c.ex.stats().misses);
  return v;
}
}  // namespace

void cmd_get(exec_context& c) {
  if (wrong_type(c, c.argv[1], value_type::string)) return;
  auto v = get_counted(c);
  if (!v) return c.r.null();
  if (!c.fits(bulk_bytes(v->size()))) return c.reply_too_large();
  c.r.bulk(*v);
}

// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]
void cmd_set(exec_context& c) {
  put_options po;
  bool want_get = false;
  bool have_expire = false;
  for (std::size_t i = 3; i < c.argv.size(); ++i) {
    auto a = c.argv[i];
    bool has_next = i + 1 < c.argv.size();
    if (iequal(a, "NX") && po.cond != put_cond::if_present) {
      po.cond = put_cond::if_absent;
    } else if (iequal(a, "XX") && po.cond != put_cond::if_absent) {
      po.cond = put_cond::if_present;
    } else if (iequal(a, "GET")) {
      want_get = true;
    } else if (iequal(a, "KEEPTTL") && !have_expire) {
      po.keep_ttl = true;
    } else if ((iequal(a, "EX") || iequal(a, "PX") || iequal(a, "EXAT") || iequal(a, "PXAT")) &&
               has_next && !have_expire && !po.keep_ttl) {
      std::int64_t v;
      if (!to_i64(c.argv[i + 1], v)) return c.r.error(err_int);
      bool secs = iequal(a, "EX") || iequal(a, "EXAT");
      bool relative = iequal(a, "EX") || iequal(a, "PX");
      // Replay takes a logged absolute time at or before now, negative ones
      // included (an older server logged them), as the deletion it stands for.
      const bool past_ok = c.replaying() && !relative;
      if (v <= 0 && !past_ok) return c.r.error("ERR invalid expire time in 'set' command");
      std::int64_t ms = v, at = 0;
      if (secs && __builtin_mul_overflow(v, std::int64_t{1000}, &ms)) {
        if (!past_ok || v > 0) return c.r.error("ERR invalid expire time in 'set' command");
        ms = std::numeric_limits<std::int64_t>::min();
      }
      if (!relative)
        at = ms;
      else if (__builtin_add_overflow(ms, c.now, &at))
        return c.r.error("ERR invalid expire time in 'set' command");
      po.expire_at = at;
      have_expire = true;
      ++i;
    } else {
      return c.r.error(err_syntax);
    }
  }
  std::optional<std::string> old;
  if (want_get) {
    if (wrong_type(c, c.argv[1], value_type::string)) return;
    auto v = c.st().get(c.argv[1], c.now);
    // The old value must fit the reply before anything changes (it would be lost).
    if (v && !c.fits(bulk_bytes(v->size()))) return c.reply_too_large();
    if (v) old.emplace(*v);
  }
  auto key = c.argv[1], value = c.argv[2];
  // An absolute time already past: the key is set and gone at once (Redis deletes it).
  if (po.expire_at && *po.expire_at <= c.now) {
    bool exists = c.st().contains(key, c.now);
    bool ok = po.cond == put_cond::always || (po.cond == put_cond::if_absent ? !exists : exists);
    if (ok && c.st().erase(key, c.now)) c.log({"DEL", key});
    if (want_get) return old ? c.r.bulk(*old) : c.r.null();
    return ok ? c.r.simple("OK") : c.r.null();
  }
  put_status st;
  if (!put_or_error(c, key, value, po, &st)) {
    if (st != put_status::not_stored) return;  // the error is the reply
    return want_get ? (old ? c.r.bulk(*old) : c.r.null()) : c.r.null();
  }
  if (po.expire_at) {
    std::string t = i64_str(*po.expire_at);
    c.log({"SET", key, value, "PXAT", t});
  } else if (po.keep_ttl) {
    c.log({"SET", key, value, "KEEPTTL"});
  } else {
    c.log({"SET", key, value});
  }
  if (want_get) return old ? c.r.bulk(*old) : c.r.null();
  c.r.simple("OK");
}

namespace {

void set_with_ttl(exec_context& c, std::string_view key, std::string_view value,
                  std::string_view ttl, bool secs, std::string_view cmd) {
  std::int64_t v;
  if (!to_i64(ttl, v)) return c.r.error(err_int);
  // now + ttl must not overflow (it would log a negative time), in either unit.
  std::int64_t ms = v, at = 0;
  if (v <= 0 || (secs && __builtin_mul_overflow(v, std::int64_t{1000}, &ms)) ||
      __builtin_add_overflow(ms, c.now, &at)) {
    std::string e = "ERR invalid expire time in '";
    e += cmd;
    e += "' command";
    return c.r.error(e);
  }
  put_options po;
  po.expire_at = at;
  if (!put_or_error(c, key, value, po)) return;
  std::string t = i64_str(*po.expire_at);
  c.log({"SET", key, value, "PXAT", t});
  c.r.simple("OK");
}

}  // namespace

void cmd_setex(exec_context& c) {
  set_with_ttl(c, c.argv[1], c.argv[3], c.argv[2], true, "setex");
}
void cmd_psetex(exec_context& c) {
  set_with_ttl(c, c.argv[1], c.argv[3], c.argv[2], false, "psetex");
}

void cmd_setnx(exec_context& c) {
  put_options po;
  po.cond = put_cond::if_absent;
  put_status st;
  if (put_or_error(c, c.argv[1], c.argv[2], po, &st)) {
    c.log({"SET", c.argv[1], c.argv[2]});
    return c.r.integer(1);
  }
  if (st == put_status::not_stored) c.r.integer(0);
}

void cmd_getset(exec_context& c) {
  if (wrong_type(c, c.argv[1], value_type::string)) return;
  std::optional<std::string> old;
  if (auto v = c.st().get(c.argv[1], c.now)) {
    if (!c.fits(bulk_bytes(v->size()))) return c.reply_too_large();  // before the write
    old.emplace(*v);
  }
  if (!put_or_error(c, c.argv[1], c.argv[2], put_options{})) return;
  c.log({"SET", c.argv[1], c.argv[2]});
  old ? c.r.bulk(*old) : c.r.null();
}

void cmd_getdel(exec_context& c) {
  if (wrong_type(c, c.argv[1], value_type::string)) return;
  auto v = get_counted(c);
  if (!v) return c.r.null();
  // A value the reply cannot carry stays where it is.
  if (!c.fits(bulk_bytes(v->size()))) return c.reply_too_large();
  c.r.bulk(*v);  // copied into the reply before the erase frees it
  c.st().erase(c.argv[1], c.now);
  c.log({"DEL", c.argv[1]});
}

// The reply is bounded as it is built: one key named many times must not make
// a short request into a reply of many times the value.
void cmd_mget(exec_context& c) {
  c.r.array(c.argv.size() - 1);
  for (std::size_t i = 1; i < c.argv.size(); ++i) {
    auto v = c.st().get(c.argv[i], c.now);
    if (!c.fits(v ? bulk_bytes(v->size()) : 8)) return c.reply_too_large();
    if (v) {
      ++c.ex.stats().hits;
      c.r.bulk(*v);
    } else {
      ++c.ex.stats().misses;
      c.r.null();
    }
  }
}

void cmd_mset(exec_context& c) {
  if (c.argv.size() % 2 != 1) return c.wrong_args();
  for (std::size_t i = 1; i < c.argv.size(); i += 2) {
    if (!put_or_error(c, c.argv[i], c.argv[i + 1], put_options{}))
      return;  // error already the reply
    c.log({"SET", c.argv[i], c.argv[i + 1]});
  }
  c.r.simple("OK");
}

void cmd_msetnx(exec_context& c) {
  if (c.argv.size() % 2 != 1) return c.wrong_args();
  for (std::size_t i = 1; i < c.argv.size(); i += 2)
    if (c.st().contains(c.argv[i], c.now)) return c.r.integer(0);
  for (std::size_t i = 1; i < c.argv.size(); i += 2) {
    if (!put_or_error(c, c.argv[i], c.argv[i + 1], put_options{})) return;
    c.log({"SET", c.argv[i], c.argv[i + 1]});
  }
  c.r.integer(1);
}

namespace {

void incr_by(exec_context& c, std::int64_t delta) {
  if (wrong_type(c, c.argv[1], value_type::string)) return;
  std::int64_t cur = 0;
  if (auto v = c.st().get(c.argv[1], c.now)) {
    if (!to_i64(*v, cur)) return c.r.error(err_int);
  }
  std::int64_t next;
  if (__builtin_add_overflow(cur, delta, &next))
    return c.r.error("ERR increment or decrement would overflow");
  std::string s = i64_str(next);
  put_options po;
  po.keep_ttl = true;
  if (!put_or_error(c, c.argv[1], s, po)) return;
  c.log({"SET", c.argv[1], s, "KEEPTTL"});
  c.r.integer(next);
}

}  // namespace

void cmd_incr(exec_context& c) {
  incr_by(c, 1);
}
void cmd_decr(exec_context& c) {
  incr_by(c, -1);
}
void cmd_incrby(exec_context& c) {
  std::int64_t d;
  if (!to_i64(c.argv[2], d)) return c.r.error(err_int);
  incr_by(c, d);
}
void cmd_decrby(exec_context& c) {
  std::int64_t d;
  if (!to_i64(c.argv[2], d) || d == std::numeric_limits<std::int64_t>::min())
    return c.r.error(d == std::numeric_limits<std::int64_t>::min() ? "ERR decrement would overflow"
                                                                   : err_int);
  incr_by(c, -d);
}

void cmd_append(exec_context& c) {
  if (wrong_type(c, c.argv[1], value_type::string)) return;
  std::string s;
  if (auto v = c.st().get(c.argv[1], c.now)) s.assign(*v);
  s.append(c.argv[2]);
  put_options po;
  po.keep_ttl = true;
  if (!put_or_error(c, c.argv[1], s, po)) return;
  c.log({"SET", c.argv[1], s, "KEEPTTL"});
  c.r.integer(static_cast<std::int64_t>(s.size()));
}

void cmd_strlen(exec_context& c) {
  if (wrong_type(c, c.argv[1], value_type::string)) return;
  auto v = c.st().get(c.argv[1], c.now);
  c.r.integer(v ? static_cast<std::int64_t>(v->size()) : 0);
}

void cmd_getrange(exec_context& c) {
  std::int64_t start, end;
  if (!to_i64(c.argv[2], start) || !to_i64(c.argv[3], end)) return c.r.error(err_int);
  if (wrong_type(c, c.argv[1], value_type::string)) return;
  auto v = c.st().get(c.argv[1], c.now);
  if (!v || v->empty()) return c.r.bulk("");
  auto n = static_cast<std::int64_t>(v->size());
  if (start < 0 && end < 0 && start > end) return c.r.bulk("");
  if (start < 0) start = std::max<std::int64_t>(n + start, 0);
  if (end < 0) end = std::max<std::int64_t>(n + end, 0);
  if (end >= n) end = n - 1;
  if (start > end || start >= n) return c.r.bulk("");
  c.r.bulk(v->substr(static_cast<std::size_t>(start), static_cast<std::size_t>(end - start + 1)));
}

}  // namespace conveyor::kv
