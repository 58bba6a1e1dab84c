// conveyor::kv::cluster::coord — what the cluster needs from its coordination
// service (issue 35; the etcd implementation is etcd.hpp).
//
// The cluster keeps its truth in a small, strongly consistent key-value store
// with revisions and leases (etcd's model): node registrations bound to each
// node's lease, one shard-map document changed only by compare-and-swap on its
// mod_revision, and a controller key created only if absent. This interface is
// exactly that much, so a test double or another engine can stand behind it:
//
//   auto c = etcd_coord::open({.endpoints = {"127.0.0.1:2379"}}).value();
//   auto lease = c->grant_lease(3s).value();          // lease.ttl: etcd's choice
//   c->put("/conveyor-kv/c1/nodes/" + id, reg_json, lease.id).value();
//   auto cfg = c->get("/conveyor-kv/c1/config").value();  // std::optional<key_value>
//   auto r = c->put_if("/conveyor-kv/c1/config", next_json,
//                      cfg ? cfg->mod_revision : 0).value();  // r.succeeded
//
// Keys and values are arbitrary bytes (std::string). Revisions are the
// store's: every write gets the next store-wide revision; a key's
// mod_revision is the revision of its last write and is 0 for a key that does
// not exist, so put_if(key, v, 0) means "create if absent".
//
// Watching is a blocking long-poll with a timeout (watch_prefix): it returns
// the events at or after `from_revision` as soon as there are some, or none
// when the timeout passes. The caller resumes from `next_revision`, so no
// event is lost between two calls, and no thread or open stream lives in the
// coord object between calls (see etcd.hpp for why this over polling).
//
// Errors are conveyor::result errors (error.hpp). The codes callers act on:
// timed_out (no answer within the bound: for a write the outcome is unknown),
// connection_refused (no endpoint could be reached), not_found (a lease that
// expired or was revoked), protocol_error (a reply that is not what the
// service's protocol allows, including one over the size bound),
// invalid_argument (the service refused the request). Implementations are
// safe to call from several threads at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/error.hpp>

namespace conveyor::kv::cluster {

// One key as the store holds it.
struct key_value {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;  // revision of the write that created it
  std::int64_t mod_revision = 0;     // revision of its last write (the CAS guard)
  std::int64_t version = 0;          // writes since it was created (1 after creation)
  std::int64_t lease = 0;            // the lease it is bound to, 0 if none
};

struct range_result {
  std::vector<key_value> kvs;  // in key order
  std::int64_t revision = 0;   // the store's revision the read saw
  bool more = false;           // true when `limit` cut the answer short
};

struct cas_result {
  bool succeeded = false;
  std::int64_t revision = 0;         // the store's revision after the call (the new
                                     // mod_revision of the key when succeeded)
  std::optional<key_value> current;  // when it failed: the key as it is now (nullopt:
                                     // absent), so the caller can retry without a read
};

struct lease_grant {
  std::int64_t id = 0;
  std::chrono::seconds ttl{0};  // the TTL the service chose (it may raise a small request)
};

struct watch_event {
  enum class kind : std::uint8_t { put, del };
  kind type = kind::put;
  key_value kv;  // for del: key and mod_revision (the deletion's revision) only
};

struct watch_result {
  std::vector<watch_event> events;  // in revision order
  // Where the next watch_prefix call resumes: one past the last event returned;
  // with no events, `from_revision` again (or, from "now", one past the
  // revision the watch began at).
  std::int64_t next_revision = 0;
  // Non-zero when `from_revision` was compacted away: events before this
  // revision are lost; the caller re-reads the prefix and watches from the
  // read's revision + 1. `events` is then empty.
  std::int64_t compact_revision = 0;
};

class coord {
 public:
  virtual ~coord() = default;

  // The key, or nullopt when it does not exist.
  virtual result<std::optional<key_value>> get(std::string_view key) = 0;
  // Every key that starts with `prefix` (all keys when empty), at most `limit`
  // of them when limit > 0 (then `more` says whether some were left out).
  virtual result<range_result> range_prefix(std::string_view prefix, std::int64_t limit = 0) = 0;
  // Writes the key unconditionally, bound to `lease` when non-zero (the key
  // goes when the lease does). Returns the write's revision. not_found when
  // the lease no longer exists.
  virtual result<std::int64_t> put(std::string_view key, std::string_view value,
                                   std::int64_t lease = 0) = 0;
  // Writes the key only if its mod_revision is `expected_mod_revision` (0: only
  // if absent), in one transaction.
  virtual result<cas_result> put_if(std::string_view key, std::string_view value,
                                    std::int64_t expected_mod_revision, std::int64_t lease = 0) = 0;
  // put_if, and only if none of `absent` exists either (the controller's
  // failover: the map changes only while the deposed primaries' registrations
  // are still gone), in one transaction.
  virtual result<cas_result> put_if_absent(std::string_view key, std::string_view value,
                                           std::int64_t expected_mod_revision,
                                           const std::vector<std::string>& absent) = 0;
  // Deletes the key; returns how many keys went (0 or 1).
  virtual result<std::int64_t> del(std::string_view key) = 0;

  // A new lease of about `ttl` (whole seconds, at least 1): the service may
  // choose a longer one; read lease_grant::ttl.
  virtual result<lease_grant> grant_lease(std::chrono::seconds ttl) = 0;
  // Renews the lease once; returns its TTL from now. not_found when it has
  // already expired or been revoked (its keys are gone).
  virtual result<std::chrono::seconds> keep_alive(std::int64_t lease) = 0;
  // Ends the lease now and deletes its keys. not_found when it is already gone.
  virtual result<void> revoke_lease(std::int64_t lease) = 0;

  // Blocks until at least one change to a key under `prefix` at a revision >=
  // `from_revision` (0: from now) is known, or `timeout` passes (then an empty
  // result). See watch_result for how to resume.
  virtual result<watch_result> watch_prefix(std::string_view prefix, std::int64_t from_revision,
                                            std::chrono::milliseconds timeout) = 0;
};

}  // namespace conveyor::kv::cluster
