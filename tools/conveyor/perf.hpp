// tools/conveyor/perf.hpp — entry points of the `conveyor` subcommands.
#pragma once

#include "perf_options.hpp"

namespace conveyor::tool {

// Each returns the process exit status (0 ok, 1 failure) and prints its own errors.
int run_perf_client(const perf_options& o);
int run_perf_server(const perf_options& o);
// Both sides: resolves the address (bare hosts, ::1, names), takes SIGINT and
// SIGTERM (perf_signals.hpp), then runs the server or the client.
int run_perf(perf_options o);

struct devices_options {
  bool json = false;
  std::string provider;  // "" = all
};
int run_devices(const devices_options& o);
// `conveyor env`: the environment variables Conveyor reads, now and by default.
int run_env();

}  // namespace conveyor::tool
