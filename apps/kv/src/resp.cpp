// RESP2 request parsing and RESP2/RESP3 reply writing (resp.hpp).
#include "resp.hpp"

#include <charconv>
#include <cstring>

namespace conveyor::kv {

namespace {

// Parses a non-negative or negative decimal that fills [p, end) exactly.
bool parse_i64(const char* p, const char* end, std::int64_t& v) {
  if (p == end) return false;
  auto [q, ec] = std::from_chars(p, end, v);
  return ec == std::errc{} && q == end;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f';
}

// Raw control bytes (NUL, ESC...) have no place in a typed command: binary
// garbage is a protocol error, not an unknown command (escapes such as "\x00"
// inside quotes still give any byte).
bool is_control(char c) {
  auto u = static_cast<unsigned char>(c);
  return (u < 0x20 && !is_space(c)) || u == 0x7f;
}

}  // namespace

bool split_inline(std::string_view line, std::vector<std::string>& out) {
  out.clear();
  for (char c : line)
    if (is_control(c)) return false;
  std::size_t i = 0, n = line.size();
  while (true) {
    while (i < n && is_space(line[i])) ++i;
    if (i == n) return true;
    std::string cur;
    bool in_dq = false, in_sq = false, done = false;
    while (!done) {
      if (in_dq) {
        if (i == n) return false;  // unterminated quotes
        char c = line[i];
        if (c == '\\' && i + 3 < n && line[i + 1] == 'x' && hex_digit(line[i + 2]) >= 0 &&
            hex_digit(line[i + 3]) >= 0) {
          cur.push_back(static_cast<char>(hex_digit(line[i + 2]) * 16 + hex_digit(line[i + 3])));
          i += 4;
        } else if (c == '\\' && i + 1 < n) {
          char e = line[i + 1];
          switch (e) {
            case 'n':
              cur.push_back('\n');
              break;
            case 'r':
              cur.push_back('\r');
              break;
            case 't':
              cur.push_back('\t');
              break;
            case 'b':
              cur.push_back('\b');
              break;
            case 'a':
              cur.push_back('\a');
              break;
            default:
              cur.push_back(e);
              break;
          }
          i += 2;
        } else if (c == '"') {
          // A closing quote must be followed by a space or the end.
          if (i + 1 < n && !is_space(line[i + 1])) return false;
          ++i;
          done = true;
        } else {
          cur.push_back(c);
          ++i;
        }
      } else if (in_sq) {
        if (i == n) return false;
        char c = line[i];
        if (c == '\\' && i + 1 < n && line[i + 1] == '\'') {
          cur.push_back('\'');
          i += 2;
        } else if (c == '\'') {
          if (i + 1 < n && !is_space(line[i + 1])) return false;
          ++i;
          done = true;
        } else {
          cur.push_back(c);
          ++i;
        }
      } else {
        if (i == n) {
          done = true;
          break;
        }
        char c = line[i];
        if (is_space(c)) {
          done = true;
        } else if (c == '"') {
          in_dq = true;
          ++i;
        } else if (c == '\'') {
          in_sq = true;
          ++i;
        } else {
          cur.push_back(c);
          ++i;
        }
      }
    }
    out.push_back(std::move(cur));
  }
}

void request_parser::feed(std::string_view bytes) {
  if (failed_) return;
  if (pos_ != 0) {
    // Drop what earlier commands consumed; the current command's progress is
    // kept relative to pos_, so it survives the move.
    consumed_base_ += pos_;
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

parse_status request_parser::fail(std::string why) {
  failed_ = true;
  error_ = std::move(why);
  buf_.clear();
  buf_.shrink_to_fit();
  spans_.clear();
  pos_ = 0;
  return parse_status::error;
}

parse_status request_parser::parse_inline(std::vector<std::string_view>& argv) {
  const char* base = buf_.data() + pos_;
  std::size_t avail = buf_.size() - pos_;
  const void* nl = std::memchr(base, '\n', avail);
  if (nl == nullptr) {
    if (avail > lim_.max_line) return fail("Protocol error: too big inline request");
    return parse_status::need_more;
  }
  std::size_t len = static_cast<const char*>(nl) - base;
  if (len > lim_.max_line) return fail("Protocol error: too big inline request");
  std::string_view line(base, len);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (!split_inline(line, inline_args_))
    return fail("Protocol error: unbalanced quotes in request");
  if (inline_args_.size() > lim_.max_args) return fail("Protocol error: invalid multibulk length");
  pos_ += len + 1;
  argv.clear();
  for (auto& a : inline_args_) argv.emplace_back(a);
  return parse_status::command;
}

parse_status request_parser::next(std::vector<std::string_view>& argv) {
  if (failed_) return parse_status::error;
  argv.clear();
  if (pos_ == buf_.size()) {
    if (pos_ != 0) {  // everything consumed: reuse the buffer from the start
      consumed_base_ += pos_;
      buf_.clear();
      pos_ = 0;
      // A large command's buffer is not kept for the connection's lifetime
      // (idle clients would hold it, counted in the server's client memory).
      if (buf_.capacity() > (1u << 20)) buf_.shrink_to_fit();
    }
    return parse_status::need_more;
  }
  if (want_args_ < 0 && buf_[pos_] != '*') {
    // An RDMA client that dialed this port (kv serve --port instead of
    // --rdma-listen) sends an MPA request, RFC 5044's key first, and would wait
    // out its handshake timeout for an answer: it gets one now.
    static constexpr std::string_view mpa_request_key = "MPA ID Req Frame";
    if (std::string_view(buf_).substr(pos_).starts_with(mpa_request_key))
      return fail(
          "Protocol error: an RDMA connection request (MPA) on the Redis protocol port; RDMA "
          "clients connect to kv serve's --rdma-listen address");
    return parse_inline(argv);
  }

  const char* base = buf_.data() + pos_;
  const std::size_t avail = buf_.size() - pos_;
  // Reads the line starting at scan_ (without its CRLF) into [b, e); false if
  // the line is incomplete.
  auto line = [&](const char*& b, const char*& e, bool& bad) {
    bad = false;
    const char* p = base + scan_;
    std::size_t left = avail - scan_;
    const void* nl = std::memchr(p, '\n', left < lim_.max_line + 2 ? left : lim_.max_line + 2);
    if (nl == nullptr) {
      if (left > lim_.max_line + 1) bad = true;
      return false;
    }
    e = static_cast<const char*>(nl);
    if (e == p || e[-1] != '\r') {
      bad = true;
      return false;
    }
    b = p;
    --e;
    scan_ = static_cast<std::size_t>(static_cast<const char*>(nl) - base) + 1;
    return true;
  };

  const char* b;
  const char* e;
  bool bad;
  if (want_args_ < 0) {
    if (!line(b, e, bad)) {
      if (bad) return fail("Protocol error: too big mbulk count string");
      return parse_status::need_more;
    }
    std::int64_t n;
    if (!parse_i64(b + 1, e, n) || n > static_cast<std::int64_t>(lim_.max_args))
      return fail("Protocol error: invalid multibulk length");
    if (n <= 0) {  // *0 and *-1 are empty commands, as in Redis
      pos_ += scan_;
      scan_ = 0;
      return parse_status::command;
    }
    want_args_ = n;
    spans_.clear();
    spans_.reserve(static_cast<std::size_t>(n < 1024 ? n : 1024));
  }
  while (static_cast<std::int64_t>(spans_.size()) < want_args_) {
    if (bulk_len_ < 0) {
      if (scan_ >= avail) break;
      if (base[scan_] != '$') {
        char c = base[scan_];
        std::string why = "Protocol error: expected '$', got '";
        why.push_back(c >= 32 && c < 127 ? c : '?');
        why += "'";
        return fail(std::move(why));
      }
      if (!line(b, e, bad)) {
        if (bad) return fail("Protocol error: invalid bulk length");
        break;
      }
      std::int64_t len;
      if (!parse_i64(b + 1, e, len) || len < 0 || static_cast<std::uint64_t>(len) > lim_.max_bulk)
        return fail("Protocol error: invalid bulk length");
      bulk_len_ = len;
    }
    std::size_t need = static_cast<std::size_t>(bulk_len_) + 2;
    // Nothing is reserved for a declared length: memory grows only with bytes
    // that actually arrive (a header alone cannot make the server allocate).
    if (avail - scan_ < need) break;
    if (base[scan_ + need - 2] != '\r' || base[scan_ + need - 1] != '\n')
      return fail("Protocol error: bulk not terminated by CRLF");
    spans_.emplace_back(scan_, static_cast<std::size_t>(bulk_len_));
    scan_ += need;
    bulk_len_ = -1;
  }
  if (static_cast<std::int64_t>(spans_.size()) < want_args_) {
    if (avail > lim_.max_buffered)
      return fail("Protocol error: command too large (query buffer limit)");
    return parse_status::need_more;
  }
  for (auto [off, len] : spans_) argv.emplace_back(base + off, len);
  pos_ += scan_;
  scan_ = 0;
  want_args_ = -1;
  spans_.clear();
  return parse_status::command;
}

// ---- replies ----------------------------------------------------------------

void reply::header(char type, std::int64_t n) {
  char tmp[24];
  auto [p, ec] = std::to_chars(tmp, tmp + sizeof tmp, n);
  out_.push_back(type);
  out_.append(tmp, p);
  out_.append("\r\n", 2);
}

void reply::simple(std::string_view s) {
  out_.push_back('+');
  out_.append(s);
  out_.append("\r\n", 2);
}

void reply::error(std::string_view s) {
  out_.push_back('-');
  for (char c : s) out_.push_back(c == '\r' || c == '\n' ? ' ' : c);
  out_.append("\r\n", 2);
}

void reply::integer(std::int64_t v) {
  header(':', v);
}

void reply::bulk(std::string_view s) {
  header('$', static_cast<std::int64_t>(s.size()));
  out_.append(s);
  out_.append("\r\n", 2);
}

void reply::dbl(std::string_view s) {
  if (resp_ < 3) return bulk(s);
  out_.push_back(',');
  out_.append(s);
  out_.append("\r\n", 2);
}

void reply::null() {
  if (resp_ >= 3)
    out_.append("_\r\n", 3);
  else
    out_.append("$-1\r\n", 5);
}

void reply::null_array() {
  if (resp_ >= 3)
    out_.append("_\r\n", 3);
  else
    out_.append("*-1\r\n", 5);
}

void reply::array(std::size_t n) {
  header('*', static_cast<std::int64_t>(n));
}

void reply::map(std::size_t n) {
  if (resp_ >= 3)
    header('%', static_cast<std::int64_t>(n));
  else
    header('*', static_cast<std::int64_t>(2 * n));
}

void reply::set(std::size_t n) {
  header(resp_ >= 3 ? '~' : '*', static_cast<std::int64_t>(n));
}

void reply::verbatim(std::string_view s) {
  if (resp_ >= 3) {
    header('=', static_cast<std::int64_t>(s.size() + 4));
    out_.append("txt:", 4);
    out_.append(s);
    out_.append("\r\n", 2);
  } else {
    bulk(s);
  }
}

void encode_command(std::string& out, std::span<const std::string_view> argv) {
  reply r(out, 2);
  r.array(argv.size());
  for (auto a : argv) r.bulk(a);
}

}  // namespace conveyor::kv
