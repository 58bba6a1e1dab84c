// conveyor/cm.hpp — the connection manager, in the rdma_cm style.
//
// Target (passive side):
//   auto lis = conveyor::listener::bind(dev, "0.0.0.0:7471").value();
//   (or listener::bind(dev): an ephemeral address; lis.address() says where)
//   auto req = lis.accept(5s).value();            // peer's private data: req.private_data()
//   req.accept(qp, mr.remote().encode()).value(); // qp is now RTS
// Initiator (active side):
//   auto info = conveyor::connect(qp, "127.0.0.1:7471", {.private_data = hello}).value();
//   auto peer = conveyor::remote_region::decode(info.private_data).value();
//
// Errors say what happened and where: "connect to 127.0.0.1:7471: connection
// refused", "peer 127.0.0.1:7471 rejected: <reason>", "MPA handshake with
// 127.0.0.1:7471 timed out after 5 s". Private data is at most 251 bytes each way.
//
// Thread safety: a listener is thread-compatible; connect may run concurrently
// for different QPs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "conveyor/device.hpp"
#include "conveyor/error.hpp"
#include "conveyor/export.hpp"
#include "conveyor/qp.hpp"

namespace conveyor {

namespace detail {
class listener_impl;
class conn_request_impl;
}  // namespace detail

inline constexpr std::size_t max_private_data = 251;

struct connect_options {
  std::span<const std::byte> private_data{};
  std::chrono::milliseconds timeout{5000};  // TCP connect + MPA handshake
};

// What connect() / connect_request::accept() learned.
struct connection_info {
  std::vector<std::byte> private_data;  // the peer's
  qp_connection_attr attr;
};

class CONVEYOR_API connect_request {
 public:
  connect_request() noexcept;
  explicit connect_request(std::unique_ptr<detail::conn_request_impl> impl) noexcept;
  connect_request(connect_request&&) noexcept;
  connect_request& operator=(connect_request&&) noexcept;
  ~connect_request();  // an unanswered request is rejected

  std::span<const std::byte> private_data() const noexcept;
  std::string peer_address() const;

  // Completes the handshake on `qp` (state INIT, same device); qp becomes RTS.
  // Never waits for the peer's next step (as rdma_accept, whose connection is
  // established later): on soft the initiator's RTR (RFC 6581) is read by the
  // device afterwards; work posted meanwhile waits, and a QP whose RTR does
  // not come within device_options::handshake_timeout_ms goes to ERROR (its
  // work flushed with wr_flush_err). So a peer that stops mid-handshake holds
  // no accepting thread.
  result<connection_info> accept(queue_pair& qp, std::span<const std::byte> private_data = {});
  // Refuses the peer; it sees errc::rejected with this reason.
  result<void> reject(std::span<const std::byte> reason = {});
  result<void> reject(std::string_view reason);

 private:
  std::unique_ptr<detail::conn_request_impl> impl_;
};

class CONVEYOR_API listener {
 public:
  listener() noexcept;
  explicit listener(std::unique_ptr<detail::listener_impl> impl) noexcept;
  listener(listener&&) noexcept;
  listener& operator=(listener&&) noexcept;
  ~listener();

  // Listens at `address` in the provider's syntax: "ip:port" (soft, verbs;
  // port 0 picks a free one), "@name" (an abstract Unix socket) or a socket
  // path (shm). See address() for where it ended up.
  static result<listener> bind(const device& dev, std::string_view address, int backlog = 64);
  // Listens at an ephemeral address the provider picks, for a peer to reach
  // through address(): soft "127.0.0.1:<free port>" (loopback: this host
  // only); shm a fresh abstract socket name the kernel makes unique
  // ("@" and five hex digits; abstract names are visible to every process of
  // the network namespace, so the name is no secret); verbs "<ip>:<free
  // port>" with the device's first IPv4 address (errc::address_error when it
  // has none). Errors as the other bind.
  static result<listener> bind(const device& dev, int backlog = 64);
  std::string address() const;
  std::uint16_t port() const noexcept;

  // Waits for a peer's connection request (TCP + MPA request), bounded.
  // soft and shm: the listener's own thread reads every connection's request
  // at once, so a silent or slow peer delays no other. accept() hands out
  // complete requests only; a connection that sends something else, closes,
  // or misses device_options::handshake_timeout_ms is closed by the listener
  // (logged at info), and at most device_options::software.max_pending_handshakes are
  // half-open at a time (the oldest goes first). At most `backlog` complete
  // requests wait for accept(); more are refused with "listener busy".
  result<connect_request> accept(std::chrono::milliseconds timeout);

 private:
  std::unique_ptr<detail::listener_impl> impl_;
};

// Connects `qp` (state INIT) to a listener; on success qp is RTS.
CONVEYOR_API result<connection_info> connect(queue_pair& qp, std::string_view address,
                                             const connect_options& opts = {});

}  // namespace conveyor
