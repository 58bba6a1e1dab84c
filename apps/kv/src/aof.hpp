// conveyor::kv::aof — the append-only file: every change to the data, logged as
// the RESP command that redoes it (SET k v PXAT t, DEL k, PEXPIREAT k t,
// PERSIST k, FLUSHALL), replayed at start.
//
// Expiry is logged as an absolute time (PXAT/PEXPIREAT), so a replay long after
// the write expires exactly what would have expired.
//
// Replay and damage (load_aof, the pure part, and aof::replay):
//   - a torn last record (its declared length runs past the end of the file,
//     and no complete record follows inside those bytes: what one interrupted
//     write leaves) is copied to a side file, `<path>.torn-<offset>`, synced,
//     and only then cut off the log, with a warning naming both;
//   - anything else that does not parse (damage in the middle: a bad length, a
//     missing CRLF, a length past the file's end with complete records after
//     it, a record above the store's bounds) refuses the start, names the
//     offset and leaves the file untouched;
//   - a transaction (MULTI, its records, EXEC: what EXEC logs) whose EXEC is
//     not in the file is a torn tail from its MULTI on: none of it is
//     applied, and it is saved aside and cut off like a torn record;
//   - a well-formed record the store refuses refuses the start, naming its
//     offset and command, unless skip_bad_records (--aof-skip-bad-records),
//     which skips it with a warning.
// Memory at start is bounded by one record (max_record) plus a 1 MiB read
// chunk, whatever the file's size.
//
// fsync policies have Redis's meanings:
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
  // Bounds of one record at replay (the server derives them from the store's
  // max_key and max_value): a declared length above max_bulk, or a record
  // above max_record bytes, is damage, found without reading further.
  std::size_t max_bulk = 64u << 20;
  std::size_t max_record = (64u << 20) + (512u << 10) + (1u << 20);
  // Skip the records the store refuses (with a warning naming each) instead of
  // refusing to start.
  bool skip_bad_records = false;
};

struct replay_result {
  std::uint64_t commands = 0;
  std::uint64_t bytes = 0;            // valid bytes kept
  std::uint64_t truncated_bytes = 0;  // incomplete tail cut off (0: none)
  std::uint64_t skipped = 0;          // records refused and skipped (skip_bad_records)
  std::string side_file;              // where the cut tail's bytes were saved
};

// The loader over a log's bytes, without a file or a store (the fuzz target
// drives it from memory): `read` returns the bytes at an offset (0: end, -1:
// error), `apply` runs one record.
enum class aof_verdict {
  clean,       // every byte is a complete record
  torn_tail,   // the bytes from good_bytes on are one record cut short
  damaged,     // bytes at damage_at do not parse: the file is not a log as written
  bad_record,  // the record at damage_at was refused by apply
  read_error
};
struct aof_load_result {
  aof_verdict verdict = aof_verdict::clean;
  std::uint64_t commands = 0, skipped = 0;
  std::uint64_t good_bytes = 0;     // just past the last complete record
  std::uint64_t damage_at = 0;      // damaged, bad_record: where that record starts
  std::uint64_t next_record = 0;    // damaged by an overlong length: a complete record after it
  std::uint64_t peak_buffered = 0;  // most bytes held at once (<= max_record + chunk)
  std::string command;              // bad_record: its command name (64 bytes at most)
  bool open_transaction = false;    // torn_tail: a MULTI whose EXEC is not in the file
  std::string why;                  // what is wrong
};
using aof_read_fn = std::function<std::int64_t(std::uint64_t off, char* buf, std::size_t len)>;
using aof_apply_fn = std::function<bool(std::span<const std::string_view>, std::string& why)>;
// on_skip (may be empty) hears of each record skipped under skip_bad_records.
aof_load_result load_aof(
    std::uint64_t size, const aof_read_fn& read, const aof_apply_fn& apply, const aof_options& opts,
    const std::function<void(std::uint64_t off, std::string_view why)>& on_skip = {},
    std::size_t chunk = 1u << 20);
// Where, in the bytes of an incomplete last record, a complete record begins at
// a line start (past the first byte); npos if none. Such a record means the
// overlong length is damage, not a torn write.
std::size_t find_complete_record(std::string_view tail, std::size_t max_bulk);

// The data set's current state as the records that rebuild it (the rewrite
// form: SET k v [PXAT t], a collection's commands, PEXPIREAT k t), handed to
// `sink` in chunks of about 1 MiB (a large collection's chunk holds it
// whole); false as soon as sink returns false. Loop thread (reads the store).
bool snapshot_records(store& data, const std::function<bool(std::string&)>& sink);

class aof {
 public:
  // Opens (creating if needed) the file. On error returns null and sets `why`.
  static std::unique_ptr<aof> open(const aof_options& opts, std::string& why);
  ~aof();
  aof(const aof&) = delete;
  aof& operator=(const aof&) = delete;

  // Reads the whole file, calling `apply` for each command; a torn last record
  // (a crash mid-write) is saved to a side file and cut off the log, with a
  // warning on stderr. Returns false with `why` (naming the offset, and the
  // command for a refused record, and what the operator can do) on damage or
  // when `apply` refuses a command: then the file is left as it is and the
  // server must not start.
  bool replay(const std::function<bool(std::span<const std::string_view>, std::string& why)>& apply,
              replay_result& res, std::string& why);

  // Buffers one command.
  void append(std::span<const std::string_view> argv);
  // Writes the buffer (and fdatasyncs with `always`). Called before the replies
  // of the buffered commands are sent. False after an error (see above).
  bool flush();
  // Once a second from the loop: the everysec fdatasync, and the rewrite check.
  void tick();
  // Writes and fdatasyncs now, whatever the policy (SHUTDOWN, the end of serve).
  bool sync();
  // CONFIG SET appendfsync.
  void set_fsync(fsync_policy p) noexcept { opts_.fsync = p; }
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
