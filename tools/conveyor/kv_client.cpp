// conveyor kv get|set|del|hget|hgetall|call — the conveyor::kv client on the
// command line (get, hget and hgetall by one-sided READs; call runs any
// command as an RPC and prints its RESP reply), with
// redis-cli's letters: -h host, -p port, -a password. An "@name" address is an
// shm server's, host:port a soft one's, unless --provider says otherwise.
//
//   conveyor kv set greeting hello -p 7380          # 127.0.0.1:7380, soft
//   conveyor kv get greeting -h @kv -a s3cret       # shm server "@kv", requirepass s3cret
//   conveyor kv del greeting -h 10.0.0.5 --provider verbs
//   conveyor kv hgetall user:1 -p 7380              # a small hash: one item, one-sided
//   conveyor kv call RPUSH jobs j1 -p 7380          # any command, as an RPC
//   conveyor kv get user:1 -c --address 127.0.0.1:17001   # a cluster: the slot's primary
#include "kv_client.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor_kv/client.hpp"

namespace conveyor::tool {

std::string kv_client_address(const kv_client_options& o) {
  if (!o.address.empty()) return o.address;
  if (o.host.starts_with('@')) return o.host;
  // An IPv6 literal is bracketed before its port.
  const std::string h = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  return h + ":" + std::to_string(o.port);
}

std::string kv_client_provider(const kv_client_options& o) {
  return o.provider.empty() ? std::string(kv::provider_for_address(kv_client_address(o)))
                            : o.provider;
}

kv_client_commands add_kv_client_commands(CLI::App& kv, kv_client_options& o) {
  kv_client_commands c;
  auto common = [&](CLI::App* a) {
    // -h is the host, as in redis-cli; help is --help.
    a->set_help_flag("--help", "print this help and exit");
    a->add_option("-h,--host", o.host,
                  "the server's host (kv serve --rdma-listen's), or \"@name\" for an shm server")
        ->capture_default_str();
    a->add_option("-p,--port", o.port,
                  "the server's RDMA port (kv serve --rdma-listen's; its RESP --port is for "
                  "redis-cli)")
        ->capture_default_str();
    a->add_option("--address", o.address,
                  "the server's address as kv serve --rdma-listen has it (host:port or @name), "
                  "instead of -h/-p");
    a->add_option("--provider", o.provider,
                  "device: soft, shm, verbs (default: shm for an @name address, else soft)");
    a->add_option("-a,--pass,--password", o.password, "the server's requirepass");
    a->add_option("-t,--timeout", o.timeout_s,
                  "seconds the connection (the RDMA handshake) and each request may take")
        ->check(CLI::Range(0.001, 3600.0))
        ->capture_default_str();
    a->add_option(
         "--progress", o.progress,
         "the client device's progress: thread (an engine thread) or manual (the "
         "calling thread drives the engine while it waits: the default, a hand-off less per READ)")
        ->check(CLI::IsMember({"thread", "manual"}))
        ->capture_default_str();
  };
  auto cluster = [&](CLI::App* a) {
    a->add_flag("-c,--cluster", o.cluster,
                "the address is any node of a cluster (kv serve --cluster): the key goes to its "
                "slot's primary, as redis-cli -c sends it");
  };
  c.get = kv.add_subcommand("get", "GET a key by one-sided RDMA READs");
  c.get->add_option("key", o.key)->required();
  common(c.get);
  cluster(c.get);
  c.set = kv.add_subcommand("set", "SET a key (an RPC)");
  c.set->add_option("key", o.key)->required();
  c.set->add_option("value", o.value)->required();
  common(c.set);
  cluster(c.set);
  c.del = kv.add_subcommand("del", "DEL a key (an RPC)");
  c.del->add_option("key", o.key)->required();
  common(c.del);
  cluster(c.del);
  c.hget = kv.add_subcommand("hget", "HGET a hash's field by one-sided RDMA READs");
  c.hget->add_option("key", o.key)->required();
  c.hget->add_option("field", o.field)->required();
  common(c.hget);
  c.hgetall = kv.add_subcommand(
      "hgetall", "HGETALL a hash by one-sided RDMA READs (an RPC for a hash too large to publish)");
  c.hgetall->add_option("key", o.key)->required();
  common(c.hgetall);
  c.call = kv.add_subcommand("call", "run any command as an RPC and print its RESP reply");
  c.call->add_option("command", o.argv, "the command and its arguments")->required();
  common(c.call);
  return c;
}

namespace {

kv::client_options client_options_of(const kv_client_options& o) {
  kv::client_options co;
  co.password = o.password;
  co.depth = 1;  // one key at a time
  co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout_s * 1000));
  co.device.progress = o.progress == "manual" ? progress_mode::manual : progress_mode::thread;
  return co;
}

// get, set or del of one key in a cluster (-c).
int run_in_cluster(const kv_client_commands& cmds, const kv_client_options& o) {
  const char* what = *cmds.get ? "get" : *cmds.set ? "set" : "del";
  auto failed = [&](const error& e) {
    std::fprintf(stderr, "conveyor kv %s: %s\n", what, e.to_string().c_str());
    return 1;
  };
  auto c = kv::cluster_client::connect(kv_client_provider(o), kv_client_address(o),
                                       client_options_of(o));
  if (!c) return failed(c.error());
  if (*cmds.get) {
    auto r = (*c)->get(o.key);
    if (!r) return failed(r.error());
    if (!*r) return std::printf("(nil)\n"), 0;
    std::fwrite((*r)->data(), 1, (*r)->size(), stdout);
    std::printf("\n");
    return 0;
  }
  if (*cmds.set) {
    auto r = (*c)->set(o.key, o.value);
    if (!r) return failed(r.error());
    return std::printf("OK\n"), 0;
  }
  auto r = (*c)->del(o.key);
  if (!r) return failed(r.error());
  std::printf("(integer) %d\n", *r ? 1 : 0);
  return 0;
}

std::unique_ptr<kv::client> open(const kv_client_options& o, int& rc) {
  auto c = kv::client::connect(kv_client_provider(o), kv_client_address(o), client_options_of(o));
  if (!c) {
    std::fprintf(stderr, "conveyor kv: %s\n", c.error().to_string().c_str());
    rc = 1;
    return nullptr;
  }
  return std::move(*c);
}

}  // namespace

int run_kv_client(const kv_client_commands& cmds, const kv_client_options& o) {
  if (!*cmds.get && !*cmds.set && !*cmds.del && !*cmds.hget && !*cmds.hgetall && !*cmds.call)
    return -1;
  if (o.cluster) return run_in_cluster(cmds, o);
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
  if (*cmds.hget) {
    auto r = c->hget(o.key, o.field);
    if (!r) return std::fprintf(stderr, "conveyor kv hget: %s\n", r.error().to_string().c_str()), 1;
    if (!*r) return std::printf("(nil)\n"), 0;
    std::fwrite((*r)->data(), 1, (*r)->size(), stdout);
    std::printf("\n");
    return 0;
  }
  if (*cmds.hgetall) {
    auto r = c->hgetall(o.key);
    if (!r)
      return std::fprintf(stderr, "conveyor kv hgetall: %s\n", r.error().to_string().c_str()), 1;
    if (r->empty()) return std::printf("(empty array)\n"), 0;
    for (auto& [f, v] : *r) {  // redis-cli's raw form: field, then value, a line each
      std::fwrite(f.data(), 1, f.size(), stdout);
      std::printf("\n");
      std::fwrite(v.data(), 1, v.size(), stdout);
      std::printf("\n");
    }
    return 0;
  }
  if (*cmds.call) {
    std::vector<std::string_view> argv(o.argv.begin(), o.argv.end());
    auto r = c->command(argv);
    if (!r) return std::fprintf(stderr, "conveyor kv call: %s\n", r.error().to_string().c_str()), 1;
    std::fwrite(r->data(), 1, r->size(), stdout);
    return r->starts_with("-") ? 1 : 0;
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
