// The command table and the commands (commands.hpp). Replies and error texts
// follow Redis 7 so that clients that match on them keep working.
#include "commands.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "aof.hpp"
#include "resp.hpp"
#include "store.hpp"

namespace conveyor::kv {

namespace {

using argv_t = std::span<const std::string_view>;

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Redis's string2ll: optional '-', digits, no leading zeros, no spaces, fits int64.
bool to_i64(std::string_view s, std::int64_t& v) {
  if (s.empty() || s.size() > 20) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  if (s.size() > 1 && s[0] == '-' && s[1] == '0') return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} && p == s.data() + s.size();
}

std::string i64_str(std::int64_t v) {
  char tmp[24];
  auto [p, ec] = std::to_chars(tmp, tmp + sizeof tmp, v);
  return std::string(tmp, p);
}

constexpr std::string_view err_syntax = "ERR syntax error";
constexpr std::string_view err_int = "ERR value is not an integer or out of range";
constexpr std::string_view err_oom = "OOM command not allowed when used memory > 'maxmemory'.";
// Short enough for the smallest RDMA message (64 bytes).
constexpr std::string_view err_reply_too_large = "ERR reply exceeds this client's reply limit";

// The bytes a bulk string of n bytes takes in a reply ($n\r\n...\r\n), at most.
constexpr std::size_t bulk_bytes(std::size_t n) {
  return n + 24;
}

}  // namespace

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

namespace {
enum : std::uint8_t { elem_literal, elem_any, elem_class };

unsigned char other_case(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return static_cast<unsigned char>(c - 'A' + 'a');
  if (c >= 'a' && c <= 'z') return static_cast<unsigned char>(c - 'a' + 'A');
  return c;
}
}  // namespace

glob_pattern::glob_pattern(std::string_view p, bool nocase) : pattern_size_(p.size()) {
  // Scans the pattern as Redis's stringmatchlen does (the scan never depends on
  // the string), turning it into elements and the star positions between them.
  std::vector<std::size_t> stars;  // element index where each star run sits
  std::size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '*') {
      while (i < p.size() && p[i] == '*') ++i;
      stars.push_back(elements_.size());
      continue;
    }
    if (c == '?') {
      elements_.push_back({elem_any, 0, 0, 0});
      ++i;
    } else if (c == '[') {
      std::array<std::uint64_t, 4> set{};
      auto add = [&](unsigned char b) { set[b >> 6] |= std::uint64_t{1} << (b & 63); };
      ++i;
      const bool negate = i < p.size() && p[i] == '^';
      if (negate) ++i;
      while (i < p.size() && p[i] != ']') {
        if (p[i] == '\\' && i + 1 < p.size()) {  // the next byte, exactly (no case folding)
          add(static_cast<unsigned char>(p[i + 1]));
          i += 2;
        } else if (i + 2 < p.size() && p[i + 1] == '-') {
          // Redis compares signed chars: swap first, then fold the case.
          int lo = static_cast<signed char>(p[i]), hi = static_cast<signed char>(p[i + 2]);
          if (lo > hi) std::swap(lo, hi);
          if (nocase) {
            lo = lo >= 'A' && lo <= 'Z' ? lo - 'A' + 'a' : lo;
            hi = hi >= 'A' && hi <= 'Z' ? hi - 'A' + 'a' : hi;
          }
          for (int b = 0; b < 256; ++b) {
            int v = static_cast<signed char>(static_cast<unsigned char>(b));
            if (nocase && v >= 'A' && v <= 'Z') v = v - 'A' + 'a';
            if (v >= lo && v <= hi) add(static_cast<unsigned char>(b));
          }
          i += 3;
        } else {
          const auto b = static_cast<unsigned char>(p[i]);
          add(b);
          if (nocase) add(other_case(b));
          ++i;
        }
      }
      if (i < p.size()) ++i;  // the ']' (an unterminated class runs to the end)
      if (negate)
        for (auto& w : set) w = ~w;
      classes_.push_back(set);
      elements_.push_back({elem_class, 0, 0, static_cast<std::uint32_t>(classes_.size() - 1)});
    } else {
      char lit = c;
      if (c == '\\' && i + 1 < p.size()) lit = p[++i];
      const auto b = static_cast<unsigned char>(lit);
      elements_.push_back({elem_literal, b, nocase ? other_case(b) : b, 0});
      ++i;
    }
    if (elements_.size() > max_elements) {  // longer than any key: matches nothing
      never_ = true;
      elements_ = {};
      classes_ = {};
      return;
    }
  }
  star_ = !stars.empty();
  literals_.reserve(elements_.size());
  for (const auto& el : elements_) literals_.push_back(static_cast<char>(el.a));
  auto add_piece = [&](std::size_t b, std::size_t e) {
    piece pc{b, e, true};
    for (std::size_t k = b; k < e && pc.is_plain; ++k)
      pc.is_plain = elements_[k].kind == elem_literal && elements_[k].a == elements_[k].b;
    pieces_.push_back(pc);
  };
  if (!star_) {
    add_piece(0, elements_.size());
    return;
  }
  add_piece(0, stars.front());
  for (std::size_t k = 1; k < stars.size(); ++k) add_piece(stars[k - 1], stars[k]);
  add_piece(stars.back(), elements_.size());
}

bool glob_pattern::match_at(const piece& pc, std::string_view s, std::size_t at,
                            std::uint64_t& steps) const {
  for (std::size_t k = pc.begin; k < pc.end; ++k) {
    ++steps;
    const auto& el = elements_[k];
    const auto c = static_cast<unsigned char>(s[at + k - pc.begin]);
    switch (el.kind) {
      case elem_any:
        break;
      case elem_literal:
        if (c != el.a && c != el.b) return false;
        break;
      default:
        if (!((classes_[el.cls][c >> 6] >> (c & 63)) & 1)) return false;
    }
  }
  return true;
}

bool glob_pattern::match(std::string_view s, std::uint64_t* steps_out) const {
  std::uint64_t steps = 0;
  auto done = [&](bool r) {
    if (steps_out != nullptr) *steps_out = steps;
    return r;
  };
  if (never_) return done(false);
  if (!star_) {
    const auto& pc = pieces_.front();
    return done(pc.end - pc.begin == s.size() && match_at(pc, s, 0, steps));
  }
  const auto& head = pieces_.front();
  const auto& tail = pieces_.back();
  const std::size_t head_n = head.end - head.begin, tail_n = tail.end - tail.begin;
  if (head_n + tail_n > s.size()) return done(false);
  if (!match_at(head, s, 0, steps) || !match_at(tail, s, s.size() - tail_n, steps))
    return done(false);
  // The pieces between stars, each at its leftmost fit in what is left: if a
  // match exists, the one that places every piece leftmost is one.
  std::size_t pos = head_n;
  const std::size_t end = s.size() - tail_n;
  const std::uint64_t budget = 64 * (std::uint64_t{s.size()} + pattern_size_) + 4096;
  for (std::size_t k = 1; k + 1 < pieces_.size(); ++k) {
    const auto& pc = pieces_[k];
    const std::size_t n = pc.end - pc.begin;
    if (n > end - pos) return done(false);
    if (pc.is_plain) {
      const void* hit = ::memmem(s.data() + pos, end - pos, literals_.data() + pc.begin, n);
      steps += n;  // memmem's own work is linear in what it searched
      if (hit == nullptr) {
        steps += end - pos;
        return done(false);
      }
      const auto at = static_cast<std::size_t>(static_cast<const char*>(hit) - s.data());
      steps += at - pos;
      pos = at + n;
      continue;
    }
    std::size_t at = pos;
    while (!match_at(pc, s, at, steps)) {
      if (at == end - n || steps > budget) return done(false);
      ++at;
    }
    pos = at + n;
  }
  return done(true);
}

bool glob_match(std::string_view p, std::string_view s, bool nocase) {
  return glob_pattern(p, nocase).match(s);
}

struct exec_context {
  executor& ex;
  session& sess;
  argv_t argv;
  reply r;
  time_ms now;
  std::size_t reply_start;  // where this command's reply begins in r.out()
  store& st() { return ex.store_; }
  bool replaying() const { return ex.replaying_; }
  // True if `bytes` more of reply stay within the session's max_reply.
  bool fits(std::size_t bytes) {
    const std::size_t used = r.out().size() - reply_start;
    return used <= sess.max_reply && bytes <= sess.max_reply - used;
  }
  // Drops what the reply holds so far and answers the error instead.
  void reply_too_large() {
    r.out().resize(reply_start);
    r.error(err_reply_too_large);
  }
  void log(std::initializer_list<std::string_view> a) { ex.log(argv_t(a.begin(), a.size())); }
  void log(argv_t a) { ex.log(a); }
  void wrong_args() {
    std::string e = "ERR wrong number of arguments for '";
    for (char c : argv[0]) e.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
    e += "' command";
    r.error(e);
  }
};

struct executor::command {
  std::string_view name;
  int arity;  // > 0 exact, < 0 at least -arity (Redis's convention, name included)
  bool write;
  int first_key, last_key, step;  // COMMAND's key positions
  std::string_view flags;         // COMMAND's flags, space separated
  void (*fn)(exec_context&);
};

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

void reply_command_info(exec_context& c, const executor::command& k);

void cmd_command(exec_context& c);  // needs the table; defined below

struct config_entry {
  std::string_view name;
  std::string value;
};

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

void cmd_info(exec_context& c);
void cmd_bgrewriteaof(exec_context& c);

// ---- string commands ---------------------------------------------------------

void cmd_get(exec_context& c) {
  auto v = c.st().get(c.argv[1], c.now);
  if (!v) {
    ++c.ex.stats().misses;
    return c.r.null();
  }
  ++c.ex.stats().hits;
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
  auto v = c.st().get(c.argv[1], c.now);
  if (!v) {
    ++c.ex.stats().misses;
    return c.r.null();
  }
  ++c.ex.stats().hits;
  // A value the reply cannot carry stays where it is.
  if (!c.fits(bulk_bytes(v->size()))) return c.reply_too_large();
  c.r.bulk(*v);  // copied into the reply before the erase frees it
  c.st().erase(c.argv[1], c.now);
  c.log({"DEL", c.argv[1]});
}

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

void incr_by(exec_context& c, std::int64_t delta) {
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
  auto v = c.st().get(c.argv[1], c.now);
  c.r.integer(v ? static_cast<std::int64_t>(v->size()) : 0);
}

void cmd_getrange(exec_context& c) {
  std::int64_t start, end;
  if (!to_i64(c.argv[2], start) || !to_i64(c.argv[3], end)) return c.r.error(err_int);
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

// ---- expiry -----------------------------------------------------------------

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

void ttl_generic(exec_context& c, bool ms, bool absolute) {
  auto e = c.st().expiry(c.argv[1], c.now);
  if (!e) return c.r.integer(-2);
  if (*e < 0) return c.r.integer(-1);
  if (absolute) return c.r.integer(ms ? *e : *e / 1000);
  std::int64_t left = *e - c.now;
  if (left < 0) left = 0;
  c.r.integer(ms ? left : (left + 500) / 1000);
}

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

void cmd_type(exec_context& c) {
  c.r.simple(c.st().contains(c.argv[1], c.now) ? "string" : "none");
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
  bool type_ok = !type || iequal(*type, "string");
  const glob_pattern glob(pattern);
  std::size_t bytes = 64;  // the reply's headers and the cursor
  bool too_large = false;
  auto next = c.st().scan(cursor, static_cast<std::size_t>(std::min<std::int64_t>(count, 1 << 20)),
                          [&](std::string_view k) {
                            if (too_large || !type_ok || (has_pattern && !glob.match(k))) return;
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

void cmd_keys(exec_context& c) {
  std::vector<std::string> keys;
  bool all = c.argv[1] == "*";
  const glob_pattern glob(c.argv[1]);
  // The keys are collected within the reply bound (what they will take in the
  // reply): a store of large keys must not become an unbounded copy.
  std::size_t bytes = 16;
  bool too_large = false;
  std::uint64_t cursor = 0;
  do {
    cursor = c.st().scan(cursor, 1024, [&](std::string_view k) {
      if (too_large || !(all || glob.match(k))) return;
      bytes += bulk_bytes(k.size());
      if (!c.fits(bytes))
        too_large = true;
      else
        keys.emplace_back(k);
    });
  } while (cursor != 0 && !too_large);
  if (too_large) return c.reply_too_large();
  // scan may report a key twice if the table moved; KEYS reports each once.
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  // Keys that expired are not reported (scan may visit them before lazy expiry).
  std::erase_if(keys, [&](const std::string& k) { return !c.st().contains(k, c.now); });
  c.r.array(keys.size());
  for (auto& k : keys) c.r.bulk(k);
}

// ---- the table -----------------------------------------------------------------

const executor::command commands[] = {
    {"ping", -1, false, 0, 0, 0, "fast", cmd_ping},
    {"echo", 2, false, 0, 0, 0, "fast", cmd_echo},
    {"quit", -1, false, 0, 0, 0, "fast noauth", cmd_quit},
    {"select", 2, false, 0, 0, 0, "loading stale fast", cmd_select},
    {"auth", -2, false, 0, 0, 0, "noscript loading stale fast noauth", cmd_auth},
    {"hello", -1, false, 0, 0, 0, "noscript loading stale fast noauth", cmd_hello},
    {"client", -2, false, 0, 0, 0, "noscript loading stale", cmd_client},
    {"command", -1, false, 0, 0, 0, "loading stale", cmd_command},
    {"config", -2, false, 0, 0, 0, "admin noscript loading stale", cmd_config},
    {"info", -1, false, 0, 0, 0, "loading stale", cmd_info},
    {"dbsize", 1, false, 0, 0, 0, "readonly fast", cmd_dbsize},
    {"flushall", -1, true, 0, 0, 0, "write", cmd_flushall},
    {"flushdb", -1, true, 0, 0, 0, "write", cmd_flushall},
    {"time", 1, false, 0, 0, 0, "loading stale fast", cmd_time},
    {"bgrewriteaof", 1, false, 0, 0, 0, "admin noscript", cmd_bgrewriteaof},
    {"get", 2, false, 1, 1, 1, "readonly fast", cmd_get},
    {"set", -3, true, 1, 1, 1, "write denyoom", cmd_set},
    {"setnx", 3, true, 1, 1, 1, "write denyoom fast", cmd_setnx},
    {"setex", 4, true, 1, 1, 1, "write denyoom", cmd_setex},
    {"psetex", 4, true, 1, 1, 1, "write denyoom", cmd_psetex},
    {"getset", 3, true, 1, 1, 1, "write denyoom fast", cmd_getset},
    {"getdel", 2, true, 1, 1, 1, "write fast", cmd_getdel},
    {"del", -2, true, 1, -1, 1, "write", cmd_del},
    {"unlink", -2, true, 1, -1, 1, "write fast", cmd_del},
    {"exists", -2, false, 1, -1, 1, "readonly fast", cmd_exists},
    {"mget", -2, false, 1, -1, 1, "readonly fast", cmd_mget},
    {"mset", -3, true, 1, -1, 2, "write denyoom", cmd_mset},
    {"msetnx", -3, true, 1, -1, 2, "write denyoom", cmd_msetnx},
    {"incr", 2, true, 1, 1, 1, "write denyoom fast", cmd_incr},
    {"decr", 2, true, 1, 1, 1, "write denyoom fast", cmd_decr},
    {"incrby", 3, true, 1, 1, 1, "write denyoom fast", cmd_incrby},
    {"decrby", 3, true, 1, 1, 1, "write denyoom fast", cmd_decrby},
    {"append", 3, true, 1, 1, 1, "write denyoom", cmd_append},
    {"strlen", 2, false, 1, 1, 1, "readonly fast", cmd_strlen},
    {"getrange", 4, false, 1, 1, 1, "readonly", cmd_getrange},
    {"expire", -3, true, 1, 1, 1, "write fast", cmd_expire},
    {"pexpire", -3, true, 1, 1, 1, "write fast", cmd_pexpire},
    {"expireat", -3, true, 1, 1, 1, "write fast", cmd_expireat},
    {"pexpireat", -3, true, 1, 1, 1, "write fast", cmd_pexpireat},
    {"ttl", 2, false, 1, 1, 1, "readonly fast", cmd_ttl},
    {"pttl", 2, false, 1, 1, 1, "readonly fast", cmd_pttl},
    {"expiretime", 2, false, 1, 1, 1, "readonly fast", cmd_expiretime},
    {"pexpiretime", 2, false, 1, 1, 1, "readonly fast", cmd_pexpiretime},
    {"persist", 2, true, 1, 1, 1, "write fast", cmd_persist},
    {"type", 2, false, 1, 1, 1, "readonly fast", cmd_type},
    {"scan", -2, false, 0, 0, 0, "readonly", cmd_scan},
    {"keys", 2, false, 0, 0, 0, "readonly", cmd_keys},
};

const std::unordered_map<std::string_view, const executor::command*>& table() {
  static const auto t = [] {
    std::unordered_map<std::string_view, const executor::command*> m;
    for (const auto& k : commands) m.emplace(k.name, &k);
    return m;
  }();
  return t;
}

const executor::command* lookup(std::string_view name) {
  if (name.size() > 32) return nullptr;
  char low[32];
  for (std::size_t i = 0; i < name.size(); ++i) {
    char ch = name[i];
    low[i] = ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch;
  }
  auto it = table().find(std::string_view(low, name.size()));
  return it == table().end() ? nullptr : it->second;
}

void reply_command_info(exec_context& c, const executor::command& k) {
  c.r.array(6);
  c.r.bulk(k.name);
  c.r.integer(k.arity);
  std::size_t nflags = 0;
  for (std::size_t i = 0; i < k.flags.size();) {
    auto j = k.flags.find(' ', i);
    if (j == std::string_view::npos) j = k.flags.size();
    ++nflags;
    i = j + 1;
  }
  c.r.set(nflags);
  for (std::size_t i = 0; i < k.flags.size();) {
    auto j = k.flags.find(' ', i);
    if (j == std::string_view::npos) j = k.flags.size();
    c.r.simple(k.flags.substr(i, j - i));
    i = j + 1;
  }
  c.r.integer(k.first_key);
  c.r.integer(k.last_key);
  c.r.integer(k.step);
}

void cmd_command(exec_context& c) {
  if (c.argv.size() == 1) {
    c.r.array(std::size(commands));
    for (const auto& k : commands) reply_command_info(c, k);
    if (!c.fits(0)) c.reply_too_large();
    return;
  }
  auto sub = c.argv[1];
  if (iequal(sub, "COUNT") && c.argv.size() == 2)
    return c.r.integer(static_cast<std::int64_t>(std::size(commands)));
  if (iequal(sub, "INFO")) {
    if (c.argv.size() == 2) {
      c.r.array(std::size(commands));
      for (const auto& k : commands) reply_command_info(c, k);
      if (!c.fits(0)) c.reply_too_large();
      return;
    }
    // One name asked many times: checked per element, as MGET.
    c.r.array(c.argv.size() - 2);
    for (std::size_t i = 2; i < c.argv.size(); ++i) {
      if (!c.fits(256)) return c.reply_too_large();
      auto* k = lookup(c.argv[i]);
      if (k)
        reply_command_info(c, *k);
      else
        c.r.null_array();
    }
    return;
  }
  if (iequal(sub, "DOCS")) {
    // Docs are optional for clients (redis-cli asks at start and falls back to
    // its built-in help): each command gets a short summary and nothing else.
    std::vector<const executor::command*> which;
    if (c.argv.size() == 2) {
      for (const auto& k : commands) which.push_back(&k);
    } else {
      for (std::size_t i = 2; i < c.argv.size(); ++i)
        if (auto* k = lookup(c.argv[i])) which.push_back(k);
    }
    c.r.map(which.size());
    for (auto* k : which) {
      if (!c.fits(128)) return c.reply_too_large();
      c.r.bulk(k->name);
      c.r.map(2);
      c.r.bulk("summary");
      c.r.bulk(k->write ? "conveyor-kv write command" : "conveyor-kv command");
      c.r.bulk("group");
      c.r.bulk(k->first_key != 0 ? "string" : "server");
    }
    return;
  }
  if (iequal(sub, "LIST")) {
    c.r.array(std::size(commands));
    for (const auto& k : commands) c.r.bulk(k.name);
    return;
  }
  std::string e = "ERR unknown subcommand or wrong number of arguments for '";
  e += sub;
  e += "'. Try COMMAND HELP.";
  c.r.error(e);
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

}  // namespace

executor::executor(store& s, aof* log, const server_config& cfg)
    : store_(s), aof_(log), cfg_(cfg), start_ms_(now_ms()) {}

void executor::log(std::span<const std::string_view> argv) {
  if (aof_ != nullptr && !replaying_) aof_->append(argv);
}

void executor::execute(session& sess, std::span<const std::string_view> argv, std::string& out) {
  reply r(out, sess.resp);
  if (argv.empty()) return;
  ++stats_.commands;
  const command* k = lookup(argv[0]);
  bool noauth_ok = k != nullptr && k->flags.find("noauth") != std::string_view::npos;
  if (!cfg_.requirepass.empty() && !sess.authenticated && !replaying_ && !noauth_ok)
    return r.error("NOAUTH Authentication required.");
  if (k == nullptr) {
    std::string e = "ERR unknown command '";
    e += argv[0].substr(0, 128);
    e += "', with args beginning with: ";
    for (std::size_t i = 1; i < argv.size() && e.size() < 1024; ++i) {
      e += '\'';
      e += argv[i].substr(0, 128);
      e += "' ";
    }
    return r.error(e);
  }
  const std::size_t start = out.size();
  exec_context c{*this, sess, argv, r, now_ms(), start};
  if ((k->arity > 0 && argv.size() != static_cast<std::size_t>(k->arity)) ||
      (k->arity < 0 && argv.size() < static_cast<std::size_t>(-k->arity)))
    return c.wrong_args();
  if (k->write && aof_ != nullptr && !aof_->healthy() && !replaying_)
    return r.error("MISCONF Errors writing to the AOF file: " + aof_->last_error());
  try {
    k->fn(c);
  } catch (const std::bad_alloc&) {
    // An allocation the command needed failed: this command fails, the server
    // and every other client go on (the reply so far is dropped; shrinking
    // allocates nothing).
    out.resize(start);
    r.error("OOM out of memory while running the command");
    return;
  }
  // Commands without a bound of their own (GETRANGE, ECHO, INFO...) have
  // replies no larger than what they were sent or a value: checked once here.
  if (out.size() - start > sess.max_reply) c.reply_too_large();
}

bool executor::replay(std::span<const std::string_view> argv, std::string& why) {
  if (argv.empty()) return true;
  const command* k = lookup(argv[0]);
  if (k == nullptr || !k->write) {
    why = "not a logged command: " + std::string(argv[0].substr(0, 64));
    return false;
  }
  session sess;
  sess.authenticated = true;
  std::string out;
  replaying_ = true;
  execute(sess, argv, out);
  replaying_ = false;
  --stats_.commands;
  // No reader exists before the front ends start: what this command replaced
  // is freed now, not a grace time later (back to back, the overwrites of a
  // log would otherwise all be in grace at once and run the store out).
  store_.reclaim_all();
  if (!out.empty() && out[0] == '-') {
    why = "replaying " + std::string(argv[0].substr(0, 64)) + ": " +
          out.substr(1, out.find('\r') - 1);
    return false;
  }
  return true;
}

}  // namespace conveyor::kv
