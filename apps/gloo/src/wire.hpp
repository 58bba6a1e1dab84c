// wire.hpp — conveyor-gloo's messages and pair address: fixed layouts, encoded
// little-endian field by field, decoded into validated copies (a peer's bytes
// are never used in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace conveyor_gloo::wire {

// Every message a pair sends is one SEND into a peer's staging receive: this
// header, then (DATA only) the payload.
enum class msg_type : std::uint8_t {
  notify = 1,        // a send was posted for `slot` (feeds recv-from-any)
  rtr = 2,           // ready to receive: token, nbytes; large ones carry addr/rkey
  data = 3,          // eager payload for `token`
  done = 4,          // RDMA WRITEs for `token` are placed
  credit = 5,        // returns receive credits only
  buf_announce = 6,  // bound recv buffer for `slot`: addr, nbytes, rkey
  buf_retract = 7,   // bound recv buffer for `slot` is gone
  buf_done = 8,      // bound write of nbytes at offset (in token) for `slot` placed
  rtr_cancel = 9,    // the receive behind RTR `token` is gone: withdraw it if unused
  cancel_ack = 10,   // RTR `token` was withdrawn: nothing will be written for it
};

inline constexpr std::uint32_t msg_magic = 0x4356474d;  // "CVGM"
inline constexpr std::uint8_t flag_notify = 1;          // data/done also count as the notify

struct header {
  msg_type type = msg_type::credit;
  std::uint8_t flags = 0;
  std::uint32_t credits = 0;
  std::uint64_t slot = 0;
  std::uint64_t token = 0;
  std::uint64_t nbytes = 0;
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
};
inline constexpr std::size_t header_size = 48;

inline void put32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void put64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
inline std::uint32_t get32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(p[i]) << (8 * i);
  return v;
}
inline std::uint64_t get64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(p[i]) << (8 * i);
  return v;
}

inline void encode(const header& h, std::byte* out) {
  std::memset(out, 0, header_size);
  put32(out, msg_magic);
  out[4] = std::byte(h.type);
  out[5] = std::byte(h.flags);
  put32(out + 8, h.credits);
  put64(out + 12, h.slot);
  put64(out + 20, h.token);
  put64(out + 28, h.nbytes);
  put64(out + 36, h.addr);
  put32(out + 44, h.rkey);
}

// Checks the magic and the type; the caller checks fields against its state.
inline std::optional<header> decode(const std::byte* in, std::size_t len) {
  if (len < header_size || get32(in) != msg_magic) return std::nullopt;
  header h;
  auto t = std::uint8_t(in[4]);
  if (t < 1 || t > 10) return std::nullopt;
  h.type = msg_type(t);
  h.flags = std::uint8_t(in[5]);
  if ((h.flags & ~flag_notify) != 0) return std::nullopt;
  h.credits = get32(in + 8);
  h.slot = get64(in + 12);
  h.token = get64(in + 20);
  h.nbytes = get64(in + 28);
  h.addr = get64(in + 36);
  h.rkey = get32(in + 44);
  return h;
}

// A pair's address: what the peer needs to connect to it. Fixed size, since
// Gloo's rendezvous splits the concatenated addresses of a rank evenly. It
// travels only through the rendezvous store: `key` is the pair's secret (the
// acceptor's; the connector proves it knows it), never shown anywhere else.
inline constexpr std::uint32_t addr_magic = 0x43564732;  // "CVG2" (v1, "CVGL", had a cookie)
inline constexpr std::size_t addr_size = 184;            // <= gloo's kMaxByteSize (192)
inline constexpr std::size_t key_size = 16;              // 128-bit pair secret
inline constexpr std::size_t nonce_size = 16;
// HMAC-SHA256 truncated to its first 192 bits (RFC 2104 section 5 allows
// truncation to no less than half the output): the whole 32 bytes would make
// the hello 60 bytes, past the 55 bytes of private data a connection request
// carries over RoCE (rxe: "private data of 60 bytes exceeds 55").
inline constexpr std::size_t mac_size = 24;

struct address {
  std::uint32_t rank = 0;
  std::uint8_t key[key_size] = {};      // acceptor: the pair's secret
  std::uint8_t nonce[nonce_size] = {};  // acceptor: its challenge for the connector
  std::uint8_t host_id[24] = {};        // boot id + network namespace: "same host" test
  std::string forced;                   // provider forced on this side ("" = choose), <= 15
  std::string soft;                     // "ip:port" of the soft listener, "" if none
  std::string shm;                      // "@name" of the shm listener, "" if none
  std::string verbs;                    // "ip:port" of the verbs listener, "" if none
};

inline void put_str(std::byte* p, std::size_t cap, const std::string& s) {
  std::size_t n = s.size() < cap - 1 ? s.size() : cap - 1;
  p[0] = std::byte(n);
  std::memcpy(p + 1, s.data(), n);
}
inline std::optional<std::string> get_str(const std::byte* p, std::size_t cap) {
  std::size_t n = std::size_t(p[0]);
  if (n > cap - 1) return std::nullopt;
  std::string s(reinterpret_cast<const char*>(p + 1), n);
  for (char c : s)
    if (c < 0x21 || c > 0x7e) return std::nullopt;
  return s;
}

// Layout: magic 0..4, rank 4..8, key 8..24, nonce 24..40, host id 40..64,
// forced 64..80, soft 80..114, shm 114..150, verbs 150..184 (strings: a length
// byte, then printable ASCII). "255.255.255.255:65535" is 21 characters.
inline constexpr std::size_t forced_cap = 16, soft_cap = 34, shm_cap = 36, verbs_cap = 34;

inline std::vector<char> encode(const address& a) {
  std::vector<char> out(addr_size, 0);
  auto* p = reinterpret_cast<std::byte*>(out.data());
  put32(p, addr_magic);
  put32(p + 4, a.rank);
  std::memcpy(p + 8, a.key, key_size);
  std::memcpy(p + 24, a.nonce, nonce_size);
  std::memcpy(p + 40, a.host_id, sizeof a.host_id);
  put_str(p + 64, forced_cap, a.forced);
  put_str(p + 80, soft_cap, a.soft);
  put_str(p + 114, shm_cap, a.shm);
  put_str(p + 150, verbs_cap, a.verbs);
  return out;
}

inline std::optional<address> decode_address(const std::vector<char>& bytes) {
  if (bytes.size() != addr_size) return std::nullopt;
  auto* p = reinterpret_cast<const std::byte*>(bytes.data());
  if (get32(p) != addr_magic) return std::nullopt;
  address a;
  a.rank = get32(p + 4);
  std::memcpy(a.key, p + 8, key_size);
  std::memcpy(a.nonce, p + 24, nonce_size);
  std::memcpy(a.host_id, p + 40, sizeof a.host_id);
  auto f = get_str(p + 64, forced_cap), s = get_str(p + 80, soft_cap),
       m = get_str(p + 114, shm_cap), v = get_str(p + 150, verbs_cap);
  if (!f || !s || !m || !v) return std::nullopt;
  a.forced = *f;
  a.soft = *s;
  a.shm = *m;
  a.verbs = *v;
  return a;
}

// The pair handshake, in the connection manager's private data (docs/GLOO.md,
// "What a local process or peer is trusted with"). The connector sends a
// hello: its rank, the rank it wants, a fresh nonce and
// HMAC(key, hello label, ranks, acceptor's nonce, its nonce). The acceptor
// accepts only a hello whose MAC checks, and answers with
// HMAC(key, reply label, ranks, both nonces), which the connector checks.
inline constexpr std::uint32_t hello_magic = 0x43564748;                      // "CVGH"
inline constexpr std::uint32_t reply_magic = 0x43564752;                      // "CVGR"
inline constexpr std::size_t hello_size = 4 + 4 + 4 + nonce_size + mac_size;  // 52
inline constexpr std::size_t reply_size = 4 + 4 + mac_size;                   // 32
// The smallest private data any transport's connection request carries (verbs
// over InfiniBand/RoCE, as rxe reports it); the hello and its reply must fit.
inline constexpr std::size_t min_connect_private_data = 55;
static_assert(hello_size <= min_connect_private_data && reply_size <= min_connect_private_data);

struct hello {
  std::uint32_t from_rank = 0;  // the connector
  std::uint32_t to_rank = 0;    // the acceptor it means
  std::uint8_t nonce[nonce_size] = {};
  std::uint8_t mac[mac_size] = {};
};

struct hello_reply {
  std::uint32_t rank = 0;  // the acceptor
  std::uint8_t mac[mac_size] = {};
};

inline std::vector<std::byte> encode(const hello& h) {
  std::vector<std::byte> out(hello_size);
  put32(out.data(), hello_magic);
  put32(out.data() + 4, h.from_rank);
  put32(out.data() + 8, h.to_rank);
  std::memcpy(out.data() + 12, h.nonce, nonce_size);
  std::memcpy(out.data() + 12 + nonce_size, h.mac, mac_size);
  return out;
}

inline std::optional<hello> decode_hello(const std::byte* in, std::size_t len) {
  if (len != hello_size || get32(in) != hello_magic) return std::nullopt;
  hello h;
  h.from_rank = get32(in + 4);
  h.to_rank = get32(in + 8);
  std::memcpy(h.nonce, in + 12, nonce_size);
  std::memcpy(h.mac, in + 12 + nonce_size, mac_size);
  return h;
}

inline std::vector<std::byte> encode(const hello_reply& r) {
  std::vector<std::byte> out(reply_size);
  put32(out.data(), reply_magic);
  put32(out.data() + 4, r.rank);
  std::memcpy(out.data() + 8, r.mac, mac_size);
  return out;
}

inline std::optional<hello_reply> decode_reply(const std::byte* in, std::size_t len) {
  if (len != reply_size || get32(in) != reply_magic) return std::nullopt;
  hello_reply r;
  r.rank = get32(in + 4);
  std::memcpy(r.mac, in + 8, mac_size);
  return r;
}

}  // namespace conveyor_gloo::wire
