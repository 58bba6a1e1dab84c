// The replication protocol's bytes (apps/kv/src/repl/wire.hpp): round trips,
// and every message a side must refuse.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <vector>

#include <conveyor/cm.hpp>

#include "repl/wire.hpp"

namespace repl = conveyor::kv::repl;
using repl::header;
using repl::msg_type;
using repl::reader;

namespace {

std::vector<std::byte> message(const header& h, std::size_t payload) {
  std::vector<std::byte> m(repl::header_bytes + payload, std::byte{'x'});
  repl::encode(h, std::span<std::byte, repl::header_bytes>(m.data(), repl::header_bytes));
  return m;
}

std::string refusal(std::span<const std::byte> m, reader who) {
  std::string why;
  auto h = repl::decode(m, who, why);
  EXPECT_FALSE(h.has_value());
  return why;
}

const std::string id_a(40, 'a'), id_b(40, 'b');

}  // namespace

TEST(kv_repl_wire, every_type_round_trips_to_the_side_that_reads_it) {
  for (auto t : {msg_type::snap_begin, msg_type::snap_data, msg_type::snap_end, msg_type::stream,
                 msg_type::ping}) {
    const bool carries = t == msg_type::snap_data || t == msg_type::stream;
    header h{t, 3, carries ? 100u : 0u, 0x0102030405060708ull};
    auto m = message(h, h.len);
    std::string why;
    auto d = repl::decode(m, reader::replica, why);
    ASSERT_TRUE(d.has_value()) << why;
    EXPECT_EQ(d->type, t);
    EXPECT_EQ(d->credits, 3u);
    EXPECT_EQ(d->len, h.len);
    EXPECT_EQ(d->offset, h.offset);
    EXPECT_NE(refusal(m, reader::primary).find("not one a primary accepts"), std::string::npos);
  }
  auto ack = message({msg_type::ack, repl::replica_slots, 0, 42}, 0);
  std::string why;
  auto d = repl::decode(ack, reader::primary, why);
  ASSERT_TRUE(d.has_value()) << why;
  EXPECT_EQ(d->offset, 42u);
  EXPECT_NE(refusal(ack, reader::replica).find("not one a replica accepts"), std::string::npos);
}

TEST(kv_repl_wire, short_foreign_or_inconsistent_messages_are_refused) {
  std::vector<std::byte> tiny(10);
  EXPECT_NE(refusal(tiny, reader::primary).find("shorter than its header"), std::string::npos);
  auto m = message({msg_type::ack, 0, 0, 1}, 0);
  m[0] = std::byte{'G'};
  EXPECT_NE(refusal(m, reader::primary).find("bad magic"), std::string::npos);
  m = message({msg_type::ack, 0, 0, 1}, 0);
  m[5] = std::byte{1};
  EXPECT_NE(refusal(m, reader::primary).find("reserved"), std::string::npos);
  m = message({msg_type::ack, 0, 0, 1}, 0);
  m[4] = std::byte{99};
  EXPECT_NE(refusal(m, reader::primary).find("type 99"), std::string::npos);
  m[4] = std::byte{0};
  EXPECT_NE(refusal(m, reader::replica).find("type 0"), std::string::npos);
  // The length must be what arrived, within the message size.
  m = message({msg_type::stream, 0, 50, 0}, 49);
  EXPECT_NE(refusal(m, reader::replica).find("does not match"), std::string::npos);
  m = message({msg_type::ack, 0, 8, 0}, 9);
  EXPECT_NE(refusal(m, reader::primary).find("does not match"), std::string::npos);
  m = message({msg_type::ack, 0, 0, 0}, 0);
  m.resize(repl::ack_message + 1);
  EXPECT_NE(refusal(m, reader::primary).find("does not match"), std::string::npos);
  // Payload only where the type carries one, and then not empty.
  m = message({msg_type::ping, 0, 4, 0}, 4);
  EXPECT_NE(refusal(m, reader::replica).find("carries no payload"), std::string::npos);
  m = message({msg_type::stream, 0, 0, 0}, 0);
  EXPECT_NE(refusal(m, reader::replica).find("empty payload"), std::string::npos);
  // Credits within the buffers the reader posted.
  m = message({msg_type::ack, repl::replica_slots + 1, 0, 0}, 0);
  EXPECT_NE(refusal(m, reader::primary).find("credits"), std::string::npos);
  m = message({msg_type::ping, repl::primary_slots + 1, 0, 0}, 0);
  EXPECT_NE(refusal(m, reader::replica).find("credits"), std::string::npos);
}

TEST(kv_repl_wire, random_bytes_never_pass_as_a_message_by_accident) {
  std::mt19937_64 rng(7);
  std::vector<std::byte> m(64);
  for (int i = 0; i < 20000; ++i) {
    for (auto& b : m) b = static_cast<std::byte>(rng());
    std::string why;
    EXPECT_FALSE(repl::decode(m, reader::primary, why).has_value());
  }
}

TEST(kv_repl_wire, hello_round_trips_and_refuses_anything_else) {
  auto h = repl::encode_hello({id_a, id_b});
  std::string why;
  auto d = repl::decode_hello(h, why);
  ASSERT_TRUE(d.has_value()) << why;
  EXPECT_EQ(d->node_id, id_a);
  EXPECT_EQ(d->shard_id, id_b);
  EXPECT_EQ(d->password, "");
  auto hp = repl::encode_hello({id_a, id_b, "sekrit"});
  d = repl::decode_hello(hp, why);
  ASSERT_TRUE(d.has_value()) << why;
  EXPECT_EQ(d->password, "sekrit");
  EXPECT_LE(repl::encode_hello({id_a, id_b, std::string(300, 'p')}).size(),
            conveyor::max_private_data);
  hp.pop_back();  // the password runs past the end
  EXPECT_FALSE(repl::decode_hello(hp, why).has_value());
  EXPECT_NE(why.find("password"), std::string::npos);
  EXPECT_FALSE(repl::decode_hello(std::span(h).first(20), why).has_value());
  auto bad = h;
  bad[8] = std::byte{2};
  EXPECT_FALSE(repl::decode_hello(bad, why).has_value());
  EXPECT_NE(why.find("version 2"), std::string::npos);
  bad = h;
  bad[12] = std::byte{'Z'};  // not hex
  EXPECT_FALSE(repl::decode_hello(bad, why).has_value());
  EXPECT_NE(why.find("40 hex"), std::string::npos);
  bad = h;
  bad[0] = std::byte{'X'};
  EXPECT_FALSE(repl::decode_hello(bad, why).has_value());
}
