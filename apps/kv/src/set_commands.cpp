// Set commands (Redis's t_set.c): SADD, SREM, SMEMBERS, SISMEMBER, SCARD,
// SPOP, SRANDMEMBER (a negative count repeats members), SINTER, SUNION,
// SDIFF, SSCAN. SPOP is logged as the SREM of what it took.
#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "type_commands.hpp"

namespace conveyor::kv {

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 g{std::random_device{}()};
  return g;
}

using member = set_object::member;

bool set_add(exec_context& c, set_object& s, std::string_view m) {
  if (!s.members.insert(m).second) return false;
  s.bytes += m.size() + element_overhead;
  std::int64_t v;
  if (!to_i64(m, v) || s.members.size() > c.st().encodings().set_max_intset_entries) s.big = true;
  return true;
}

void set_erase(set_object& s, member* m) {
  s.bytes -= m->key_len + element_overhead;
  s.members.erase(m);
}

// A member picked at random, every member alike (s not empty).
member* random_member(set_object& s) {
  return s.members.random(rng());
}

// n distinct members picked at random (n < the set's size).
std::vector<member*> distinct_members(set_object& s, std::size_t n) {
  std::vector<member*> out;
  if (n * 3 > s.members.size()) {  // a good part of the set: shuffle it all
    out.assign(s.members.begin(), s.members.end());
    std::shuffle(out.begin(), out.end(), rng());
    out.resize(n);
    return out;
  }
  std::unordered_set<const member*> seen;
  while (out.size() < n) {
    auto* m = random_member(s);
    if (seen.insert(m).second) out.push_back(m);
  }
  return out;
}

// The members of a reply, bounded as it is built; false if it did not fit.
template <class Range>
bool reply_members(exec_context& c, const Range& r, std::size_t n, bool as_set) {
  as_set ? c.r.set(n) : c.r.array(n);
  for (const auto& m : r) {
    if (!c.fits(bulk_bytes(std::string_view(m).size()))) {
      c.reply_too_large();
      return false;
    }
    c.r.bulk(m);
  }
  return true;
}

}  // namespace

void cmd_sadd(exec_context& c) {
  bool failed;
  auto* s =
      find_for_write<set_object>(c, c.argv[1], value_type::set, args_bytes(c, 2), true, &failed);
  if (failed) return;
  std::int64_t n = 0;
  for (std::size_t i = 2; i < c.argv.size(); ++i) n += set_add(c, *s, c.argv[i]) ? 1 : 0;
  if (n > 0) {
    c.st().changed(c.argv[1], c.now);
    c.log(c.argv);
  }
  c.r.integer(n);
}

void cmd_srem(exec_context& c) {
  remove_elements<set_object>(c, value_type::set, [](set_object& s, std::string_view m) {
    auto* e = s.members.find(m);
    if (e == nullptr) return false;
    set_erase(s, e);
    return true;
  });
}

void cmd_smembers(exec_context& c) {
  bool failed;
  auto* s = find_for_read<set_object>(c, c.argv[1], value_type::set, &failed);
  if (failed) return;
  if (s == nullptr) return c.r.set(0);
  std::vector<std::string_view> out;
  for (const auto* m : s->members) out.emplace_back(m->key());
  reply_members(c, out, out.size(), true);
}

void cmd_sismember(exec_context& c) {
  bool failed;
  auto* s = find_for_read<set_object>(c, c.argv[1], value_type::set, &failed);
  if (failed) return;
  c.r.integer(s && s->members.find(c.argv[2]) ? 1 : 0);
}

void cmd_scard(exec_context& c) {
  bool failed;
  auto* s = find_for_read<set_object>(c, c.argv[1], value_type::set, &failed);
  if (failed) return;
  c.r.integer(s ? static_cast<std::int64_t>(s->members.size()) : 0);
}

void cmd_spop(exec_context& c) {
  if (c.argv.size() > 3) return c.r.error(err_syntax);
  const bool has_count = c.argv.size() == 3;
  std::int64_t count = 1;
  if (has_count && (!to_i64(c.argv[2], count) || count < 0))
    return c.r.error("ERR value is out of range, must be positive");
  bool failed;
  auto* s = find_for_write<set_object>(c, c.argv[1], value_type::set, 0, false, &failed);
  if (failed) return;
  if (s == nullptr) return has_count ? c.r.set(0) : c.r.null();
  const auto n = std::min<std::int64_t>(count, static_cast<std::int64_t>(s->members.size()));
  std::vector<member*> picked;
  std::size_t bytes = 16;
  if (n == static_cast<std::int64_t>(s->members.size()))
    picked.assign(s->members.begin(), s->members.end());
  else if (n == 1)
    picked.push_back(random_member(*s));
  else
    picked = distinct_members(*s, static_cast<std::size_t>(n));
  for (auto* m : picked) bytes += bulk_bytes(m->key_len);
  if (!c.fits(bytes)) return c.reply_too_large();  // before anything is taken
  if (!has_count) {
    if (picked.empty()) return c.r.null();
    c.r.bulk(picked[0]->key());
  } else {
    c.r.set(picked.size());
    for (auto* m : picked) c.r.bulk(m->key());
  }
  if (picked.empty()) return;
  std::vector<std::string> taken;
  for (auto* m : picked) {
    taken.emplace_back(m->key());
    set_erase(*s, m);
  }
  c.st().changed(c.argv[1], c.now);
  std::vector<std::string_view> log{"SREM", c.argv[1]};
  for (auto& m : taken) log.emplace_back(m);
  c.log(log);
}

void cmd_srandmember(exec_context& c) {
  if (c.argv.size() > 3) return c.r.error(err_syntax);
  const bool has_count = c.argv.size() == 3;
  std::int64_t count = 1;
  if (has_count && !to_i64(c.argv[2], count)) return c.r.error(err_int);
  bool failed;
  auto* s = find_for_read<set_object>(c, c.argv[1], value_type::set, &failed);
  if (failed) return;
  if (!has_count) {
    if (s == nullptr) return c.r.null();
    return c.r.bulk(random_member(*s)->key());
  }
  if (s == nullptr || count == 0) return c.r.array(0);
  if (count < 0) {  // repeats allowed: |count| picks, the reply bounded as built
    if (count == std::numeric_limits<std::int64_t>::min())
      return c.r.error("ERR value is out of range");
    const auto n = static_cast<std::uint64_t>(-count);
    if (n > (std::uint64_t{1} << 32)) return c.reply_too_large();
    c.r.array(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto m = random_member(*s)->key();
      if (!c.fits(bulk_bytes(m.size()))) return c.reply_too_large();
      c.r.bulk(m);
    }
    return;
  }
  std::vector<std::string_view> out;
  if (static_cast<std::uint64_t>(count) >= s->members.size()) {
    for (const auto* m : s->members) out.emplace_back(m->key());
  } else {
    for (const auto* m : distinct_members(*s, static_cast<std::size_t>(count)))
      out.emplace_back(m->key());
  }
  reply_members(c, out, out.size(), false);
}

namespace {

enum class set_op { inter, uni, diff };

void set_algebra(exec_context& c, set_op op) {
  std::vector<set_object*> sets;
  for (std::size_t i = 1; i < c.argv.size(); ++i) {
    bool failed;
    sets.push_back(find_for_read<set_object>(c, c.argv[i], value_type::set, &failed));
    if (failed) return;
  }
  std::vector<std::string_view> out;
  if (op == set_op::inter) {
    // Smallest first; any missing set makes the intersection empty.
    if (std::find(sets.begin(), sets.end(), nullptr) == sets.end()) {
      std::sort(sets.begin(), sets.end(),
                [](auto* a, auto* b) { return a->members.size() < b->members.size(); });
      for (const auto* m : sets[0]->members) {
        bool all = true;
        for (std::size_t i = 1; i < sets.size() && all; ++i)
          all = sets[i]->members.find(m->key()) != nullptr;
        if (all) out.emplace_back(m->key());
      }
    }
  } else if (op == set_op::uni) {
    std::unordered_set<std::string_view> seen;
    for (auto* s : sets)
      if (s)
        for (const auto* m : s->members)
          if (seen.insert(m->key()).second) out.emplace_back(m->key());
  } else if (sets[0] != nullptr) {
    for (const auto* m : sets[0]->members) {
      bool other = false;
      for (std::size_t i = 1; i < sets.size() && !other; ++i)
        other = sets[i] && sets[i]->members.find(m->key()) != nullptr;
      if (!other) out.emplace_back(m->key());
    }
  }
  reply_members(c, out, out.size(), true);
}

}  // namespace

void cmd_sinter(exec_context& c) {
  set_algebra(c, set_op::inter);
}
void cmd_sunion(exec_context& c) {
  set_algebra(c, set_op::uni);
}
void cmd_sdiff(exec_context& c) {
  set_algebra(c, set_op::diff);
}

void cmd_sscan(exec_context& c) {
  scan_args a;
  if (!parse_scan_cursor(c, 2, a)) return;
  bool failed;
  auto* s = find_for_read<set_object>(c, c.argv[1], value_type::set, &failed);
  if (failed) return;
  if (s == nullptr) return reply_empty_scan(c);
  if (!parse_scan_options(c, 2, a)) return;
  std::vector<std::string_view> out;
  const glob_pattern glob(a.pattern);
  const auto next = scan_table(s->members, a.cursor, a.count, !s->big, [&](const member* m) {
    if (!a.has_pattern || glob.match(m->key())) out.emplace_back(m->key());
  });
  c.r.array(2);
  c.r.bulk(std::to_string(next));
  reply_members(c, out, out.size(), false);
}

}  // namespace conveyor::kv
