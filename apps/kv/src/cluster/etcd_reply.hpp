// conveyor::kv::cluster::etcd_reply — what etcd 3.4's v3 JSON gateway answers,
// read and checked: pure functions from a reply's bytes to a result, no curl,
// no sockets, no state (etcd.cpp does the HTTP; tests/fuzz/fuzz_etcd_reply
// feeds these hostile bytes).
//
//   auto r = etcd_reply::parse_put(body);   // result<std::int64_t>: the revision
//   if (!r) return make_error(r.error().code, where + ": " + r.error().context);
//
// Every parser takes bytes a peer wrote. Anything that is not what the gateway
// sends (not JSON, a wrong type, bad base64, an int64 that does not parse, a
// missing header, a kv outside what was asked for) is a protocol_error whose
// context says what was wrong, without the endpoint (the caller adds where it
// came from); never a crash, never an exception. The reply shapes are listed
// at the top of etcd_reply.cpp.
//
// Plain functions and values: safe from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/error.hpp>

#include "cluster/coord.hpp"

namespace conveyor::kv::cluster {

// Base64 (RFC 4648, with padding) through OpenSSL's EVP codec; decode refuses
// anything that is not canonical base64 (bad characters, length, padding).
std::string base64_encode(std::string_view bytes);
result<std::string> base64_decode(std::string_view text);

namespace etcd_reply {

// At most `max` printable ASCII characters of s ('?' for the others, "..."
// when cut): for error texts that quote a peer.
std::string printable(std::string_view s, std::size_t max = 120);

// gRPC status codes (etcd's "code") to ours: INVALID_ARGUMENT and OUT_OF_RANGE
// invalid_argument, NOT_FOUND not_found, DEADLINE_EXCEEDED and UNAVAILABLE
// timed_out, RESOURCE_EXHAUSTED resource_exhausted, FAILED_PRECONDITION
// invalid_state, anything else rejected.
errc from_grpc(std::int64_t code);

// etcd's error body, sent with a non-200 status: {"error":..,"message":text,"code":int}.
struct error_body {
  std::int64_t grpc_code = 0;
  errc code = errc::rejected;  // from_grpc(grpc_code)
  std::string message;         // printable()
};
// protocol_error when the body is not etcd's error (no string message, no integer code).
result<error_body> parse_error(std::string_view body);

// kv/range for one key: the key, or nullopt when it does not exist.
result<std::optional<key_value>> parse_range_one(std::string_view body);
// kv/range for every key under `prefix`: each kv must start with it.
result<range_result> parse_range_prefix(std::string_view body, std::string_view prefix);
// kv/put: the write's revision (> 0).
result<std::int64_t> parse_put(std::string_view body);
// kv/txn of put_if (compare mod_revision, put on success, range `key` on failure).
result<cas_result> parse_txn(std::string_view body, std::string_view key);
// kv/deleterange of one key: how many went (0 or 1).
result<std::int64_t> parse_deleterange(std::string_view body);
// lease/grant: the lease's ID and TTL (both > 0).
result<lease_grant> parse_lease_grant(std::string_view body);
// lease/revoke: only a header.
result<void> parse_lease_revoke(std::string_view body);

// One line of the lease/keepalive stream.
struct keepalive_message {
  std::optional<std::string> error;  // the stream's error object: "etcd: <its JSON>", printable
  std::int64_t ttl = 0;              // 0 (left out) when the lease is gone
};
// protocol_error when the line is not JSON, has no result with a header, or
// answers for a lease other than `lease`.
result<keepalive_message> parse_keepalive_line(std::string_view line, std::int64_t lease);
// keep_alive's result from the stream's first message (nullopt: the stream
// ended without one): rejected for an error object, not_found when the lease is
// gone, protocol_error for no message.
result<std::chrono::seconds> keepalive_outcome(const std::optional<keepalive_message>& first,
                                               std::int64_t lease);

// One line of the watch stream, for a watch on `prefix` from `from_revision`.
struct watch_message {
  std::optional<std::string> error;  // the stream's error object: "etcd: <its JSON>", printable
  bool created = false;
  std::int64_t created_revision = 0;  // the header's revision, read only when created
  bool canceled = false;
  std::int64_t compact_revision = 0;  // when canceled because the start was compacted
  std::string cancel_reason;          // when canceled otherwise (printable)
  std::vector<watch_event> events;    // each under the prefix and at or after from_revision
};
result<watch_message> parse_watch_line(std::string_view line, std::string_view prefix,
                                       std::int64_t from_revision);

// What one watch call has read so far, message by message, and what it returns.
class watch_collector {
 public:
  explicit watch_collector(std::int64_t from_revision) : from_revision_(from_revision) {}
  // Takes the next message; true when the call has what it needs (an error, a
  // cancel, or events) and reads no further.
  bool take(watch_message m);
  // The call's result once the stream stopped (or, ran_out, reached its time
  // bound `timeout`): rejected for an error or a cancel, timed_out when etcd
  // never started the watch in time, protocol_error when the stream ended
  // before it started or left no revision to resume at (an event at INT64_MAX;
  // from "now", a start revision that is not in 1..INT64_MAX-1); else the
  // events (or none) and where to resume.
  result<watch_result> finish(bool ran_out, std::chrono::milliseconds timeout) const;

 private:
  std::int64_t from_revision_;
  bool created_ = false;
  std::int64_t created_revision_ = 0;
  std::optional<std::string> canceled_;
  watch_result out_;
};

}  // namespace etcd_reply
}  // namespace conveyor::kv::cluster
