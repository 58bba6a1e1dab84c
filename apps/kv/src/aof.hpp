// conveyor::kv::aof — the append-only file: every change to the data, logged as
// the RESP command that redoes it (SET k v PXAT t, DEL k, PEXPIREAT k t,
// PERSIST k, FLUSHALL), replayed at start.
//
// Expiry is logged as an absolute time (PXAT/PEXPIREAT), so a replay long after
// the write expires exactly what would have expired. fsync policies have Redis's
// meanings:
//   always   — flush() writes and fdatasyncs before any reply of the commands
//              it covers goes out: no acknowledged write is lost on a crash.
//   everysec — flush() writes (so a killed process loses nothing the kernel
//              has); tick() fdatasyncs once a second: a machine crash loses
//              about the last second.
//   no       — flush() writes, the kernel decides when to sync.
// A write or fsync error with `always` ends the process (a reply would claim
// durability that is not there); with the others the error is reported, and
// writes are refused (-MISCONF) until a write succeeds again.
//
// Rewrite: when the file has grown past rewrite_min_size and by
// rewrite_percentage since the last rewrite, rewrite() writes the data's current
// state to a temporary file, fsyncs it and renames it over the log. It runs on
// the loop thread and blocks it for the time it takes to write the whole data
// set (docs/KV.md) — bounded by the data size, not by history.
//
// Thread safety: loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace conveyor::kv {

class store;

enum class fsync_policy { always, everysec, no };
bool parse_fsync_policy(std::string_view s, fsync_policy& out);
std::string_view to_string(fsync_policy p) noexcept;

struct aof_options {
  std::string path;
  fsync_policy fsync = fsync_policy::everysec;
  std::uint64_t rewrite_min_size = 64u << 20;  // auto-aof-rewrite-min-size
  unsigned rewrite_percentage = 100;           // auto-aof-rewrite-percentage (0: never)
};

struct replay_result {
  std::uint64_t commands = 0;
  std::uint64_t bytes = 0;            // valid bytes kept
  std::uint64_t truncated_bytes = 0;  // incomplete tail cut off (0: none)
};

class aof {
 public:
  // Opens (creating if needed) the file. On error returns null and sets `why`.
  static std::unique_ptr<aof> open(const aof_options& opts, std::string& why);
  ~aof();
  aof(const aof&) = delete;
  aof& operator=(const aof&) = delete;

  // Reads the whole file, calling `apply` for each command; an incomplete last
  // command (a crash mid-write) is cut off the file with a warning on stderr.
  // Returns false with `why` on a malformed file or when `apply` refuses a
  // command (then the file is left as it is and the server must not start).
  bool replay(const std::function<bool(std::span<const std::string_view>, std::string& why)>& apply,
              replay_result& res, std::string& why);

  // Buffers one command.
  void append(std::span<const std::string_view> argv);
  // Writes the buffer (and fdatasyncs with `always`). Called before the replies
  // of the buffered commands are sent. False after an error (see above).
  bool flush();
  // Once a second from the loop: the everysec fdatasync, and the rewrite check.
  void tick();
  bool rewrite_due() const noexcept;
  // Rewrites the file from the store's current contents (see above).
  bool rewrite(store& data, std::string& why);

  bool healthy() const noexcept { return healthy_; }
  const std::string& last_error() const noexcept { return last_error_; }
  std::uint64_t size() const noexcept { return size_; }
  std::uint64_t rewrites() const noexcept { return rewrites_; }
  const aof_options& options() const noexcept { return opts_; }
  bool pending() const noexcept { return !buf_.empty(); }

 private:
  explicit aof(const aof_options& opts) : opts_(opts) {}
  bool write_all(int fd, std::string_view bytes);
  void set_error(std::string why);

  aof_options opts_;
  int fd_ = -1;
  std::string buf_;
  std::uint64_t size_ = 0, base_size_ = 0, rewrites_ = 0;
  bool dirty_ = false;  // written since the last fdatasync
  bool healthy_ = true;
  std::string last_error_;
};

}  // namespace conveyor::kv
