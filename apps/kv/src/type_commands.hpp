// What the collection command files share (hash_, list_, set_, zset_commands.cpp
// and object_commands.cpp): finding a key's collection with Redis's WRONGTYPE,
// creating one within maxmemory, SCAN's arguments, float parsing, bounded
// replies. Internal to the executor.
#pragma once

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "command_context.hpp"
#include "glob.hpp"
#include "object.hpp"

namespace conveyor::kv {

constexpr std::string_view err_wrongtype =
    "WRONGTYPE Operation against a key holding the wrong kind of value";
constexpr std::string_view err_float = "ERR value is not a valid float";

// The collection of type T at `key` for a read: nullptr if absent; on another
// type the reply is WRONGTYPE and *failed is set.
template <class T>
T* find_for_read(exec_context& c, std::string_view key, value_type t, bool* failed) {
  bool wrong = false;
  auto* o = c.st().find_collection(key, t, c.now, &wrong);
  *failed = wrong;
  if (wrong) c.r.error(err_wrongtype);
  return static_cast<T*>(o);
}

// For a write that may add `bytes`: WRONGTYPE or OOM answered (nullptr, *failed);
// otherwise the key's collection, created empty if absent and `create`.
template <class T>
T* find_for_write(exec_context& c, std::string_view key, value_type t, std::size_t bytes,
                  bool create, bool* failed) {
  bool wrong = false;
  *failed = false;
  c.st().find_collection(key, t, c.now, &wrong);
  if (wrong) {
    *failed = true;
    c.r.error(err_wrongtype);
    return nullptr;
  }
  // A small hash is republished whole after the change: its next item must
  // find memory before anything changes (deletions included).
  if ((bytes != 0 && !c.st().reserve(key, bytes, c.now)) ||
      (t == value_type::hash && !c.st().can_publish(key, bytes + 8 * c.argv.size(), c.now))) {
    *failed = true;
    c.r.error(err_oom);
    return nullptr;
  }
  // Looked up again: making room may have moved things (never evicts `key`).
  auto* o = c.st().find_collection(key, t, c.now, &wrong);
  if (o != nullptr || !create) return static_cast<T*>(o);
  o = c.st().create_collection(key, t, c.now);
  if (o == nullptr) {
    *failed = true;
    c.r.error(err_oom);  // no room for its item (or a key above the store's max_key)
  }
  return static_cast<T*>(o);
}

// SREM, ZREM: erase_one(obj, element) for each element of argv[2..] (true if
// it was there); the key's change published and the command logged as sent
// when any was; the count of those removed is the reply.
template <class T, class EraseOne>
void remove_elements(exec_context& c, value_type t, EraseOne&& erase_one) {
  bool failed;
  auto* o = find_for_write<T>(c, c.argv[1], t, 0, false, &failed);
  if (failed) return;
  if (o == nullptr) return c.r.integer(0);
  std::int64_t n = 0;
  for (std::size_t i = 2; i < c.argv.size(); ++i) n += erase_one(*o, c.argv[i]) ? 1 : 0;
  if (n > 0) {
    c.st().changed(c.argv[1], c.now);
    c.log(c.argv);
  }
  c.r.integer(n);
}

// Replies WRONGTYPE if `key` holds a type other than `t`; true then.
inline bool wrong_type(exec_context& c, std::string_view key, value_type t) {
  auto have = c.st().type_of(key, c.now);
  if (have && *have != t) {
    c.r.error(err_wrongtype);
    return true;
  }
  return false;
}

// Bytes of a command's arguments from `from` on, with the per-element overhead.
inline std::size_t args_bytes(const exec_context& c, std::size_t from, std::size_t per = 1) {
  std::size_t n = 0;
  for (std::size_t i = from; i < c.argv.size(); ++i) n += c.argv[i].size();
  return n + (c.argv.size() - from) / per * element_overhead;
}

// Redis's strtod-based score parsing (inf, -inf, +inf accepted; NaN refused).
inline bool to_double(std::string_view s, double& d) {
  if (s.empty() || s.size() > 256 || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  std::string tmp(s);
  char* end = nullptr;
  errno = 0;
  d = std::strtod(tmp.c_str(), &end);
  if (end != tmp.c_str() + tmp.size() || std::isnan(d)) return false;
  if (errno == ERANGE && !std::isinf(d) && d != 0) return false;
  return true;
}

// SCAN-family arguments after the cursor: [MATCH p] [COUNT n].
struct scan_args {
  std::uint64_t cursor = 0;
  std::string_view pattern;
  bool has_pattern = false;
  std::int64_t count = 10;
};
// The cursor at argv[at]; false with the error replied. Redis checks it
// before the key, and the options (parse_scan_options) only for a key that exists.
inline bool parse_scan_cursor(exec_context& c, std::size_t at, scan_args& a) {
  // Redis's strtoul: a sign is accepted ("-1" is the largest cursor), a
  // leading space or trailing bytes are not.
  const std::string cur(c.argv[at].substr(0, 64));
  char* end = nullptr;
  errno = 0;
  a.cursor = std::strtoull(cur.c_str(), &end, 10);
  if (c.argv[at].size() > 64 ||
      (!cur.empty() && std::isspace(static_cast<unsigned char>(cur[0]))) || *end != '\0' ||
      errno == ERANGE) {
    c.r.error("ERR invalid cursor");
    return false;
  }
  return true;
}
// The empty reply of a scan of a key that does not exist.
inline void reply_empty_scan(exec_context& c) {
  c.r.array(2);
  c.r.bulk("0");
  c.r.array(0);
}
// The options after the cursor at argv[at]; false with the error replied.
inline bool parse_scan_options(exec_context& c, std::size_t at, scan_args& a) {
  for (std::size_t i = at + 1; i < c.argv.size(); ++i) {
    bool has_next = i + 1 < c.argv.size();
    if (iequal(c.argv[i], "MATCH") && has_next) {
      a.pattern = c.argv[++i];
      a.has_pattern = !(a.pattern.size() == 1 && a.pattern[0] == '*');
    } else if (iequal(c.argv[i], "COUNT") && has_next) {
      if (!to_i64(c.argv[++i], a.count)) {
        c.r.error(err_int);
        return false;
      }
      if (a.count < 1) {
        c.r.error(err_syntax);
        return false;
      }
    } else {
      c.r.error(err_syntax);
      return false;
    }
  }
  return true;
}

// SCAN of a hash's or set's table (element_table.hpp): bucket by bucket from
// `cursor` until `count` elements were visited (at most count * 10 buckets, as
// Redis), or everything at once when `all` (a small collection, as Redis's
// listpack and intset). Returns the next cursor; emit(entry) for each visited.
template <class Table, class Emit>
std::uint64_t scan_table(const Table& t, std::uint64_t cursor, std::int64_t count, bool all,
                         Emit&& emit) {
  if (all) {
    for (const auto* e : t) emit(e);
    return 0;
  }
  std::int64_t n = 0;
  std::int64_t buckets = count > std::numeric_limits<std::int64_t>::max() / 10
                             ? std::numeric_limits<std::int64_t>::max()
                             : count * 10;
  do {
    cursor = t.scan(cursor, [&](const auto* e) {
      emit(e);
      ++n;
    });
  } while (cursor != 0 && n < count && --buckets > 0);
  return cursor;
}

inline const element_key& element_key_of(const element_key& k) {
  return k;
}
template <class V>
const element_key& element_key_of(const std::pair<const element_key, V>& p) {
  return p.first;
}

// Walks an ordered-by-hash container (a sorted set's members) as SCAN: from the
// first element whose hash >= cursor, `count` elements (all of one hash value
// together), or everything when `all` (a small collection, as Redis's listpack
// and intset). Returns the next cursor; emit(element) for each visited.
template <class Map, class Emit>
std::uint64_t scan_ordered(const Map& m, std::uint64_t cursor, std::int64_t count, bool all,
                           Emit&& emit) {
  auto it = all || cursor == 0 ? m.begin() : m.lower_bound(element_key{cursor, std::string()});
  std::int64_t n = 0;
  while (it != m.end()) {
    if (!all && n >= count) break;
    const std::uint64_t h = element_key_of(*it).first;
    while (it != m.end() && element_key_of(*it).first == h) {
      emit(*it);
      ++it;
      ++n;
    }
  }
  return it == m.end() ? 0 : element_key_of(*it).first;
}

}  // namespace conveyor::kv
