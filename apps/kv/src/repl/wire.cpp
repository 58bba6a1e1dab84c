// The replication protocol's bytes (wire.hpp).
#include "repl/wire.hpp"

#include <cstring>

#include "cluster/shard_map.hpp"

namespace conveyor::kv::repl {

namespace {

constexpr char hello_magic[8] = {'C', 'V', 'K', 'V', 'R', 'E', 'P', 'L'};

void put32(std::byte* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint32_t get32(const std::byte* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}
std::uint64_t get64(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}

}  // namespace

std::string_view to_string(msg_type t) noexcept {
  switch (t) {
    case msg_type::snap_begin:
      return "snap_begin";
    case msg_type::snap_data:
      return "snap_data";
    case msg_type::snap_end:
      return "snap_end";
    case msg_type::stream:
      return "stream";
    case msg_type::ping:
      return "ping";
    case msg_type::ack:
      return "ack";
  }
  return "?";
}

void encode(const header& h, std::span<std::byte, header_bytes> out) noexcept {
  std::byte* p = out.data();
  put32(p, magic);
  p[4] = static_cast<std::byte>(h.type);
  p[5] = p[6] = p[7] = std::byte{0};
  put32(p + 8, h.credits);
  put32(p + 12, h.len);
  put64(p + 16, h.offset);
}

std::optional<header> decode(std::span<const std::byte> bytes, reader who, std::string& why) {
  if (bytes.size() < header_bytes) {
    why = "a message of " + std::to_string(bytes.size()) + " bytes, shorter than its header";
    return std::nullopt;
  }
  const std::byte* p = bytes.data();
  if (get32(p) != magic) {
    why = "not a replication message (bad magic)";
    return std::nullopt;
  }
  const auto t = std::to_integer<std::uint8_t>(p[4]);
  if (p[5] != std::byte{0} || p[6] != std::byte{0} || p[7] != std::byte{0}) {
    why = "reserved header bytes are not zero";
    return std::nullopt;
  }
  header h;
  h.credits = get32(p + 8);
  h.len = get32(p + 12);
  h.offset = get64(p + 16);
  const bool to_primary = t == static_cast<std::uint8_t>(msg_type::ack);
  const bool known = t >= static_cast<std::uint8_t>(msg_type::snap_begin) &&
                     t <= static_cast<std::uint8_t>(msg_type::ack);
  if (!known || to_primary != (who == reader::primary)) {
    why = "message type " + std::to_string(t) + " is not one a " +
          (who == reader::primary ? "primary" : "replica") + " accepts";
    return std::nullopt;
  }
  h.type = static_cast<msg_type>(t);
  const std::uint32_t limit = who == reader::primary ? ack_message : max_message;
  const std::uint32_t slots = who == reader::primary ? replica_slots : primary_slots;
  if (bytes.size() > limit || h.len != bytes.size() - header_bytes) {
    why = "payload length " + std::to_string(h.len) + " does not match the " +
          std::to_string(bytes.size()) + " bytes received (at most " + std::to_string(limit) + ")";
    return std::nullopt;
  }
  const bool carries = h.type == msg_type::snap_data || h.type == msg_type::stream;
  if (!carries && h.len != 0) {
    why = std::string(to_string(h.type)) + " carries no payload";
    return std::nullopt;
  }
  if (carries && h.len == 0) {
    why = std::string(to_string(h.type)) + " with an empty payload";
    return std::nullopt;
  }
  if (h.credits > slots) {
    why = "returns " + std::to_string(h.credits) + " credits, more than the " +
          std::to_string(slots) + " buffers";
    return std::nullopt;
  }
  return h;
}

std::vector<std::byte> encode_hello(const hello& h) {
  const std::size_t pass = std::min(h.password.size(), max_hello_password);
  std::vector<std::byte> out(hello_bytes + pass);
  std::memcpy(out.data(), hello_magic, 8);
  out[8] = std::byte{1};
  std::memcpy(out.data() + 9, h.node_id.data(), std::min<std::size_t>(h.node_id.size(), 40));
  std::memcpy(out.data() + 49, h.shard_id.data(), std::min<std::size_t>(h.shard_id.size(), 40));
  out[89] = static_cast<std::byte>(pass);
  std::memcpy(out.data() + hello_bytes, h.password.data(), pass);
  return out;
}

std::optional<hello> decode_hello(std::span<const std::byte> bytes, std::string& why) {
  if (bytes.size() < hello_bytes || std::memcmp(bytes.data(), hello_magic, 8) != 0) {
    why = "not a conveyor-kv replica hello";
    return std::nullopt;
  }
  if (bytes[8] != std::byte{1}) {
    why = "replication protocol version " + std::to_string(std::to_integer<int>(bytes[8])) +
          " (this primary speaks 1)";
    return std::nullopt;
  }
  hello h;
  h.node_id.assign(reinterpret_cast<const char*>(bytes.data()) + 9, 40);
  h.shard_id.assign(reinterpret_cast<const char*>(bytes.data()) + 49, 40);
  if (!cluster::valid_id(h.node_id) || !cluster::valid_id(h.shard_id)) {
    why = "a replica hello whose node or shard id is not 40 hex";
    return std::nullopt;
  }
  const auto pass = std::to_integer<std::size_t>(bytes[89]);
  if (pass > max_hello_password || bytes.size() < hello_bytes + pass) {
    why = "a replica hello whose password runs past its end";
    return std::nullopt;
  }
  h.password.assign(reinterpret_cast<const char*>(bytes.data()) + hello_bytes, pass);
  return h;
}

}  // namespace conveyor::kv::repl
