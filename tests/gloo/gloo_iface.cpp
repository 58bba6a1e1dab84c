// gloo_iface.cpp — which IPv4 address a conveyor-gloo device advertises:
// attr.iface (what torch passes for GLOO_SOCKET_IFNAME) and its comma-separated
// list, GLOO_SOCKET_IFNAME read by CreateDevice itself, a numeric hostname
// kept as given, and a host name resolving to loopback giving way to an up,
// non-loopback interface. It reads the soft listener's address from a pair's
// address string (the lower rank binds it when the pair is created).
//
//   conveyor-gloo-iface-test
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdlib.h>

#include <cstdio>
#include <string>

#include <gloo/common/error.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>

#include "conveyor_gloo/transport.hpp"

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::fprintf(stderr, "%s %s\n", ok ? "ok    " : "FAILED", what.c_str());
  if (!ok) ++g_failures;
}

// The soft listener's "ip:port" from a new pair's address ("conveyor[rank 0 ... soft ip:port]").
std::string soft_address(const conveyor_gloo::attr& a) {
  auto dev = conveyor_gloo::CreateDevice(a);
  auto ctx = dev->createContext(0, 2);
  auto& pair = ctx->createPair(1);
  std::string s = pair->address().str();
  auto at = s.find(" soft ");
  if (at == std::string::npos) return "(none in " + s + ")";
  auto end = s.find_first_of(" ]", at + 6);
  return s.substr(at + 6, end - at - 6);
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

// Whether this host has an up, non-loopback IPv4 interface.
bool has_other_interface() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (auto* i = list; i != nullptr; i = i->ifa_next)
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
        (i->ifa_flags & IFF_UP) != 0 && (i->ifa_flags & IFF_LOOPBACK) == 0)
      found = true;
  ::freeifaddrs(list);
  return found;
}

}  // namespace

int main() {
  ::unsetenv("GLOO_SOCKET_IFNAME");
  ::setenv("CONVEYOR_GLOO_DEVICE", "soft", 1);
  try {
    (void)soft_address({.iface = "cvg-none0"});
    check(false, "an interface that does not exist is refused");
  } catch (const ::gloo::Exception& e) {
    std::string what = e.what();
    check(what.find("cvg-none0") != std::string::npos,
          "an interface that does not exist is refused, by name: " + what);
  }
  auto a = soft_address({.iface = "cvg-none0,lo"});
  check(starts_with(a, "127.0.0.1:"), "iface 'cvg-none0,lo' takes lo's address: " + a);
  a = soft_address({.hostname = "127.0.0.1"});
  check(starts_with(a, "127.0.0.1:"), "a numeric hostname is kept as given: " + a);
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  a = soft_address({});
  check(starts_with(a, "127.0.0.1:"), "GLOO_SOCKET_IFNAME=lo with no iface or hostname: " + a);
  ::setenv("GLOO_SOCKET_IFNAME", "cvg-none0", 1);
  a = soft_address({.iface = "lo"});
  check(starts_with(a, "127.0.0.1:"), "attr.iface wins over GLOO_SOCKET_IFNAME: " + a);
  ::unsetenv("GLOO_SOCKET_IFNAME");
  a = soft_address({.hostname = "localhost"});
  if (has_other_interface())
    check(!starts_with(a, "127."),
          "a host name resolving to loopback gives way to an interface's address: " + a);
  else
    std::fprintf(stderr, "note: no up, non-loopback interface here; 'localhost' stays %s\n",
                 a.c_str());
  std::printf("%s\n", g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
