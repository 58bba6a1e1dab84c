// conveyor — Conveyor's command-line tool.
//
//   conveyor devices [--json] [--provider P]
//   conveyor perf --server [ADDRESS] [options]
//   conveyor perf ADDRESS --test write --mode bw --size 1M [options]
//   conveyor write_bw|write_lat|read_bw|read_lat|send_bw|send_lat|atomic_bw|atomic_lat
//            [perftest's flags] [HOST]   (no HOST: the server)
//   conveyor kv serve [--port 7379] [--appendonly yes] [options]
//   conveyor kv get|set|del KEY [VALUE] [-h HOST|@NAME] [-p PORT] [-a PASSWORD]   (RDMA client;
//            the load generator is bench/kv's conveyor-kv-bench)
//   conveyor kv cluster up|create|status [--shards 3] [--etcd host:port]   (docs/KV-CLUSTER.md)
//   conveyor ping --server [ADDRESS] | conveyor ping ADDRESS   (connectivity check)
//   conveyor env                    (environment variables: value and default)
//   conveyor version | --version   (the build facts: version, commit, compiler, providers)
//
// Exit status: 0 success, 1 the run failed (message on stderr), 2 bad arguments.
#include <CLI/CLI.hpp>
#include <conveyor/conveyor.hpp>

#include <cstdio>
#include <string>

#include "kv_client.hpp"
#include "kv_cluster.hpp"
#include "kv_serve.hpp"
#include "perf.hpp"
#include "perftest.hpp"
#include "ping.hpp"

namespace {

// What `conveyor --version` prints: the library that is loaded (which may be a
// different build than this program when libconveyor.so was upgraded alone).
std::string version_text() {
  const auto& b = conveyor::build_info();
  auto sv = [](std::string_view v) { return std::string(v.empty() ? "unknown" : v); };
  std::string out = "conveyor " + std::string(conveyor::version_string) + "\n";
  out += "  library    libconveyor " + sv(b.version) + ", commit " + sv(b.commit) + "\n";
  out += "  compiler   " + sv(b.compiler) + ", " + sv(b.build_type) + "\n";
  out += "  providers  " + sv(b.providers) +
         " (built in; `conveyor devices` shows which are usable)\n";
  out += "  ISA-L      " + sv(b.isal);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace conveyor::tool;
  CLI::App app{"conveyor: RDMA devices and performance (docs/CLI.md)", "conveyor"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text,
                       "print the version and the facts of the build, then exit");
  devices_options dopts;
  auto* devices = app.add_subcommand("devices", "list every device of every provider");
  devices->add_flag("--json", dopts.json, "JSON output (schema conveyor-devices/1)");
  devices->add_option("-p,--provider", dopts.provider, "only this provider");
  perf_options popts;
  auto* perf = app.add_subcommand(
      "perf", "measure bandwidth, latency or message rate against a `perf --server`");
  add_perf_options(*perf, popts);
  perftest_args ptargs;  // conveyor write_bw & co. (perftest.cpp)
  const auto perftest = add_perftest_commands(app, ptargs);
  // conveyor-kv (apps/kv, docs/KV.md): the server, and the client commands.
  auto* kv = app.add_subcommand(
      "kv", "conveyor-kv: key-value store with one-sided RDMA GETs and the Redis protocol");
  kv->require_subcommand(1);
  kv_serve_options kv_sopts;
  auto* kv_serve = kv->add_subcommand("serve", "run the server (RESP on TCP; docs/KV.md)");
  add_kv_serve_options(*kv_serve, kv_sopts);
  kv_client_options kv_copts;  // kv get|set|del (kv_client.cpp)
  const auto kv_client = add_kv_client_commands(*kv, kv_copts);
  kv_cluster_options kv_clopts;  // kv cluster create|status|up (kv_cluster.cpp)
  const auto kv_cluster = add_kv_cluster_commands(*kv, kv_clopts);
  ping_options pingopts;
  auto* ping = app.add_subcommand(
      "ping", "check RDMA to a host: SEND, WRITE and READ, verified (rping-style)");
  add_ping_options(*ping, pingopts);
  auto* env = app.add_subcommand(
      "env", "every environment variable Conveyor reads: its value now and its default");
  auto* version =
      app.add_subcommand("version", "print the version and the facts of the build (as --version)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e) == 0 ? 0 : 2;  // prints the help or the error
    if (rc != 0 && *perf) {
      if (auto hint = perftest_habit_hint({argv + 1, argv + argc}); !hint.empty())
        std::fprintf(stderr, "conveyor perf: %s\n", hint.c_str());
    }
    return rc;
  }
  if (*devices) return run_devices(dopts);
  if (*env) return run_env();
  if (*ping) return run_ping(pingopts);
  if (int rc = run_perftest(perftest, ptargs); rc >= 0) return rc;
  if (*kv_serve) return run_kv_serve(kv_sopts);
  if (int rc = run_kv_client(kv_client, kv_copts); rc >= 0) return rc;
  if (int rc = run_kv_cluster(kv_cluster, kv_clopts); rc >= 0) return rc;
  if (*version) {
    std::printf("%s\n", version_text().c_str());
    return 0;
  }
  if (auto why = validate_perf_options(popts); !why.empty()) {
    std::fprintf(stderr, "conveyor perf: %s\n", why.c_str());
    if (auto hint = perftest_habit_hint({argv + 1, argv + argc}); !hint.empty())
      std::fprintf(stderr, "conveyor perf: %s\n", hint.c_str());
    return 2;
  }
  return run_perf(popts);
}
