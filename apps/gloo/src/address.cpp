// address.cpp — the address a device advertises (interface, host name, never a
// loopback address resolved from a name when another exists) and this host's
// identity, which tells ranks on one host from ranks on others.
#include "address.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include <gloo/common/error.h>

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

void read_host_id(std::uint8_t out[24]) {
  std::memset(out, 0, 24);
  int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[64] = {};
    auto n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    for (ssize_t i = 0, j = 0; i < n && j < 16; ++i) {
      char c = buf[i];
      int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
      if (v < 0) continue;
      out[j / 2] = std::uint8_t(out[j / 2] | (v << ((j % 2) ? 0 : 4)));
      ++j;
      if (j == 32) break;
    }
  }
  struct stat st {};
  if (::stat("/proc/self/ns/net", &st) == 0) {
    std::uint64_t ino = st.st_ino;
    std::memcpy(out + 16, &ino, 8);
  }
}

namespace {

bool is_loopback(const in_addr& a) {
  return (ntohl(a.s_addr) >> 24) == 127;
}

std::string ntop(const in_addr& a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, ip, sizeof ip);
  return ip;
}

// The IPv4 address of interface `name`, or of the first up, non-loopback
// interface when `name` is empty; nullopt if there is none.
std::optional<in_addr> interface_ipv4(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<in_addr> found;
  for (auto* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    auto a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if (name.empty()) {
      if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0 || is_loopback(a))
        continue;
    } else if (name != i->ifa_name) {
      continue;
    }
    found = a;
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace

// The address this device's soft and verbs listeners bind and advertise, as
// Gloo's TCP transport and torch choose it: the interface(s) named (a comma-
// separated list, as GLOO_SOCKET_IFNAME takes: the first one with an IPv4
// address), else the host name given, else this host's name. A name (not a
// numeric address) that resolves to loopback, as a stock Debian host's own
// name does (127.0.1.1 in /etc/hosts), would be advertised to peers on other
// hosts, which cannot reach it: the first up, non-loopback interface's
// address is taken instead when there is one.
std::string choose_ipv4(const std::string& iface, const std::string& host) {
  if (!iface.empty()) {
    std::string tried;
    std::size_t pos = 0;
    while (pos <= iface.size()) {
      auto end = std::min(iface.find(',', pos), iface.size());
      std::string name = iface.substr(pos, end - pos);
      pos = end + 1;
      if (name.empty()) continue;
      if (auto a = interface_ipv4(name)) return ntop(*a);
      tried += (tried.empty() ? "" : ", ") + name;
    }
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: no IPv4 address on interface(s) '",
                                           tried.empty() ? iface : tried,
                                           "' (GLOO_SOCKET_IFNAME or attr.iface)");
  }
  std::string name = host;
  if (name.empty()) {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "127.0.0.1";
    name = buf;
  }
  in_addr literal{};
  if (::inet_pton(AF_INET, name.c_str(), &literal) == 1) return name;  // as given
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    GLOO_THROW_IO_EXCEPTION("conveyor-gloo: cannot resolve host '", name, "'");
  }
  auto a = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  if (is_loopback(a))
    if (auto other = interface_ipv4("")) return ntop(*other);
  return ntop(a);
}

// Whether "ip:port" names a loopback address.
bool loopback_target(const std::string& target) {
  in_addr a{};
  auto ip = target.substr(0, target.rfind(':'));
  return ::inet_pton(AF_INET, ip.c_str(), &a) == 1 && is_loopback(a);
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
