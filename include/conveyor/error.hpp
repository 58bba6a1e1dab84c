// conveyor/error.hpp — error codes, the control-path result<T>, completion statuses.
//
// Control-path calls (open, register, create, connect) return result<T>, a
// std::expected carrying an `error` with a canonical code, the errno underneath
// and a context string naming the device, QP and peer:
//
//   auto dev = conveyor::device::open("soft");
//   if (!dev) std::cerr << dev.error().to_string() << '\n';
//
// Data-path calls (post, poll) return `status` values instead: they never
// allocate and never throw. Work completions carry a `wc_status` (the verbs
// statuses). Everything here is a value type and thread-compatible.
#pragma once

#include <cstdint>
#include <exception>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

#include "conveyor/export.hpp"

namespace conveyor {

// Canonical error codes shared by every provider.
enum class errc : std::uint8_t {
  ok = 0,
  invalid_argument,    // a parameter is out of range or malformed
  not_found,           // no such device / key / object
  unsupported,         // the provider or this connection cannot do it
  again,               // a queue is full: retry after completions are reaped
  timed_out,           // a bounded wait expired
  connection_refused,  // nothing listens at the address
  connection_reset,    // the peer or the network dropped the connection
  rejected,            // the peer rejected the connection (reason in context)
  protocol_error,      // the peer violated the wire protocol
  address_error,       // the address could not be parsed or bound
  resource_exhausted,  // out of memory, keys, descriptors or locked memory
  invalid_state,       // the object is in the wrong state (e.g. QP not RTS)
  qp_in_error,         // the QP is in ERROR: posts are refused
  cq_overflow,         // the CQ overflowed; completions were lost
  io_error,            // a system call failed (errno in error::sys_errno)
};

CONVEYOR_API std::string_view to_string(errc e) noexcept;

// A control-path error: what, the errno underneath (0 if none), and where.
struct CONVEYOR_API error {
  errc code = errc::ok;
  int sys_errno = 0;
  std::string context;  // e.g. "connect to 127.0.0.1:7471: connection refused"

  // "<context> (<code>[, errno N: text])"
  std::string to_string() const;
};

template <class T>
using result = std::expected<T, error>;

// Builds an unexpected error; context is copied.
CONVEYOR_API std::unexpected<error> make_error(errc code, std::string context, int sys_errno = 0);

// The data-path status of post_* calls: ok, again (queue full), invalid_argument
// (bad SGE, opcode, length), qp_in_error, invalid_state, unsupported.
using status = errc;

// Work completion status: the verbs statuses, with the verbs meanings.
enum class wc_status : std::uint8_t {
  success = 0,
  loc_len_err,    // local length: receive buffer too small
  loc_qp_op_err,  // local QP operation error
  loc_prot_err,   // local protection: bad lkey or range
  wr_flush_err,   // flushed: the QP entered ERROR before this request ran
  mw_bind_err,
  bad_resp_err,       // the peer's response did not match the request
  loc_access_err,     // local access: the local buffer lacks a right
  rem_inv_req_err,    // remote invalid request: opcode/length the peer refuses
  rem_access_err,     // remote access: bad rkey, out of bounds or missing right
  rem_op_err,         // remote operation error
  retry_exc_err,      // transport retries exceeded: the connection was lost
  rnr_retry_exc_err,  // receiver not ready: no receive posted at the peer
  fatal_err,
  resp_timeout_err,
  general_err,
};

CONVEYOR_API std::string_view to_string(wc_status s) noexcept;

}  // namespace conveyor

// `.value()` on a failed result<T> throws std::bad_expected_access<conveyor::error>;
// this specialization (allowed: it depends on a Conveyor type) makes its
// what() the error's to_string(), so an uncaught one tells the user what
// failed ("connect to 10.0.0.2:7471: connection refused (connection_refused, errno
// 111: ...)") instead of "bad access to std::expected without expected value".
// It is otherwise the standard class: error() returns the conveyor::error.
template <>
class std::bad_expected_access<conveyor::error> : public std::bad_expected_access<void> {
 public:
  explicit bad_expected_access(conveyor::error e)
      : error_(std::move(e)), what_(error_.to_string()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  conveyor::error& error() & noexcept { return error_; }
  const conveyor::error& error() const& noexcept { return error_; }
  conveyor::error&& error() && noexcept { return std::move(error_); }
  const conveyor::error&& error() const&& noexcept { return std::move(error_); }

 private:
  conveyor::error error_;
  std::string what_;
};
