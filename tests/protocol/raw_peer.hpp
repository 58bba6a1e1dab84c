// A raw-socket iWARP peer for protocol tests: blocking TCP with timeouts, MPA
// frames and FPDUs read and written byte for byte with the project's codecs.
#pragma once

#include "providers/soft/wire/wire.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cvp {

class raw_peer {
 public:
  raw_peer() = default;
  explicit raw_peer(int fd) : fd_(fd) {}
  raw_peer(raw_peer&& o) noexcept : fd_(o.fd_), crc_(o.crc_) { o.fd_ = -1; }
  raw_peer& operator=(raw_peer&& o) noexcept;
  ~raw_peer();

  // 127.0.0.1, 5 s receive timeout; rcvbuf > 0 shrinks the receive buffer
  // before connecting (so the window stays small); maxseg > 0 sets TCP_MAXSEG
  // before connecting, so both ends of the connection get an MSS of at most
  // that (a loopback MSS is ~64 KiB; this is what an MTU does across hosts).
  static raw_peer connect_to(std::uint16_t port, int rcvbuf = 0, int maxseg = 0);
  // TCP's current MSS of the socket.
  int mss() const;
  int fd() const { return fd_; }
  void set_crc(bool on) { crc_ = on; }
  bool crc() const { return crc_; }

  bool send_all(std::span<const std::byte> b);
  // Reads exactly n bytes (false on EOF/timeout).
  bool read_exact(std::span<std::byte> out);
  // Reads one MPA frame; nullopt on EOF/timeout/undecodable.
  std::optional<conveyor::wire::mpa_frame> read_mpa(bool reply,
                                                    std::vector<std::byte>* raw = nullptr);
  // Reads one whole FPDU (length, ULPDU, pad, CRC).
  std::optional<std::vector<std::byte>> read_fpdu();
  // True if the peer closes (EOF) within the timeout.
  bool sees_eof(std::chrono::milliseconds t);

 private:
  int fd_ = -1;
  bool crc_ = false;
};

// A listening raw socket on 127.0.0.1 (port chosen by the kernel).
class raw_listener {
 public:
  // maxseg > 0: TCP_MAXSEG on the listening socket (accepted connections get
  // an MSS of at most that, both ways).
  explicit raw_listener(int maxseg = 0);
  ~raw_listener();
  std::uint16_t port() const { return port_; }
  raw_peer accept_one();  // 5 s timeout; fd -1 on failure

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace cvp
