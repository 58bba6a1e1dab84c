// conveyor kv get|set|del|hget|hgetall|call: the RDMA client commands (kv_client.cpp). The
// server's address takes redis-cli's letters: -h host, -p port, -a password.
#pragma once

#include "cli_fwd.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::tool {

struct kv_client_options {
  std::string host = "127.0.0.1";  // or "@name": an shm server on this host
  std::uint16_t port = 7380;       // the server's --rdma-listen port (kv serve's example's)
  std::string address;             // "host:port" or "@name", instead of -h/-p
  std::string provider;            // empty: from the address ("@name": shm; else soft)
  std::string password;
  std::string progress = "manual";  // the client device's progress mode: thread | manual
  double timeout_s = 2;             // the connection and each request
  std::string key, value;
  std::string field;              // hget
  std::vector<std::string> argv;  // call: any command, as an RPC
  bool cluster = false;           // -c: get/set/del through kv::cluster_client
};

struct kv_client_commands {
  CLI::App *get = nullptr, *set = nullptr, *del = nullptr;
  CLI::App *hget = nullptr, *hgetall = nullptr, *call = nullptr;
};

kv_client_commands add_kv_client_commands(CLI::App& kv, kv_client_options& o);
// The address and the provider the options name (tests).
std::string kv_client_address(const kv_client_options& o);
std::string kv_client_provider(const kv_client_options& o);
// Runs whichever of the commands was given; -1 if none was.
int run_kv_client(const kv_client_commands& c, const kv_client_options& o);

}  // namespace conveyor::tool
