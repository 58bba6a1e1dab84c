// The verbs provider's transport policy, as pure functions of plain values (no
// rdma-core types), so that tests/unit checks them without an RDMA device:
// which verbs_transport_params create_qp accepts, how they change what the
// connection manager proposes for RTR/RTS, and how long a port may stay down
// before a QP on it is failed (device_options::verbs.port_down_grace), with the
// clock the device's event thread keeps of its ports.
#pragma once

#include "conveyor/qp.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace conveyor::verbs {

// Why `p` cannot be applied ("retry_count 9 must be 0..7"), or "" when it can.
std::string check_transport_params(const verbs_transport_params& p);

// The RTR/RTS attributes that verbs_transport_params touch, in ibv's encoding
// except path_mtu_bytes (256..4096).
struct rc_attrs {
  std::uint8_t retry_cnt = 0;
  std::uint8_t rnr_retry = 0;
  std::uint8_t min_rnr_timer = 0;
  std::uint8_t timeout = 0;
  std::uint32_t path_mtu_bytes = 0;
};

// What the QP gets, given what the connection manager proposed (`cm`) and the
// user's parameters (checked): retry counts as set, the timers where set, the
// smaller of the two MTUs.
rc_attrs apply_transport_params(const rc_attrs& cm, const verbs_transport_params& p);

// How long a request of a QP whose local ACK timeout code is `timeout` keeps
// being resent before it fails: 4.096 us x 2^timeout x (retry_cnt + 1).
// nullopt for timeout 0 (the QP waits for ever).
std::optional<std::chrono::milliseconds> retry_span(std::uint8_t timeout, std::uint8_t retry_cnt);

inline constexpr std::chrono::milliseconds max_port_down_grace{60'000};
inline constexpr std::chrono::milliseconds untimed_port_down_grace{5'000};

// The grace period of one QP (device_options::verbs.port_down_grace): the option
// when set; else what the QP's retries ride out (retry_span, at most
// max_port_down_grace) when it has transport timers (`timed`: IB/RoCE), else
// untimed_port_down_grace (iWARP, or timeout 0).
std::chrono::milliseconds port_down_grace(const std::optional<std::chrono::milliseconds>& option,
                                          bool timed, std::uint8_t timeout, std::uint8_t retry_cnt);

// Which of a device's ports are down, and since when (the device's event
// thread only). Ports are numbered from 1.
class port_down_clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  // The port went down at `now` (a second port_down keeps the first time).
  void down(std::uint8_t port, time_point now);
  // The port came back at `now`: how long it was down (nullopt if it was not).
  std::optional<std::chrono::milliseconds> up(std::uint8_t port, time_point now);
  std::optional<time_point> down_since(std::uint8_t port) const;
  // Whether a QP on `port` with grace period `grace` must fail at `now`: the
  // port is down and has been for at least `grace`.
  bool expired(std::uint8_t port, std::chrono::milliseconds grace, time_point now) const;
  bool any_down() const noexcept;

 private:
  std::vector<std::optional<time_point>> since_;  // [port]
};

}  // namespace conveyor::verbs
