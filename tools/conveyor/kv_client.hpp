// conveyor kv get|set|del|bench: the RDMA client commands (kv_client.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace conveyor::tool {

struct kv_client_options {
  std::string address = "127.0.0.1:7380";  // the server's --rdma-listen
  std::string provider = "soft";
  std::string password;
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
};

struct kv_client_commands {
  CLI::App *get = nullptr, *set = nullptr, *del = nullptr, *bench = nullptr;
};

kv_client_commands add_kv_client_commands(CLI::App& kv, kv_client_options& o);
// Runs whichever of the commands was given; -1 if none was.
int run_kv_client(const kv_client_commands& c, const kv_client_options& o);

}  // namespace conveyor::tool
