// conveyor::kv::layout — the bytes the store exports and one-sided readers
// interpret: shared by the store (writer) and the client (reader). docs/KV.md
// explains the layout and why a reader never returns a mixed value.
//
// Index region: a 64-byte header, then buckets+1 buckets of 64 bytes (the last
// one only ever serves as the second bucket of group buckets-1). A bucket is a
// check word (a hash of the seven slots and the bucket's number) and seven slot
// words. A key hashes to two groups g1, g2 (two adjacent buckets each, 128 bytes,
// one READ each); it lives in one of their 28 slots.
//
// Slot word: bits 0..39 item offset in 64-byte units, bits 40..55 item size in
// 64-byte units (0xffff: at least that; read the header for the size), bits
// 56..63 a tag from the key's hash (never 0). 0 is an empty slot.
//
// Data region: items at 64-byte aligned offsets, immutable once written but
// for the checksum word's form (live or retired, see item_header):
//   item_header (32 bytes) | key | value     (checksum covers bytes 8..end)
// Everything here is plain arithmetic on values; no pointers into peer memory.
#pragma once

#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/mr.hpp>

namespace conveyor::kv::layout {

inline constexpr std::uint32_t index_magic = 0x43564b49;     // "CVKI"
inline constexpr std::uint32_t describe_magic = 0x43564b44;  // "CVKD"
// 2: items carry their key's type (item_header::type) and hashes an encoding.
// 3: an item's checksum word is live (the checksum) only while the item is its
//    key's current value, and ~checksum before and after (item_header).
inline constexpr std::uint16_t format_version = 3;
inline constexpr std::size_t unit = 64;  // allocation and bucket unit
inline constexpr std::size_t slots_per_bucket = 7;
inline constexpr std::size_t buckets_per_group = 2;
inline constexpr std::size_t group_bytes = unit * buckets_per_group;
inline constexpr std::size_t index_header_bytes = 64;
inline constexpr std::uint64_t size_saturated = 0xffff;
inline constexpr std::uint64_t max_offset_units = (1ull << 40) - 1;

// The clock item_header::expire_at counts on: milliseconds since the Unix
// epoch (CLOCK_REALTIME), the store's and every reader's.
inline std::int64_t now_ms() noexcept {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

struct index_header {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t flags;       // header_cluster: the four words below are kept
  std::uint64_t generation;  // bumped by clear(): the table's contents changed wholesale
  std::uint64_t buckets;     // power of two (the region holds buckets+1)
  std::uint64_t seed;
  // A cluster node's words for one-sided readers (docs/KV-CLUSTER.md, "What a
  // one-sided reader checks"); each an aligned 8-byte word stored atomically,
  // each only ever growing but valid_until_ms (0 once fenced):
  std::uint64_t epoch;          // the shard map's epoch the node serves under
  std::int64_t valid_until_ms;  // CLOCK_REALTIME ms: the node's lease vouches until then
  std::uint64_t write_version;  // stored before any change a reader can see is made
  std::uint64_t acked_version;  // every change up to it is on every in-sync replica
};
static_assert(sizeof(index_header) == index_header_bytes);
inline constexpr std::uint16_t header_cluster = 1;
inline constexpr std::size_t header_words_offset = 32;  // epoch .. acked_version
inline constexpr std::size_t header_words_bytes = 32;

// What a reader makes of the cluster words it READ after its data (a READ
// posted after the data's on the same queue pair): whether the data may be
// returned. `item_version`: the version of the item the data read found (0:
// a miss, or nothing to vouch for by itself).
struct header_words {
  std::uint64_t epoch = 0;
  std::int64_t valid_until_ms = 0;
  std::uint64_t write_version = 0, acked_version = 0;
};
inline header_words decode_header_words(const std::byte* p) noexcept {
  header_words w;
  std::memcpy(&w.epoch, p, 8);
  std::memcpy(&w.valid_until_ms, p + 8, 8);
  std::memcpy(&w.write_version, p + 16, 8);
  std::memcpy(&w.acked_version, p + 24, 8);
  return w;
}
enum class header_verdict {
  ok,          // every change the data showed is on every in-sync replica
  wait_acked,  // read the words again until acked_version reaches `need`
  lease,       // the node's lease does not vouch for now (fenced, hung, or clocks apart)
};
// The rule (docs/KV-CLUSTER.md): the lease must hold past now + skew; then
// the data is returned when acked_version covers write_version (nothing was
// unreplicated when the words were read, after the data), or covers the
// item found; otherwise the reader waits for acked_version to reach the
// write_version of its first words.
inline header_verdict judge(const header_words& w, std::uint64_t item_version, std::int64_t now_ms,
                            std::int64_t skew_ms, std::uint64_t& need) noexcept {
  if (w.valid_until_ms <= now_ms + skew_ms) return header_verdict::lease;
  if (need == 0) need = w.write_version;
  if (w.acked_version >= need) return header_verdict::ok;
  if (item_version != 0 && w.acked_version >= item_version) return header_verdict::ok;
  return header_verdict::wait_acked;
}

// The type of the value an item holds (item_header::type). A string's value
// is its bytes; a hash's is hash_inline + its encoding (encode_hash) while it is
// small, or hash_served alone; a list's, set's and sorted set's value is empty:
// those are served by the server (RPC) only.
enum class value_type : std::uint8_t { string = 0, list = 1, hash = 2, set = 3, zset = 4 };
inline constexpr std::size_t max_key_len = (std::size_t{1} << 24) - 1;

struct item_header {
  // The hash of bytes [8, item_bytes) with the seed while the item is its key's
  // current value (live); ~that hash while it is being published and after it
  // was replaced or deleted (retired). Both forms verify the bytes.
  std::uint64_t checksum;
  std::uint64_t version;   // store-wide write counter when the item was made
  std::int64_t expire_at;  // ms since the Unix epoch; 0: no TTL
  std::uint32_t key_len : 24;
  std::uint32_t type : 8;  // value_type
  std::uint32_t value_len;
};
static_assert(sizeof(item_header) == 32);

constexpr std::size_t item_bytes(std::size_t key_len, std::size_t value_len) noexcept {
  return sizeof(item_header) + key_len + value_len;
}
constexpr std::size_t round_units(std::size_t bytes) noexcept {
  return (bytes + unit - 1) / unit;
}

// --- hashing: not cryptographic; the seed is per store (random), so a client
// cannot aim keys at one group without knowing it, and torn reads (a mix of two
// writes) are caught with probability 1 - 2^-64 per check.
constexpr std::uint64_t mix(std::uint64_t x) noexcept {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

inline std::uint64_t hash_bytes(const std::byte* p, std::size_t n, std::uint64_t seed) noexcept {
  constexpr std::uint64_t k = 0x9e3779b97f4a7c15ull;
  std::uint64_t a = seed ^ k, b = seed + n, c = ~seed, d = seed * k;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    std::uint64_t w[4];
    std::memcpy(w, p + i, 32);
    a = std::rotl((a ^ w[0]) * k, 31);
    b = std::rotl((b ^ w[1]) * k, 29);
    c = std::rotl((c ^ w[2]) * k, 27);
    d = std::rotl((d ^ w[3]) * k, 25);
  }
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    a = std::rotl((a ^ w) * k, 31) + b;
    std::swap(a, b);
  }
  if (i < n) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, n - i);
    c = std::rotl((c ^ w ^ (static_cast<std::uint64_t>(n - i) << 56)) * k, 23);
  }
  return mix(a ^ mix(b + 1) ^ mix(c + 2) ^ mix(d + 3) ^ n);
}
inline std::uint64_t hash_key(std::string_view key, std::uint64_t seed) noexcept {
  return hash_bytes(reinterpret_cast<const std::byte*>(key.data()), key.size(), seed);
}

struct placement {
  std::uint64_t group[2];  // first bucket of each group
  std::uint8_t tag;
};
inline placement place(std::uint64_t h, std::uint64_t buckets) noexcept {
  placement p{};
  p.group[0] = h & (buckets - 1);
  p.group[1] = mix(h ^ 0x5bd1e995ull) & (buckets - 1);
  if (p.group[1] == p.group[0]) p.group[1] = (p.group[0] + buckets / 2) & (buckets - 1);
  p.tag = static_cast<std::uint8_t>((h >> 56) | 1);
  return p;
}
constexpr std::uint64_t bucket_offset(std::uint64_t bucket) noexcept {
  return index_header_bytes + bucket * unit;
}

// --- slot words
constexpr std::uint64_t make_slot(std::uint64_t offset_units, std::uint64_t size_units,
                                  std::uint8_t tag) noexcept {
  if (size_units > size_saturated) size_units = size_saturated;
  return offset_units | (size_units << 40) | (static_cast<std::uint64_t>(tag) << 56);
}
constexpr std::uint64_t slot_offset_units(std::uint64_t s) noexcept {
  return s & max_offset_units;
}
constexpr std::uint64_t slot_size_units(std::uint64_t s) noexcept {
  return (s >> 40) & 0xffff;
}
constexpr std::uint8_t slot_tag(std::uint64_t s) noexcept {
  return static_cast<std::uint8_t>(s >> 56);
}

// The check word of a bucket: a function of its number and its seven slots.
inline std::uint64_t bucket_check(std::uint64_t bucket, const std::uint64_t* slots,
                                  std::uint64_t seed) noexcept {
  std::uint64_t h = mix(seed ^ (bucket * 0x9e3779b97f4a7c15ull) ^ 0xb0c4e7ull);
  for (std::size_t i = 0; i < slots_per_bucket; ++i) h = mix(h ^ slots[i]) + i;
  return h;
}

inline std::uint64_t item_checksum(const std::byte* item, std::size_t bytes,
                                   std::uint64_t seed) noexcept {
  return hash_bytes(item + 8, bytes - 8, seed ^ 0x17e3);
}

// --- what an RDMA client is told at connection time (accept private data)
struct description {
  remote_region index;
  remote_region data;
  std::uint64_t buckets = 0;
  std::uint64_t seed = 0;
  std::uint64_t generation = 0;
  std::uint32_t reclaim_grace_ms = 0;  // a GET that took longer retries (docs/KV.md)
  std::uint32_t max_message = 0;       // largest RPC request or reply, bytes
  std::uint32_t rpc_slots = 0;         // RPCs a client may have outstanding (rdma_server)
  std::uint16_t flags = 0;             // index_header::flags (header_cluster)
};
inline constexpr std::size_t description_bytes =
    4 + 2 + 2 + 2 * remote_region::encoded_size + 8 * 3 + 4 * 3;

inline void put_be(std::byte* p, std::uint64_t v, int n) noexcept {
  for (int i = n - 1; i >= 0; --i, v >>= 8) p[i] = static_cast<std::byte>(v & 0xff);
}
inline std::uint64_t get_be(const std::byte* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

inline std::vector<std::byte> encode(const description& d) {
  std::vector<std::byte> out(description_bytes);
  std::byte* p = out.data();
  put_be(p, describe_magic, 4);
  put_be(p + 4, format_version, 2);
  put_be(p + 6, d.flags, 2);
  p += 8;
  d.index.encode_to(
      std::span<std::byte, remote_region::encoded_size>(p, remote_region::encoded_size));
  p += remote_region::encoded_size;
  d.data.encode_to(
      std::span<std::byte, remote_region::encoded_size>(p, remote_region::encoded_size));
  p += remote_region::encoded_size;
  put_be(p, d.buckets, 8);
  put_be(p + 8, d.seed, 8);
  put_be(p + 16, d.generation, 8);
  put_be(p + 24, d.reclaim_grace_ms, 4);
  put_be(p + 28, d.max_message, 4);
  put_be(p + 32, d.rpc_slots, 4);
  return out;
}

// Validates everything a reader later relies on (bounds, power of two).
inline std::optional<description> decode(std::span<const std::byte> in) {
  if (in.size() < description_bytes) return std::nullopt;
  const std::byte* p = in.data();
  if (get_be(p, 4) != describe_magic || get_be(p + 4, 2) != format_version) return std::nullopt;
  description d;
  d.flags = static_cast<std::uint16_t>(get_be(p + 6, 2));
  if (d.flags & ~header_cluster) return std::nullopt;
  p += 8;
  auto idx = remote_region::decode(std::span(p, remote_region::encoded_size));
  p += remote_region::encoded_size;
  auto dat = remote_region::decode(std::span(p, remote_region::encoded_size));
  p += remote_region::encoded_size;
  if (!idx || !dat) return std::nullopt;
  d.index = *idx;
  d.data = *dat;
  d.buckets = get_be(p, 8);
  d.seed = get_be(p + 8, 8);
  d.generation = get_be(p + 16, 8);
  d.reclaim_grace_ms = static_cast<std::uint32_t>(get_be(p + 24, 4));
  d.max_message = static_cast<std::uint32_t>(get_be(p + 28, 4));
  d.rpc_slots = static_cast<std::uint32_t>(get_be(p + 32, 4));
  if (d.buckets == 0 || !std::has_single_bit(d.buckets) || d.buckets > (1ull << 32))
    return std::nullopt;
  if (d.index.length < bucket_offset(d.buckets + 1)) return std::nullopt;
  if (d.data.length == 0 || d.data.length / unit > max_offset_units) return std::nullopt;
  return d;
}

// --- the client's connect private data: magic "CVKC", version, password.
inline constexpr std::uint32_t hello_magic = 0x43564b43;
inline constexpr std::size_t max_password = 200;
inline std::vector<std::byte> encode_hello(std::string_view password) {
  std::vector<std::byte> out(8 + password.size());
  put_be(out.data(), hello_magic, 4);
  put_be(out.data() + 4, format_version, 2);
  put_be(out.data() + 6, password.size(), 2);
  std::memcpy(out.data() + 8, password.data(), password.size());
  return out;
}
// The password the client presented; nullopt if the bytes are not a hello.
inline std::optional<std::string> decode_hello(std::span<const std::byte> in) {
  if (in.size() < 8 || get_be(in.data(), 4) != hello_magic ||
      get_be(in.data() + 4, 2) != format_version)
    return std::nullopt;
  const auto n = get_be(in.data() + 6, 2);
  if (n > max_password || in.size() != 8 + n) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(in.data() + 8), n);
}

// --- the reader's checks (client, tests): pure functions of bytes read.

enum class bucket_result { ok, torn };

// A group's 128 bytes as read: checks both buckets' check words and collects
// the slot words whose tag matches (at most 14). `first_bucket` is the group's.
inline bucket_result match_group(const std::byte* group, std::uint64_t first_bucket,
                                 std::uint8_t tag, std::uint64_t seed,
                                 std::vector<std::uint64_t>& out) {
  for (std::size_t b = 0; b < buckets_per_group; ++b) {
    std::uint64_t w[1 + slots_per_bucket];
    std::memcpy(w, group + b * unit, unit);
    if (bucket_check(first_bucket + b, w + 1, seed) != w[0]) return bucket_result::torn;
    for (std::size_t i = 0; i < slots_per_bucket; ++i)
      if (w[1 + i] && slot_tag(w[1 + i]) == tag) out.push_back(w[1 + i]);
  }
  return bucket_result::ok;
}

// Where a slot's item is and how much to READ; nullopt if it lies outside the
// data region (a torn or hostile slot word): never READ outside.
struct item_span {
  std::uint64_t offset, bytes;
  bool saturated;  // size unknown beyond `bytes`: read the header, then the rest
};
inline std::optional<item_span> item_of(std::uint64_t slot, std::uint64_t data_len) noexcept {
  const std::uint64_t off = slot_offset_units(slot) * unit;
  const std::uint64_t size_units = slot_size_units(slot);
  if (size_units == 0 || off >= data_len) return std::nullopt;
  std::uint64_t bytes = size_units * unit;
  if (bytes > data_len - off) return std::nullopt;
  return item_span{off, bytes, size_units == size_saturated};
}

enum class item_result {
  ok,         // the item is this key's, complete and self-consistent
  other_key,  // a whole item of another key (tag collision or reused memory)
  torn,       // checksum or lengths wrong: concurrent reuse; retry from the bucket
  need_more,  // saturated size: `need` bytes must be read
};
struct item_check {
  item_result result;
  std::uint64_t need = 0;  // need_more: total item bytes
  std::uint64_t version = 0;
  std::int64_t expire_at = 0;
  value_type type = value_type::string;
  std::size_t value_offset = 0, value_len = 0;  // within buf
  bool live = false;  // ok: the checksum word was in its live form (not retired)
};
inline item_check check_item(const std::byte* buf, std::size_t n, std::string_view key,
                             std::uint64_t seed) noexcept {
  item_check c{item_result::torn};
  if (n < sizeof(item_header)) return c;
  item_header h;
  std::memcpy(&h, buf, sizeof h);
  const std::uint64_t total = item_bytes(h.key_len, h.value_len);
  if (total > n) {
    if (round_units(total) * unit > n && n >= size_saturated * unit) {
      c.result = item_result::need_more;
      c.need = total;
    }
    return c;
  }
  const std::uint64_t sum = item_checksum(buf, total, seed);
  if (sum != h.checksum && ~sum != h.checksum) return c;
  if (std::string_view(reinterpret_cast<const char*>(buf) + sizeof h, h.key_len) != key) {
    c.result = item_result::other_key;
    return c;
  }
  if (h.type > static_cast<std::uint32_t>(value_type::zset)) return c;  // not a type we know
  c.result = item_result::ok;
  c.live = sum == h.checksum;
  c.type = static_cast<value_type>(h.type);
  c.version = h.version;
  c.expire_at = h.expire_at;
  c.value_offset = sizeof h + h.key_len;
  c.value_len = h.value_len;
  return c;
}

// --- a hash's value in its item. First byte: hash_inline (the fields follow)
// or hash_served (the hash is too large to publish: a reader asks the server).
// Inline: count (4, little-endian), then per field: field length (4), value
// length (4), field, value. The item's checksum covers it; decode_hash also
// checks that the lengths add up exactly, so a reader never returns bytes
// that are not a complete encoding.
inline constexpr std::uint8_t hash_inline = 1, hash_served = 2;

inline void put_le32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline std::uint32_t get_le32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

// An inline encoding is built as: encode_hash_begin(out, count), then
// encode_hash_field(out, f, v) for each of the count fields.
inline void encode_hash_begin(std::string& out, std::uint32_t count) {
  out.clear();
  out.push_back(static_cast<char>(hash_inline));
  put_le32(out, count);
}
inline void encode_hash_field(std::string& out, std::string_view f, std::string_view v) {
  put_le32(out, static_cast<std::uint32_t>(f.size()));
  put_le32(out, static_cast<std::uint32_t>(v.size()));
  out.append(f);
  out.append(v);
}

enum class hash_form { fields, served, invalid };
// Calls fn(field, value) for each field of an inline encoding (only once the
// whole encoding has been checked).
template <class Fn>
hash_form decode_hash(const std::byte* p, std::size_t n, Fn&& fn) {
  if (n == 1 && static_cast<std::uint8_t>(p[0]) == hash_served) return hash_form::served;
  if (n < 5 || static_cast<std::uint8_t>(p[0]) != hash_inline) return hash_form::invalid;
  const std::uint32_t count = get_le32(p + 1);
  std::size_t at = 5;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (n - at < 8) return hash_form::invalid;
    const std::uint64_t fl = get_le32(p + at), vl = get_le32(p + at + 4);
    if (fl + vl > n - at - 8) return hash_form::invalid;
    at += 8 + fl + vl;
  }
  if (at != n) return hash_form::invalid;
  at = 5;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t fl = get_le32(p + at), vl = get_le32(p + at + 4);
    const char* f = reinterpret_cast<const char*>(p + at + 8);
    fn(std::string_view(f, fl), std::string_view(f + fl, vl));
    at += 8 + fl + vl;
  }
  return hash_form::fields;
}

}  // namespace conveyor::kv::layout
