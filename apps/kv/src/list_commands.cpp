// List commands (Redis's t_list.c): LPUSH/RPUSH (and the X forms), LPOP/RPOP
// with a count, LRANGE, LLEN, LINDEX, LSET, LREM, LTRIM, BLPOP/BRPOP. A push
// signals the key to the blocked clients (blocking.hpp). Pops are logged as
// LPOP/RPOP with the count they took; BLPOP's as the pop it did.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "type_commands.hpp"

namespace conveyor::kv {

namespace {

void push_generic(exec_context& c, bool left, bool only_existing) {
  bool failed;
  auto* l = find_for_write<list_object>(c, c.argv[1], value_type::list, args_bytes(c, 2),
                                        !only_existing, &failed);
  if (failed) return;
  if (l == nullptr) return c.r.integer(0);
  for (std::size_t i = 2; i < c.argv.size(); ++i) {
    l->bytes += c.argv[i].size() + element_overhead;
    if (left)
      l->items.emplace_front(c.argv[i]);
    else
      l->items.emplace_back(c.argv[i]);
  }
  const auto n = static_cast<std::int64_t>(l->items.size());
  c.st().changed(c.argv[1], c.now);
  std::vector<std::string_view> log{left ? "LPUSH" : "RPUSH"};
  log.insert(log.end(), c.argv.begin() + 1, c.argv.end());
  c.log(log);
  c.ex.blocking().signal(c.argv[1]);
  c.r.integer(n);
}

std::string pop_one(list_object& l, bool left) {
  std::string v = std::move(left ? l.items.front() : l.items.back());
  left ? l.items.pop_front() : l.items.pop_back();
  l.bytes -= v.size() + element_overhead;
  return v;
}

// Redis's index normalisation for LRANGE and LTRIM: false if the range is empty.
bool clamp_range(std::int64_t n, std::int64_t& start, std::int64_t& end) {
  if (start < 0) start += n;
  if (end < 0) end += n;
  if (start < 0) start = 0;
  if (start > end || start >= n) return false;
  if (end >= n) end = n - 1;
  return true;
}

void pop_generic(exec_context& c, bool left) {
  if (c.argv.size() > 3) return c.wrong_args();
  const bool has_count = c.argv.size() == 3;
  std::int64_t count = 1;
  if (has_count && (!to_i64(c.argv[2], count) || count < 0))
    return c.r.error("ERR value is out of range, must be positive");
  bool failed;
  auto* l = find_for_write<list_object>(c, c.argv[1], value_type::list, 0, false, &failed);
  if (failed) return;
  if (l == nullptr) return has_count ? c.r.null_array() : c.r.null();
  if (!has_count) {
    std::string v = pop_one(*l, left);
    c.st().changed(c.argv[1], c.now);
    c.log({left ? "LPOP" : "RPOP", c.argv[1]});
    return c.r.bulk(v);
  }
  const auto n = std::min<std::int64_t>(count, static_cast<std::int64_t>(l->items.size()));
  // The reply must fit before anything is taken (a popped element would be lost).
  std::size_t bytes = 16;
  for (std::int64_t i = 0; i < n; ++i)
    bytes += bulk_bytes(left ? l->items[static_cast<std::size_t>(i)].size()
                             : l->items[l->items.size() - 1 - static_cast<std::size_t>(i)].size());
  if (!c.fits(bytes)) return c.reply_too_large();
  c.r.array(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) c.r.bulk(pop_one(*l, left));
  if (n == 0) return;
  c.st().changed(c.argv[1], c.now);
  const std::string ns = i64_str(n);
  c.log({left ? "LPOP" : "RPOP", c.argv[1], ns});
}

void bpop_generic(exec_context& c, bool left) {
  // The timeout (last argument) is checked before the keys, as Redis does.
  long double t;
  {
    auto s = c.argv.back();
    std::string tmp(s);
    char* end = nullptr;
    errno = 0;
    t = s.empty() || s.size() > 256 || std::isspace(static_cast<unsigned char>(s[0]))
            ? NAN
            : std::strtold(tmp.c_str(), &end);
    if (std::isnan(t) || end != tmp.c_str() + tmp.size() || (errno == ERANGE && std::isinf(t)))
      return c.r.error("ERR timeout is not a float or out of range");
  }
  t *= 1000;
  // Redis 7.0 converts without a range check, and a timeout past 2^63 ms
  // turns negative there: its answer is kept.
  if (t >= static_cast<long double>(std::numeric_limits<std::int64_t>::max()))
    return c.r.error("ERR timeout is negative");
  auto ms = static_cast<std::int64_t>(std::ceil(t));
  if (ms < 0) return c.r.error("ERR timeout is negative");
  if (ms > 0 && ms > std::numeric_limits<std::int64_t>::max() - c.now)
    return c.r.error("ERR timeout is out of range");
  const std::size_t nkeys = c.argv.size() - 2;
  for (std::size_t i = 1; i <= nkeys; ++i) {
    bool failed;
    auto* l = find_for_write<list_object>(c, c.argv[i], value_type::list, 0, false, &failed);
    if (failed) return;
    if (l == nullptr) continue;
    std::string v = pop_one(*l, left);
    c.st().changed(c.argv[i], c.now);
    c.log({left ? "LPOP" : "RPOP", c.argv[i]});
    c.r.array(2);
    c.r.bulk(c.argv[i]);
    return c.r.bulk(v);
  }
  if (!c.sess.may_block) return c.r.null_array();  // as a timeout (RDMA RPC, replay)
  if (!c.sess.blocked && c.ex.blocking().full()) return c.r.error("ERR too many blocked clients");
  c.sess.blocked = true;
  c.sess.block_keys.assign(c.argv.begin() + 1, c.argv.begin() + 1 + static_cast<long>(nkeys));
  c.sess.block_deadline = ms == 0 ? 0 : c.now + ms;
}

}  // namespace

void cmd_lpush(exec_context& c) {
  push_generic(c, true, false);
}
void cmd_rpush(exec_context& c) {
  push_generic(c, false, false);
}
void cmd_lpushx(exec_context& c) {
  push_generic(c, true, true);
}
void cmd_rpushx(exec_context& c) {
  push_generic(c, false, true);
}
void cmd_lpop(exec_context& c) {
  pop_generic(c, true);
}
void cmd_rpop(exec_context& c) {
  pop_generic(c, false);
}
void cmd_blpop(exec_context& c) {
  bpop_generic(c, true);
}
void cmd_brpop(exec_context& c) {
  bpop_generic(c, false);
}

void cmd_llen(exec_context& c) {
  bool failed;
  auto* l = find_for_read<list_object>(c, c.argv[1], value_type::list, &failed);
  if (failed) return;
  c.r.integer(l ? static_cast<std::int64_t>(l->items.size()) : 0);
}

void cmd_lrange(exec_context& c) {
  std::int64_t start, end;
  if (!to_i64(c.argv[2], start) || !to_i64(c.argv[3], end)) return c.r.error(err_int);
  bool failed;
  auto* l = find_for_read<list_object>(c, c.argv[1], value_type::list, &failed);
  if (failed) return;
  if (l == nullptr || !clamp_range(static_cast<std::int64_t>(l->items.size()), start, end))
    return c.r.array(0);
  c.r.array(static_cast<std::size_t>(end - start + 1));
  for (auto i = start; i <= end; ++i) {
    const auto& v = l->items[static_cast<std::size_t>(i)];
    if (!c.fits(bulk_bytes(v.size()))) return c.reply_too_large();
    c.r.bulk(v);
  }
}

// LINDEX and LSET look the key up before they read the index, as Redis does.
void cmd_lindex(exec_context& c) {
  bool failed;
  auto* l = find_for_read<list_object>(c, c.argv[1], value_type::list, &failed);
  if (failed) return;
  if (l == nullptr) return c.r.null();
  std::int64_t i;
  if (!to_i64(c.argv[2], i)) return c.r.error(err_int);
  const auto n = static_cast<std::int64_t>(l->items.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return c.r.null();
  const auto& v = l->items[static_cast<std::size_t>(i)];
  if (!c.fits(bulk_bytes(v.size()))) return c.reply_too_large();
  c.r.bulk(v);
}

void cmd_lset(exec_context& c) {
  bool failed;
  auto* l =
      find_for_write<list_object>(c, c.argv[1], value_type::list, c.argv[3].size(), false, &failed);
  if (failed) return;
  if (l == nullptr) return c.r.error("ERR no such key");
  std::int64_t i;
  if (!to_i64(c.argv[2], i)) return c.r.error(err_int);
  const auto n = static_cast<std::int64_t>(l->items.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return c.r.error("ERR index out of range");
  auto& v = l->items[static_cast<std::size_t>(i)];
  l->bytes = l->bytes - v.size() + c.argv[3].size();
  v.assign(c.argv[3]);
  c.st().changed(c.argv[1], c.now);
  c.log(c.argv);
  c.r.simple("OK");
}

void cmd_lrem(exec_context& c) {
  std::int64_t count;
  if (!to_i64(c.argv[2], count)) return c.r.error(err_int);
  bool failed;
  auto* l = find_for_write<list_object>(c, c.argv[1], value_type::list, 0, false, &failed);
  if (failed) return;
  if (l == nullptr) return c.r.integer(0);
  const auto v = c.argv[3];
  std::int64_t removed = 0;
  const std::int64_t limit = count == 0
                                 ? std::numeric_limits<std::int64_t>::max()
                                 : (count < 0 ? (count == std::numeric_limits<std::int64_t>::min()
                                                     ? std::numeric_limits<std::int64_t>::max()
                                                     : -count)
                                              : count);
  std::deque<std::string> kept;
  if (count >= 0) {
    for (auto& e : l->items)
      if (removed < limit && e == v)
        ++removed;
      else
        kept.push_back(std::move(e));
  } else {
    for (auto it = l->items.rbegin(); it != l->items.rend(); ++it)
      if (removed < limit && *it == v)
        ++removed;
      else
        kept.push_front(std::move(*it));
  }
  l->items = std::move(kept);  // the elements were moved into it
  if (removed == 0) return c.r.integer(0);
  l->bytes -= static_cast<std::size_t>(removed) * (v.size() + element_overhead);
  c.st().changed(c.argv[1], c.now);
  c.log(c.argv);
  c.r.integer(removed);
}

void cmd_ltrim(exec_context& c) {
  std::int64_t start, end;
  if (!to_i64(c.argv[2], start) || !to_i64(c.argv[3], end)) return c.r.error(err_int);
  bool failed;
  auto* l = find_for_write<list_object>(c, c.argv[1], value_type::list, 0, false, &failed);
  if (failed) return;
  if (l == nullptr) return c.r.simple("OK");
  const auto n = static_cast<std::int64_t>(l->items.size());
  std::int64_t keep_from = 0, keep_to = -1;  // inclusive
  if (clamp_range(n, start, end)) {
    keep_from = start;
    keep_to = end;
  }
  while (static_cast<std::int64_t>(l->items.size()) > keep_to + 1) pop_one(*l, false);
  for (std::int64_t i = 0; i < keep_from && !l->items.empty(); ++i) pop_one(*l, true);
  c.st().changed(c.argv[1], c.now);
  c.log(c.argv);
  c.r.simple("OK");
}

}  // namespace conveyor::kv
