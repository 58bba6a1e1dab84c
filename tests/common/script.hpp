// tests/common/script.hpp — the two-party exchange used across processes and hosts.
//
// The target publishes two regions in the accept's private data (data, then a
// 64-byte atomic area) and waits for one final SEND; the initiator WRITEs a
// prefix of the data region, READs the whole region back, runs atomics (when the
// connection negotiated RFC 7306), then SENDs the final message. Both sides
// compute the expected bytes from the same seeds, so the target can verify
// everything the initiator did and report it through its exit status.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/process.hpp"

namespace cvt {

struct two_party_script {
  std::string provider = "soft";
  conveyor::progress_mode progress = conveyor::progress_mode::thread;
  bool crc = true;
  std::size_t region_size = 4 * 1024 * 1024;
  std::uint64_t region_seed = 0x1000;
  std::size_t write_len = 1536 * 1024 + 3;
  std::uint64_t write_seed = 0x2000;
  std::size_t msg_len = 100003;
  std::uint64_t msg_seed = 0x3000;
  std::uint32_t max_mss = 0;     // initiator: also require connection mss <= this (0: no check)
  std::string expect_data_path;  // initiator: also require this connection data_path ("": no check)
  std::uint32_t target_uid = 0;  // target child: switch to this uid/gid first (0: stay)

  static constexpr std::uint64_t cas_initial = 0x0123456789abcdefULL;
  static constexpr std::uint64_t cas_swap = 0xfedcba9876543210ULL;
  static constexpr std::uint64_t faa_initial = 0xfffffffffffffff0ULL;
  static constexpr std::uint64_t faa_add = 0x21;  // wraps around 2^64

  // "--key=value" arguments for a child, and back.
  std::vector<std::string> to_args() const;
  static two_party_script from_args(const child_args& a);
};

// Initiator side: connects to `address` and runs the script. "" on success,
// otherwise what went wrong. Logs progress lines to stderr when `verbose`.
std::string run_two_party_initiator(const two_party_script& s, const std::string& address,
                                    const std::string& netns = {});

// Target roles, run inside a child process (see child_main):
//   "verify": accept one connection, wait for the final SEND, verify, exit 0/1.
//   "serve":  accept one connection and serve one-sided operations until killed
//             (or the lifetime alarm); exits 0 if the peer went away.
int run_two_party_target(const child_args& a);
int run_two_party_initiator_child(const child_args& a);

// Joins the network namespace /var/run/netns/<name> (this thread). "" or why not.
std::string enter_netns(const std::string& name);

}  // namespace cvt
