// conveyor-loopback-bench — Conveyor's soft provider next to raw TCP, over
// 127.0.0.1, in one run.
//
//   conveyor-loopback-bench [--runs N] [--progress thread|manual] [--crc on|off] [--json]
//
// The program forks right after parsing its arguments: the parent is the client
// (it drives every measurement and prints the results), the child is the server.
// They are two processes, each with its own device, connected by one Conveyor
// connection, by plain TCP sockets for the raw-TCP baselines, and by a Unix
// socketpair that carries only control messages (never timed).
//
// Measurements (each repeated --runs times; the table shows median [min-max]):
//   - 8 B RDMA WRITE ping-pong round trip (ib_write_lat style: each side writes
//     into the other's buffer and spins on its own memory for the new value;
//     inline writes, one in 64 signaled);
//   - 8 B RDMA READ round trip (post, spin on poll() for the completion);
//   - raw TCP 8 B ping-pong with TCP_NODELAY (blocking send/recv);
//   - 64 KiB and 1 MiB RDMA WRITE and READ bandwidth, 16 requests outstanding,
//     next to raw TCP streaming with writes of the same size;
//   - 8 B RDMA WRITE message rate (batches of 16 inline, unsignaled writes, the
//     last of each batch signaled, 8 batches outstanding) next to 8-byte TCP
//     send() calls;
//   - CPU used by each idle process (connection open, nothing to do) over 2 s.
// Busy loops use completion_queue::poll(); blocking waits use wait().
//
// loopback_common.hpp holds what both processes share, loopback_server.cpp and
// loopback_client.cpp the two processes; this file the options and the fork.
#include <CLI/CLI.hpp>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>

#include "loopback_common.hpp"

using loopback::options;
using loopback::run_client;
using loopback::run_server;

int main(int argc, char** argv) {
  options o;
  std::string progress = "thread", crc = "on";
  CLI::App app{
      "Conveyor loopback benchmark: the soft provider next to raw TCP, measured by the "
      "same program in the same run (client and server are two processes).",
      "conveyor-loopback-bench"};
  app.add_option("--runs", o.runs, "runs of every measurement (medians are reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--progress", progress, "engine progress: a thread per device, or manual (poll)")
      ->check(CLI::IsMember({"thread", "manual"}))
      ->capture_default_str();
  app.add_option("--crc", crc, "ask the peer for MPA CRC32c")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_flag("--json", o.json, "print JSON instead of the table");
  CLI11_PARSE(app, argc, argv);
  o.progress = progress == "manual" ? cvy::progress_mode::manual : cvy::progress_mode::thread;
  o.crc = crc == "on";

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    std::perror("socketpair");
    return 1;
  }
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {  // the server
    ::close(sv[0]);
    int rc = 1;
    try {
      rc = run_server(o, sv[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "conveyor-loopback-bench server: FAILED: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  ::close(sv[1]);
  int rc = 1;
  try {
    rc = run_client(o, sv[0]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "conveyor-loopback-bench client: FAILED: %s\n", e.what());
  }
  ::close(sv[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    std::fprintf(stderr, "conveyor-loopback-bench: the server process failed\n");
    rc = 1;
  }
  return rc;
}
