// The verbs provider's helpers (verbs_util.hpp).
#include "providers/verbs/verbs_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace conveyor::verbs {

void log(detail::log_level l, const std::string& s) {
  if (detail::log_enabled(l)) detail::log_line(l, s);
}

std::string err_text(int e) {
  return std::string(std::strerror(e));
}

const char* mtu_name(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256:
      return "256";
    case IBV_MTU_512:
      return "512";
    case IBV_MTU_1024:
      return "1024";
    case IBV_MTU_2048:
      return "2048";
    case IBV_MTU_4096:
      return "4096";
  }
  return "?";
}

ibv_mtu mtu_from_bytes(std::uint32_t bytes) {
  if (bytes >= 4096) return IBV_MTU_4096;
  if (bytes >= 2048) return IBV_MTU_2048;
  if (bytes >= 1024) return IBV_MTU_1024;
  if (bytes >= 512) return IBV_MTU_512;
  return IBV_MTU_256;
}

result<sockaddr_storage> parse_address(std::string_view address, socklen_t& len) {
  sockaddr_storage ss{};
  auto colon = address.rfind(':');
  if (colon == std::string_view::npos)
    return make_error(errc::address_error,
                      "address \"" + std::string(address) + "\": expected ip:port");
  std::string host(address.substr(0, colon));
  std::string port_s(address.substr(colon + 1));
  char* end = nullptr;
  unsigned long port = std::strtoul(port_s.c_str(), &end, 10);
  if (port_s.empty() || *end != '\0' || port > 65535)
    return make_error(errc::address_error, "address \"" + std::string(address) + "\": bad port");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<std::uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &s6->sin6_addr) != 1)
      return make_error(errc::address_error,
                        "address \"" + std::string(address) + "\": bad IPv6 address");
    len = sizeof(sockaddr_in6);
    return ss;
  }
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(static_cast<std::uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &s4->sin_addr) != 1)
    return make_error(errc::address_error,
                      "address \"" + std::string(address) +
                          "\": bad IPv4 address (verbs needs a numeric address)");
  len = sizeof(sockaddr_in);
  return ss;
}

std::string format_address(const sockaddr* sa) {
  if (sa == nullptr) return "?";
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(s4->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(s6->sin6_port));
  }
  return "?";
}

bool set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

rdma_cm_event* next_event(rdma_event_channel* ch, clock_type::time_point deadline) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_core().rdma_get_cm_event(ch, &ev) == 0) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return nullptr;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) {
      errno = ETIMEDOUT;
      return nullptr;
    }
    pollfd p{ch->fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count() + 1, 1000)));
  }
}

void drain_events(rdma_event_channel* ch) {
  rdma_cm_event* ev = nullptr;
  while (rdma_core().rdma_get_cm_event(ch, &ev) == 0) {
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_cm_id* child = ev->id;
      rdma_core().rdma_reject(child, nullptr, 0);
      rdma_core().rdma_ack_cm_event(ev);
      rdma_core().rdma_destroy_id(child);
    } else {
      rdma_core().rdma_ack_cm_event(ev);
    }
  }
}

result<cm_endpoint> create_cm_id(const std::string& what) {
  rdma_event_channel* ch = rdma_core().rdma_create_event_channel();
  if (ch == nullptr)
    return make_error(
        errc::io_error,
        what + ": rdma_create_event_channel: " + err_text(errno) + " (is rdma_ucm loaded?)", errno);
  set_nonblock(ch->fd);
  rdma_cm_id* id = nullptr;
  if (rdma_core().rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
    int e = errno;
    rdma_core().rdma_destroy_event_channel(ch);
    return make_error(errc::io_error, what + ": rdma_create_id: " + err_text(e), e);
  }
  return cm_endpoint{ch, id};
}

void destroy_id_detached(rdma_cm_id* id, rdma_event_channel* ch) {
  std::thread([id, ch] {
    // Drain events already queued so rdma_destroy_id does not wait for their ack.
    if (ch != nullptr) drain_events(ch);
    if (id != nullptr) rdma_core().rdma_destroy_id(id);
    if (ch != nullptr) rdma_core().rdma_destroy_event_channel(ch);
  }).detach();
}

int ibv_access(access a, bool atomics) {
  int f = 0;
  if (has(a, access::local_write)) f |= IBV_ACCESS_LOCAL_WRITE;
  if (has(a, access::remote_write)) f |= IBV_ACCESS_REMOTE_WRITE;
  if (has(a, access::remote_read)) f |= IBV_ACCESS_REMOTE_READ;
  if (has(a, access::remote_atomic) && atomics) f |= IBV_ACCESS_REMOTE_ATOMIC;
  return f;
}

wc_status map_status(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS:
      return wc_status::success;
    case IBV_WC_LOC_LEN_ERR:
      return wc_status::loc_len_err;
    case IBV_WC_LOC_QP_OP_ERR:
      return wc_status::loc_qp_op_err;
    case IBV_WC_LOC_PROT_ERR:
      return wc_status::loc_prot_err;
    case IBV_WC_WR_FLUSH_ERR:
      return wc_status::wr_flush_err;
    case IBV_WC_MW_BIND_ERR:
      return wc_status::mw_bind_err;
    case IBV_WC_BAD_RESP_ERR:
      return wc_status::bad_resp_err;
    case IBV_WC_LOC_ACCESS_ERR:
      return wc_status::loc_access_err;
    case IBV_WC_REM_INV_REQ_ERR:
      return wc_status::rem_inv_req_err;
    case IBV_WC_REM_ACCESS_ERR:
      return wc_status::rem_access_err;
    case IBV_WC_REM_OP_ERR:
      return wc_status::rem_op_err;
    case IBV_WC_RETRY_EXC_ERR:
      return wc_status::retry_exc_err;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return wc_status::rnr_retry_exc_err;
    case IBV_WC_FATAL_ERR:
      return wc_status::fatal_err;
    case IBV_WC_RESP_TIMEOUT_ERR:
      return wc_status::resp_timeout_err;
    default:
      return wc_status::general_err;
  }
}

wc_opcode map_opcode(ibv_wc_opcode o) {
  switch (o) {
    case IBV_WC_SEND:
      return wc_opcode::send;
    case IBV_WC_RDMA_WRITE:
      return wc_opcode::rdma_write;
    case IBV_WC_RDMA_READ:
      return wc_opcode::rdma_read;
    case IBV_WC_COMP_SWAP:
      return wc_opcode::comp_swap;
    case IBV_WC_FETCH_ADD:
      return wc_opcode::fetch_add;
    case IBV_WC_RECV:
      return wc_opcode::recv;
    case IBV_WC_RECV_RDMA_WITH_IMM:
      return wc_opcode::recv_rdma_with_imm;
    default:
      return (o & IBV_WC_RECV) ? wc_opcode::recv : wc_opcode::send;
  }
}

std::vector<std::byte> wrap_private(bool iwarp, std::span<const std::byte> d) {
  const std::size_t off = iwarp ? 0 : 1;
  std::vector<std::byte> out(off + d.size());
  if (!iwarp) out[0] = static_cast<std::byte>(d.size());
  if (!d.empty()) std::memcpy(out.data() + off, d.data(), d.size());
  return out;
}
std::vector<std::byte> unwrap_private(bool iwarp, const void* p, std::size_t len) {
  const auto* b = static_cast<const std::byte*>(p);
  if (p == nullptr || len == 0) return {};
  const std::size_t off = iwarp ? 0 : 1;
  const std::size_t n =
      iwarp ? len : std::min<std::size_t>(static_cast<std::size_t>(b[0]), len - 1);
  std::vector<std::byte> out(n);
  if (n > 0) std::memcpy(out.data(), b + off, n);
  return out;
}

void move_to_error(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  rdma_core().ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

}  // namespace conveyor::verbs
