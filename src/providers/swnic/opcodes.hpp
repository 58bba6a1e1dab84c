// Opcode classes of a send work request, and the completion opcode each one
// reports: the same rules on every software provider.
#pragma once

#include <conveyor/cq.hpp>
#include <conveyor/qp.hpp>

namespace conveyor::swnic {

constexpr bool is_send_op(wr_opcode op) noexcept {
  return op == wr_opcode::send || op == wr_opcode::send_with_imm || op == wr_opcode::send_with_inv;
}
constexpr bool is_write_op(wr_opcode op) noexcept {
  return op == wr_opcode::rdma_write || op == wr_opcode::rdma_write_with_imm;
}
constexpr bool is_atomic_op(wr_opcode op) noexcept {
  return op == wr_opcode::atomic_cmp_and_swp || op == wr_opcode::atomic_fetch_and_add;
}
// The sink of a READ or the 8-byte result of an atomic is written locally.
constexpr bool writes_local(wr_opcode op) noexcept {
  return op == wr_opcode::rdma_read || is_atomic_op(op);
}
constexpr wc_opcode wc_of(wr_opcode op) noexcept {
  switch (op) {
    case wr_opcode::send:
    case wr_opcode::send_with_imm:
    case wr_opcode::send_with_inv:
      return wc_opcode::send;
    case wr_opcode::rdma_write:
    case wr_opcode::rdma_write_with_imm:
      return wc_opcode::rdma_write;
    case wr_opcode::rdma_read:
      return wc_opcode::rdma_read;
    case wr_opcode::atomic_cmp_and_swp:
      return wc_opcode::comp_swap;
    case wr_opcode::atomic_fetch_and_add:
      return wc_opcode::fetch_add;
  }
  return wc_opcode::send;
}

}  // namespace conveyor::swnic
