// conveyor::kv::executor — runs one Redis command (argv) against the store and
// appends the RESP reply to `out`. Both front ends use it: resp_server for TCP
// clients, rdma_server for the RDMA write RPCs (whose requests and replies are
// RESP too), so both paths have one meaning and one AOF. Loop thread only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace conveyor::kv {

class store;
class aof;

struct session {
  std::uint64_t id = 0;
  std::string name;       // CLIENT SETNAME
  bool authenticated = false;
  int resp = 2;           // HELLO 3 switches to RESP3
  bool close_after_reply = false;  // QUIT
};

struct server_config {
  std::string requirepass;  // empty: no AUTH needed, on either path
  // ... the rest is the executor's own (CONFIG GET answers from it)
};

class executor {
 public:
  executor(store& s, aof* log, const server_config& cfg);
  void execute(session& sess, std::span<const std::string_view> argv, std::string& out);
  // ...
};

}  // namespace conveyor::kv
