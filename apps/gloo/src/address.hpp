// address.hpp — a pair's address as Gloo sees it, and how a device chooses the
// address it advertises (docs/GLOO.md, "Choosing the network").
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <gloo/transport/address.h>

#include "wire.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

class Address final : public ::gloo::transport::Address {
 public:
  explicit Address(wire::address a) : a_(std::move(a)) {}
  std::string str() const override {
    std::ostringstream o;
    o << "conveyor[rank " << a_.rank;
    if (!a_.shm.empty()) o << " shm " << a_.shm;
    if (!a_.soft.empty()) o << " soft " << a_.soft;
    if (!a_.verbs.empty()) o << " verbs " << a_.verbs;
    o << "]";
    return o.str();
  }
  std::vector<char> bytes() const override { return wire::encode(a_); }
  const wire::address& value() const { return a_; }

 private:
  wire::address a_;
};

// This host's identity: boot id (16 bytes) + network-namespace inode (8).
void read_host_id(std::uint8_t out[24]);

// The address this device's soft and verbs listeners bind and advertise, as
// Gloo's TCP transport and torch choose it: the interface(s) named (a comma-
// separated list, as GLOO_SOCKET_IFNAME takes: the first one with an IPv4
// address), else the host name given, else this host's name. A name (not a
// numeric address) that resolves to loopback, as a stock Debian host's own
// name does (127.0.1.1 in /etc/hosts), would be advertised to peers on other
// hosts, which cannot reach it: the first up, non-loopback interface's
// address is taken instead when there is one.
std::string choose_ipv4(const std::string& iface, const std::string& host);

// Whether "ip:port" names a loopback address.
bool loopback_target(const std::string& target);

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
