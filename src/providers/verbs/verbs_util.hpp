// The verbs provider's small helpers, shared by its files: logging, errno text,
// ibv <-> Conveyor conversions (access flags, completion status and opcode,
// MTU), addresses for rdma_cm, bounded waits on an rdma_cm event channel, and
// the private-data framing IB/RoCE needs. Internal to src/providers/verbs.
#pragma once

#include "conveyor/cq.hpp"
#include "conveyor/error.hpp"
#include "conveyor/mr.hpp"
#include "core/log.hpp"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::verbs {

using clock_type = std::chrono::steady_clock;

void log(detail::log_level l, const std::string& s);
std::string err_text(int e);

// IB/RoCE connection private data is padded by the CM to a fixed size; a
// one-byte length prefix keeps the user's bytes exact. iWARP (MPA) carries the
// exact length, so nothing is added there (and soft peers interoperate).
inline constexpr std::size_t ib_req_private =
    56 - 1;  // REQ: 92 minus the rdma_cm header (36), minus prefix
inline constexpr std::size_t ib_rep_private = 196 - 1;
inline constexpr std::size_t ib_rej_private = 148 - 1;
std::vector<std::byte> wrap_private(bool iwarp, std::span<const std::byte> d);
std::vector<std::byte> unwrap_private(bool iwarp, const void* p, std::size_t len);

const char* mtu_name(ibv_mtu m);
// 256..4096 (a power of two; anything else rounds down, below 256 is 256).
ibv_mtu mtu_from_bytes(std::uint32_t bytes);
inline std::uint32_t mtu_bytes(ibv_mtu m) {
  return 128u << static_cast<int>(m);
}
inline const char* port_state_name(ibv_port_state s) {
  return ibv_port_state_str(s);
}

// "ip:port" or "[ipv6]:port", numeric only (rdma_cm resolves addresses, not names).
result<sockaddr_storage> parse_address(std::string_view address, socklen_t& len);
std::string format_address(const sockaddr* sa);
bool set_nonblock(int fd);

// Waits for the next event on a channel (non-blocking fd), bounded.
// Returns nullptr with errno = ETIMEDOUT on timeout.
rdma_cm_event* next_event(rdma_event_channel* ch, clock_type::time_point deadline);
// Acks every event queued on `ch`, rejecting (and destroying) connection requests.
void drain_events(rdma_event_channel* ch);
// A non-blocking event channel and a TCP-port-space cm_id on it; errors start with `what`.
struct cm_endpoint {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
};
result<cm_endpoint> create_cm_id(const std::string& what);
// Destroys a cm_id and its channel on a detached thread: acks whatever still
// arrives, never blocks the caller.
void destroy_id_detached(rdma_cm_id* id, rdma_event_channel* ch);

int ibv_access(access a, bool atomics);
wc_status map_status(ibv_wc_status s);
wc_opcode map_opcode(ibv_wc_opcode o);
void move_to_error(ibv_qp* qp);

}  // namespace conveyor::verbs
