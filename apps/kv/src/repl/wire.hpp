// conveyor::kv::repl — the replication protocol's bytes (issue 35): the hello a
// replica presents when it connects to its primary's replication listener, and
// the header every message carries, as pure functions over byte spans (no
// QPs, no state), so they are unit-tested and fuzzed alone.
//
// A replica connects (Conveyor's connection manager: soft over TCP across
// hosts, shm on one) with the hello in the private data; both sides post
// their receive buffers before the connection is made. Every message is one
// SEND: a 24-byte header and `len` payload bytes.
//
//   primary -> replica  snap_begin  offset S: a full snapshot follows; the
//                                   replica empties its keyspace
//                       snap_data   payload: records of the snapshot (the AOF
//                                   rewrite form, RESP arrays)
//                       snap_end    offset S: the snapshot is whole; the
//                                   replica's applied offset is S
//                       stream      payload: the records written from
//                                   `offset` on (the AOF's records, RESP
//                                   arrays, MULTI/EXEC blocks included)
//                       ping        nothing but credits
//   replica -> primary  ack         offset: every record before it is applied
//
// Flow control is by credits: each side starts with as many credits as the
// other posted receive buffers (replica_slots, primary_slots), spends one per
// message and learns in every message it receives how many buffers the
// peer has posted again (`credits`). The primary keeps its last credit for a
// ping, so returning credits never waits for data.
//
// Every header read from a peer is copied once and checked once (decode):
// the magic, a type that this direction may carry, a length that matches
// what arrived and is within the message size, credits within the slots.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::kv::repl {

inline constexpr std::uint32_t magic = 0x50525643;  // "CVRP" little-endian
inline constexpr std::size_t header_bytes = 24;
// Receive buffers: the replica posts replica_slots of max_message bytes for
// the primary's messages; the primary posts primary_slots of ack_message
// bytes for each replica's acks.
inline constexpr std::uint32_t replica_slots = 16;
inline constexpr std::uint32_t max_message = 256u << 10;
inline constexpr std::uint32_t max_payload = max_message - header_bytes;
inline constexpr std::uint32_t primary_slots = 16;
inline constexpr std::uint32_t ack_message = 64;

enum class msg_type : std::uint8_t { snap_begin = 1, snap_data, snap_end, stream, ping, ack };
std::string_view to_string(msg_type t) noexcept;

struct header {
  msg_type type = msg_type::ping;
  std::uint32_t credits = 0;  // receive buffers the sender posted again since its last message
  std::uint32_t len = 0;      // payload bytes after the header
  std::uint64_t offset = 0;
};

// Writes the header's 24 bytes.
void encode(const header& h, std::span<std::byte, header_bytes> out) noexcept;

// Which side reads the message: a primary reads only acks, a replica
// everything but acks.
enum class reader { primary, replica };
// Checks a received message of `bytes` (what the completion said arrived);
// nullopt with `why` when it is not a message this side accepts.
std::optional<header> decode(std::span<const std::byte> bytes, reader who, std::string& why);

// The hello in the connection request's private data: "CVKVREPL", version 1,
// the replica's node id and the id of the shard it replicates (40 hex each),
// then the password's length (one byte) and the password (the cluster's
// requirepass, which the primary compares in constant time; at most
// max_hello_password bytes, so the hello fits the 251 bytes of private data).
inline constexpr std::size_t hello_bytes = 8 + 1 + 40 + 40 + 1;
inline constexpr std::size_t max_hello_password = 160;
struct hello {
  std::string node_id, shard_id, password;
};
// The password is cut at max_hello_password bytes (the server refuses a
// longer requirepass in cluster mode).
std::vector<std::byte> encode_hello(const hello& h);
std::optional<hello> decode_hello(std::span<const std::byte> bytes, std::string& why);

}  // namespace conveyor::kv::repl
