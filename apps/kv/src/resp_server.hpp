// conveyor::kv::resp_server — the Redis protocol on TCP, on the server loop.
//
// Pipelining: every complete command in what a read brings is executed in
// order; the replies collect in the client's output buffer and go out once per
// loop iteration, after the AOF flush (with appendfsync always, a reply leaves
// only after its write is on disk; one fdatasync covers all clients of the
// iteration).
//
// Bounds on a client (each one closes the connection, counted in INFO):
//   - protocol errors (resp.hpp's limits): the error is sent, then the close;
//   - output: above output_pause bytes pending the server stops reading from
//     the client (a pipelining client waits for its replies); above
//     output_limit it is closed (one batch of large replies it did not read);
//   - one command's reply may take what is left of output_limit (the session's
//     max_reply): a command whose reply would pass it answers an error instead,
//     and no more than that is ever built (MGET of one large key many times);
//   - a command that has begun arriving must complete within partial_timeout,
//     counted from when the command before it completed (slow-loris and half
//     commands; a pipeline that keeps completing commands is never cut);
//   - all clients together: when their query and output buffers pass
//     maxmemory_clients, the client holding the most is closed (and logged),
//     until the total fits (Redis's maxmemory-clients);
//   - the executor's timeout (CONFIG SET timeout; 0: none) closes connections
//     with nothing to say (pub/sub and MONITOR clients excepted, as Redis);
//   - pub/sub subscribers: client-output-buffer-limit pubsub (hard, soft for
//     seconds), closed at the next loop iteration; MONITOR: output_limit;
//   - protected mode (no password, protected-mode yes): a client from outside
//     loopback is told Redis's -DENIED and closed;
//   - maxclients connections; one more is told "-ERR max number of clients
//     reached" and closed. So is one that arrives while the process is out of
//     file descriptors (a spare descriptor is kept for that); if even that
//     fails, the listener is not watched for a quarter second (no busy loop).
//   - a command that runs out of memory (std::bad_alloc) answers -OOM; if the
//     connection's own buffers cannot grow, that client is closed. The server
//     goes on either way.
// Thread safety: loop thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "resp.hpp"

namespace conveyor::kv {

class server_loop;
class executor;

struct resp_server_options {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 7379;  // 0: any free port (port() says which)
  std::size_t maxclients = 10000;
  parser_limits limits;
  std::size_t output_pause = 4u << 20;
  std::size_t output_limit = 256u << 20;
  std::chrono::milliseconds partial_timeout{10000};
  // Query and output buffers of all clients together (0: no bound).
  std::size_t maxmemory_clients = std::size_t{1} << 30;
  bool log = true;  // a line on stderr for each client closed by maxmemory_clients
};

class resp_server {
 public:
  resp_server(server_loop& loop, executor& exec, const resp_server_options& opts);
  ~resp_server();  // closes the listener and every client
  resp_server(const resp_server&) = delete;
  resp_server& operator=(const resp_server&) = delete;

  // Binds and listens; false with `why` on failure.
  bool listen(std::string& why);
  std::uint16_t port() const noexcept;
  std::size_t clients() const noexcept;
  // The executor's sync_point moved (a replica acknowledged, or time passed):
  // replies held for replication go out, or past their bound answer
  // -NOREPLICAS (resp_sync.cpp).
  void replicated();

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

}  // namespace conveyor::kv
