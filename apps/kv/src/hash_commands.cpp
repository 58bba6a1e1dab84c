// Hash commands (Redis's t_hash.c): HSET/HMSET/HSETNX, HGET/HMGET/HGETALL,
// HDEL, HLEN, HEXISTS, HSTRLEN, HKEYS/HVALS, HINCRBY/HINCRBYFLOAT, HSCAN. The
// store republishes a small hash's item after each change (changed()), so
// one-sided readers see every acknowledged write. Changes are logged as HSET
// and HDEL of the resulting values.
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "type_commands.hpp"

namespace conveyor::kv {

namespace {

// Sets one field; true if it was new. Keeps `bytes` and the encoding's size rule.
bool hash_set(exec_context& c, hash_object& h, std::string_view f, std::string_view v) {
  const auto& lim = c.st().encodings();
  if (f.size() > lim.hash_max_listpack_value || v.size() > lim.hash_max_listpack_value)
    h.big = true;
  auto [e, fresh] = h.fields.insert(f);
  if (fresh) {
    h.bytes += f.size() + v.size() + element_overhead;
  } else {
    h.bytes = h.bytes - e->value.size() + v.size();
  }
  e->value.assign(v);
  return fresh;
}

const std::string* hash_get(const hash_object* h, std::string_view f) {
  if (h == nullptr) return nullptr;
  const auto* e = h->fields.find(f);
  return e == nullptr ? nullptr : &e->value;
}

void hset_generic(exec_context& c, bool reply_ok) {
  if (c.argv.size() % 2 != 0) return c.wrong_args();
  bool failed;
  auto* h = find_for_write<hash_object>(c, c.argv[1], value_type::hash, args_bytes(c, 2, 2), true,
                                        &failed);
  if (failed) return;
  std::int64_t added = 0;
  for (std::size_t i = 2; i < c.argv.size(); i += 2)
    added += hash_set(c, *h, c.argv[i], c.argv[i + 1]) ? 1 : 0;
  c.st().changed(c.argv[1], c.now);
  std::vector<std::string_view> log{"HSET"};
  log.insert(log.end(), c.argv.begin() + 1, c.argv.end());
  c.log(log);
  reply_ok ? c.r.simple("OK") : c.r.integer(added);
}

// Redis's ld2string(LD_STR_HUMAN): %.17Lf without trailing zeros.
std::string ld_human(long double v) {
  char buf[5200];
  int n = std::snprintf(buf, sizeof buf, "%.17Lf", v);
  std::string s(buf, static_cast<std::size_t>(n));
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

// Redis's string2ld: no leading space, whole string, no NaN, no overflow.
bool to_long_double(std::string_view s, long double& v) {
  if (s.empty() || s.size() > 5 * 1024 || std::isspace(static_cast<unsigned char>(s[0])))
    return false;
  std::string tmp(s);
  char* end = nullptr;
  errno = 0;
  v = std::strtold(tmp.c_str(), &end);
  if (end != tmp.c_str() + tmp.size() || std::isnan(v)) return false;
  if (errno == ERANGE && (v == HUGE_VALL || v == -HUGE_VALL || v == 0)) return false;
  return true;
}

}  // namespace

void cmd_hset(exec_context& c) {
  hset_generic(c, false);
}
void cmd_hmset(exec_context& c) {
  hset_generic(c, true);
}

void cmd_hsetnx(exec_context& c) {
  bool failed;
  auto* cur = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  if (hash_get(cur, c.argv[2]) != nullptr) return c.r.integer(0);
  auto* h = find_for_write<hash_object>(c, c.argv[1], value_type::hash, args_bytes(c, 2, 2), true,
                                        &failed);
  if (failed) return;
  hash_set(c, *h, c.argv[2], c.argv[3]);
  c.st().changed(c.argv[1], c.now);
  c.log({"HSET", c.argv[1], c.argv[2], c.argv[3]});
  c.r.integer(1);
}

void cmd_hget(exec_context& c) {
  bool failed;
  auto* h = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  auto* v = hash_get(h, c.argv[2]);
  if (v == nullptr) return c.r.null();
  if (!c.fits(bulk_bytes(v->size()))) return c.reply_too_large();
  c.r.bulk(*v);
}

void cmd_hmget(exec_context& c) {
  bool failed;
  auto* h = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  c.r.array(c.argv.size() - 2);
  for (std::size_t i = 2; i < c.argv.size(); ++i) {
    auto* v = hash_get(h, c.argv[i]);
    if (!c.fits(v ? bulk_bytes(v->size()) : 8)) return c.reply_too_large();
    v ? c.r.bulk(*v) : c.r.null();
  }
}

namespace {
// HGETALL, HKEYS, HVALS: the reply is bounded as it is built.
void hash_all(exec_context& c, bool keys, bool values) {
  bool failed;
  auto* h = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  const std::size_t n = h ? h->fields.size() : 0;
  if (keys && values)
    c.r.map(n);
  else
    c.r.array(n);
  if (h == nullptr) return;
  for (const auto* e : h->fields) {
    if (!c.fits(bulk_bytes(e->key_len) + bulk_bytes(e->value.size()))) return c.reply_too_large();
    if (keys) c.r.bulk(e->key());
    if (values) c.r.bulk(e->value);
  }
}
}  // namespace

void cmd_hgetall(exec_context& c) {
  hash_all(c, true, true);
}
void cmd_hkeys(exec_context& c) {
  hash_all(c, true, false);
}
void cmd_hvals(exec_context& c) {
  hash_all(c, false, true);
}

void cmd_hdel(exec_context& c) {
  bool failed;
  auto* h = find_for_write<hash_object>(c, c.argv[1], value_type::hash, 0, false, &failed);
  if (failed) return;
  if (h == nullptr) return c.r.integer(0);
  std::int64_t n = 0;
  std::vector<std::string_view> log{"HDEL", c.argv[1]};
  for (std::size_t i = 2; i < c.argv.size(); ++i) {
    auto* e = h->fields.find(c.argv[i]);
    if (e == nullptr) continue;
    h->bytes -= e->key_len + e->value.size() + element_overhead;
    log.push_back(c.argv[i]);
    h->fields.erase(e);
    ++n;
  }
  if (n == 0) return c.r.integer(0);
  c.st().changed(c.argv[1], c.now);  // deletes the key if that was the last field
  c.log(log);
  c.r.integer(n);
}

void cmd_hlen(exec_context& c) {
  bool failed;
  auto* h = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  c.r.integer(h ? static_cast<std::int64_t>(h->fields.size()) : 0);
}

void cmd_hexists(exec_context& c) {
  bool failed;
  auto* h = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  c.r.integer(hash_get(h, c.argv[2]) ? 1 : 0);
}

void cmd_hstrlen(exec_context& c) {
  bool failed;
  auto* h = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  auto* v = hash_get(h, c.argv[2]);
  c.r.integer(v ? static_cast<std::int64_t>(v->size()) : 0);
}

// HINCRBY, HINCRBYFLOAT: the field argv[2] of the hash argv[1] set to `value`
// (the hash created if absent), logged as the HSET that redoes it; false when
// WRONGTYPE or OOM was answered.
namespace {
bool store_field(exec_context& c, std::string_view value) {
  bool failed;
  auto* h = find_for_write<hash_object>(c, c.argv[1], value_type::hash,
                                        c.argv[2].size() + value.size() + element_overhead, true,
                                        &failed);
  if (failed) return false;
  hash_set(c, *h, c.argv[2], value);
  c.st().changed(c.argv[1], c.now);
  c.log({"HSET", c.argv[1], c.argv[2], value});
  return true;
}
}  // namespace

void cmd_hincrby(exec_context& c) {
  std::int64_t incr;
  if (!to_i64(c.argv[3], incr)) return c.r.error(err_int);
  bool failed;
  auto* cur = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  std::int64_t v = 0;
  if (auto* s = hash_get(cur, c.argv[2]); s && !to_i64(*s, v))
    return c.r.error("ERR hash value is not an integer");
  std::int64_t next;
  if (__builtin_add_overflow(v, incr, &next))
    return c.r.error("ERR increment or decrement would overflow");
  const std::string s = i64_str(next);
  if (store_field(c, s)) c.r.integer(next);
}

void cmd_hincrbyfloat(exec_context& c) {
  long double incr;
  if (!to_long_double(c.argv[3], incr)) return c.r.error(err_float);
  if (std::isinf(incr)) return c.r.error("ERR value is NaN or Infinity");
  bool failed;
  auto* cur = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  long double v = 0;
  if (auto* s = hash_get(cur, c.argv[2]); s && !to_long_double(*s, v))
    return c.r.error("ERR hash value is not a float");
  v += incr;
  if (std::isnan(v) || std::isinf(v))
    return c.r.error("ERR increment would produce NaN or Infinity");
  const std::string s = ld_human(v);
  if (store_field(c, s)) c.r.bulk(s);
}

void cmd_hscan(exec_context& c) {
  scan_args a;
  if (!parse_scan_cursor(c, 2, a)) return;
  bool failed;
  auto* h = find_for_read<hash_object>(c, c.argv[1], value_type::hash, &failed);
  if (failed) return;
  if (h == nullptr) return reply_empty_scan(c);
  if (!parse_scan_options(c, 2, a)) return;
  std::vector<const hash_object::field*> out;
  const glob_pattern glob(a.pattern);
  const auto next = scan_table(h->fields, a.cursor, a.count, !h->big, [&](const auto* e) {
    if (!a.has_pattern || glob.match(e->key())) out.push_back(e);
  });
  c.r.array(2);
  c.r.bulk(std::to_string(next));
  c.r.array(2 * out.size());
  for (auto* e : out) {
    if (!c.fits(bulk_bytes(e->key_len) + bulk_bytes(e->value.size()))) return c.reply_too_large();
    c.r.bulk(e->key());
    c.r.bulk(e->value);
  }
}

}  // namespace conveyor::kv
