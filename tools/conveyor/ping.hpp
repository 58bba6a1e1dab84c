// tools/conveyor/ping.hpp — `conveyor ping`: is RDMA between here and there
// working? (rping / ibv_rc_pingpong). docs/CLI.md.
//
//   conveyor ping --server [ADDRESS]      # default 0.0.0.0:18515 (shm: @conveyor-ping)
//   conveyor ping HOST[:PORT]             # SEND echoed, RDMA WRITE then READ back, all verified
//   conveyor ping -C 20 HOST[:PORT]       # each step 20 times: min/median/max per step
#pragma once

#include "cli_fwd.hpp"

#include <cstdint>
#include <string>

namespace conveyor::tool {

struct ping_options {
  bool server = false;
  bool once = false;  // server: exit after one client
  std::string address;
  std::string provider = "soft";
  std::string device;
  std::uint32_t size = 4096;
  std::uint32_t count = 1;  // client: times each step runs (rping -C, ibv_rc_pingpong -n)
  double timeout = 5;
};

void add_ping_options(CLI::App& app, ping_options& o);
// 0: every step verified; 1: a step failed (one line on stderr says why); 2: bad arguments.
int run_ping(const ping_options& o);

}  // namespace conveyor::tool
