// The append-only file (aof.hpp).
#include "aof.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "resp.hpp"
#include "store.hpp"

namespace conveyor::kv {

bool parse_fsync_policy(std::string_view s, fsync_policy& out) {
  if (s == "always")
    out = fsync_policy::always;
  else if (s == "everysec")
    out = fsync_policy::everysec;
  else if (s == "no")
    out = fsync_policy::no;
  else
    return false;
  return true;
}

std::string_view to_string(fsync_policy p) noexcept {
  switch (p) {
    case fsync_policy::always:
      return "always";
    case fsync_policy::everysec:
      return "everysec";
    case fsync_policy::no:
      return "no";
  }
  return "?";
}

std::unique_ptr<aof> aof::open(const aof_options& opts, std::string& why) {
  std::unique_ptr<aof> a(new aof(opts));
  a->fd_ = ::open(opts.path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (a->fd_ < 0) {
    why = "cannot open " + opts.path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (::fstat(a->fd_, &st) != 0) {
    why = "cannot stat " + opts.path + ": " + std::strerror(errno);
    return nullptr;
  }
  a->size_ = a->base_size_ = static_cast<std::uint64_t>(st.st_size);
  return a;
}

aof::~aof() {
  if (fd_ >= 0) {
    flush();
    if (dirty_ && opts_.fsync != fsync_policy::no) ::fdatasync(fd_);
    ::close(fd_);
  }
}

namespace {

// Reads "<c><decimal>\r\n" at pos (a header line is short: 20 digits at most).
bool header_line(std::string_view s, std::size_t& pos, char c, std::int64_t& v) {
  if (pos >= s.size() || s[pos] != c) return false;
  std::size_t i = pos + 1, end = std::min(s.size(), pos + 24);
  std::size_t digits = i;
  if (i < end && s[i] == '-') ++i;
  while (i < end && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == digits || i + 1 >= s.size() || s[i] != '\r' || s[i + 1] != '\n') return false;
  auto [q, ec] = std::from_chars(s.data() + digits, s.data() + i, v);
  if (ec != std::errc{} || q != s.data() + i) return false;
  pos = i + 2;
  return true;
}

// A whole multibulk record whose first argument is a command name, at s[0].
bool complete_record(std::string_view s, std::size_t max_bulk) {
  std::size_t pos = 0;
  std::int64_t n;
  if (!header_line(s, pos, '*', n) || n < 1 || n > 64) return false;
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t len;
    if (!header_line(s, pos, '$', len) || len < 0 || static_cast<std::uint64_t>(len) > max_bulk)
      return false;
    const auto l = static_cast<std::size_t>(len);
    if (s.size() - pos < l + 2 || s[pos + l] != '\r' || s[pos + l + 1] != '\n') return false;
    if (k == 0) {
      if (l == 0 || l > 32) return false;
      for (std::size_t i = 0; i < l; ++i) {
        char ch = s[pos + i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))) return false;
      }
    }
    pos += l + 2;
  }
  return true;
}

}  // namespace

std::size_t find_complete_record(std::string_view tail, std::size_t max_bulk) {
  for (std::size_t i = 1; i < tail.size(); ++i) {
    const void* star = std::memchr(tail.data() + i, '*', tail.size() - i);
    if (star == nullptr) break;
    i = static_cast<std::size_t>(static_cast<const char*>(star) - tail.data());
    if (tail[i - 1] == '\n' && complete_record(tail.substr(i), max_bulk)) return i;
  }
  return std::string_view::npos;
}

namespace {

bool is_word(std::span<const std::string_view> argv, std::string_view w) {
  if (argv.size() != 1 || argv[0].size() != w.size()) return false;
  for (std::size_t i = 0; i < w.size(); ++i)
    if ((argv[0][i] & ~0x20) != w[i]) return false;
  return true;
}

// Whether the transaction whose records start at `from` ends (an EXEC record)
// inside the file's `size` bytes. Reads ahead with a parser of its own (one
// record and one chunk held); bytes that do not parse count as an end: the
// main pass reaches them and reports the damage.
bool transaction_ends(std::uint64_t from, std::uint64_t size, const aof_read_fn& read,
                      const parser_limits& lim, std::size_t chunk) {
  request_parser p(lim);
  std::vector<std::string_view> argv;
  std::vector<char> buf(chunk == 0 ? 1 : chunk);
  std::uint64_t off = from;
  while (true) {
    while (true) {
      const auto st = p.next(argv);
      if (st == parse_status::need_more) break;
      if (st == parse_status::error) return true;
      if (is_word(argv, "EXEC")) return true;
    }
    if (off >= size) return false;
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - off));
    const std::int64_t n = read(off, buf.data(), want);
    if (n <= 0) return n < 0;  // a read error: the main pass reports it
    off += static_cast<std::uint64_t>(n);
    p.feed(std::string_view(buf.data(), static_cast<std::size_t>(n)));
  }
}

}  // namespace

aof_load_result load_aof(std::uint64_t size, const aof_read_fn& read, const aof_apply_fn& apply,
                         const aof_options& opts,
                         const std::function<void(std::uint64_t, std::string_view)>& on_skip,
                         std::size_t chunk) {
  aof_load_result res;
  // Limits of one record, not of the file: a length grown by damage cannot
  // make the loader wait for (and hold) the rest of the file.
  parser_limits lim;
  lim.max_bulk = opts.max_bulk;
  lim.max_buffered = opts.max_record;
  request_parser p(lim);
  std::vector<std::string_view> argv;
  std::vector<char> buf(chunk == 0 ? 1 : chunk);
  std::uint64_t off = 0;
  bool in_tx = false;
  while (true) {
    while (true) {
      const std::uint64_t start = p.consumed();
      const auto st = p.next(argv);
      if (st == parse_status::need_more) break;
      if (st == parse_status::error) {
        res.verdict = aof_verdict::damaged;
        res.good_bytes = res.damage_at = start;
        res.why = p.error();
        return res;
      }
      if (argv.empty()) continue;
      // A transaction (EXEC's records between MULTI and EXEC) is applied only
      // if its EXEC is in the file: one cut inside it is a torn tail from its
      // MULTI on, and none of it is applied (Redis's loader does the same).
      if (is_word(argv, "MULTI") || is_word(argv, "EXEC")) {
        const bool multi = argv[0].size() == 5;
        if (multi == in_tx) {
          res.verdict = aof_verdict::bad_record;
          res.good_bytes = res.damage_at = start;
          res.command = multi ? "MULTI" : "EXEC";
          res.why = multi ? "MULTI inside a transaction" : "EXEC without MULTI";
          return res;
        }
        in_tx = multi;
        if (multi && !transaction_ends(p.consumed(), size, read, lim, chunk)) {
          res.verdict = aof_verdict::torn_tail;
          res.open_transaction = true;
          res.good_bytes = start;
          return res;
        }
        continue;
      }
      std::string reason;
      if (!apply(argv, reason)) {
        if (opts.skip_bad_records) {
          ++res.skipped;
          if (on_skip) on_skip(start, reason);
          continue;
        }
        res.verdict = aof_verdict::bad_record;
        res.good_bytes = res.damage_at = start;
        for (char ch : argv[0].substr(0, 64)) res.command.push_back(ch > 32 && ch < 127 ? ch : '?');
        res.why = std::move(reason);
        return res;
      }
      ++res.commands;
    }
    res.peak_buffered = std::max<std::uint64_t>(res.peak_buffered, p.buffered());
    if (off >= size) break;
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - off));
    const std::int64_t n = read(off, buf.data(), want);
    if (n < 0) {
      res.verdict = aof_verdict::read_error;
      res.good_bytes = p.consumed();
      res.why = "read error at offset " + std::to_string(off);
      return res;
    }
    if (n == 0) {
      size = off;  // the file ended early
      break;
    }
    off += static_cast<std::uint64_t>(n);
    p.feed(std::string_view(buf.data(), static_cast<std::size_t>(n)));
    res.peak_buffered = std::max<std::uint64_t>(res.peak_buffered, p.buffered());
  }
  res.good_bytes = p.consumed();
  if (res.good_bytes >= size) return res;
  // An incomplete last record: at most max_record bytes (the parser refused
  // more). One interrupted write leaves a prefix of one record; a complete
  // record inside those bytes means a damaged length instead.
  std::string tail(static_cast<std::size_t>(size - res.good_bytes), '\0');
  for (std::size_t got = 0; got < tail.size();) {
    const std::int64_t n = read(res.good_bytes + got, tail.data() + got, tail.size() - got);
    if (n <= 0) {
      res.verdict = aof_verdict::read_error;
      res.why = "read error at offset " + std::to_string(res.good_bytes + got);
      return res;
    }
    got += static_cast<std::size_t>(n);
  }
  res.peak_buffered = std::max<std::uint64_t>(res.peak_buffered, tail.size());
  if (auto k = find_complete_record(tail, opts.max_bulk); k != std::string_view::npos) {
    res.verdict = aof_verdict::damaged;
    res.damage_at = res.good_bytes;
    res.next_record = res.good_bytes + k;
    res.why =
        "the record declares more bytes than the file holds, yet a complete record "
        "follows at offset " +
        std::to_string(res.next_record);
    return res;
  }
  res.verdict = aof_verdict::torn_tail;
  return res;
}

namespace {

// Copies [from, from + len) of fd to a new file next to `path` and syncs it and
// its directory; returns the new file's name, or empty with `why`.
std::string save_tail(int fd, const std::string& path, std::uint64_t from, std::uint64_t len,
                      std::string& why) {
  std::string name;
  int out = -1;
  for (int i = 0; i < 100 && out < 0; ++i) {
    name = path + ".torn-" + std::to_string(from) + (i ? "." + std::to_string(i) : "");
    out = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0 && errno != EEXIST) break;
  }
  if (out < 0) {
    why = "cannot create " + name + ": " + std::strerror(errno);
    return {};
  }
  std::vector<char> buf(1u << 20);
  bool ok = true;
  for (std::uint64_t done = 0; ok && done < len;) {
    auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), len - done));
    ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(from + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    for (ssize_t w = 0; ok && w < n;) {
      ssize_t m = ::write(out, buf.data() + w, static_cast<std::size_t>(n - w));
      if (m < 0 && errno == EINTR) continue;
      if (m <= 0) ok = false;
      w += m > 0 ? m : 0;
    }
    done += static_cast<std::uint64_t>(n);
  }
  if (ok && ::fsync(out) != 0) ok = false;
  int e = errno;
  ::close(out);
  if (!ok) {
    why = "saving the torn tail to " + name + ": " + std::strerror(e);
    ::unlink(name.c_str());
    return {};
  }
  std::string dir = path;
  auto slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return name;
}

}  // namespace

bool aof::replay(const std::function<bool(std::span<const std::string_view>, std::string&)>& apply,
                 replay_result& res, std::string& why) {
  res = {};
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    why = "cannot stat " + opts_.path + ": " + std::strerror(errno);
    return false;
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  auto read = [this](std::uint64_t off, char* buf, std::size_t len) -> std::int64_t {
    while (true) {
      ssize_t n = ::pread(fd_, buf, len, static_cast<off_t>(off));
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  };
  auto on_skip = [this](std::uint64_t off, std::string_view reason) {
    std::fprintf(stderr,
                 "conveyor kv: warning: %s: skipping the record at offset %llu (%.*s) "
                 "(--aof-skip-bad-records)\n",
                 opts_.path.c_str(), static_cast<unsigned long long>(off),
                 static_cast<int>(reason.size()), reason.data());
  };
  auto r = load_aof(size, read, apply, opts_, on_skip);
  res.commands = r.commands;
  res.skipped = r.skipped;
  const std::string at = std::to_string(r.damage_at);
  switch (r.verdict) {
    case aof_verdict::clean:
      break;
    case aof_verdict::read_error:
      why = "reading " + opts_.path + ": " + r.why + ": " + std::strerror(errno);
      return false;
    case aof_verdict::bad_record:
      why = opts_.path + " at offset " + at + ": the record " + r.command + " is refused (" +
            r.why + "); the file is left as it is. " +
            "Start with --aof-skip-bad-records to skip each such record (each is named), " +
            "or repair the file";
      return false;
    case aof_verdict::damaged:
      why = opts_.path + " is not a valid append-only file at offset " + at + " (" + r.why +
            "): damage, not a torn last record, so nothing was cut and the file is left as "
            "it is. The " +
            std::to_string(r.commands) + " records before offset " + at +
            " are intact: to start with them alone, keep a copy and cut the file there (cp " +
            opts_.path + " " + opts_.path + ".damaged && truncate -s " + at + " " + opts_.path +
            "), or repair the record. (A record above this server's bounds, " +
            std::to_string(opts_.max_bulk) +
            " bytes per argument, reads as damage too: if --data-bytes was lowered since the "
            "file was written, start with the earlier size.)";
      return false;
    case aof_verdict::torn_tail: {
      // A record cut short: the crash came mid-write. Its command was never
      // acknowledged (acknowledgement follows the write), so it is dropped;
      // its bytes are kept aside first.
      res.truncated_bytes = size - r.good_bytes;
      res.side_file = save_tail(fd_, opts_.path, r.good_bytes, res.truncated_bytes, why);
      if (res.side_file.empty()) return false;
      std::fprintf(
          stderr,
          "conveyor kv: warning: %s ends with an incomplete %s (%llu bytes at "
          "offset %llu, a write cut short by a crash); saved to %s and cut off\n",
          opts_.path.c_str(),
          r.open_transaction ? "transaction (MULTI without EXEC: none of it applied)" : "command",
          static_cast<unsigned long long>(res.truncated_bytes),
          static_cast<unsigned long long>(r.good_bytes), res.side_file.c_str());
      if (::ftruncate(fd_, static_cast<off_t>(r.good_bytes)) != 0 || ::fdatasync(fd_) != 0) {
        why = "truncating " + opts_.path + ": " + std::strerror(errno);
        return false;
      }
      break;
    }
  }
  res.bytes = r.good_bytes;
  size_ = base_size_ = res.bytes;
  return true;
}

void aof::append(std::span<const std::string_view> argv) {
  encode_command(buf_, argv);
}

bool aof::write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void aof::set_error(std::string why) {
  healthy_ = false;
  last_error_ = std::move(why);
  std::fprintf(stderr, "conveyor kv: append-only file error: %s\n", last_error_.c_str());
  if (opts_.fsync == fsync_policy::always) {
    // The replies about to go out would promise durability that is not there.
    std::fprintf(
        stderr, "conveyor kv: cannot recover from an AOF error with appendfsync always; exiting\n");
    std::_Exit(1);
  }
}

bool aof::flush() {
  if (buf_.empty()) return healthy_;
  if (!write_all(fd_, buf_)) {
    // A partial write leaves a truncated record; cut it so later records stay
    // parseable (replay would otherwise stop there).
    int e = errno;
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
    }
    set_error(std::string("write: ") + std::strerror(e));
    return false;
  }
  size_ += buf_.size();
  buf_.clear();
  dirty_ = true;
  if (opts_.fsync == fsync_policy::always) {
    if (::fdatasync(fd_) != 0) {
      set_error(std::string("fdatasync: ") + std::strerror(errno));
      return false;
    }
    dirty_ = false;
  }
  healthy_ = true;
  return true;
}

void aof::tick() {
  flush();
  if (opts_.fsync == fsync_policy::everysec && dirty_) {
    if (::fdatasync(fd_) != 0) {
      set_error(std::string("fdatasync: ") + std::strerror(errno));
      return;
    }
    dirty_ = false;
  }
}

bool aof::sync() {
  if (!flush()) return false;
  if (dirty_) {
    if (::fdatasync(fd_) != 0) {
      set_error(std::string("fdatasync: ") + std::strerror(errno));
      return false;
    }
    dirty_ = false;
  }
  return true;
}

bool snapshot_records(store& data, const std::function<bool(std::string&)>& sink) {
  auto now = now_ms();
  std::string out;
  std::vector<std::string> keys;
  std::uint64_t cursor = 0;
  // The whole data set, key by key: SET k v [PXAT t], and a collection as
  // the commands that build it, then PEXPIREAT k t (object_aof.cpp). Keys are collected per
  // scan step and their values read after (get may not run inside scan's callback).
  do {
    keys.clear();
    cursor = data.scan(cursor, 256, [&](std::string_view k) { keys.emplace_back(k); });
    for (auto& k : keys) {
      auto exp = data.expiry(k, now);
      if (!exp) continue;  // expired meanwhile
      auto type = data.type_of(k, now);
      if (type && *type != value_type::string) {
        bool wrong = false;
        if (auto* obj = data.find_collection(k, *type, now, &wrong)) {
          encode_collection(out, k, *obj);
          if (*exp >= 0) {
            std::string t = std::to_string(*exp);
            std::string_view a[] = {"PEXPIREAT", k, t};
            encode_command(out, a);
          }
        }
        continue;
      }
      auto v = data.get(k, now);
      if (!v) continue;
      if (*exp >= 0) {
        std::string t = std::to_string(*exp);
        std::string_view a[] = {"SET", k, *v, "PXAT", t};
        encode_command(out, a);
      } else {
        std::string_view a[] = {"SET", k, *v};
        encode_command(out, a);
      }
    }
    if (out.size() >= (1u << 20) || (cursor == 0 && !out.empty())) {
      if (!sink(out)) return false;
      out.clear();
    }
  } while (cursor != 0);
  return true;
}

bool aof::rewrite_due() const noexcept {
  if (opts_.rewrite_percentage == 0 || size_ < opts_.rewrite_min_size) return false;
  std::uint64_t base = base_size_ != 0 ? base_size_ : 1;
  return (size_ - base_size_) * 100 / base >= opts_.rewrite_percentage || base_size_ == 0;
}

bool aof::rewrite(store& data, std::string& why) {
  if (!flush()) {
    why = last_error_;
    return false;
  }
  std::string tmp = opts_.path + ".rewrite.tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  std::uint64_t written = 0;
  bool ok = snapshot_records(data, [&](std::string& chunk) {
    if (!write_all(fd, chunk)) return false;
    written += chunk.size();
    return true;
  });
  if (ok && ::fsync(fd) != 0) ok = false;
  if (!ok) {
    why = "writing " + tmp + ": " + std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    return false;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), opts_.path.c_str()) != 0) {
    why = "renaming " + tmp + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  // The rename is durable once the directory is synced.
  std::string dir = opts_.path;
  auto slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  int nfd = ::open(opts_.path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (nfd < 0) {
    set_error("reopening " + opts_.path + " after rewrite: " + std::strerror(errno));
    why = last_error_;
    return false;
  }
  ::close(fd_);
  fd_ = nfd;
  size_ = base_size_ = written;
  dirty_ = false;
  ++rewrites_;
  return true;
}

}  // namespace conveyor::kv
