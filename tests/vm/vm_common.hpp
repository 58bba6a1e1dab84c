// What the VM harness's programs share (tests/vm: interop.cpp, port_checks.cpp,
// transport.cpp): CHECK and the failure count, byte patterns, taking a netdev
// down and up, the device's events time-stamped.
#pragma once

#include <conveyor/conveyor.hpp>

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace cvy = conveyor;

namespace vmcheck {

inline int failures = 0;
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::printf("interop: FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                            \
      std::printf("\n");                                                   \
      ++failures;                                                          \
    }                                                                      \
  } while (0)

inline std::byte pattern(std::size_t i, unsigned seed) {
  return static_cast<std::byte>((i * 131u + seed * 7u + (i >> 8)) & 0xff);
}
inline void fill(std::span<std::byte> b, unsigned seed) {
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = pattern(i, seed);
}

inline std::string st(cvy::wc_status s) {
  return std::string(cvy::to_string(s));
}

// Sets the netdev's IFF_UP with one ioctl: no fork/exec between posting and
// the link going down, so the requests are still in flight.
inline bool set_link(const std::string& netdev, bool up) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", netdev.c_str());
  bool ok = ::ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    if (up)
      ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    else
      ifr.ifr_flags = static_cast<short>(ifr.ifr_flags & ~IFF_UP);
    ok = ::ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  }
  ::close(fd);
  return ok;
}

using steady = std::chrono::steady_clock;
inline double ms_since(steady::time_point t0, steady::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

// The device's events, time-stamped.
struct event_log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<steady::time_point, cvy::device_event>> events;
  void add(const cvy::device_event& e) {
    std::lock_guard lk(mu);
    events.emplace_back(steady::now(), e);
    cv.notify_all();
  }
  // The first event matching `pred` within `t`, if any.
  template <class Pred>
  std::optional<std::pair<steady::time_point, cvy::device_event>> wait(
      Pred pred, std::chrono::milliseconds t) {
    std::unique_lock lk(mu);
    std::optional<std::pair<steady::time_point, cvy::device_event>> got;
    cv.wait_for(lk, t, [&] {
      for (const auto& e : events)
        if (pred(e.second)) {
          got = e;
          return true;
        }
      return false;
    });
    return got;
  }
};

// transport.cpp: the verbs transport parameters (--transport DEV IP) and the
// port-down grace period (--port-flap DEV NETDEV IP). Exit status 0 if all held.
int transport_check(const std::string& dev_name, const std::string& ip);
int port_flap(const std::string& dev_name, const std::string& netdev, const std::string& ip);

// port_checks.cpp: the link taken down and up with no connection
// (--port-events), under a connection with requests in flight (--port-down),
// or the device removed under one (--device-removal). Exit status 0 if all held.
int port_events(const std::string& dev_name, const std::string& netdev);
// What cuts the connection: the link going down (with the provider's policy,
// checked, or without it, only measured) or the device being removed.
enum class cut { port_down, port_down_kernel_alone, removal };
void port_down_once(const std::string& dev_name, const std::string& netdev, const std::string& ip,
                    cut how);
int port_down(const std::string& dev_name, const std::string& netdev, const std::string& ip);

}  // namespace vmcheck
