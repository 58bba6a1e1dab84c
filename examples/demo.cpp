// conveyor-demo — two processes, one RDMA connection, every verb once.
//
//   conveyor-demo --role target    --address 127.0.0.1:7471 [--crc on|off] [--device soft]
//   conveyor-demo --role initiator --address 127.0.0.1:7471 [--crc on|off] [--device soft]
//
// --device names the device to open on this side: "soft" (the default),
// "verbs:rxe0", "verbs:siw0", ... (see `conveyor devices`). Operations the
// device lacks (atomics and immediate data on iWARP NICs) are skipped with a
// note, and the initiator tells the target which ran so it checks the rest.
//
// The target registers a 16 MiB buffer and an 8-byte atomic slot with every
// remote right, publishes both keys in the connection's private data and then
// only waits for messages: the initiator's RDMA WRITEs, READs and atomics are
// served by the target's engine, with no target application thread involved.
// The target checks each two-sided message (SEND, SEND_WITH_IMM,
// WRITE_WITH_IMM) and answers it with a small SEND (the "ack"); on the final
// "done" message it checks every byte the initiator wrote, answers, prints one
// line and exits.
//
// The initiator runs each operation a modest number of times, verifies every
// byte (reads back what it wrote, checks every atomic's returned value, gets the
// target's verdict for each message) and prints a table. Any failure ends
// either side with a message and a non-zero exit status.
//
// demo_common.hpp holds what both roles share, demo_target.cpp and
// demo_initiator.cpp the two roles; this file the command line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "demo_common.hpp"

using demo::failure;
using demo::run_initiator;
using demo::run_target;

int main(int argc, char** argv) {
  std::string role, address, crc_s = "on", device = "soft";
  CLI::App app{
      "Conveyor demo: a target registers memory and idles while an initiator runs every "
      "verb against it. Start the target first; the initiator retries a refused "
      "connection for 15 s.",
      "conveyor-demo"};
  app.add_option("--role", role, "target or initiator")
      ->required()
      ->check(CLI::IsMember({"target", "initiator"}));
  app.add_option("--address", address, "IP:PORT to listen on (target) or connect to (initiator)")
      ->required();
  app.add_option("--crc", crc_s, "ask the peer for MPA CRC32c")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--device", device, "device to open: soft, verbs:<ibdev> (see `conveyor devices`)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const bool crc = crc_s == "on";
  try {
    return role == "target" ? run_target(device, address, crc)
                            : run_initiator(device, address, crc);
  } catch (const failure& e) {
    std::fprintf(stderr, "conveyor-demo %s: FAILED: %s\n", role.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "conveyor-demo %s: FAILED: %s\n", role.c_str(), e.what());
    return 1;
  }
}
