// conveyor kv get|set|del|bench: the RDMA client commands (kv_client.cpp).
#pragma once

#include "cli_fwd.hpp"

#include <conveyor/error.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace conveyor::kv {
class client;
}  // namespace conveyor::kv

namespace conveyor::tool {

struct kv_client_options {
  std::string address = "127.0.0.1:7380";  // the server's --rdma-listen
  std::string provider = "soft";
  std::string password;
  std::string progress = "thread";  // the client device's progress mode: thread | manual
  std::string key, value;
  // bench
  std::uint64_t keys = 100000;
  std::uint32_t value_size = 64;
  double get_ratio = 0.95;
  double zipf = 0;          // 0: uniform; 0.99: Zipf
  std::uint32_t depth = 1;  // GETs in flight (an MGET batch of this many keys)
  double seconds = 5;
  bool load = true;  // SET every key first
  bool json = false;
  std::string protocol = "rdma";   // rdma | resp | memcached (kv_bench.cpp)
  std::string host = "127.0.0.1";  // resp, memcached
  std::uint16_t port = 0;          // 0: 7379 (resp), 11211 (memcached)
  std::uint16_t load_port = 0;     // rdma: load over RESP at host:load_port (same store)
  unsigned clients = 1;            // threads, one connection each
  int server_pid = 0;              // read this process's CPU time around the run
};

struct kv_client_commands {
  CLI::App *get = nullptr, *set = nullptr, *del = nullptr, *bench = nullptr;
};

kv_client_commands add_kv_client_commands(CLI::App& kv, kv_client_options& o);
// Opens the RDMA client these options describe (get, set, del and bench share it).
result<std::unique_ptr<kv::client>> open_kv_client(const kv_client_options& o);
// Runs whichever of the commands was given; -1 if none was.
int run_kv_client(const kv_client_commands& c, const kv_client_options& o);
// conveyor kv bench (kv_bench.cpp): 0, 1 on errors, 2 on bad options.
int run_kv_bench(const kv_client_options& o);

}  // namespace conveyor::tool
