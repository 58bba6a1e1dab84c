// The verbs provider's small helpers, shared by its files: logging, errno text,
// ibv <-> Conveyor conversions (access flags, completion status and opcode,
// MTU), addresses for rdma_cm, bounded waits on an rdma_cm event channel, and
// the private-data framing IB/RoCE needs. Internal to src/providers/verbs.
#pragma once

#include "conveyor/cq.hpp"
#include "conveyor/error.hpp"
#include "conveyor/mr.hpp"
#include "conveyor/qp.hpp"
#include "core/log.hpp"
#include "providers/verbs/rdma_core_loader.hpp"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <algorithm>
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
  return rdma_core().ibv_port_state_str(s);
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

// Posts receive requests to a QP's receive queue or an SRQ, 16 ibv_recv_wr at a
// time: post(first, &bad_wr) is ibv_post_recv or ibv_post_srq_recv, and
// map(rc) turns its error into a status. A request with more than max_sge SGEs
// is refused (invalid_argument) and those before it are posted; *bad is the
// index of the first request not posted.
template <class Post, class Map>
status post_recv_chunks(std::span<const recv_wr> wrs, std::uint32_t max_sge, std::size_t* bad,
                        Post&& post, Map&& map) noexcept {
  if (bad) *bad = 0;
  constexpr std::size_t chunk = 16;
  ibv_recv_wr w[chunk];
  std::size_t done = 0;
  while (done < wrs.size()) {
    std::size_t n = std::min(chunk, wrs.size() - done);
    bool refused = false;  // the requests before a refused one are posted
    for (std::size_t i = 0; i < n; ++i) {
      const auto& r = wrs[done + i];
      if (r.sg_list.size() > max_sge) {
        refused = true;
        n = i;
        break;
      }
      w[i] = ibv_recv_wr{};
      w[i].wr_id = r.wr_id;
      w[i].next = (i + 1 < n) ? &w[i + 1] : nullptr;
      w[i].sg_list = const_cast<ibv_sge*>(reinterpret_cast<const ibv_sge*>(r.sg_list.data()));
      w[i].num_sge = static_cast<int>(r.sg_list.size());
    }
    if (n > 0) {
      w[n - 1].next = nullptr;
      ibv_recv_wr* bad_wr = nullptr;
      if (const int rc = post(w, &bad_wr); rc != 0) {
        if (bad) *bad = done + static_cast<std::size_t>(bad_wr ? bad_wr - w : 0);
        return map(rc);
      }
    }
    done += n;
    if (refused) {
      if (bad) *bad = done;
      return errc::invalid_argument;
    }
  }
  return errc::ok;
}

}  // namespace conveyor::verbs
