// conveyor::kv::cluster::etcd_coord — the coord interface (coord.hpp) over
// etcd 3.4's v3 JSON gateway (Debian 12's etcd-server), with libcurl and
// nlohmann-json.
//
//   auto c = etcd_coord::open({.endpoints = {"127.0.0.1:2379", "127.0.0.1:22379"}});
//   if (!c) return c.error();          // invalid_argument: an endpoint it cannot use
//   auto kv = (*c)->get("/conveyor-kv/c1/config");
//
// Why the gateway: etcd has no C or C++ client in Debian and its native
// protocol is gRPC; the gateway is etcd's own documented route for languages
// without gRPC, and speaks plain HTTP/1.1 + JSON, which libcurl (a well-kept
// client we do not write) and nlohmann-json (already a dependency) handle.
// Requests are POST <endpoint>/v3/<service>/<method> with protobuf's JSON
// mapping: bytes (keys, values) as base64, int64 as decimal strings, fields at
// their default value (0, false, empty) left out of replies.
//
// Replies are read by etcd_reply.hpp's pure parsers (fuzzed on their own);
// this class does the HTTP around them.
//
// Endpoints are tried in turn, starting from the last one that answered. A
// request moves on to the next endpoint when it could not reach this one
// (refused, unreachable, or a read whose answer did not come: timeout,
// garbage, a 5xx). A write (put, put_if, del, lease grant and revoke) moves on
// only when it surely never reached the endpoint (the connection failed):
// otherwise it may have been applied, and retrying it elsewhere could apply it
// twice; it returns timed_out and the caller decides. An answer from etcd
// itself (a 4xx with etcd's error, e.g. lease not found) is final.
//
// Every request is bounded: connect_timeout, request_timeout for the whole
// exchange, max_reply_bytes for what the peer may make us hold (the transfer
// is aborted past it). Replies are checked field by field; anything that is
// not what the gateway sends (wrong JSON type, bad base64, an int64 that does
// not parse, a missing header) is a protocol_error naming the endpoint and
// method, never a crash.
//
// Watch: a long-poll. Each watch_prefix call POSTs /v3/watch with a
// create_request from `from_revision` and reads the reply stream (one JSON
// object per line) until the first message with events (or a cancel or
// error), then closes the connection; with no events it returns empty after
// `timeout`. This rather than a polling fallback because the gateway does
// stream watches (checked against etcd 3.4.23: a "created" message, then one
// message per revision batch), so a change is seen as soon as etcd sends it,
// and a quiet cluster costs one idle request per timeout, not one range per
// poll interval. Starting each call at a revision makes it lossless across
// calls, and keeping no stream open between calls means no thread, no
// reconnection state and no cancellation protocol inside this object. The
// price is one request and one etcd watcher per wake-up, which the config
// key's change rate (a few per failover) makes negligible.
//
// Thread safety: every method may be called from several threads at once
// (curl handles come from a locked pool; each call uses its own).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/coord.hpp"
#include "cluster/etcd_reply.hpp"  // base64_encode, base64_decode

namespace conveyor::kv::cluster {

struct etcd_options {
  // "host:port" (http assumed) or "http://host:port" / "https://host:port".
  std::vector<std::string> endpoints;
  std::chrono::milliseconds connect_timeout{500};
  // The whole exchange with one endpoint. watch_prefix is bounded by its own
  // timeout instead (a long-poll is meant to wait).
  std::chrono::milliseconds request_timeout{2000};
  // Largest reply accepted (one message of a watch stream included).
  std::size_t max_reply_bytes = std::size_t{16} << 20;
};

class etcd_coord final : public coord {
 public:
  // Checks the options (at least one endpoint, each with an http or https
  // scheme or none, a host and a port); contacts nothing.
  static result<std::unique_ptr<etcd_coord>> open(etcd_options opts);
  ~etcd_coord() override;
  etcd_coord(const etcd_coord&) = delete;
  etcd_coord& operator=(const etcd_coord&) = delete;

  result<std::optional<key_value>> get(std::string_view key) override;
  result<range_result> range_prefix(std::string_view prefix, std::int64_t limit = 0) override;
  result<std::int64_t> put(std::string_view key, std::string_view value,
                           std::int64_t lease = 0) override;
  result<cas_result> put_if(std::string_view key, std::string_view value,
                            std::int64_t expected_mod_revision, std::int64_t lease = 0) override;
  result<cas_result> put_if_absent(std::string_view key, std::string_view value,
                                   std::int64_t expected_mod_revision,
                                   const std::vector<std::string>& absent) override;
  result<std::int64_t> del(std::string_view key) override;
  result<lease_grant> grant_lease(std::chrono::seconds ttl) override;
  result<std::chrono::seconds> keep_alive(std::int64_t lease) override;
  result<void> revoke_lease(std::int64_t lease) override;
  result<watch_result> watch_prefix(std::string_view prefix, std::int64_t from_revision,
                                    std::chrono::milliseconds timeout) override;

  const etcd_options& options() const noexcept { return opts_; }

  struct exchange;  // one request's state (etcd.cpp)

 private:
  explicit etcd_coord(etcd_options opts);

  enum class retry : std::uint8_t { read, write };
  // POSTs `body` to <endpoint>/v3/<method> on each endpoint in turn (see the
  // file comment); `x` parses the reply. Returns the endpoint that answered.
  result<std::string> call(std::string_view method, const std::string& body, retry kind,
                           exchange& x, std::chrono::milliseconds timeout);
  // call() for a one-object reply, left in `reply`; returns "etcd <endpoint> /v3/<method>".
  result<std::string> unary(std::string_view method, const std::string& body, retry kind,
                            std::string& reply);

  void* take_handle();
  void give_handle(void* h);

  etcd_options opts_;
  std::atomic<std::size_t> preferred_{0};  // the endpoint that answered last
  std::mutex pool_mu_;
  std::vector<void*> pool_;  // idle CURL easy handles (kept for connection reuse)
};

// The smallest key greater than every key starting with `prefix` (etcd's
// range_end for a prefix): its last byte below 0xff incremented, the bytes
// after it dropped; "\0" (the whole keyspace) when there is none.
std::string prefix_end(std::string_view prefix);

}  // namespace conveyor::kv::cluster
