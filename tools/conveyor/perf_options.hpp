// tools/conveyor/perf_options.hpp — what `conveyor perf` is asked to do.
#pragma once

#include <conveyor/conveyor.hpp>
#include "cli_fwd.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::tool {

enum class perf_test : std::uint8_t { write, read, send, fetch_add, compare_swap, write_imm };
enum class perf_mode : std::uint8_t { bw, lat, rate };

std::string_view to_string(perf_test t) noexcept;
std::string_view to_string(perf_mode m) noexcept;
bool is_atomic(perf_test t) noexcept;
// SEND and WRITE_WITH_IMM consume a receive at the target (flow-controlled).
bool consumes_receive(perf_test t) noexcept;
// The most data QPs one client may connect (--qps).
inline constexpr std::uint32_t perf_max_qps = 4096;
// The most buffers per QP that requests may rotate through (--slots).
inline constexpr std::uint32_t perf_max_slots = 4096;

struct perf_options {
  bool server = false;
  bool persistent = false;  // server: serve clients one after another
  std::string address;      // client: the server's; server: where to bind
  std::string provider = "soft";
  std::string device;  // a device name; "" = the provider's first
  perf_test test = perf_test::write;
  perf_mode mode = perf_mode::bw;
  std::vector<std::uint64_t> sizes;  // message sizes in bytes, in run order
  std::uint64_t iters = 0;           // per size; 0 = use duration
  double duration = 0;               // seconds per size; 0 = use iters
  std::uint64_t warmup = 0;          // untimed iterations first
  std::uint32_t qps = 1;
  std::uint32_t tx_depth = 0;    // outstanding requests per QP (0 = mode default)
  std::uint32_t slots = 0;       // buffers per QP the requests rotate through (0 = one per request)
  std::uint32_t rx_depth = 512;  // receives posted per QP for send/write-imm
  std::uint32_t inline_size = 64;  // messages up to this size go inline
  std::uint32_t batch = 0;         // signal one request in `batch` (0 = mode default)
  bool crc = true;
  progress_mode progress = progress_mode::thread;
  int cpu = -1;  // pin the process to this CPU
  bool verify = false;
  bool json = false;
  bool quiet = false;                  // no progress lines on stderr
  bool report_gbits = false;           // bandwidth in Gb/s (10^9 bit/s) instead of MB/s (10^6 B/s)
  std::uint16_t default_port = 18515;  // of a bare host (perftest's port)
  double timeout = 10;                 // seconds without progress before giving up
  double accept_timeout = 0;           // server: seconds to wait for a client (0 = forever)
  std::uint64_t max_size = 64ull << 20;  // server: largest message it accepts
  // server: the most memory one client may make it allocate for its data
  // region (QPs x slots x slot size), so a hello cannot ask for gigabytes.
  std::uint64_t max_memory = 1ull << 30;
  // `conveyor write_bw` & co. report as perftest does (perf_report.hpp):
  // perftest's columns, MB/sec = 2^20 bytes/s, and WRITE/SEND latency as half
  // the round trip (ib_write_lat, ib_send_lat); READ and atomics keep the round trip.
  bool perftest_report = false;
  bool perftest_no_peak = false;  // -N: the peak column reads 0, as perftest's
  std::string perftest_output;    // --output: "bandwidth" or "latency": that number alone

  // The size options as typed (turned into `sizes` / `max_size` after parsing).
  struct typed {
    std::string size, sizes, max_size, max_memory;
    std::string test = "write", mode = "bw", progress = "thread", crc = "on";
    bool all = false;
  } typed;
};

// Registers the options of `conveyor perf` on `app`; validate_perf_options()
// must run after parsing.
void add_perf_options(CLI::App& app, perf_options& o);
// Fills defaults that depend on the mode and checks combinations; returns ""
// or a message for the user.
std::string validate_perf_options(perf_options& o);

// The address to connect to or listen on, as the library takes it: a bare host
// gets the default port ("10.0.0.2" -> "10.0.0.2:18515"), a bare IPv6 address
// its brackets ("::1" -> "[::1]:18515"), a host name is resolved ("localhost",
// "node7:7471"); shm names ("@name", paths) are left alone. "" and a message in
// `why` when it cannot be resolved.
std::string resolve_address(const perf_options& o, std::string_view address, std::string& why);

// The command line's provider or device name ("shm", "shm:<label>") is shm,
// whose addresses are socket names, not hosts: for defaults and hints decided
// before any device is open (after, read the device's transport_type).
bool names_shm(std::string_view provider_or_device);

// When `conveyor perf`'s arguments look like perftest's (where its short
// letters mean something else: -s size, -p port, -t tx depth, -m MTU, -S SL),
// a sentence that points to the right flag or to `conveyor write_bw` & co.; "" otherwise.
std::string perftest_habit_hint(const std::vector<std::string>& perf_args);

// "8", "4K", "4KiB", "64k", "1M", "1MiB", "2G": bytes; nullopt when malformed.
std::optional<std::uint64_t> parse_size(std::string_view text);
std::string format_size(std::uint64_t bytes);

}  // namespace conveyor::tool
