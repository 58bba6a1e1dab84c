// Sorted set commands (Redis's t_zset.c): ZADD (NX/XX/GT/LT/CH/INCR), ZINCRBY,
// ZREM, ZSCORE, ZCARD, ZRANGE (BYSCORE/BYLEX/REV/LIMIT/WITHSCORES),
// ZRANGEBYSCORE, ZREVRANGE, ZRANK/ZREVRANK, ZCOUNT, ZPOPMIN/ZPOPMAX, ZSCAN.
// Every change is logged as ZADD of the resulting score or ZREM.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "type_commands.hpp"

namespace conveyor::kv {

namespace {

using ranked_it = zset_object::ranked::const_iterator;

// Sets member's score (new or moved) and keeps both orders and the encoding rule.
void zset_put(exec_context& c, zset_object& z, std::string_view m, double score) {
  auto [it, fresh] = z.scores.try_emplace(element_of(m), score);
  if (fresh) {
    z.bytes += m.size() + 2 * element_overhead;
    if (m.size() > c.st().encodings().zset_max_listpack_value ||
        z.scores.size() > c.st().encodings().zset_max_listpack_entries)
      z.big = true;
  } else {
    z.order.erase({it->second, std::string(m)});
    it->second = score;
  }
  z.order.insert({score, std::string(m)});
}

void zset_erase(zset_object& z, std::map<element_key, double>::iterator it) {
  z.order.erase({it->second, it->first.second});
  z.bytes -= it->first.second.size() + 2 * element_overhead;
  z.scores.erase(it);
}

// One (member, score) of a reply: nested pairs in RESP3, flat in RESP2.
void reply_scored(exec_context& c, const std::string& m, double s, bool withscores) {
  if (!withscores) return c.r.bulk(m);
  if (c.r.resp() >= 3) c.r.array(2);
  c.r.bulk(m);
  c.r.dbl(score_str(s));
}

struct score_bound {
  double v;
  bool excl;
};
bool parse_score_bound(std::string_view s, score_bound& b) {
  b.excl = !s.empty() && s[0] == '(';
  if (b.excl) s.remove_prefix(1);
  return to_double(s, b.v);
}
bool above_min(double v, const score_bound& b) {
  return b.excl ? v > b.v : v >= b.v;
}
bool below_max(double v, const score_bound& b) {
  return b.excl ? v < b.v : v <= b.v;
}

struct lex_bound {
  std::string v;
  int kind;  // -1: "-", +1: "+", 0: a value
  bool excl;
};
bool parse_lex_bound(std::string_view s, lex_bound& b) {
  b.excl = false;
  if (s == "-") return b.kind = -1, true;
  if (s == "+") return b.kind = 1, true;
  if (s.empty() || (s[0] != '[' && s[0] != '(')) return false;
  b.kind = 0;
  b.excl = s[0] == '(';
  b.v.assign(s.substr(1));
  return true;
}
bool lex_above_min(const std::string& m, const lex_bound& b) {
  if (b.kind != 0) return b.kind < 0;
  return b.excl ? m > b.v : m >= b.v;
}
bool lex_below_max(const std::string& m, const lex_bound& b) {
  if (b.kind != 0) return b.kind > 0;
  return b.excl ? m < b.v : m <= b.v;
}

enum class range_kind { rank, score, lex };

// ZRANGE and its older forms. argv[first] is the key; min/max follow.
void zrange_generic(exec_context& c, std::size_t first, range_kind kind, bool rev) {
  bool withscores = false, have_limit = false, kind_given = kind != range_kind::rank;
  std::int64_t offset = 0, limit = -1;
  const bool is_zrange = iequal(c.argv[0], "zrange");
  for (std::size_t j = first + 3; j < c.argv.size(); ++j) {
    const std::size_t left = c.argv.size() - j - 1;
    if (iequal(c.argv[j], "WITHSCORES")) {
      withscores = true;
    } else if (iequal(c.argv[j], "LIMIT") && left >= 2) {
      if (!to_i64(c.argv[j + 1], offset) || !to_i64(c.argv[j + 2], limit))
        return c.r.error(err_int);
      have_limit = true;
      j += 2;
    } else if (is_zrange && !kind_given && iequal(c.argv[j], "BYSCORE")) {
      kind = range_kind::score;
      kind_given = true;
    } else if (is_zrange && !kind_given && iequal(c.argv[j], "BYLEX")) {
      kind = range_kind::lex;
      kind_given = true;
    } else if (is_zrange && !rev && iequal(c.argv[j], "REV")) {
      rev = true;
    } else {
      return c.r.error(err_syntax);
    }
  }
  if (have_limit && limit != -1 && kind == range_kind::rank)  // Redis checks the count only
    return c.r.error(
        "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX");
  if (withscores && kind == range_kind::lex)
    return c.r.error("ERR syntax error, WITHSCORES not supported in combination with BYLEX");
  auto a_min = c.argv[first + 1], a_max = c.argv[first + 2];
  if (rev && kind != range_kind::rank) std::swap(a_min, a_max);
  std::int64_t start = 0, end = 0;
  score_bound smin{}, smax{};
  lex_bound lmin{}, lmax{};
  if (kind == range_kind::rank) {
    if (!to_i64(a_min, start) || !to_i64(a_max, end)) return c.r.error(err_int);
  } else if (kind == range_kind::score) {
    if (!parse_score_bound(a_min, smin) || !parse_score_bound(a_max, smax))
      return c.r.error("ERR min or max is not a float");
  } else if (!parse_lex_bound(a_min, lmin) || !parse_lex_bound(a_max, lmax)) {
    return c.r.error("ERR min or max not valid string range item");
  }
  bool failed;
  auto* z = find_for_read<zset_object>(c, c.argv[first], value_type::zset, &failed);
  if (failed) return;
  std::vector<std::pair<const std::string*, double>> out;
  std::size_t bytes = 16;
  auto emit = [&](const std::pair<double, std::string>& e) {
    out.emplace_back(&e.second, e.first);
    bytes += bulk_bytes(e.second.size()) + 48;
    return c.fits(bytes);
  };
  if (z != nullptr) {
    const auto n = static_cast<std::int64_t>(z->order.size());
    if (kind == range_kind::rank) {
      if (start < 0) start += n;
      if (end < 0) end += n;
      if (start < 0) start = 0;
      if (start <= end && start < n) {
        if (end >= n) end = n - 1;
        auto it = z->order.find_by_order(static_cast<std::size_t>(rev ? n - 1 - start : start));
        for (auto i = start; i <= end; ++i) {
          if (!emit(*it)) return c.reply_too_large();
          if (rev && it != z->order.begin())
            --it;
          else if (!rev)
            ++it;
        }
      }
    } else if (offset >= 0) {
      auto in = [&](const std::pair<double, std::string>& e) {
        if (kind == range_kind::score) return above_min(e.first, smin) && below_max(e.first, smax);
        return lex_above_min(e.second, lmin) && lex_below_max(e.second, lmax);
      };
      auto visit = [&](const std::pair<double, std::string>& e) {
        if (!in(e)) return true;
        if (offset > 0) return --offset, true;
        if (limit == 0) return false;
        if (limit > 0) --limit;
        if (!emit(e)) {
          c.reply_too_large();
          return false;
        }
        return true;
      };
      if (!rev) {
        auto it = kind == range_kind::score ? z->order.lower_bound({smin.v, std::string()})
                                            : z->order.begin();
        for (; it != z->order.end(); ++it) {
          if (kind == range_kind::score && !below_max(it->first, smax)) break;
          if (!visit(*it)) break;
        }
      } else {
        for (auto it = z->order.end(); it != z->order.begin();) {
          --it;
          if (kind == range_kind::score && !above_min(it->first, smin)) break;
          if (!visit(*it)) break;
        }
      }
      if (c.r.out().size() > c.reply_start) return;  // the too-large error
    }
  }
  c.r.array(withscores && c.r.resp() < 3 ? 2 * out.size() : out.size());
  for (auto& [m, s] : out) reply_scored(c, *m, s, withscores);
}

void zpop_generic(exec_context& c, bool min) {
  if (c.argv.size() > 3) return c.r.error(err_syntax);
  const bool has_count = c.argv.size() == 3;
  std::int64_t count = 1;
  if (has_count && (!to_i64(c.argv[2], count) || count < 0))
    return c.r.error("ERR value is out of range, must be positive");
  bool failed;
  auto* z = find_for_write<zset_object>(c, c.argv[1], value_type::zset, 0, false, &failed);
  if (failed) return;
  if (z == nullptr || count == 0) return c.r.array(0);
  const auto n = std::min<std::int64_t>(count, static_cast<std::int64_t>(z->order.size()));
  std::vector<std::pair<std::string, double>> taken;
  std::size_t bytes = 16;
  {
    auto it = min ? z->order.begin() : std::prev(z->order.end());
    for (std::int64_t i = 0; i < n; ++i) {
      taken.emplace_back(it->second, it->first);
      bytes += bulk_bytes(it->second.size()) + 48;
      if (min)
        ++it;
      else if (it != z->order.begin())
        --it;
    }
  }
  if (!c.fits(bytes)) return c.reply_too_large();  // before anything is taken
  const bool nested = has_count && c.r.resp() >= 3;
  c.r.array(nested ? taken.size() : 2 * taken.size());
  std::vector<std::string_view> log{"ZREM", c.argv[1]};
  for (auto& [m, s] : taken) {
    if (nested) c.r.array(2);
    c.r.bulk(m);
    c.r.dbl(score_str(s));
    zset_erase(*z, z->scores.find(element_of(m)));
    log.emplace_back(m);
  }
  c.st().changed(c.argv[1], c.now);
  c.log(log);
}

}  // namespace

void cmd_zadd(exec_context& c) {
  bool nx = false, xx = false, gt = false, lt = false, ch = false, incr = false;
  std::size_t at = 2;
  for (; at < c.argv.size(); ++at) {
    auto a = c.argv[at];
    if (iequal(a, "NX"))
      nx = true;
    else if (iequal(a, "XX"))
      xx = true;
    else if (iequal(a, "GT"))
      gt = true;
    else if (iequal(a, "LT"))
      lt = true;
    else if (iequal(a, "CH"))
      ch = true;
    else if (iequal(a, "INCR"))
      incr = true;
    else
      break;
  }
  const std::size_t elements = c.argv.size() - at;
  if (elements == 0 || elements % 2 != 0) return c.r.error(err_syntax);
  if (nx && xx) return c.r.error("ERR XX and NX options at the same time are not compatible");
  if ((gt && nx) || (lt && nx) || (gt && lt))
    return c.r.error("ERR GT, LT, and/or NX options at the same time are not compatible");
  if (incr && elements > 2)
    return c.r.error("ERR INCR option supports a single increment-element pair");
  std::vector<double> scores;
  for (std::size_t i = at; i < c.argv.size(); i += 2) {
    double d;
    if (!to_double(c.argv[i], d)) return c.r.error(err_float);
    scores.push_back(d);
  }
  bool failed;
  // Each member is charged twice the overhead (zset_put): in both orders.
  auto* z = find_for_write<zset_object>(c, c.argv[1], value_type::zset,
                                        args_bytes(c, at, 2) + elements / 2 * element_overhead, !xx,
                                        &failed);
  if (failed) return;
  std::int64_t added = 0, updated = 0;
  bool processed = false;
  double last = 0;
  std::vector<std::string> log_scores;
  std::vector<std::string_view> log_members;
  if (z != nullptr) {
    for (std::size_t k = 0; k < scores.size(); ++k) {
      const auto m = c.argv[at + 2 * k + 1];
      double score = scores[k];
      auto it = z->scores.find(element_of(m));
      if (it != z->scores.end()) {
        if (nx) continue;
        const double cur = it->second;
        if (incr) {
          score += cur;
          if (std::isnan(score))  // INCR has one pair: nothing changed
            return c.r.error("ERR resulting score is not a number (NaN)");
        }
        if ((lt && score >= cur) || (gt && score <= cur)) continue;
        processed = true;
        last = score;
        if (score != cur) {
          zset_put(c, *z, m, score);
          ++updated;
          log_scores.push_back(score_str(score));
          log_members.push_back(m);
        }
      } else {
        if (xx) continue;
        zset_put(c, *z, m, score);
        ++added;
        processed = true;
        last = score;
        log_scores.push_back(score_str(score));
        log_members.push_back(m);
      }
    }
    // A set created for nothing goes again; one left as it was is not a
    // write (WATCH stays intact, as Redis's signalModifiedKey only on a change).
    if (!log_members.empty() || z->size() == 0) c.st().changed(c.argv[1], c.now);
  }
  if (!log_members.empty()) {
    std::vector<std::string_view> log{"ZADD", c.argv[1]};
    for (std::size_t i = 0; i < log_members.size(); ++i) {
      log.emplace_back(log_scores[i]);
      log.emplace_back(log_members[i]);
    }
    c.log(log);
  }
  if (incr) return processed ? c.r.dbl(score_str(last)) : c.r.null();
  c.r.integer(ch ? added + updated : added);
}

void cmd_zincrby(exec_context& c) {
  double by;
  if (!to_double(c.argv[2], by)) return c.r.error(err_float);
  bool failed;
  auto* z = find_for_write<zset_object>(c, c.argv[1], value_type::zset,
                                        c.argv[3].size() + 2 * element_overhead, true, &failed);
  if (failed) return;
  double score = by;
  auto it = z->scores.find(element_of(c.argv[3]));
  if (it != z->scores.end()) score += it->second;
  if (std::isnan(score)) {
    c.st().changed(c.argv[1], c.now);
    return c.r.error("ERR resulting score is not a number (NaN)");
  }
  zset_put(c, *z, c.argv[3], score);
  c.st().changed(c.argv[1], c.now);
  const std::string s = score_str(score);
  c.log({"ZADD", c.argv[1], s, c.argv[3]});
  c.r.dbl(s);
}

void cmd_zrem(exec_context& c) {
  remove_elements<zset_object>(c, value_type::zset, [](zset_object& z, std::string_view m) {
    auto it = z.scores.find(element_of(m));
    if (it == z.scores.end()) return false;
    zset_erase(z, it);
    return true;
  });
}

void cmd_zscore(exec_context& c) {
  bool failed;
  auto* z = find_for_read<zset_object>(c, c.argv[1], value_type::zset, &failed);
  if (failed) return;
  if (z == nullptr) return c.r.null();
  auto it = z->scores.find(element_of(c.argv[2]));
  if (it == z->scores.end()) return c.r.null();
  c.r.dbl(score_str(it->second));
}

void cmd_zcard(exec_context& c) {
  bool failed;
  auto* z = find_for_read<zset_object>(c, c.argv[1], value_type::zset, &failed);
  if (failed) return;
  c.r.integer(z ? static_cast<std::int64_t>(z->scores.size()) : 0);
}

void cmd_zrange(exec_context& c) {
  zrange_generic(c, 1, range_kind::rank, false);
}
void cmd_zrangebyscore(exec_context& c) {
  zrange_generic(c, 1, range_kind::score, false);
}
void cmd_zrevrange(exec_context& c) {
  zrange_generic(c, 1, range_kind::rank, true);
}

namespace {
void zrank_generic(exec_context& c, bool rev) {
  bool failed;
  auto* z = find_for_read<zset_object>(c, c.argv[1], value_type::zset, &failed);
  if (failed) return;
  if (z == nullptr) return c.r.null();
  auto it = z->scores.find(element_of(c.argv[2]));
  if (it == z->scores.end()) return c.r.null();
  const auto r = z->order.order_of_key({it->second, std::string(c.argv[2])});
  c.r.integer(static_cast<std::int64_t>(rev ? z->order.size() - 1 - r : r));
}
}  // namespace

void cmd_zrank(exec_context& c) {
  zrank_generic(c, false);
}
void cmd_zrevrank(exec_context& c) {
  zrank_generic(c, true);
}

void cmd_zcount(exec_context& c) {
  score_bound lo, hi;
  if (!parse_score_bound(c.argv[2], lo) || !parse_score_bound(c.argv[3], hi))
    return c.r.error("ERR min or max is not a float");
  bool failed;
  auto* z = find_for_read<zset_object>(c, c.argv[1], value_type::zset, &failed);
  if (failed) return;
  if (z == nullptr) return c.r.integer(0);
  std::int64_t n = 0;
  for (auto it = z->order.lower_bound({lo.v, std::string()});
       it != z->order.end() && below_max(it->first, hi); ++it)
    if (above_min(it->first, lo)) ++n;
  c.r.integer(n);
}

void cmd_zpopmin(exec_context& c) {
  zpop_generic(c, true);
}
void cmd_zpopmax(exec_context& c) {
  zpop_generic(c, false);
}

void cmd_zscan(exec_context& c) {
  scan_args a;
  if (!parse_scan_cursor(c, 2, a)) return;
  bool failed;
  auto* z = find_for_read<zset_object>(c, c.argv[1], value_type::zset, &failed);
  if (failed) return;
  if (z == nullptr) return reply_empty_scan(c);
  if (!parse_scan_options(c, 2, a)) return;
  std::vector<std::pair<const std::string*, double>> out;
  std::uint64_t next = 0;
  const glob_pattern glob(a.pattern);
  if (z != nullptr && !z->big) {  // small: all of it, in score order (Redis's listpack)
    for (const auto& [s, m] : z->order)
      if (!a.has_pattern || glob.match(m)) out.emplace_back(&m, s);
  } else if (z != nullptr) {
    next = scan_ordered(z->scores, a.cursor, a.count, false, [&](const auto& e) {
      if (!a.has_pattern || glob.match(e.first.second)) out.emplace_back(&e.first.second, e.second);
    });
  }
  c.r.array(2);
  c.r.bulk(std::to_string(next));
  c.r.array(2 * out.size());
  for (auto& [m, s] : out) {
    if (!c.fits(bulk_bytes(m->size()) + 48)) return c.reply_too_large();
    c.r.bulk(*m);
    c.r.bulk(score_str(s));
  }
}

}  // namespace conveyor::kv
