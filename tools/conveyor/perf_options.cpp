// Option parsing and validation of `conveyor perf`.
#include "perf_options.hpp"

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

namespace conveyor::tool {

std::string_view to_string(perf_test t) noexcept {
  switch (t) {
    case perf_test::write:
      return "write";
    case perf_test::read:
      return "read";
    case perf_test::send:
      return "send";
    case perf_test::fetch_add:
      return "fetch-add";
    case perf_test::compare_swap:
      return "compare-swap";
    case perf_test::write_imm:
      return "write-imm";
  }
  return "?";
}

std::string_view to_string(perf_mode m) noexcept {
  switch (m) {
    case perf_mode::bw:
      return "bw";
    case perf_mode::lat:
      return "lat";
    case perf_mode::rate:
      return "rate";
  }
  return "?";
}

bool is_atomic(perf_test t) noexcept {
  return t == perf_test::fetch_add || t == perf_test::compare_swap;
}
bool consumes_receive(perf_test t) noexcept {
  return t == perf_test::send || t == perf_test::write_imm;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p == text.data()) return std::nullopt;
  std::string unit(p, end);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  std::uint64_t mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb")
    mult = 1ull << 10;
  else if (unit == "m" || unit == "mib" || unit == "mb")
    mult = 1ull << 20;
  else if (unit == "g" || unit == "gib" || unit == "gb")
    mult = 1ull << 30;
  else
    return std::nullopt;
  if (v > (~0ull) / mult) return std::nullopt;
  return v * mult;
}

std::string format_size(std::uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + " GiB";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

namespace {

// A CLI11 validator/transformer for sizes with units.
std::string check_size(std::string& s) {
  if (!parse_size(s)) return "not a size: '" + s + "' (examples: 8, 4K, 64KiB, 1M)";
  return {};
}

// Validators whose messages name the bound and nothing else (CLI11's own print
// the far end of the range too: DBL_MAX written out in 309 digits).
CLI::Validator positive_seconds() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v) || v <= 0)
          return "must be a number of seconds greater than 0, not '" + s + "'";
        return {};
      },
      "SECONDS>0");
}
CLI::Validator non_negative_seconds() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v) || v < 0)
          return "must be a number of seconds, 0 or more, not '" + s + "'";
        return {};
      },
      "SECONDS>=0");
}
// A whole number in [lo, hi]; "-1" is refused, not wrapped to 2^64 - 1.
CLI::Validator whole_number(std::uint64_t lo, std::uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        std::uint64_t v = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi)
          return "must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) +
                 ", not '" + s + "'";
        return {};
      },
      "N");
}

}  // namespace

void add_perf_options(CLI::App& app, perf_options& o) {
  auto& size_text = o.typed.size;
  auto& sizes_text = o.typed.sizes;
  auto& all_sizes = o.typed.all;
  auto& max_size_text = o.typed.max_size;
  auto& max_memory_text = o.typed.max_memory;
  app.add_option(
      "address", o.address,
      "client: the server's address (ip:port); server: where to listen (default 0.0.0.0:18515)");
  app.add_flag("-s,--server", o.server, "run the server side (waits for a client)");
  app.add_flag("--persistent", o.persistent, "server: keep serving clients one after another");
  app.add_option("-p,--provider", o.provider, "provider: soft, shm, verbs")->default_val("soft");
  app.add_option("-d,--device", o.device, "device name (default: the provider's first device)");
  app.add_option("-t,--test", o.typed.test,
                 "operation: write, read, send, fetch-add, compare-swap, write-imm")
      ->check(CLI::IsMember({"write", "read", "send", "fetch-add", "compare-swap", "write-imm"}))
      ->default_str("write");
  app.add_option("-m,--mode", o.typed.mode,
                 "bw (bandwidth), lat (round-trip latency), rate (message rate)")
      ->check(CLI::IsMember({"bw", "lat", "rate"}))
      ->default_str("bw");
  app.add_option("-S,--size", size_text, "message size (8, 4K, 1M, ...)")
      ->check(CLI::Validator(check_size, "SIZE"));
  app.add_option("--sizes", sizes_text, "comma-separated message sizes, run in order");
  app.add_flag("-a,--all", all_sizes, "sweep sizes 2 B .. 8 MiB in powers of two");
  app.add_option("-n,--iters", o.iters,
                 "iterations per size (default: lat 1000; bw/rate use --duration)")
      ->check(whole_number(1, 1ull << 40));
  app.add_option("-D,--duration", o.duration, "seconds per size (default for bw/rate: 1)")
      ->check(positive_seconds());
  app.add_option("--warmup", o.warmup,
                 "untimed iterations before each size (default: lat 100, bw 0)")
      ->check(whole_number(0, 1ull << 40));
  app.add_option("-q,--qps", o.qps,
                 "number of connected QPs (bandwidth and rate: data is spread round-robin; "
                 "READ and atomic latency: each round trip takes the next QP)")
      ->check(CLI::Range(1u, perf_max_qps))
      ->default_val(1);
  app.add_option("--tx-depth", o.tx_depth,
                 "outstanding requests per QP (default: bw/rate 128; READ/atomics limited by ORD)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--slots", o.slots,
                 "buffers per QP that bandwidth and rate requests rotate through (default: one "
                 "per outstanding request, within 64 MiB a QP; 1: every request uses the same "
                 "buffer, as ib_write_bw and most benchmarks do)")
      ->check(CLI::Range(1u, perf_max_slots));
  app.add_option("--rx-depth", o.rx_depth, "receives posted per QP for send / write-imm")
      ->check(CLI::Range(1, 8192))
      ->default_val(512);
  app.add_option("-I,--inline", o.inline_size, "post messages up to this size inline")
      ->check(CLI::Range(0, 4096))
      ->default_val(64);
  app.add_option("--batch", o.batch,
                 "signal one request in N, post N at a time (default: bw 16, rate 16, lat 1)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--crc", o.typed.crc, "ask for MPA CRC32c: on or off (soft)")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str("on");
  app.add_option("--progress", o.typed.progress, "progress engine: thread or manual")
      ->check(CLI::IsMember({"thread", "manual"}))
      ->default_str("thread");
  app.add_option("--cpu", o.cpu, "pin this process (and its engine thread) to one CPU")
      ->check(whole_number(0, 65535));
  app.add_flag("--verify", o.verify, "check the bytes moved, on both sides (slower)");
  app.add_flag("--json", o.json, "print results as JSON (schema conveyor-perf/2, docs/CLI.md)");
  app.add_flag("--quiet", o.quiet, "no progress lines on stderr");
  app.add_flag(
      "--report_gbits,--report-gbits", o.report_gbits,
      "bandwidth in Gb/s (10^9 bit/s) instead of MB/s (10^6 byte/s), as perftest's --report_gbits");
  app.add_flag("-F,--CPU-freq")
      ->description("accepted for perftest habits: there is no CPU-frequency check to silence");
  app.add_option("--timeout", o.timeout,
                 "seconds without progress (or to connect) before giving up")
      ->check(positive_seconds())
      ->default_val(10);
  app.add_option("--accept-timeout", o.accept_timeout,
                 "server: seconds to wait for a client (0 = forever)")
      ->check(non_negative_seconds())
      ->default_val(0);
  app.add_option("--max-size", max_size_text,
                 "server: largest message size it accepts (default 64M)")
      ->check(CLI::Validator(check_size, "SIZE"));
  app.add_option(
         "--max-memory", max_memory_text,
         "server: most memory one client may make it allocate for its data region (default 1G)")
      ->check(CLI::Validator(check_size, "SIZE"));

  app.callback([&o, &size_text, &sizes_text, &all_sizes, &max_size_text, &max_memory_text] {
    o.sizes.clear();
    int given = (!size_text.empty()) + (!sizes_text.empty()) + (all_sizes ? 1 : 0);
    if (given > 1) throw CLI::ValidationError("--size, --sizes and --all", "choose one of them");
    if (!size_text.empty()) o.sizes.push_back(*parse_size(size_text));
    if (!sizes_text.empty()) {
      std::string_view s(sizes_text);
      while (!s.empty()) {
        auto comma = s.find(',');
        std::string item(s.substr(0, comma));
        auto v = parse_size(item);
        if (!v) throw CLI::ValidationError("--sizes", "not a size: '" + item + "'");
        o.sizes.push_back(*v);
        if (comma == std::string_view::npos) break;
        s.remove_prefix(comma + 1);
      }
    }
    if (all_sizes)
      for (std::uint64_t v = 2; v <= (8ull << 20); v *= 2) o.sizes.push_back(v);
    if (!max_size_text.empty()) o.max_size = *parse_size(max_size_text);
    if (!max_memory_text.empty()) o.max_memory = *parse_size(max_memory_text);
    const std::map<std::string, perf_test> tests{{"write", perf_test::write},
                                                 {"read", perf_test::read},
                                                 {"send", perf_test::send},
                                                 {"fetch-add", perf_test::fetch_add},
                                                 {"compare-swap", perf_test::compare_swap},
                                                 {"write-imm", perf_test::write_imm}};
    o.test = tests.at(o.typed.test);
    o.mode = o.typed.mode == "lat"    ? perf_mode::lat
             : o.typed.mode == "rate" ? perf_mode::rate
                                      : perf_mode::bw;
    o.progress = o.typed.progress == "manual" ? progress_mode::manual : progress_mode::thread;
    o.crc = o.typed.crc == "on";
  });
}

bool names_shm(std::string_view provider_or_device) {
  // Name check: the command line names a provider before any device opens.
  return provider_or_device == "shm" || provider_or_device.starts_with("shm:");
}

std::string resolve_address(const perf_options& o, std::string_view address, std::string& why) {
  std::string a(address);
  // shm: abstract names and socket paths; never a host.
  if (names_shm(o.provider) || names_shm(o.device) || a.starts_with('@') || a.starts_with('/') ||
      a.starts_with('.'))
    return a;
  const std::string port = std::to_string(o.default_port);
  std::string host, service;
  if (a.starts_with('[')) {  // [v6] or [v6]:port
    auto close = a.find(']');
    if (close == std::string::npos) {
      why = "address \"" + a + "\": no closing ']'";
      return {};
    }
    host = a.substr(1, close - 1);
    if (close + 1 == a.size())
      service = port;
    else if (a[close + 1] == ':')
      service = a.substr(close + 2);
    else {
      why = "address \"" + a + "\": expected [ipv6]:port";
      return {};
    }
  } else if (std::count(a.begin(), a.end(), ':') >= 2) {  // a bare IPv6 address: "::1", "fe80::2"
    host = a;
    service = port;
  } else if (auto colon = a.rfind(':'); colon != std::string::npos) {
    host = a.substr(0, colon);
    service = a.substr(colon + 1);
  } else {  // a bare host: perftest's habit, the default port
    host = a;
    service = port;
  }
  if (host.empty()) host = "0.0.0.0";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
      rc != 0 || res == nullptr) {
    const bool bad_port =
        service.empty() || service.find_first_not_of("0123456789") != std::string::npos;
    why = "address \"" + a + "\": " +
          (bad_port ? "the port '" + service + "' is not a number"
                    : "cannot resolve host '" + host + "': " + ::gai_strerror(rc)) +
          " (addresses look like 192.0.2.1:18515, [::1]:18515, HOST or HOST:PORT)";
    return {};
  }
  // IPv4 first when a name has both ("localhost"): the server's default
  // address, 0.0.0.0, is IPv4.
  const addrinfo* pick = res;
  for (const addrinfo* r = res; r != nullptr; r = r->ai_next)
    if (r->ai_family == AF_INET) {
      pick = r;
      break;
    }
  char buf[INET6_ADDRSTRLEN] = {};
  std::string out;
  if (pick->ai_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(pick->ai_addr)->sin6_addr, buf,
                sizeof buf);
    out = "[" + std::string(buf) + "]:" + service;
  } else {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(pick->ai_addr)->sin_addr, buf,
                sizeof buf);
    out = std::string(buf) + ":" + service;
  }
  ::freeaddrinfo(res);
  return out;
}

namespace {
bool is_number(std::string_view s) {
  return !s.empty() && std::isdigit(static_cast<unsigned char>(s.front())) &&
         parse_size(s).has_value();
}
}  // namespace

std::string perftest_habit_hint(const std::vector<std::string>& args) {
  std::string hint;
  auto add = [&hint](const std::string& s) {
    if (hint.find(s) == std::string::npos) hint += (hint.empty() ? "" : "; ") + s;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool num_next = i + 1 < args.size() && is_number(args[i + 1]);
    if (a == "-s" && num_next)
      add("-s is --server in `conveyor perf`: the message size is -S/--size");
    if (a == "-p" && num_next)
      add("-p is --provider in `conveyor perf`: put the port in the address (HOST:PORT)");
    if (a == "-t" && num_next) add("-t is --test in `conveyor perf`: the tx depth is --tx-depth");
    if (a == "-m" && num_next) add("-m is --mode in `conveyor perf`; the MTU is the path's own");
    if (a == "-x" || a == "-R" || a == "--rdma_cm" || a == "--ib-dev" || a == "--port")
      add(a + " is perftest's spelling");
  }
  if (hint.empty()) return {};
  return hint +
         ". perftest's flags, with perftest's meanings, are taken by `conveyor write_bw`, "
         "`read_lat`, ... "
         "(e.g. conveyor write_bw -s 65536 -p 18515 HOST; docs/CLI.md, \"perftest habits\")";
}

std::string validate_perf_options(perf_options& o) {
  if (!o.provider.empty() && o.provider.find_first_not_of("0123456789") == std::string::npos)
    return "provider '" + o.provider +
           "' is a number: -p is --provider (soft, shm, verbs) here, not a port";
  if (!o.address.empty() && o.address.find_first_not_of("0123456789") == std::string::npos)
    return "'" + o.address +
           "' is a number, not an address (HOST, HOST:PORT, [IPv6]:PORT or @shm-name)";
  if (o.server) {
    if (o.address.empty()) o.address = names_shm(o.provider) ? "@conveyor-perf" : "0.0.0.0:18515";
    return {};
  }
  if (o.address.empty())
    return "the server's address is missing (e.g. conveyor perf 10.0.0.1:18515)";
  if (o.iters != 0 && o.duration != 0) return "--iters and --duration exclude each other";
  if (o.sizes.empty())
    o.sizes.push_back(is_atomic(o.test) ? 8 : (o.mode == perf_mode::bw ? 65536 : 8));
  for (auto s : o.sizes) {
    if (is_atomic(o.test) && s != 8)
      return "atomics move exactly 8 bytes: use --size 8 (or leave it out)";
    if (o.mode == perf_mode::lat && o.test == perf_test::write && s < 8)
      return "write latency needs --size of at least 8 (the peer watches the last 8 bytes)";
    if (s > 0x7FFFFFFFull) return "message size " + std::to_string(s) + " exceeds 2 GiB - 1";
  }
  if (o.iters == 0 && o.duration == 0) {
    if (o.mode == perf_mode::lat)
      o.iters = 1000;
    else
      o.duration = 1.0;
  }
  if (o.warmup == 0 && o.mode == perf_mode::lat) o.warmup = 100;
  if (o.tx_depth == 0) o.tx_depth = o.mode == perf_mode::lat ? 1 : 128;
  if (o.batch == 0)
    o.batch = o.mode == perf_mode::lat ? 1 : std::min<std::uint32_t>(16, o.tx_depth);
  if (o.batch > o.tx_depth)
    return "--batch " + std::to_string(o.batch) + " exceeds --tx-depth " +
           std::to_string(o.tx_depth);
  if (o.mode == perf_mode::lat && o.slots != 0)
    return "--slots is for bandwidth and rate runs (a latency run uses one buffer each way)";
  if (o.mode == perf_mode::lat && o.qps != 1 && o.test != perf_test::read && !is_atomic(o.test))
    return "latency runs over several QPs are READ and atomics only (the server answers WRITE, "
           "SEND and WRITE_WITH_IMM on one QP): drop --qps";
  return {};
}

}  // namespace conveyor::tool
