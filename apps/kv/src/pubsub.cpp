// Publish/subscribe (pubsub.hpp) and its commands: SUBSCRIBE, UNSUBSCRIBE,
// PSUBSCRIBE, PUNSUBSCRIBE, PUBLISH, PUBSUB CHANNELS|NUMSUB|NUMPAT (Redis's
// pubsub.c).
#include "pubsub.hpp"

#include <charconv>

#include "command_context.hpp"

namespace conveyor::kv {

namespace {

void header(std::string& out, char type, std::size_t n) {
  char tmp[24];
  auto [p, ec] = std::to_chars(tmp, tmp + sizeof tmp, n);
  out += type;
  out.append(tmp, p);
  out += "\r\n";
}

void bulk(std::string& out, std::string_view s) {
  header(out, '$', s.size());
  out += s;
  out += "\r\n";
}

// A message frame for one protocol: [p]message [pattern] channel payload.
std::string message_frame(int resp, const std::string_view* pattern, std::string_view channel,
                          std::string_view message) {
  std::string f;
  f.reserve(channel.size() + message.size() + (pattern ? pattern->size() : 0) + 64);
  header(f, resp == 3 ? '>' : '*', pattern ? 4 : 3);
  bulk(f, pattern ? "pmessage" : "message");
  if (pattern) bulk(f, *pattern);
  bulk(f, channel);
  bulk(f, message);
  return f;
}

}  // namespace

void pubsub_frame(std::string& out, int resp, std::string_view kind, const std::string_view* name,
                  std::size_t count) {
  header(out, resp == 3 ? '>' : '*', 3);
  bulk(out, kind);
  if (name)
    bulk(out, *name);
  else
    out += resp == 3 ? "_\r\n" : "$-1\r\n";
  out += ':';
  out += std::to_string(count);
  out += "\r\n";
}

bool pubsub::subscribe(session& s, std::string_view channel) {
  if (!s.channels.emplace(channel).second) return false;
  channels_[std::string(channel)][s.id] = &s;
  return true;
}

bool pubsub::unsubscribe(session& s, std::string_view channel) {
  auto it = s.channels.find(channel);
  if (it == s.channels.end()) return false;
  s.channels.erase(it);
  auto c = channels_.find(std::string(channel));
  if (c != channels_.end()) {
    c->second.erase(s.id);
    if (c->second.empty()) channels_.erase(c);
  }
  return true;
}

bool pubsub::psubscribe(session& s, std::string_view pattern) {
  if (!s.patterns.emplace(pattern).second) return false;
  auto it = patterns_.find(pattern);
  if (it == patterns_.end())
    it = patterns_.emplace(std::string(pattern), pattern_subs{glob_pattern(pattern), {}}).first;
  it->second.subs[s.id] = &s;
  return true;
}

bool pubsub::punsubscribe(session& s, std::string_view pattern) {
  auto it = s.patterns.find(pattern);
  if (it == s.patterns.end()) return false;
  s.patterns.erase(it);
  auto p = patterns_.find(pattern);
  if (p != patterns_.end()) {
    p->second.subs.erase(s.id);
    if (p->second.subs.empty()) patterns_.erase(p);
  }
  return true;
}

void pubsub::add_monitor(session& s) {
  s.monitor = true;
  monitors_[s.id] = &s;
}

void pubsub::feed_monitors(std::string_view line) {
  if (!hooks_.deliver) return;
  std::vector<std::uint64_t> ids;
  for (auto& [id, s] : monitors_) ids.push_back(id);
  for (auto id : ids) hooks_.deliver(id, line);
}

void pubsub::forget(session& s) {
  if (s.monitor) monitors_.erase(s.id);
  s.monitor = false;
  while (!s.channels.empty()) unsubscribe(s, std::string(*s.channels.begin()));
  while (!s.patterns.empty()) punsubscribe(s, std::string(*s.patterns.begin()));
}

std::size_t pubsub::publish(std::string_view channel, std::string_view message) {
  // Who receives is fixed first: a delivery may close a subscriber (its output
  // bound), which is done later by the front end, never inside this walk.
  struct target {
    std::uint64_t id;
    int resp;
    const std::string* pattern;
  };
  std::vector<target> to;
  if (auto c = channels_.find(std::string(channel)); c != channels_.end())
    for (auto& [id, s] : c->second) to.push_back({id, s->resp, nullptr});
  for (auto& [pat, p] : patterns_)
    if (p.glob.match(channel))
      for (auto& [id, s] : p.subs) to.push_back({id, s->resp, &pat});
  if (!hooks_.deliver) return to.size();
  std::string frames[2];  // RESP2, RESP3: built once per channel delivery
  for (const auto& t : to) {
    if (t.pattern) {
      std::string_view pv(*t.pattern);
      hooks_.deliver(t.id, message_frame(t.resp, &pv, channel, message));
    } else {
      auto& f = frames[t.resp == 3 ? 1 : 0];
      if (f.empty()) f = message_frame(t.resp, nullptr, channel, message);
      hooks_.deliver(t.id, f);
    }
  }
  return to.size();
}

std::vector<std::string_view> pubsub::active_channels(std::string_view pattern, bool all) const {
  std::vector<std::string_view> out;
  glob_pattern g(all ? "*" : pattern);
  for (auto& [name, subs] : channels_)
    if (all || g.match(name)) out.push_back(name);
  return out;
}

std::size_t pubsub::subscribers(std::string_view channel) const {
  auto c = channels_.find(std::string(channel));
  return c == channels_.end() ? 0 : c->second.size();
}

// ---- the commands ---------------------------------------------------------------

namespace {

bool can_subscribe(exec_context& c) {
  if (c.sess.resp_client) return true;
  c.r.error("ERR this connection cannot receive messages (pub/sub needs a RESP connection)");
  return false;
}

std::size_t subscriptions(const session& s) {
  return s.channels.size() + s.patterns.size();
}

// Every name is checked before any is subscribed: the command does all or nothing.
bool within_bounds(exec_context& c) {
  const auto& cfg = c.ex.config();
  for (std::size_t i = 1; i < c.argv.size(); ++i)
    if (c.argv[i].size() > cfg.pubsub_max_name) {
      c.r.error("ERR channel or pattern longer than " + std::to_string(cfg.pubsub_max_name) +
                " bytes");
      return false;
    }
  if (subscriptions(c.sess) + c.argv.size() - 1 > cfg.pubsub_max_subscriptions) {
    c.r.error("ERR too many subscriptions (at most " +
              std::to_string(cfg.pubsub_max_subscriptions) + " channels and patterns per client)");
    return false;
  }
  return true;
}

}  // namespace

void cmd_subscribe(exec_context& c) {
  if (!can_subscribe(c) || !within_bounds(c)) return;
  for (std::size_t i = 1; i < c.argv.size(); ++i) {
    c.ex.channels().subscribe(c.sess, c.argv[i]);
    pubsub_frame(c.r.out(), c.sess.resp, "subscribe", &c.argv[i], subscriptions(c.sess));
  }
}

void cmd_psubscribe(exec_context& c) {
  if (!can_subscribe(c) || !within_bounds(c)) return;
  for (std::size_t i = 1; i < c.argv.size(); ++i) {
    c.ex.channels().psubscribe(c.sess, c.argv[i]);
    pubsub_frame(c.r.out(), c.sess.resp, "psubscribe", &c.argv[i], subscriptions(c.sess));
  }
}

namespace {

void leave(exec_context& c, bool patterns) {
  auto& ps = c.ex.channels();
  const std::string_view kind = patterns ? "punsubscribe" : "unsubscribe";
  auto& mine = patterns ? c.sess.patterns : c.sess.channels;
  if (c.argv.size() == 1) {
    if (mine.empty())
      return pubsub_frame(c.r.out(), c.sess.resp, kind, nullptr, subscriptions(c.sess));
    while (!mine.empty()) {
      std::string name = *mine.begin();
      patterns ? ps.punsubscribe(c.sess, name) : ps.unsubscribe(c.sess, name);
      std::string_view v(name);
      pubsub_frame(c.r.out(), c.sess.resp, kind, &v, subscriptions(c.sess));
    }
    return;
  }
  for (std::size_t i = 1; i < c.argv.size(); ++i) {
    patterns ? ps.punsubscribe(c.sess, c.argv[i]) : ps.unsubscribe(c.sess, c.argv[i]);
    pubsub_frame(c.r.out(), c.sess.resp, kind, &c.argv[i], subscriptions(c.sess));
  }
}

}  // namespace

void cmd_unsubscribe(exec_context& c) {
  leave(c, false);
}

void cmd_punsubscribe(exec_context& c) {
  leave(c, true);
}

void cmd_publish(exec_context& c) {
  c.r.integer(static_cast<std::int64_t>(c.ex.channels().publish(c.argv[1], c.argv[2])));
}

void cmd_pubsub(exec_context& c) {
  auto sub = c.argv[1];
  auto& ps = c.ex.channels();
  if (iequal(sub, "CHANNELS") && c.argv.size() <= 3) {
    auto names = ps.active_channels(c.argv.size() == 3 ? c.argv[2] : "*", c.argv.size() == 2);
    c.r.array(names.size());
    for (auto n : names) {
      if (!c.fits(bulk_bytes(n.size()))) return c.reply_too_large();
      c.r.bulk(n);
    }
    return;
  }
  if (iequal(sub, "NUMSUB")) {
    c.r.map(c.argv.size() - 2);
    for (std::size_t i = 2; i < c.argv.size(); ++i) {
      if (!c.fits(bulk_bytes(c.argv[i].size()) + 24)) return c.reply_too_large();
      c.r.bulk(c.argv[i]);
      c.r.integer(static_cast<std::int64_t>(ps.subscribers(c.argv[i])));
    }
    return;
  }
  if (iequal(sub, "NUMPAT") && c.argv.size() == 2)
    return c.r.integer(static_cast<std::int64_t>(ps.patterns()));
  std::string e = "ERR unknown subcommand or wrong number of arguments for '";
  e += sub.substr(0, 128);
  e += "'. Try PUBSUB HELP.";
  c.r.error(e);
}

}  // namespace conveyor::kv
