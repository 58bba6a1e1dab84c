// tools/conveyor/perftest.hpp — `conveyor write_bw`, `read_lat`, ...: perftest's
// programs and flags, with perftest's meanings, over `conveyor perf`'s runs.
//
//   conveyor write_bw                         # server (no host): listens on 0.0.0.0:18515
//   conveyor write_bw -s 65536 -D 2 HOST      # client: bare host = port 18515
//   conveyor read_lat -a -d shm localhost     # every size 2 B .. 8 MiB over shm
//
// `conveyor perf` keeps its own short letters (-s server, -p provider, -t test,
// -m mode, -S size) for the scripts that use them; docs/CLI.md maps the two.
#pragma once

#include "cli_fwd.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "perf_options.hpp"

namespace conveyor::tool {

// What perftest's flags were given as (filled by CLI11, turned into
// perf_options by perftest_to_perf).
struct perftest_args {
  std::string host;            // empty: run the server
  std::uint16_t port = 18515;  // -p
  std::string device;          // -d: soft, shm, verbs:<name>, or an rdma-core name (mlx5_0)
  std::string size;            // -s
  bool all = false;            // -a
  std::uint64_t iters = 0;     // -n
  double duration = 0;         // -D
  std::uint32_t qps = 1;       // -q
  std::uint32_t tx_depth = 0;  // -t
  std::uint32_t rx_depth = 0;  // -r
  std::optional<std::uint32_t> inline_size;  // -I
  std::uint32_t post_list = 0;               // -l / -Q: post N, signal one
  bool report_gbits = false;                 // --report_gbits
  bool rdma_cm = false;                    // -R: accepted (Conveyor always connects through its CM)
  bool cpu_freq = false;                   // -F: accepted (nothing to check)
  std::optional<std::uint32_t> gid_index;  // -x: verbs' GID index
  std::string atomic_type;                 // -A: CMP_AND_SWAP or FETCH_AND_ADD (atomic_*)
  std::string connection = "RC";           // -c: RC only
  std::optional<std::uint32_t> mtu;        // -m: refused with the reason
  bool bidirectional = false;              // -b: refused with the reason
  std::optional<std::uint32_t> ib_port;    // -i: accepted (the route picks the port)
  bool events = false;                     // -e: refused with the reason
  bool no_peak = false;                    // -N
  std::string output;                      // --output bandwidth|latency
  bool run_infinitely = false;             // --run_infinitely: refused with the reason
  // Conveyor's own long options, for what perftest has no letter for.
  std::string provider;
  bool json = false, verify = false, quiet = false;
  std::string progress = "thread";
  int cpu = -1;
  double timeout = 10;
};

struct perftest_command {
  CLI::App* app = nullptr;
  perf_test test = perf_test::write;
  perf_mode mode = perf_mode::bw;
};

// Registers write_bw, write_lat, read_bw, read_lat, send_bw, send_lat,
// atomic_bw and atomic_lat on `app`, all filling `args`.
std::vector<perftest_command> add_perftest_commands(CLI::App& app, perftest_args& args);
// perftest's flags as `conveyor perf` options; "" or what is wrong (a flag
// that does not apply, with what to use instead).
std::string perftest_to_perf(const perftest_args& a, perf_test test, perf_mode mode,
                             perf_options& o);
// Runs the command that was parsed, or returns -1 if none of them was.
int run_perftest(const std::vector<perftest_command>& cmds, const perftest_args& args);

}  // namespace conveyor::tool
