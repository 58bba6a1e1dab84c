// Operations commands (Redis's networking.c, config.c, slowlog.c, server.c):
// CLIENT (LIST, KILL, INFO, ID, SETNAME, GETNAME, PAUSE, UNPAUSE, SETINFO),
// CONFIG (GET, SET, RESETSTAT), SLOWLOG, MONITOR, SHUTDOWN, RESET; and what
// runs after every command (the slow log, MONITOR's feed).
#include <sys/time.h>

#include <cstdio>
#include <string>
#include <vector>

#include "aof.hpp"
#include "command_context.hpp"
#include "pubsub.hpp"

namespace conveyor::kv {

namespace {

std::string unknown_sub(std::string_view cmd, std::string_view sub) {
  std::string e = "ERR unknown subcommand '";
  e += sub.substr(0, 128);
  e += "'. Try ";
  e += cmd;
  e += " HELP.";
  return e;
}

void sub_wrong_args(exec_context& c, std::string_view full) {
  c.r.error("ERR wrong number of arguments for '" + std::string(full) + "' command");
}

// MONITOR's quoting (Redis's sdscatrepr): printable bytes as they are, escapes for
// quote, backslash, \n \r \t \a \b, anything else \xHH.
void repr(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char ch : s) {
    switch (ch) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\a':
        out += "\\a";
        break;
      case '\b':
        out += "\\b";
        break;
      default:
        if (ch >= 32 && ch < 127) {
          out += static_cast<char>(ch);
        } else {
          char tmp[8];
          std::snprintf(tmp, sizeof tmp, "\\x%02x", ch);
          out += tmp;
        }
    }
  }
  out += '"';
}

}  // namespace

void client_line(std::string& out, const session& s, const client_io& io, std::int64_t now) {
  std::string flags;
  if (!s.channels.empty() || !s.patterns.empty()) flags += 'P';
  if (s.monitor) flags += 'O';
  if (s.in_multi) flags += 'x';
  if (flags.empty()) flags = "N";
  out += "id=" + std::to_string(s.id) + " addr=" + s.addr + " laddr=" + s.laddr +
         " fd=" + std::to_string(io.fd) + " name=" + s.name +
         " age=" + std::to_string(s.created_ms ? (now - s.created_ms) / 1000 : 0) +
         " idle=" + std::to_string(io.idle_s) + " flags=" + flags +
         " db=0 sub=" + std::to_string(s.channels.size()) +
         " psub=" + std::to_string(s.patterns.size()) +
         " ssub=0 multi=" + (s.in_multi ? std::to_string(s.queued.size()) : std::string("-1")) +
         " qbuf=" + std::to_string(io.qbuf) +
         " qbuf-free=0 argv-mem=0 multi-mem=" + std::to_string(s.queued_bytes) +
         " obl=0 oll=0 omem=" + std::to_string(io.omem) +
         " tot-mem=" + std::to_string(io.qbuf + io.omem + s.queued_bytes) +
         " events=r cmd=" + (s.last_command.empty() ? std::string("NULL") : s.last_command) +
         " user=default redir=-1 resp=" + std::to_string(s.resp) + "\n";
}

// ---- CLIENT ----------------------------------------------------------------------

namespace {

void client_kill(exec_context& c) {
  auto& hooks = c.ex.hooks();
  if (c.argv.size() == 3) {  // the old form: CLIENT KILL addr:port
    const std::string addr(c.argv[2]);
    std::size_t n = hooks.kill ? hooks.kill([&](const session& s) { return s.addr == addr; }) : 0;
    if (n == 0) return c.r.error("ERR No such client");
    return c.r.simple("OK");
  }
  if (c.argv.size() % 2 != 0) return c.r.error(err_syntax);
  std::optional<std::uint64_t> id;
  std::optional<std::string> addr, laddr, type;
  bool skipme = true;
  for (std::size_t i = 2; i + 1 < c.argv.size(); i += 2) {
    auto opt = c.argv[i];
    auto v = c.argv[i + 1];
    if (iequal(opt, "ID")) {
      std::int64_t x;
      if (!to_i64(v, x) || x <= 0) return c.r.error("ERR client-id should be greater than 0");
      id = static_cast<std::uint64_t>(x);
    } else if (iequal(opt, "ADDR")) {
      addr = std::string(v);
    } else if (iequal(opt, "LADDR")) {
      laddr = std::string(v);
    } else if (iequal(opt, "TYPE")) {
      if (!iequal(v, "normal") && !iequal(v, "pubsub") && !iequal(v, "master") &&
          !iequal(v, "replica") && !iequal(v, "slave"))
        return c.r.error("ERR Unknown client type '" + std::string(v.substr(0, 64)) + "'");
      std::string t;
      for (char ch : v) t += static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
      type = t;
    } else if (iequal(opt, "USER")) {
      if (!iequal(v, "default"))
        return c.r.error("ERR No such user '" + std::string(v.substr(0, 64)) + "'");
    } else if (iequal(opt, "SKIPME")) {
      if (iequal(v, "yes"))
        skipme = true;
      else if (iequal(v, "no"))
        skipme = false;
      else
        return c.r.error(err_syntax);
    } else {
      return c.r.error(err_syntax);
    }
  }
  const std::uint64_t self = c.sess.id;
  auto match = [&](const session& s) {
    if (skipme && s.id == self) return false;
    if (id && s.id != *id) return false;
    if (addr && s.addr != *addr) return false;
    if (laddr && s.laddr != *laddr) return false;
    if (type) {
      const bool pub = !s.channels.empty() || !s.patterns.empty();
      if (*type == "pubsub" ? !pub : (*type == "normal" ? pub : true)) return false;
    }
    return true;
  };
  c.r.integer(static_cast<std::int64_t>(hooks.kill ? hooks.kill(match) : 0));
}

}  // namespace

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
  if ((iequal(sub, "INFO") && c.argv.size() == 2) || (iequal(sub, "LIST"))) {
    const bool info = iequal(sub, "INFO");
    std::string s;
    if (!info && c.argv.size() > 2) {
      // CLIENT LIST TYPE normal|pubsub / ID id...: only the plain form and ID.
      if (!iequal(c.argv[2], "ID") || c.argv.size() < 4) return c.r.error(err_syntax);
      for (std::size_t i = 3; i < c.argv.size(); ++i) {
        std::int64_t x;
        if (!to_i64(c.argv[i], x) || x <= 0) return c.r.error("ERR Invalid client ID");
        if (c.ex.hooks().list_clients) c.ex.hooks().list_clients(s, static_cast<std::uint64_t>(x));
      }
    } else if (c.ex.hooks().list_clients) {
      c.ex.hooks().list_clients(s, info ? c.sess.id : 0);
    }
    if (info && s.empty()) client_line(s, c.sess, client_io{}, c.now);
    if (!c.fits(bulk_bytes(s.size()))) return c.reply_too_large();
    return c.r.verbatim(s);
  }
  if (iequal(sub, "KILL")) {
    if (c.argv.size() < 3) return sub_wrong_args(c, "client|kill");
    return client_kill(c);
  }
  if (iequal(sub, "PAUSE")) {
    if (c.argv.size() < 3 || c.argv.size() > 4) return sub_wrong_args(c, "client|pause");
    std::int64_t ms;
    if (!to_i64(c.argv[2], ms) || ms < 0)
      return c.r.error("ERR timeout is not an integer or out of range");
    bool writes_only = false;
    if (c.argv.size() == 4) {
      if (iequal(c.argv[3], "WRITE"))
        writes_only = true;
      else if (!iequal(c.argv[3], "ALL"))
        return c.r.error("ERR CLIENT PAUSE mode must be WRITE or ALL");
    }
    if (ms > (std::int64_t{1} << 40)) ms = std::int64_t{1} << 40;
    c.ex.pause(c.now + ms, writes_only);
    return c.r.simple("OK");
  }
  if (iequal(sub, "UNPAUSE") && c.argv.size() == 2) {
    c.ex.pause(0, false);
    return c.r.simple("OK");
  }
  if (iequal(sub, "NO-EVICT") || iequal(sub, "NO-TOUCH") || iequal(sub, "REPLY") ||
      iequal(sub, "TRACKING") || iequal(sub, "CACHING") || iequal(sub, "UNBLOCK"))
    return c.r.error("ERR CLIENT " + std::string(sub.substr(0, 32)) +
                     " is not supported by conveyor-kv");
  std::string e = "ERR unknown subcommand or wrong number of arguments for '";
  e += sub.substr(0, 128);
  e += "'. Try CLIENT HELP.";
  c.r.error(e);
}

// ---- SLOWLOG, MONITOR, after each command -------------------------------------------

void cmd_slowlog(exec_context& c) {
  auto sub = c.argv[1];
  auto& log = c.ex.slowlog();
  if (iequal(sub, "LEN")) {
    if (c.argv.size() != 2) return sub_wrong_args(c, "slowlog|len");
    return c.r.integer(static_cast<std::int64_t>(log.size()));
  }
  if (iequal(sub, "RESET")) {
    if (c.argv.size() != 2) return sub_wrong_args(c, "slowlog|reset");
    log.clear();
    return c.r.simple("OK");
  }
  if (iequal(sub, "GET")) {
    if (c.argv.size() > 3) return sub_wrong_args(c, "slowlog|get");
    std::int64_t count = 10;
    if (c.argv.size() == 3 && (!to_i64(c.argv[2], count) || count < -1))
      return c.r.error("ERR count should be greater than or equal to -1");
    std::size_t n = count == -1 ? log.size() : std::min<std::size_t>(log.size(), count);
    c.r.array(n);
    // Newest first (the log is kept oldest first).
    for (std::size_t i = 0; i < n; ++i) {
      const auto& e = log[log.size() - 1 - i];
      c.r.array(6);
      c.r.integer(static_cast<std::int64_t>(e.id));
      c.r.integer(e.at_s);
      c.r.integer(e.usec);
      c.r.array(e.argv.size());
      for (auto& a : e.argv) c.r.bulk(a);
      c.r.bulk(e.addr);
      c.r.bulk(e.name);
      if (!c.fits(0)) return c.reply_too_large();
    }
    return;
  }
  c.r.error(unknown_sub("SLOWLOG", sub));
}

void cmd_monitor(exec_context& c) {
  if (!c.sess.resp_client) return c.r.error("ERR MONITOR needs a RESP connection");
  if (c.sess.in_multi) return c.r.error("ERR MONITOR isn't allowed for DENY BLOCKING client");
  c.ex.channels().add_monitor(c.sess);
  c.r.simple("OK");
}

void after_command(exec_context& c, const executor::command& k, std::int64_t usec) {
  const auto& cfg = c.ex.config();
  const bool admin = k.flags.find("admin") != std::string_view::npos;
  const bool secret = k.name == "auth" || k.name == "hello";
  if (cfg.slowlog_log_slower_than >= 0 && usec >= cfg.slowlog_log_slower_than &&
      k.flags.find("skip_slowlog") == std::string_view::npos && cfg.slowlog_max_len != 0) {
    auto& log = c.ex.slowlog();
    slowlog_entry e;
    e.id = c.ex.slowlog_next_id()++;
    e.at_s = c.now / 1000;
    e.usec = usec;
    // Redis keeps 32 arguments of 128 bytes at most, saying what it left out.
    const std::size_t n = std::min<std::size_t>(c.argv.size(), 32);
    for (std::size_t i = 0; i < n; ++i) {
      if (i == 31 && c.argv.size() > 32) {
        e.argv.push_back("... (" + std::to_string(c.argv.size() - 31) + " more arguments)");
        break;
      }
      if (secret && i > 0) {
        e.argv.push_back("(redacted)");
        continue;
      }
      auto a = c.argv[i];
      if (a.size() > 128)
        e.argv.push_back(std::string(a.substr(0, 128)) + "... (" + std::to_string(a.size() - 128) +
                         " more bytes)");
      else
        e.argv.emplace_back(a);
    }
    e.addr = c.sess.addr;
    e.name = c.sess.name;
    log.push_back(std::move(e));
    while (log.size() > cfg.slowlog_max_len) log.erase(log.begin());
    ++c.ex.stats().slow_commands;
  }
  auto& ps = c.ex.channels();
  if (ps.has_monitors() && !admin && !secret) {
    timeval tv{};
    ::gettimeofday(&tv, nullptr);
    char head[64];
    std::snprintf(head, sizeof head, "+%lld.%06lld [0 ", static_cast<long long>(tv.tv_sec),
                  static_cast<long long>(tv.tv_usec));
    std::string line = head;
    line += c.sess.addr.empty() ? std::string("rdma") : c.sess.addr;
    line += ']';
    // One line, bounded: MONITOR must not let one command's arguments make
    // every monitor's buffer hold them all (long arguments are cut, as the
    // slow log does).
    for (auto a : c.argv) {
      line += ' ';
      repr(line, a.substr(0, 4096));
      if (line.size() > (64u << 10)) break;
    }
    line += "\r\n";
    ps.feed_monitors(line);
  }
}

// ---- SHUTDOWN, RESET --------------------------------------------------------------

void cmd_shutdown(exec_context& c) {
  for (std::size_t i = 1; i < c.argv.size(); ++i) {
    auto a = c.argv[i];
    if (!iequal(a, "NOSAVE") && !iequal(a, "SAVE") && !iequal(a, "NOW") && !iequal(a, "FORCE") &&
        !iequal(a, "ABORT"))
      return c.r.error(err_syntax);
    if (iequal(a, "ABORT")) return c.r.error("ERR No shutdown in progress.");
  }
  if (!c.ex.shutdown_server()) return c.r.error("ERR this server cannot be shut down from here");
  // As Redis: no reply; the connection closes with the server.
  if (!c.sess.resp_client) c.r.simple("OK");
  c.sess.close_after_reply = true;
}

bool executor::shutdown_server(bool abandon_exec) {
  if (!hooks_.shutdown) return false;
  abandon_exec_ = abandon_exec && in_exec_;
  if (aof_ != nullptr) {
    // Everything acknowledged so far reaches the disk before the process goes.
    aof_->flush();
    aof_->sync();
  }
  hooks_.shutdown();
  return true;
}

void cmd_reset(exec_context& c) {
  auto& s = c.sess;
  s.in_multi = false;
  s.multi_failed = false;
  s.queued.clear();
  s.queued_bytes = 0;
  s.watched.clear();
  s.watched_bytes = 0;
  c.ex.forget(s);
  s.resp = 2;
  s.name.clear();
  if (!c.ex.config().requirepass.empty()) s.authenticated = false;
  reply(c.r.out(), 2).simple("RESET");
}

}  // namespace conveyor::kv
