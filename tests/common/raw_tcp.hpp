// tests/common/raw_tcp.hpp — fake peers over plain sockets for the fault suite.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cvt {

// A TCP listener on 127.0.0.1:0 that accepts connections in a background thread
// and then behaves as told. It never answers with a valid MPA frame.
class raw_server {
 public:
  enum class behaviour {
    silent,         // accept, read and never answer
    garbage_reply,  // read the MPA request, answer with garbage, keep the socket open
    close_at_once,  // read the MPA request, then close
  };
  explicit raw_server(behaviour b);
  ~raw_server();
  raw_server(const raw_server&) = delete;
  raw_server& operator=(const raw_server&) = delete;

  bool ok() const noexcept { return fd_ >= 0; }
  const std::string& error() const noexcept { return error_; }
  std::uint16_t port() const noexcept { return port_; }
  std::size_t bytes_received() const noexcept { return received_.load(); }
  std::size_t connections() const noexcept { return accepted_.load(); }

 private:
  void run();
  behaviour b_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::string error_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> received_{0};
  std::atomic<std::size_t> accepted_{0};
  std::thread thread_;
};

// Bytes that are not an MPA Request or Reply (wrong key, nonsense lengths).
std::vector<std::byte> garbage_bytes(std::size_t n);

// A connected TCP client socket to 127.0.0.1:port (blocking connect), or -1.
int raw_connect(std::uint16_t port, std::string& why);
bool raw_send_all(int fd, const std::vector<std::byte>& bytes);

// A port on 127.0.0.1 with nothing listening (bound once, then released).
std::uint16_t unused_port();

}  // namespace cvt
