// conveyor kv get|set|del|bench — the conveyor::kv client on the command line.
//
//   conveyor kv set greeting hello --address 127.0.0.1:7380
//   conveyor kv get greeting --provider shm --address @kv
//   conveyor kv bench --keys 100000 --value-size 64 --get-ratio 0.95 --zipf 0.99 --depth 16
//   (bench: kv_bench.cpp)
#include "kv_client.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

#include "conveyor_kv/client.hpp"

namespace conveyor::tool {

result<std::unique_ptr<kv::client>> open_kv_client(const kv_client_options& o) {
  kv::client_options co;
  co.password = o.password;
  co.depth = std::max<std::uint32_t>(o.depth, 1);
  co.device.progress = o.progress == "manual" ? progress_mode::manual : progress_mode::thread;
  return kv::client::connect(o.provider, o.address, co);
}

kv_client_commands add_kv_client_commands(CLI::App& kv, kv_client_options& o) {
  kv_client_commands c;
  auto common = [&](CLI::App* a) {
    a->add_option("-a,--address", o.address, "the server's RDMA address (kv serve --rdma-listen)");
    a->add_option("-p,--provider", o.provider, "device: soft, shm, verbs");
    a->add_option("--password", o.password, "the server's requirepass");
    a->add_option("--progress", o.progress,
                  "the client device's progress: thread (an engine thread) or manual (the "
                  "calling thread drives the engine while it waits)")
        ->check(CLI::IsMember({"thread", "manual"}));
  };
  c.get = kv.add_subcommand("get", "GET a key by one-sided RDMA READs");
  c.get->add_option("key", o.key)->required();
  common(c.get);
  c.set = kv.add_subcommand("set", "SET a key (an RPC)");
  c.set->add_option("key", o.key)->required();
  c.set->add_option("value", o.value)->required();
  common(c.set);
  c.del = kv.add_subcommand("del", "DEL a key (an RPC)");
  c.del->add_option("key", o.key)->required();
  common(c.del);
  c.bench =
      kv.add_subcommand("bench", "GET/SET mix against a server: ops/s and latency percentiles");
  common(c.bench);
  c.bench->add_option("--keys", o.keys, "key space");
  c.bench->add_option("--value-size", o.value_size, "bytes per value");
  c.bench->add_option("--get-ratio", o.get_ratio, "fraction of operations that are GETs")
      ->check(CLI::Range(0.0, 1.0));
  c.bench->add_option("--zipf", o.zipf, "Zipf exponent of key popularity (0: uniform)")
      ->check(CLI::Range(0.0, 5.0));
  c.bench
      ->add_option("--depth", o.depth, "GETs in flight: each GET step is an MGET of this many keys")
      ->check(CLI::Range(1, 128));
  c.bench->add_option("--seconds", o.seconds, "measured time");
  c.bench->add_option("--load", o.load,
                      "SET every key before measuring (true/false); --seconds 0: load only");
  c.bench->add_flag("--json", o.json, "JSON output (schema conveyor-kv-bench/1)");
  c.bench
      ->add_option("--protocol", o.protocol,
                   "rdma (one-sided GETs), resp (any Redis-protocol server) or memcached (text)")
      ->check(CLI::IsMember({"rdma", "resp", "memcached"}));
  c.bench->add_option("--host", o.host, "resp, memcached: the server's host");
  c.bench->add_option("--port", o.port, "resp, memcached: the server's port (7379, 11211)");
  c.bench->add_option("--load-port", o.load_port,
                      "rdma: load over RESP at --host:PORT (kv serve --port; the same store), "
                      "pipelined, instead of one SET RPC per key");
  c.bench->add_option("--clients", o.clients, "client threads, one connection each")
      ->check(CLI::Range(1u, 1024u));
  c.bench->add_option("--server-pid", o.server_pid,
                      "report this process's CPU time over the measured interval (/proc)");
  return c;
}

namespace {

std::unique_ptr<kv::client> open(const kv_client_options& o, int& rc) {
  auto c = open_kv_client(o);
  if (!c) {
    std::fprintf(stderr, "conveyor kv: %s\n", c.error().to_string().c_str());
    rc = 1;
    return nullptr;
  }
  return std::move(*c);
}

}  // namespace

int run_kv_client(const kv_client_commands& cmds, const kv_client_options& o) {
  if (!*cmds.get && !*cmds.set && !*cmds.del && !*cmds.bench) return -1;
  if (*cmds.bench) return run_kv_bench(o);
  int rc = 0;
  auto c = open(o, rc);
  if (!c) return rc;
  if (*cmds.get) {
    auto r = c->get(o.key);
    if (!r) return std::fprintf(stderr, "conveyor kv get: %s\n", r.error().to_string().c_str()), 1;
    if (!*r) {
      std::printf("(nil)\n");
      return 0;
    }
    std::fwrite((*r)->data(), 1, (*r)->size(), stdout);
    std::printf("\n");
    return 0;
  }
  if (*cmds.set) {
    auto r = c->set(o.key, o.value);
    if (!r) return std::fprintf(stderr, "conveyor kv set: %s\n", r.error().to_string().c_str()), 1;
    std::printf("OK\n");
    return 0;
  }
  auto r = c->del(o.key);
  if (!r) return std::fprintf(stderr, "conveyor kv del: %s\n", r.error().to_string().c_str()), 1;
  std::printf("(integer) %d\n", *r ? 1 : 0);
  return 0;
}

}  // namespace conveyor::tool
