// conveyor-kv-bench — one load generator for conveyor-kv over RDMA, any RESP
// server (conveyor-kv's RESP port, Redis) and memcached (its text protocol), so
// that bench/kv/matrix compares them with the same client. The server's
// address takes redis-cli's letters, as `conveyor kv get` does: -h host, -p
// port, -a password; an "@name" host or --address is shm's, anything else soft's
// unless --provider says otherwise.
//
//   conveyor-kv-bench --keys 100000 --value-size 64 --get-ratio 0.95 --zipf 0.99 --depth 16
//   conveyor-kv-bench -h @kv --get-ratio 1 --depth 16          # RDMA over shm
//   conveyor-kv-bench --protocol resp -p 6379 --clients 32 --server-pid 1234 --json
//   conveyor-kv-bench --protocol memcached -p 11211 --depth 16
//
// Each of --clients threads has its own connection. A step is either a GET
// step of --depth GETs (an MGET over RDMA; depth GET commands written at once,
// then every reply read, on the sockets) or a SET step (one SET RPC over RDMA;
// depth pipelined SETs on the sockets); steps are drawn so that the fraction of
// operations that are GETs is --get-ratio. Latencies are per step. Every reply
// is checked: a GET of a loaded key must return the loaded value; a miss, a
// wrong value or an error reply is an error, and a run with errors exits 1.
//
// kv_bench.cpp: the command line; kv_bench_conns.cpp: the connections;
// kv_bench_run.cpp: the load, the clients and the report.
#include <CLI/CLI.hpp>

#include "kv_bench.hpp"

int main(int argc, char** argv) {
  using conveyor::kvbench::bench_options;
  bench_options o;
  CLI::App app{
      "conveyor-kv-bench: GET/SET mix against a conveyor-kv (RDMA or RESP), Redis or memcached "
      "server: ops/s and latency percentiles (bench/kv/README.md)",
      "conveyor-kv-bench"};
  // -h is the host, as in redis-cli.
  app.set_help_flag("--help", "print this help and exit");
  app.add_option("-h,--host", o.host,
                 "the server's host, or \"@name\" for an shm server (rdma); default 127.0.0.1");
  app.add_option("-p,--port", o.port,
                 "the server's port: kv serve --rdma-listen's (rdma, 7380), its --port or "
                 "Redis's (resp, 7379), memcached's (11211)");
  app.add_option("--address", o.address,
                 "rdma: the server's address as kv serve --rdma-listen has it (host:port or "
                 "@name), instead of -h/-p");
  app.add_option("--provider", o.provider,
                 "rdma: device (soft, shm, verbs); default: shm for an @name address, else soft");
  app.add_option("-a,--pass,--password", o.password, "the server's requirepass (rdma)");
  app.add_option(
         "--progress", o.progress,
         "rdma: the client device's progress: thread (an engine thread) or manual (the "
         "calling thread drives the engine while it waits: the default, a hand-off less per READ)")
      ->check(CLI::IsMember({"thread", "manual"}))
      ->capture_default_str();
  app.add_option("--keys", o.keys, "key space");
  app.add_option("--value-size", o.value_size, "bytes per value");
  app.add_option("--get-ratio", o.get_ratio, "fraction of operations that are GETs")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--zipf", o.zipf, "Zipf exponent of key popularity (0: uniform)")
      ->check(CLI::Range(0.0, 5.0));
  app.add_option("--depth", o.depth, "GETs in flight: each GET step is an MGET of this many keys")
      ->check(CLI::Range(1, 128));
  app.add_option("--seconds", o.seconds, "measured time");
  app.add_option("--location-cache", o.location_cache,
                 "rdma: item locations each client remembers (0: every GET reads the buckets "
                 "first)");
  app.add_option("--warmup", o.warmup,
                 "unmeasured GETs per client before the measured time: every key once, "
                 "then random GETs until this many seconds have passed (an RDMA client "
                 "learns where the keys' items are)");
  app.add_option("--load", o.load,
                 "SET every key before measuring (true/false); --seconds 0: load only");
  app.add_flag("--json", o.json, "JSON output (schema conveyor-kv-bench/1)");
  app.add_option("--protocol", o.protocol,
                 "rdma (one-sided GETs), resp (any Redis-protocol server) or memcached (text)")
      ->check(CLI::IsMember({"rdma", "resp", "memcached"}));
  app.add_option("--load-port", o.load_port,
                 "rdma: load over RESP at HOST:PORT (kv serve --port; the same store), "
                 "pipelined, instead of one SET RPC per key");
  app.add_option("--clients", o.clients, "client threads, one connection each")
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--wait", o.wait,
                 "resp: send WAIT N 0 after each SET step, in the same write, and count it in "
                 "the SET's time (Redis with asynchronous replicas made to wait for N of them)")
      ->check(CLI::Range(0u, 16u));
  app.add_option("--server-pid", o.server_pid,
                 "report this process's CPU time over the measured interval (/proc)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return conveyor::kvbench::run(o);
}
