// tests/hostile/listener/crowd.hpp — a crowd of hostile TCP peers for a
// listener: connections that never speak (idle), that drip an MPA request one
// byte at a time so it never completes before the deadline (drip), and that
// send bytes that are not a request (junk). One thread drives them all,
// non-blocking; with churn on, every connection the target closes is opened
// again at once, so the pressure stays constant.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace cvh {

struct crowd_config {
  std::uint16_t port = 0;
  std::size_t idle = 0, drip = 0, junk = 0;
  std::chrono::milliseconds drip_interval{200};  // one byte per drip connection per interval
  bool churn = false;  // reopen what the target closes, once per drip interval
  // Not empty: a shm listener's address ("@abstract" or a path) instead of the port.
  std::string unix_address{};
};

class crowd {
 public:
  explicit crowd(crowd_config c);
  ~crowd();  // stops the thread, closes every socket
  crowd(const crowd&) = delete;
  crowd& operator=(const crowd&) = delete;

  // Waits until every connection was established once (TCP); false on timeout.
  bool wait_connected(std::chrono::milliseconds timeout) const;
  std::size_t connected() const noexcept { return connected_.load(); }
  // Connections the target closed (EOF or reset) so far.
  std::size_t closed_by_target() const noexcept { return closed_.load(); }
  // Bytes the drip connections sent in all.
  std::size_t dripped() const noexcept { return dripped_.load(); }

 private:
  enum class kind : std::uint8_t { idle, drip, junk };
  struct peer {
    kind k;
    int fd = -1;
    bool up = false;
    std::size_t sent = 0;
  };
  void open(peer& p);
  void run();

  crowd_config cfg_;
  std::vector<peer> peers_;
  std::vector<std::byte> request_;  // what the drip connections send, byte by byte
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> connected_{0}, established_{0}, closed_{0}, dripped_{0};
  std::thread thread_;
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the limit now in force.
std::size_t raise_fd_limit();

// A non-blocking TCP connection to 127.0.0.1:port in progress (or -1).
int start_connect(std::uint16_t port);
// A Unix stream connection ("@abstract" or a path), made non-blocking once up, or -1.
int start_connect_unix(const std::string& address);

}  // namespace cvh
