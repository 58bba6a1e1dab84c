// Redis Cluster's hash slots (apps/kv/src/cluster/slots.*): CRC16-XMODEM and
// the hash-tag rules of the cluster spec.
//
// The expected numbers were checked two ways before they were written here:
// with Python (binascii.crc_hqx(data, 0), which is CRC-CCITT/XMODEM, and a
// bitwise CRC16 of the spec's polynomial 0x1021), and against Redis itself:
// `redis-cli cluster keyslot` on a redis-server 7.0 started with
// --cluster-enabled yes (KEYSLOT needs no slots assigned). The last case
// repeats that comparison on a thousand generated keys (redis-server is a
// scripts/bootstrap package, so its absence fails the case).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster/slots.hpp"
#include "free_port.hpp"

namespace {

using conveyor::kv::cluster::crc16;
using conveyor::kv::cluster::hash_tag;
using conveyor::kv::cluster::slot_of;

TEST(cluster_slots, crc16_check_value_is_xmodem) {
  EXPECT_EQ(crc16("123456789"), 0x31C3);  // the XMODEM check value (the spec's too)
  EXPECT_EQ(crc16(""), 0);
}

TEST(cluster_slots, slots_of_plain_keys_match_redis) {
  EXPECT_EQ(slot_of("foo"), 12182);
  EXPECT_EQ(slot_of("bar"), 5061);
  EXPECT_EQ(slot_of("123456789"), 12739);  // 0x31C3 & 0x3FFF
  EXPECT_EQ(slot_of(""), 0);
  EXPECT_EQ(slot_of("a{b"), 13340);  // no '}' after the '{': the whole key
}

TEST(cluster_slots, a_hash_tag_puts_related_keys_in_one_slot) {
  EXPECT_EQ(slot_of("{user1000}.following"), slot_of("{user1000}.followers"));
  EXPECT_EQ(slot_of("{user1000}.following"), slot_of("user1000"));
  EXPECT_EQ(slot_of("{user1000}.following"), 3443);
  EXPECT_EQ(hash_tag("{user1000}.following"), "user1000");
}

TEST(cluster_slots, an_empty_tag_hashes_the_whole_key) {
  EXPECT_EQ(hash_tag("foo{}{bar}"), "foo{}{bar}");
  EXPECT_EQ(slot_of("foo{}{bar}"), 8363);
  EXPECT_EQ(slot_of("foo{}{bar}"), crc16("foo{}{bar}") & 0x3FFF);
  EXPECT_EQ(slot_of("{}"), 15257);
}

TEST(cluster_slots, the_tag_runs_from_the_first_open_brace_to_the_next_close) {
  EXPECT_EQ(hash_tag("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(slot_of("foo{{bar}}zap"), slot_of("{bar"));
  EXPECT_EQ(slot_of("foo{{bar}}zap"), 4015);
  EXPECT_EQ(hash_tag("foo{bar}{zap}"), "bar");
  EXPECT_EQ(slot_of("foo{bar}{zap}"), slot_of("bar"));
  EXPECT_EQ(hash_tag("}{a}"), "a");  // a '}' before the first '{' does not count
  EXPECT_EQ(slot_of("}{a}"), 15495);
}

TEST(cluster_slots, binary_keys_hash_every_byte) {
  const std::string key("\xff\x00{\x00}", 5);
  EXPECT_EQ(hash_tag(key), std::string(1, '\0'));
  EXPECT_EQ(slot_of(key), 0);  // crc16("\0") == 0
  EXPECT_EQ(slot_of(std::string("a\0b", 3)), crc16(std::string("a\0b", 3)) & 0x3FFF);
}

// ---- the oracle: a cluster-enabled redis-server's CLUSTER KEYSLOT.

// redis-server's Unix socket, whose path is ours alone (a TCP port probed free
// can be taken by a test running beside this one before redis binds it).
int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) return -1;
  path.copy(a.sun_path, path.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

TEST(cluster_slots, a_thousand_keys_match_redis_cluster_keyslot) {
  const char* redis = "/usr/bin/redis-server";
  ASSERT_EQ(::access(redis, X_OK), 0) << "no " << redis << ": run scripts/bootstrap (redis-server)";
  auto dir = std::filesystem::temp_directory_path() / ("cvy-keyslot-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string sock = (dir / "redis.sock").string();
  pid_t pid = -1;
  int fd = -1;
  // No TCP client port (--port 0); cluster mode still binds its bus port,
  // which a test beside this one could take first: then redis exits, try again.
  for (int attempt = 0; attempt < 3 && fd < 0; ++attempt) {
    const int bus = kvtest::free_loopback_port();
    ASSERT_GT(bus, 0);
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string b = std::to_string(bus), conf = (dir / "nodes.conf").string();
      ::execl(redis, redis, "--port", "0", "--unixsocket", sock.c_str(), "--cluster-enabled", "yes",
              "--cluster-port", b.c_str(), "--cluster-config-file", conf.c_str(), "--dir",
              dir.c_str(), "--save", "", "--appendonly", "no", "--loglevel", "warning",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 100 && fd < 0 && ::waitpid(pid, nullptr, WNOHANG) == 0; ++i) {
      fd = connect_unix(sock);
      if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (fd < 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  std::mt19937 rng(35);
  std::vector<std::string> keys;
  const std::string alphabet = "ab{}{}xyz\x01\xff";
  for (int i = 0; i < 1000; ++i) {
    std::string k(rng() % 12, '\0');
    for (auto& c : k) c = alphabet[rng() % alphabet.size()];
    keys.push_back(k);
  }
  std::string request;
  for (const auto& k : keys)
    request += "*3\r\n$7\r\nCLUSTER\r\n$7\r\nKEYSLOT\r\n$" + std::to_string(k.size()) + "\r\n" + k +
               "\r\n";
  std::string reply;
  if (fd >= 0) {
    for (std::size_t off = 0; off < request.size();) {
      auto w = ::write(fd, request.data() + off, request.size() - off);
      if (w <= 0) break;
      off += static_cast<std::size_t>(w);
    }
    char buf[65536];
    std::size_t lines = 0;
    while (lines < keys.size()) {
      auto r = ::read(fd, buf, sizeof buf);
      if (r <= 0) break;
      reply.append(buf, static_cast<std::size_t>(r));
      lines = static_cast<std::size_t>(std::count(reply.begin(), reply.end(), '\n'));
    }
    ::close(fd);
  }
  if (fd >= 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  std::filesystem::remove_all(dir);
  ASSERT_GE(fd, 0) << "redis-server did not listen on " << sock;

  std::size_t at = 0, checked = 0;
  for (const auto& k : keys) {
    auto end = reply.find("\r\n", at);
    ASSERT_NE(end, std::string::npos) << "short reply after " << checked << " keys";
    ASSERT_EQ(reply[at], ':') << reply.substr(at, end - at);
    EXPECT_EQ(std::stoi(reply.substr(at + 1, end - at - 1)), slot_of(k)) << "key " << k;
    at = end + 2;
    ++checked;
  }
  EXPECT_EQ(checked, keys.size());
}

}  // namespace
