// conveyor_gloo/transport.hpp — a Gloo transport over Conveyor (soft, shm, verbs).
//
//   auto dev = conveyor_gloo::CreateDevice({.hostname = "127.0.0.1"});  // or .iface = "eth0"
//   auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
//   ctx->connectFullMesh(store, dev);           // one RC connection per pair
//   gloo::allreduce(opts);                      // any Gloo algorithm
//
// The provider is chosen per pair when it connects: `device` (or the
// CONVEYOR_GLOO_DEVICE environment variable) forces "soft", "shm" or
// "verbs[:name]"; by default two ranks on one host (same boot and network
// namespace) use shm, others soft. Each pair authenticates its peer with a
// key that travels only through the rendezvous store. docs/GLOO.md describes
// the protocol and what a local process or peer is trusted with.
//
// Thread safety: as Gloo's transports (a context and its buffers may be used
// from the threads Gloo's algorithms use).
#pragma once

#include <memory>
#include <string>

#include <gloo/transport/device.h>

namespace conveyor_gloo {

struct attr {
  // Address (or host name) peers on other hosts reach this one at (soft and
  // verbs listeners bind to it). Empty: this host's name, resolved to IPv4.
  // A name (not a numeric address) that resolves to loopback gives way to the
  // first up, non-loopback interface's address, so peers on other hosts are
  // never sent a loopback address.
  std::string hostname;
  // "", "soft", "shm", "verbs" or "verbs:<device>"; empty reads
  // CONVEYOR_GLOO_DEVICE, and if that is unset chooses per pair.
  std::string device;
  // Network interface(s) to listen on, as Gloo's TCP transport takes them:
  // its IPv4 address is advertised (a comma-separated list: the first that
  // has one; none: CreateDevice throws). Takes precedence over `hostname`.
  // When this and `hostname` are both empty, GLOO_SOCKET_IFNAME is read.
  std::string iface;
};

std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& a);

}  // namespace conveyor_gloo
