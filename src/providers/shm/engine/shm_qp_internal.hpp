// What the shm QP's source files share (shm_qp.cpp, shm_qp_tx.cpp,
// shm_qp_engine.cpp, shm_qp_exec.cpp, shm_qp_direct.cpp); never included
// elsewhere.
#pragma once

#include "providers/shm/engine/shm_qp.hpp"
#include "providers/swnic/opcodes.hpp"

#include <cstddef>
#include <cstdint>

namespace conveyor::shm::qp_parts {

using detail::key_check;
using swnic::is_atomic_op;
using swnic::is_send_op;
using swnic::is_write_op;
using swnic::wc_of;

// Payloads at least this long go by cross-memory attach when the peer can:
// below it two memcpys through a slot beat a system call.
inline constexpr std::uint64_t cma_min = 32 * 1024;
// A peer region mapped for direct access is populated when mapped (no page
// faults on the data path) only up to this size (shm_qp_direct.cpp).
inline constexpr std::uint64_t direct_populate_max = 64ull << 20;
inline constexpr int max_rx_batch = 64;
// Peer regions one QP keeps mapped (or remembers as unmappable) at most.
inline constexpr std::size_t max_peer_maps = 4096;

inline int ring_req(int side) {
  return side;
}
inline int ring_resp(int side) {
  return 2 + side;
}

}  // namespace conveyor::shm::qp_parts
