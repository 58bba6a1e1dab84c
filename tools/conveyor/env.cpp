// `conveyor env`: every environment variable Conveyor reads, its current value
// and its default (docs/CONFIGURATION.md).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "perf.hpp"

namespace conveyor::tool {

namespace {

struct variable {
  const char* name;
  const char* fallback;  // what applies when it is unset
  const char* meaning;
};

constexpr variable variables[] = {
    {"CONVEYOR_LOG", "warn", "log level: error, warn, info, debug"},
    {"CONVEYOR_SPIN_US", "20",
     "soft, shm: completion_queue::wait busy-polls this many µs (device_options::spin_us)"},
    {"CONVEYOR_ENGINE_SPIN_US", "50",
     "soft, shm: the engine thread busy-polls this many µs after activity"},
    {"CONVEYOR_ENGINE_PARK", "1",
     "soft: 0 keeps the engine thread awake while the application polls"},
    {"CONVEYOR_SOFT_LARGE_FPDUS", "1",
     "soft: 0 keeps every FPDU within one TCP MSS (no 0x08 in MPA, no 64 KiB FPDUs)"},
    {"CONVEYOR_SHM_CMA", "on",
     "shm: off forbids cross-memory attach (bulk data staged through the rings)"},
    {"CONVEYOR_SHM_DIRECT", "on", "shm: off forbids direct mapping of a peer's allocated regions"},
    {"CONVEYOR_VERBS_GID_INDEX", "(the device's choice)", "verbs: the GID index connections use"},
    {"CONVEYOR_GLOO_DEVICE", "(shm on one host, soft across hosts)",
     "conveyor-gloo: soft, shm or verbs[:name]"},
    {"CONVEYOR_GLOO_PROGRESS", "manual", "conveyor-gloo: thread keeps the device's engine thread"},
    {"CONVEYOR_GLOO_SPIN_US", "(device_options::spin_us)",
     "conveyor-gloo: cq.wait busy-polls this many µs"},
    {"CONVEYOR_GLOO_CRC", "0", "conveyor-gloo: 1 asks soft peers for MPA CRC32c"},
    {"CONVEYOR_GLOO_TRACE", "(unset: off)", "conveyor-gloo: set to trace every transfer on stderr"},
};

}  // namespace

int run_env() {
  std::printf("%-26s %-22s %-36s %s\n", "variable", "value", "default", "meaning");
  for (const auto& v : variables) {
    const char* now = std::getenv(v.name);
    const std::string shown = now == nullptr ? "(unset)" : *now == '\0' ? "(empty)" : now;
    std::printf("%-26s %-22s %-36s %s\n", v.name, shown.c_str(), v.fallback, v.meaning);
  }
  return 0;
}

}  // namespace conveyor::tool
