// conveyor — Conveyor's command-line tool.
//
//   conveyor devices [--json] [--provider P]
//   conveyor perf --server [ADDRESS] [options]
//   conveyor perf ADDRESS --test write --mode bw --size 1M [options]
//   conveyor kv serve [--port 7379] [--appendonly yes] [options]
//   conveyor kv get|set|del KEY [VALUE] | bench [options]   (RDMA client)
//   conveyor version
//
// Exit status: 0 success, 1 the run failed (message on stderr), 2 bad arguments.
#include <CLI/CLI.hpp>
#include <conveyor/conveyor.hpp>

#include <cstdio>

#include "kv_client.hpp"
#include "kv_serve.hpp"
#include "perf.hpp"

int main(int argc, char** argv) {
  using namespace conveyor::tool;
  CLI::App app{"conveyor: RDMA devices and performance (docs/CLI.md)", "conveyor"};
  app.require_subcommand(1);
  devices_options dopts;
  auto* devices = app.add_subcommand("devices", "list every device of every provider");
  devices->add_flag("--json", dopts.json, "JSON output (schema conveyor-devices/1)");
  devices->add_option("-p,--provider", dopts.provider, "only this provider");
  perf_options popts;
  auto* perf = app.add_subcommand(
      "perf", "measure bandwidth, latency or message rate against a `perf --server`");
  add_perf_options(*perf, popts);
  // conveyor-kv (apps/kv, docs/KV.md): the server, and the client commands.
  auto* kv = app.add_subcommand(
      "kv", "conveyor-kv: key-value store with one-sided RDMA GETs and the Redis protocol");
  kv->require_subcommand(1);
  kv_serve_options kv_sopts;
  auto* kv_serve = kv->add_subcommand("serve", "run the server (RESP on TCP; docs/KV.md)");
  add_kv_serve_options(*kv_serve, kv_sopts);
  kv_client_options kv_copts;  // kv get|set|del|bench (kv_client.cpp)
  const auto kv_client = add_kv_client_commands(*kv, kv_copts);
  auto* version = app.add_subcommand("version", "print the library version");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // prints the help or the error
  }
  if (*devices) return run_devices(dopts);
  if (*kv_serve) return run_kv_serve(kv_sopts);
  if (int rc = run_kv_client(kv_client, kv_copts); rc >= 0) return rc;
  if (*version) {
    std::printf("conveyor %s\n", conveyor::version_string);
    return 0;
  }
  if (auto why = validate_perf_options(popts); !why.empty()) {
    std::fprintf(stderr, "conveyor perf: %s\n", why.c_str());
    return 2;
  }
  return popts.server ? run_perf_server(popts) : run_perf_client(popts);
}
