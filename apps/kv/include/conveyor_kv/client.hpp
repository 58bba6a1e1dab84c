// conveyor_kv/client.hpp — the C++ client of conveyor-kv over RDMA.
//
//   auto c = conveyor::kv::client::connect("shm", "127.0.0.1:7380", {.password = "pw"}).value();
//   c->set("k", "v").value();
//   std::optional<std::string> v = c->get("k").value();        // one-sided READs only
//   auto vs = c->mget(std::vector<std::string_view>{"a", "b"}).value();  // READs in flight
//   together
//
// GET, MGET and get_into never involve a server thread. The first GET of a key
// READs its two bucket groups, then the item, and checks the bucket check
// words, the item's checksum and key; the client then remembers where the
// key's item is, and the next GETs are one READ of that item, accepted only
// while the item is still the key's current value (its checksum word is live;
// the server retires it before a write of the key is acknowledged). A retired,
// freed or reused item sends the GET back to the buckets. Anything torn, freed
// or moved is read again, never returned (docs/KV.md, "One READ"). Writes (set, del, incr, expire,
// command) are RPCs executed by the server. Expired keys read as absent (the item carries its
// expiry; the comparison uses this host's clock).
//
// A node of a cluster (kv serve --cluster) exports words in its index header:
// its map epoch, the time its lease vouches for its data until, and how far
// its changes are on every in-sync replica. Each doorbell then carries one
// more READ, of those words, after the data's; a GET is answered only while
// the lease holds (else errc::rejected, "CLUSTERDOWN ...": the node is fenced,
// stopped or hung) and once what it read is on every in-sync replica (it
// reads the words again until then), so a failover never takes back a value
// a GET returned.
//
// Hashes: hget, hmget and hgetall READ the hash's item the same way; while the
// hash is small (the server's hash-max-listpack-entries/-value) the item
// carries all its fields in a checksummed encoding, so they come from one
// item published by one write, never a mix of two. A larger hash's item says
// "served by the server" and the read becomes an RPC (client_stats::
// hash_rpc_reads). A key of another type answers errc::rejected with Redis's
// WRONGTYPE text (get of a hash, list, set or sorted set too; mget reads such
// a key as nil, as Redis's MGET does).
//
// Thread safety: one client per thread (thread-compatible).
#pragma once

#include <conveyor/conveyor.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace conveyor::kv {

// The provider an address form implies: "@name" is shm's (a name on this
// host), anything else ("host:port") soft's. A program takes this unless its
// user named a provider (verbs serves host:port addresses too).
std::string_view provider_for_address(std::string_view address) noexcept;

struct client_options {
  std::string password;                     // the server's requirepass
  std::uint32_t depth = 16;                 // READs in flight (capped by the connection's ORD)
  std::chrono::milliseconds timeout{5000};  // connect, each RPC, each GET batch
  // Remembered item locations (16 bytes each, direct-mapped by the key's
  // hash; pages touched as used), one cache per store shared by every client
  // of this process (the first client's size); 0: this client reads the
  // buckets first every time.
  std::size_t location_cache = std::size_t{1} << 20;
  // Against a cluster node (docs/KV-CLUSTER.md, "What a one-sided reader
  // checks"): how far this host's clock may be from the node's. A GET is
  // answered only while the node's lease vouches for its data past now plus
  // this; on one host the clocks are one (0 would do).
  std::chrono::milliseconds max_clock_skew{100};
  // cluster_client only: GETs and MGETs go to the slot's replicas (in turn)
  // rather than its primary, as Redis Cluster's READONLY connections do.
  // Every write the primary acknowledged is on every in-sync replica, but a
  // replica serves what it applied, so a read there can also return a write
  // not yet acknowledged, and a replica that is catching up (outside the
  // in-sync set) can return values older than ones already read from the
  // primary. Writes always go to the primary. A slot without a replica
  // with an RDMA front end is read at its primary.
  bool replica_reads = false;
  // For the device the client opens. A client is only ever an initiator (the
  // server never accesses its memory), so by default no engine thread: the
  // thread that waits for a GET's READs or an RPC's reply drives the device,
  // a hand-off less each way (on soft, a GET's p50 about 41 -> 15 us).
  device_options device = [] {
    device_options d;
    d.progress = progress_mode::manual;
    return d;
  }();
};

struct client_stats {
  std::uint64_t gets = 0, hits = 0, reads = 0;
  std::uint64_t retries = 0;         // bucket or item re-read: torn, freed, moved, or too slow
  std::uint64_t hash_one_sided = 0;  // hash reads answered from the item
  std::uint64_t hash_rpc_reads = 0;  // hash reads sent to the server (a large hash)
  // GETs (and one-sided hash reads) by the dependent READ rounds they took:
  // [0] one (a remembered item, or a miss seen in the buckets), [1] two
  // (buckets, then the item), [2] three, [3] four or more.
  std::array<std::uint64_t, 4> rounds{};
  std::uint64_t one_read = 0;     // answered by the one READ of a remembered item
  std::uint64_t stale_cache = 0;  // a remembered item no longer the key's: buckets read
  std::uint64_t doorbells = 0;    // posts of READs (each carries every READ ready then)
  // Against a cluster node: READs of its header words (one per doorbell),
  // GETs that waited for their data to be on every in-sync replica (one more
  // READ of the words each time), GETs refused because its lease did not vouch.
  std::uint64_t header_reads = 0, acked_waits = 0, lease_refusals = 0;
};

class client {
 public:
  // Opens `device_name` ("soft", "shm", ...) and connects to a conveyor-kv RDMA
  // front end (kv serve --rdma-listen). errc::rejected with the server's reason
  // on a wrong password. A peer that does not answer the RDMA handshake within
  // opts.timeout (errc::timed_out), or answers something else than a handshake
  // (errc::protocol_error: conveyor-kv's RESP port answers an RDMA request at
  // once), gets an error that says so and asks whether `address` is a RESP port.
  static result<std::unique_ptr<client>> connect(std::string_view device_name,
                                                 std::string_view address,
                                                 const client_options& opts = {});
  virtual ~client() = default;

  // One-sided GET: nullopt when the key does not exist (or has expired).
  virtual result<std::optional<std::string>> get(std::string_view key) = 0;
  // Into the caller's buffer: the value's length (nullopt: no key); if the value
  // is longer than `out`, only its first out.size() bytes are written.
  virtual result<std::optional<std::size_t>> get_into(std::string_view key,
                                                      std::span<std::byte> out) = 0;
  // Many keys, depth READs in flight at once.
  virtual result<std::vector<std::optional<std::string>>> mget(
      std::span<const std::string_view> keys) = 0;

  // One-sided hash reads (see above). hget: nullopt when the field or the key
  // does not exist; hmget: one entry per field; hgetall: empty for no key.
  virtual result<std::optional<std::string>> hget(std::string_view key, std::string_view field) = 0;
  virtual result<std::vector<std::optional<std::string>>> hmget(
      std::string_view key, std::span<const std::string_view> fields) = 0;
  virtual result<std::vector<std::pair<std::string, std::string>>> hgetall(
      std::string_view key) = 0;

  // RPCs. command() sends argv and returns the raw RESP reply.
  virtual result<std::string> command(std::span<const std::string_view> argv) = 0;
  virtual result<void> set(std::string_view key, std::string_view value) = 0;
  virtual result<bool> del(std::string_view key) = 0;
  virtual result<std::int64_t> incr(std::string_view key, std::int64_t by = 1) = 0;
  virtual result<bool> expire(std::string_view key, std::chrono::milliseconds ttl) = 0;

  virtual client_stats stats() const = 0;
  // The QP's counters (tests: how many READs the server's engine served).
  virtual qp_counters counters() const = 0;
  // For tests of the protection the server's keys give: the exported regions.
  virtual remote_region index_region() const = 0;
  virtual remote_region data_region() const = 0;
  // Posts one raw READ or WRITE of `len` bytes at remote (addr, rkey) and returns its
  // completion status (tests: out-of-bounds READ, WRITE to read-only keys).
  virtual result<wc_status> raw_access(bool write, std::uint64_t addr, std::uint32_t rkey,
                                       std::uint32_t len) = 0;
  // Against a cluster node: the map epoch in the header words this client
  // read last (after the data of its last GET); 0 against a standalone server.
  virtual std::uint64_t node_epoch() const = 0;
};

// A client of a whole conveyor-kv cluster (kv serve --cluster), on the
// public client above: it learns the cluster from any node (CLUSTER INFO's
// epoch and CLUSTER SLOTS, whose nodes name their RDMA front ends), sends
// each key to its slot's primary (its reads to the slot's replicas with
// client_options::replica_reads), and connects to a node when a key first
// needs it.
//
//   auto c = conveyor::kv::cluster_client::connect("soft", "127.0.0.1:17001").value();
//   c->set("user:1", "ada").value();
//   auto v = c->get("user:1").value();   // one-sided, at the slot's primary
//
// A stale map is noticed without asking: a GET's doorbell reads the node's
// header words after the data, and a node whose epoch is newer than the map's
// has taken a newer map; the result is dropped, the map read again and the GET
// sent where the new map says. A write answered -MOVED does the same. A node
// that refuses (its lease not confirmed: a failover may be under way), is
// unreachable, or answers -CLUSTERDOWN/-TRYAGAIN is retried after the map is
// read again, every 100 ms, until opts.timeout. MGET splits the keys by node
// and reads each node's share with its READs in flight together (one node
// after another). Thread safety: one cluster_client per thread.
struct cluster_client_stats {
  std::uint64_t epoch = 0;            // the map's
  std::uint64_t map_reads = 0;        // CLUSTER SLOTS read (the first included)
  std::uint64_t stale_epochs = 0;     // GETs dropped: the node had a newer map
  std::uint64_t moved = 0;            // writes answered -MOVED
  std::uint64_t retries = 0;          // refused, unreachable, CLUSTERDOWN, TRYAGAIN
  std::uint64_t nodes_connected = 0;  // connections opened
  std::uint64_t replica_reads = 0;    // keys read at a replica (replica_reads)
};

class cluster_client {
 public:
  // `address`: any node's RDMA front end (kv serve --rdma-listen's).
  static result<std::unique_ptr<cluster_client>> connect(std::string_view device_name,
                                                         std::string_view address,
                                                         const client_options& opts = {});
  virtual ~cluster_client() = default;
  virtual result<std::optional<std::string>> get(std::string_view key) = 0;
  virtual result<std::vector<std::optional<std::string>>> mget(
      std::span<const std::string_view> keys) = 0;
  virtual result<void> set(std::string_view key, std::string_view value) = 0;
  virtual result<bool> del(std::string_view key) = 0;
  virtual result<std::int64_t> incr(std::string_view key, std::int64_t by = 1) = 0;
  // Any command, sent to the primary of `key`'s slot; the raw RESP reply.
  virtual result<std::string> command(std::string_view key,
                                      std::span<const std::string_view> argv) = 0;
  virtual cluster_client_stats stats() const = 0;
};

}  // namespace conveyor::kv
