// String forms of error codes and statuses; error formatting.
#include <conveyor/cq.hpp>
#include <conveyor/device.hpp>
#include <conveyor/error.hpp>
#include <conveyor/qp.hpp>

#include <cstring>

namespace conveyor {

std::string_view to_string(errc e) noexcept {
  switch (e) {
    case errc::ok:
      return "ok";
    case errc::invalid_argument:
      return "invalid argument";
    case errc::not_found:
      return "not found";
    case errc::unsupported:
      return "unsupported";
    case errc::again:
      return "queue full, try again";
    case errc::timed_out:
      return "timed out";
    case errc::connection_refused:
      return "connection refused";
    case errc::connection_reset:
      return "connection reset";
    case errc::rejected:
      return "rejected by peer";
    case errc::protocol_error:
      return "protocol error";
    case errc::address_error:
      return "address error";
    case errc::resource_exhausted:
      return "resource exhausted";
    case errc::invalid_state:
      return "invalid state";
    case errc::qp_in_error:
      return "QP in error state";
    case errc::cq_overflow:
      return "completion queue overflow";
    case errc::io_error:
      return "I/O error";
  }
  return "unknown error";
}

std::string error::to_string() const {
  std::string s = context.empty() ? std::string(conveyor::to_string(code)) : context;
  s += " (";
  s += conveyor::to_string(code);
  if (sys_errno != 0) {
    s += ", errno ";
    s += std::to_string(sys_errno);
    s += ": ";
    s += std::strerror(sys_errno);
  }
  s += ")";
  return s;
}

std::unexpected<error> make_error(errc code, std::string context, int sys_errno) {
  return std::unexpected(error{code, sys_errno, std::move(context)});
}

std::string_view to_string(wc_status s) noexcept {
  switch (s) {
    case wc_status::success:
      return "success";
    case wc_status::loc_len_err:
      return "local length error";
    case wc_status::loc_qp_op_err:
      return "local QP operation error";
    case wc_status::loc_prot_err:
      return "local protection error";
    case wc_status::wr_flush_err:
      return "work request flushed";
    case wc_status::mw_bind_err:
      return "memory window bind error";
    case wc_status::bad_resp_err:
      return "bad response";
    case wc_status::loc_access_err:
      return "local access error";
    case wc_status::rem_inv_req_err:
      return "remote invalid request";
    case wc_status::rem_access_err:
      return "remote access error";
    case wc_status::rem_op_err:
      return "remote operation error";
    case wc_status::retry_exc_err:
      return "transport retry counter exceeded (connection lost)";
    case wc_status::rnr_retry_exc_err:
      return "receiver not ready (no receive posted)";
    case wc_status::fatal_err:
      return "fatal error";
    case wc_status::resp_timeout_err:
      return "response timeout";
    case wc_status::general_err:
      return "general error";
  }
  return "unknown status";
}

std::string_view to_string(wc_opcode op) noexcept {
  switch (op) {
    case wc_opcode::send:
      return "SEND";
    case wc_opcode::rdma_write:
      return "RDMA_WRITE";
    case wc_opcode::rdma_read:
      return "RDMA_READ";
    case wc_opcode::comp_swap:
      return "COMP_SWAP";
    case wc_opcode::fetch_add:
      return "FETCH_ADD";
    case wc_opcode::recv:
      return "RECV";
    case wc_opcode::recv_rdma_with_imm:
      return "RECV_RDMA_WITH_IMM";
  }
  return "unknown";
}

std::string_view to_string(qp_state s) noexcept {
  switch (s) {
    case qp_state::reset:
      return "RESET";
    case qp_state::init:
      return "INIT";
    case qp_state::rtr:
      return "RTR";
    case qp_state::rts:
      return "RTS";
    case qp_state::error:
      return "ERROR";
  }
  return "unknown";
}

std::string_view to_string(wr_opcode op) noexcept {
  switch (op) {
    case wr_opcode::send:
      return "SEND";
    case wr_opcode::send_with_imm:
      return "SEND_WITH_IMM";
    case wr_opcode::send_with_inv:
      return "SEND_WITH_INV";
    case wr_opcode::rdma_write:
      return "RDMA_WRITE";
    case wr_opcode::rdma_write_with_imm:
      return "RDMA_WRITE_WITH_IMM";
    case wr_opcode::rdma_read:
      return "RDMA_READ";
    case wr_opcode::atomic_cmp_and_swp:
      return "ATOMIC_CMP_AND_SWP";
    case wr_opcode::atomic_fetch_and_add:
      return "ATOMIC_FETCH_AND_ADD";
  }
  return "unknown";
}

std::string_view to_string(transport t) noexcept {
  switch (t) {
    case transport::iwarp:
      return "iWARP";
    case transport::roce:
      return "RoCE";
    case transport::infiniband:
      return "InfiniBand";
    case transport::shm:
      return "shared memory";
  }
  return "unknown";
}

std::string_view to_string(device_event_type t) noexcept {
  switch (t) {
    case device_event_type::port_active:
      return "port active";
    case device_event_type::port_down:
      return "port down";
    case device_event_type::qp_error:
      return "QP error";
    case device_event_type::cq_error:
      return "CQ error";
    case device_event_type::device_fatal:
      return "device fatal";
    case device_event_type::other:
      return "other";
    case device_event_type::srq_limit_reached:
      return "SRQ limit reached";
    case device_event_type::srq_error:
      return "SRQ error";
  }
  return "unknown";
}

}  // namespace conveyor
