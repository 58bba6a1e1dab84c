// The cluster tests' map: three shards of one primary each (nodes '0', '1',
// '2' at 127.0.0.1:7001..7003; shard of node '1' owns 5461..10922), slots
// 0..99 served by nobody, and keys chosen by the slot they land in.
#pragma once

#include <string>

#include "cluster/shard_map.hpp"
#include "cluster/slots.hpp"

namespace kvtest {

inline std::string hex_id(char c) {
  return std::string(40, c);
}

inline conveyor::kv::cluster::shard_map three_shards() {
  conveyor::kv::cluster::shard_map m;
  m.epoch = 3;
  for (int i = 0; i < 3; ++i)
    m.nodes.push_back(
        {hex_id(static_cast<char>('0' + i)), "127.0.0.1:" + std::to_string(7001 + i), "", ""});
  m.shards.push_back({hex_id('a'), {{100, 5460}}, hex_id('0'), {hex_id('0')}, {}, {}});
  m.shards.push_back({hex_id('b'), {{5461, 10922}}, hex_id('1'), {hex_id('1')}, {}, {}});
  m.shards.push_back({hex_id('c'), {{10923, 16383}}, hex_id('2'), {hex_id('2')}, {}, {}});
  return m;
}

// A key whose slot is in [lo, hi], distinct per `tag`.
inline std::string key_in(unsigned lo, unsigned hi, const std::string& tag = "k") {
  for (int i = 0;; ++i) {
    std::string k = tag + std::to_string(i);
    const unsigned s = conveyor::kv::cluster::slot_of(k);
    if (s >= lo && s <= hi) return k;
  }
}

}  // namespace kvtest
