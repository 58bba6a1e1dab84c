// conveyor::kv RESP: the Redis protocol's request parser and reply writer.
//
// request_parser takes bytes as they arrive (feed) and yields complete commands
// (next) as argument views into its own buffer. It accepts RESP2 multibulk
// requests (*N\r\n$L\r\n...\r\n) and inline commands (a text line, as redis-cli
// and telnet users send), and it is bounded: a bulk longer than max_bulk, more
// than max_args arguments, a header or inline line longer than max_line, or more
// than max_buffered bytes held for one incomplete command is a protocol error,
// after which the parser yields nothing more (the server replies with the error
// and closes the connection). So is an RDMA connection request (an MPA request
// frame): the RDMA client that sent it fails at once instead of waiting out its
// handshake.
//
//   request_parser p;
//   p.feed(bytes);
//   std::vector<std::string_view> argv;
//   while (p.next(argv) == parse_status::command) run(argv);
//
// The views stay valid until the next feed() or next() call.
// Thread safety: none (one parser per connection).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::kv {

struct parser_limits {
  std::size_t max_bulk = 512u << 20;       // Redis's proto-max-bulk-len
  std::size_t max_args = 1024 * 1024;      // Redis's multibulk limit
  std::size_t max_line = 64u << 10;        // inline command or header line
  std::size_t max_buffered = 1024u << 20;  // one incomplete command (client-query-buffer-limit)
};

enum class parse_status { need_more, command, error };

class request_parser {
 public:
  explicit request_parser(const parser_limits& limits = {}) : lim_(limits) {}

  void feed(std::string_view bytes);
  // command: argv holds the next command (possibly empty for a blank inline
  // line, which callers skip); need_more: feed more bytes; error: protocol
  // error, error() says what (Redis's wording), and every later call says error.
  parse_status next(std::vector<std::string_view>& argv);

  const std::string& error() const noexcept { return error_; }
  // Bytes fed and not yet consumed by a complete command.
  std::size_t buffered() const noexcept { return buf_.size() - pos_; }
  // Offset, in all the bytes ever fed, just past the last complete command
  // (the AOF replay cuts a truncated tail here).
  std::uint64_t consumed() const noexcept { return consumed_base_ + pos_; }
  // Bytes of memory the parser holds for the connection (its buffer's capacity).
  std::size_t memory() const noexcept { return buf_.capacity(); }
  // True while part of a command has arrived but not all of it.
  bool partial() const noexcept { return buffered() != 0; }

 private:
  parse_status fail(std::string why);
  parse_status parse_inline(std::vector<std::string_view>& argv);

  parser_limits lim_;
  std::string buf_;
  std::size_t pos_ = 0;  // start of the unconsumed bytes (the current command)
  // Progress through the current multibulk command, relative to pos_, so that a
  // large bulk arriving in pieces is not parsed again with every piece.
  std::int64_t want_args_ = -1;  // -1: header not yet parsed
  std::size_t scan_ = 0;         // where parsing resumes
  std::int64_t bulk_len_ = -1;   // -1: next is a $ line; else the pending bulk's length
  std::vector<std::pair<std::size_t, std::size_t>> spans_;  // offset, length of each argument
  std::uint64_t consumed_base_ = 0;
  bool failed_ = false;
  std::string error_;
  std::vector<std::string> inline_args_;  // inline commands are unquoted into here
};

// Splits an inline command line as Redis does (sdssplitargs: spaces separate,
// "double" quotes with \n \r \t \b \a \\ \" \xHH escapes, 'single' quotes with \'
// only). False on unbalanced quotes or on raw control bytes (below 0x20 other
// than whitespace, and 0x7f): binary garbage is refused, not run.
bool split_inline(std::string_view line, std::vector<std::string>& out);

// Reply writer: appends one RESP value to `out`. resp is 2 or 3 (HELLO 3); where
// RESP3 has its own type (null, map, double, set), RESP2 gets Redis's fallback.
class reply {
 public:
  reply(std::string& out, int resp) : out_(out), resp_(resp) {}
  void simple(std::string_view s);  // +s (s must have no CR/LF)
  void error(std::string_view s);   // -s (CR/LF replaced by spaces)
  void integer(std::int64_t v);
  void bulk(std::string_view s);
  void null();        // $-1 / _
  void null_array();  // *-1 / _
  void array(std::size_t n);
  void map(std::size_t n);            // n key/value pairs (*2n in RESP2)
  void set(std::size_t n);            // ~n in RESP3, *n in RESP2
  void verbatim(std::string_view s);  // =txt: in RESP3, a bulk in RESP2
  // A double already in Redis's form (score_str): ,s in RESP3, a bulk in RESP2.
  void dbl(std::string_view s);
  int resp() const noexcept { return resp_; }
  std::string& out() noexcept { return out_; }

 private:
  void header(char type, std::int64_t n);
  std::string& out_;
  int resp_;
};

// Encodes argv as a RESP2 multibulk request (the AOF's record format).
void encode_command(std::string& out, std::span<const std::string_view> argv);

}  // namespace conveyor::kv
