// tools/conveyor/perf_report.hpp — results of `conveyor perf`: statistics, the
// table for people and the JSON document (schema "conveyor-perf/2", docs/CLI.md).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "perf_options.hpp"

namespace conveyor::tool {

inline constexpr const char* perf_schema = "conveyor-perf/2";

// Round-trip latency of one size, microseconds.
struct latency_stats {
  double min = 0, mean = 0, p50 = 0, p99 = 0, p999 = 0, max = 0;
  double stdev = 0;  // population standard deviation
  // From per-iteration samples in nanoseconds (sorted in place).
  static latency_stats from_ns(std::vector<std::uint32_t>& ns);
};

struct perf_result {
  perf_test test = perf_test::write;
  perf_mode mode = perf_mode::bw;
  std::uint64_t size = 0;
  std::uint64_t iterations = 0;  // operations timed
  double seconds = 0;
  double mb_per_s = 0;  // 10^6 bytes per second
  double mops = 0;      // 10^6 operations per second
  std::optional<latency_stats> lat;
  double user_s = 0, sys_s = 0;            // this process during the timed part
  double peer_user_s = 0, peer_sys_s = 0;  // the server's, during the phase
  bool verified = false;
  std::uint64_t verify_errors = 0;
  // CPU seconds (both sides, user+sys) per GB (10^9 bytes) moved.
  double cpu_s_per_gb() const;
};

// What was run, resolved (printed before the results).
struct perf_settings {
  std::string provider, device, transport;
  std::string local_address, peer_address;
  std::uint32_t ird = 0, ord = 0;
  bool extensions = false;
  std::string progress;
  // Buffers per QP the requests rotate through, as laid out (--slots, or one
  // per outstanding request by default; a latency run uses one).
  std::uint32_t slots = 0;
  // The transport's own facts, as qp.connection() has them (qp.hpp).
  std::optional<iwarp_connection_attr> iwarp;
  std::optional<shm_connection_attr> shm;
  std::optional<verbs_connection_attr> verbs;
  perf_options opts;  // test, mode, sizes, qps, depths, batch, inline, cpu, iters/duration
};

void print_settings(std::FILE* out, const perf_settings& s);
void print_table_header(std::FILE* out, const perf_settings& s);
void print_table_row(std::FILE* out, const perf_settings& s, const perf_result& r);
// The factor perftest's report applies to a latency test's samples: 0.5 for
// WRITE and SEND (ib_write_lat and ib_send_lat print half the ping-pong's round
// trip), 1 for READ and atomics (their round trip is the operation).
double perftest_latency_factor(perf_test test);
nlohmann::json to_json(const perf_settings& s, const std::vector<perf_result>& results);

}  // namespace conveyor::tool
