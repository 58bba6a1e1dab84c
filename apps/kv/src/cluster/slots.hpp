// conveyor::kv::cluster — Redis Cluster's hash slots: CRC16 and key -> slot.
//
// The cluster spec ("Keys distribution model") maps a key to one of 16384
// slots by CRC16 (XMODEM: polynomial 0x1021, initial value 0, no reflection,
// no final xor) of the key, taken modulo 16384. A key holding a `{hash tag}`
// hashes the tag only, so related keys share a slot:
//
//   slot_of("{user1000}.following") == slot_of("{user1000}.followers")
//
// The tag is what lies between the key's first '{' and the first '}' after it,
// and only when that is not empty; otherwise the whole key is hashed
// ("foo{}{bar}" hashes all of it, "foo{{bar}}zap" hashes "{bar").
//
// Pure functions over bytes, no state: safe from any thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace conveyor::kv::cluster {

inline constexpr std::uint16_t slot_count = 16384;

// CRC16-XMODEM of `bytes` (crc16("123456789") == 0x31C3).
std::uint16_t crc16(std::string_view bytes) noexcept;

// The part of `key` that is hashed: its non-empty hash tag, else the whole key.
std::string_view hash_tag(std::string_view key) noexcept;

// The key's slot, 0..16383, as redis-cli's CLUSTER KEYSLOT reports it.
std::uint16_t slot_of(std::string_view key) noexcept;

}  // namespace conveyor::kv::cluster
