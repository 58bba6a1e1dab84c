// The append-only file (aof.hpp).
#include "aof.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

bool aof::replay(const std::function<bool(std::span<const std::string_view>, std::string&)>& apply,
                 replay_result& res, std::string& why) {
  res = {};
  // The log was written by this server, so its records are within the parser's
  // bounds only if the limits allow any value the store accepts.
  parser_limits lim;
  lim.max_bulk = std::size_t{1} << 40;
  lim.max_buffered = std::size_t{1} << 40;
  lim.max_args = std::size_t{1} << 30;
  request_parser p(lim);
  std::vector<std::string_view> argv;
  std::vector<char> chunk(1u << 20);
  off_t off = 0;
  while (true) {
    ssize_t n = ::pread(fd_, chunk.data(), chunk.size(), off);
    if (n < 0) {
      if (errno == EINTR) continue;
      why = "reading " + opts_.path + ": " + std::strerror(errno);
      return false;
    }
    if (n == 0) break;
    off += n;
    p.feed(std::string_view(chunk.data(), static_cast<std::size_t>(n)));
    while (true) {
      auto st = p.next(argv);
      if (st == parse_status::need_more) break;
      if (st == parse_status::error) {
        why = opts_.path + " is not a valid append-only file at offset " +
              std::to_string(p.consumed()) + " (" + p.error() + "); fix or remove it";
        return false;
      }
      if (argv.empty()) continue;
      std::string reason;
      if (!apply(argv, reason)) {
        why = opts_.path + " at offset " + std::to_string(p.consumed()) + ": " + reason;
        return false;
      }
      ++res.commands;
    }
  }
  res.bytes = p.consumed();
  auto total = static_cast<std::uint64_t>(off);
  if (res.bytes < total) {
    // A record cut short: the crash came mid-write. Its command was never
    // acknowledged (acknowledgement follows the write), so it is dropped.
    res.truncated_bytes = total - res.bytes;
    std::fprintf(stderr,
                 "conveyor kv: warning: %s ends with an incomplete command (%llu bytes at offset "
                 "%llu, a write "
                 "cut short by a crash); truncating it there\n",
                 opts_.path.c_str(), static_cast<unsigned long long>(res.truncated_bytes),
                 static_cast<unsigned long long>(res.bytes));
    if (::ftruncate(fd_, static_cast<off_t>(res.bytes)) != 0 || ::fdatasync(fd_) != 0) {
      why = "truncating " + opts_.path + ": " + std::strerror(errno);
      return false;
    }
  }
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
  auto now = now_ms();
  std::string out;
  std::uint64_t written = 0;
  bool ok = true;
  std::vector<std::string> keys;
  std::uint64_t cursor = 0;
  // The whole data set, key by key: SET k v [PXAT t]. Keys are collected per
  // scan step and their values read after (get may not run inside scan's callback).
  do {
    keys.clear();
    cursor = data.scan(cursor, 256, [&](std::string_view k) { keys.emplace_back(k); });
    for (auto& k : keys) {
      auto exp = data.expiry(k, now);
      if (!exp) continue;  // expired meanwhile
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
    if (out.size() >= (1u << 20) || cursor == 0) {
      if (!write_all(fd, out)) {
        ok = false;
        break;
      }
      written += out.size();
      out.clear();
    }
  } while (cursor != 0);
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
