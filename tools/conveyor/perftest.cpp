// `conveyor write_bw` & co.: perftest's flags over `conveyor perf`'s runs.
#include "perftest.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include "perf.hpp"

namespace conveyor::tool {

namespace {

struct entry {
  const char* name;
  perf_test test;
  perf_mode mode;
  const char* what;
};

constexpr entry entries[] = {
    {"write_bw", perf_test::write, perf_mode::bw, "RDMA WRITE bandwidth (as ib_write_bw)"},
    {"write_lat", perf_test::write, perf_mode::lat, "RDMA WRITE latency (as ib_write_lat)"},
    {"read_bw", perf_test::read, perf_mode::bw, "RDMA READ bandwidth (as ib_read_bw)"},
    {"read_lat", perf_test::read, perf_mode::lat, "RDMA READ latency (as ib_read_lat)"},
    {"send_bw", perf_test::send, perf_mode::bw, "SEND bandwidth (as ib_send_bw)"},
    {"send_lat", perf_test::send, perf_mode::lat, "SEND latency (as ib_send_lat)"},
    {"atomic_bw", perf_test::fetch_add, perf_mode::bw, "atomics bandwidth (as ib_atomic_bw)"},
    {"atomic_lat", perf_test::fetch_add, perf_mode::lat, "atomics latency (as ib_atomic_lat)"},
};

void add_flags(CLI::App& c, perftest_args& a, bool atomic) {
  c.add_option("host", a.host, "the server's host (no host: run the server, as perftest does)");
  c.add_option("-p,--port", a.port, "port to listen on or connect to (18515)")->default_val(18515);
  c.add_option("-d,--ib-dev", a.device,
               "device: soft, shm, verbs:NAME or an rdma-core name such as mlx5_0 (soft)");
  c.add_option("-s,--size", a.size, "message size in bytes (units work: 4K, 1M) (bw 65536, lat 8)");
  c.add_flag("-a,--all", a.all, "every size from 2 B to 8 MiB in powers of two");
  c.add_option("-n,--iters", a.iters, "iterations per size (lat: 1000; bw: --duration 1 s)");
  c.add_option("-D,--duration", a.duration, "seconds per size");
  c.add_option("-q,--qp", a.qps, "number of QPs (bw)")->default_val(1);
  c.add_option("-t,--tx-depth", a.tx_depth, "outstanding requests per QP (bw 128)");
  c.add_option("-r,--rx-depth", a.rx_depth, "receives the server keeps posted per QP (send) (512)");
  c.add_option("-I,--inline_size", a.inline_size, "post messages up to this size inline (64)");
  c.add_option("-l,--post_list,-Q,--cq-mod", a.post_list,
               "post N requests at once, signal the last (bw 16)");
  c.add_flag("--report_gbits,--report-gbits", a.report_gbits,
             "bandwidth in Gb/s (10^9 bit/s) instead of MB/s");
  c.add_flag("-R,--rdma_cm", a.rdma_cm,
             "accepted: Conveyor always connects through its connection manager");
  c.add_flag("-F,--CPU-freq", a.cpu_freq, "accepted: there is no CPU-frequency check to silence");
  c.add_option("-x,--gid-index", a.gid_index, "verbs: the GID index (CONVEYOR_VERBS_GID_INDEX)");
  c.add_option("-c,--connection", a.connection, "transport type: RC (the only one)")
      ->default_val("RC");
  c.add_option("-m,--mtu", a.mtu, "refused: the MTU is the path's (soft: TCP's MSS)");
  c.add_flag("-b,--bidirectional", a.bidirectional, "refused: run a client on each side instead");
  c.add_option("-i,--ib-port", a.ib_port,
               "accepted: Conveyor's connection manager uses the port the route to the peer "
               "leaves by");
  c.add_flag("-e,--events", a.events, "refused: the perf client polls its completion queues");
  c.add_flag("-N,--noPeak", a.no_peak, "no peak bandwidth (its column reads 0)");
  c.add_option("--output", a.output, "print only this number: bandwidth (bw) or latency (lat)")
      ->check(CLI::IsMember({"bandwidth", "latency"}));
  c.add_flag("--run_infinitely", a.run_infinitely,
             "refused: give a long -D instead (Ctrl-C keeps the finished rows)");
  if (atomic)
    c.add_option("-A,--atomic_type", a.atomic_type, "FETCH_AND_ADD (default) or CMP_AND_SWAP")
        ->check(CLI::IsMember({"FETCH_AND_ADD", "CMP_AND_SWAP"}));
  // Conveyor's own options that perftest has no letter for.
  c.add_option("--provider", a.provider, "provider: soft, shm, verbs (else from -d; soft)");
  c.add_flag("--json", a.json, "JSON on stdout (schema conveyor-perf/2)");
  c.add_flag("--verify", a.verify, "check the bytes moved, on both sides");
  c.add_flag("--quiet", a.quiet, "no progress lines on stderr");
  c.add_option("--progress", a.progress, "progress engine: thread or manual")
      ->check(CLI::IsMember({"thread", "manual"}));
  c.add_option("--cpu", a.cpu, "pin this process to one CPU");
  c.add_option("--timeout", a.timeout,
               "seconds without progress (or to connect) before giving up (10)");
}

}  // namespace

std::vector<perftest_command> add_perftest_commands(CLI::App& app, perftest_args& args) {
  std::vector<perftest_command> out;
  for (const auto& e : entries) {
    auto* c = app.add_subcommand(e.name, std::string(e.what) + "; perftest's flags (docs/CLI.md)");
    c->group("perftest's programs");
    add_flags(*c, args, is_atomic(e.test));
    out.push_back({c, e.test, e.mode});
  }
  return out;
}

std::string perftest_to_perf(const perftest_args& a, perf_test test, perf_mode mode,
                             perf_options& o) {
  if (a.connection != "RC")
    return "-c " + a.connection + ": Conveyor's queue pairs are reliable connected only (-c RC)";
  if (a.mtu)
    return "-m: there is no MTU to set: soft runs over TCP (its MSS is in the settings), verbs "
           "uses the path's";
  if (a.bidirectional)
    return "-b: bidirectional runs are not supported: start a client on each side";
  if (a.events)
    return "-e: waiting on completion events is not offered: the perf client polls its CQs, "
           "and soft/shm deliver completions from their engine thread either way";
  if (a.run_infinitely)
    return "--run_infinitely: not supported: give a long duration (-D 3600); Ctrl-C prints "
           "the finished rows and stops";
  if (!a.output.empty() && (a.output == "latency") != (mode == perf_mode::lat))
    return "--output " + a.output + ": this is a " +
           (mode == perf_mode::lat ? "latency test (--output latency)"
                                   : "bandwidth test (--output bandwidth)");
  o = perf_options{};
  o.test = test;
  if (is_atomic(test) && a.atomic_type == "CMP_AND_SWAP") o.test = perf_test::compare_swap;
  o.mode = mode;
  // -d: a Conveyor device name, or an rdma-core one (then the verbs provider's).
  if (!a.device.empty()) {
    const std::string provider = a.device.substr(0, a.device.find(':'));
    // Name check: -d's syntax ("<provider>[:<label>]" is Conveyor's), before any device opens.
    const bool conveyor_name = provider == "soft" || provider == "shm" || provider == "verbs";
    o.device = conveyor_name ? a.device : "verbs:" + a.device;
    o.provider = o.device.substr(0, o.device.find(':'));
  }
  if (!a.provider.empty()) o.provider = a.provider;
  o.default_port = a.port;
  o.server = a.host.empty();
  const std::string port = std::to_string(a.port);
  if (names_shm(o.provider))
    o.address = "@conveyor-perf-" + port;  // one host: the port names the socket
  else if (o.server)
    o.address = "0.0.0.0:" + port;
  else
    o.address = a.host;
  if (!a.size.empty()) {
    auto v = parse_size(a.size);
    if (!v) return "-s: not a size: '" + a.size + "' (bytes, or 4K, 1M)";
    if (a.all) return "-s and -a: choose one";
    o.sizes.push_back(*v);
  }
  // -a: 2 B .. 8 MiB; a WRITE ping-pong watches the last 8 bytes, so write_lat starts at 8.
  if (a.all)
    for (std::uint64_t v = test == perf_test::write && mode == perf_mode::lat ? 8 : 2;
         v <= (8ull << 20); v *= 2)
      o.sizes.push_back(v);
  // perftest's -a runs atomics at their one size.
  if (a.all && is_atomic(test)) o.sizes = {8};
  o.iters = a.iters;
  o.duration = a.duration;
  if (a.duration < 0) return "-D: must be a number of seconds greater than 0";
  if (a.qps < 1 || a.qps > perf_max_qps)
    return "-q: from 1 to " + std::to_string(perf_max_qps) + " QPs";
  o.qps = a.qps;
  if (a.tx_depth > 4096) return "-t: the tx depth goes up to 4096";
  o.tx_depth = a.tx_depth;
  if (a.rx_depth > 8192) return "-r: the rx depth goes up to 8192";
  if (a.rx_depth != 0) o.rx_depth = a.rx_depth;
  if (a.inline_size) {
    if (*a.inline_size > 4096) return "-I: inline sizes go up to 4096";
    o.inline_size = *a.inline_size;
  }
  if (a.post_list > 4096) return "-l/-Q: up to 4096";
  o.batch = a.post_list;
  o.report_gbits = a.report_gbits;
  o.perftest_report = true;
  o.perftest_no_peak = a.no_peak;
  o.perftest_output = a.output;
  o.json = a.json;
  o.verify = a.verify;
  o.quiet = a.quiet;
  o.progress = a.progress == "manual" ? progress_mode::manual : progress_mode::thread;
  o.cpu = a.cpu;
  if (a.timeout <= 0) return "--timeout: must be a number of seconds greater than 0";
  o.timeout = a.timeout;
  return {};
}

int run_perftest(const std::vector<perftest_command>& cmds, const perftest_args& args) {
  for (const auto& c : cmds) {
    if (!*c.app) continue;
    const std::string name = c.app->get_name();
    perf_options o;
    std::string why = perftest_to_perf(args, c.test, c.mode, o);
    if (why.empty()) why = validate_perf_options(o);
    if (!why.empty()) {
      std::fprintf(stderr, "conveyor %s: %s\n", name.c_str(), why.c_str());
      return 2;
    }
    if (args.gid_index) {
      // Name check: -x is an option of the verbs provider, chosen by name before any device opens.
      if (o.provider == "verbs")
        ::setenv("CONVEYOR_VERBS_GID_INDEX", std::to_string(*args.gid_index).c_str(), 1);
      else
        std::fprintf(stderr, "conveyor %s: -x applies to the verbs provider only; ignored\n",
                     name.c_str());
    }
    return run_perf(o);
  }
  return -1;
}

}  // namespace conveyor::tool
