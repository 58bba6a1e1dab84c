// conveyor/qp.hpp — reliable-connected queue pairs: work requests and posting.
//
//   auto qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();  // state INIT
//   qp.post_recv(recv_mr.as_sge(), /*wr_id=*/1);                        // before connecting
//   conveyor::connect(qp, "127.0.0.1:7471", {}).value();                // now RTS
//   qp.post_write(local.as_sge(), peer.slice(0, 4096), /*wr_id=*/2);
//
// States follow verbs: RESET -> INIT -> RTR -> RTS, and ERROR from anywhere.
// The connection manager (cm.hpp) drives INIT -> RTR -> RTS. In ERROR every
// outstanding request completes with wr_flush_err and new posts return
// errc::qp_in_error.
//
// Posting never blocks, never allocates and never throws: a full queue returns
// errc::again. Thread safety: post_send/post_recv may be called from several
// threads (each queue has its own lock); other members are thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "conveyor/cq.hpp"
#include "conveyor/error.hpp"
#include "conveyor/export.hpp"
#include "conveyor/mr.hpp"

namespace conveyor {

class shared_receive_queue;  // srq.hpp

namespace detail {
struct handle_access;
class qp_impl;
}  // namespace detail

enum class qp_state : std::uint8_t { reset, init, rtr, rts, error };
CONVEYOR_API std::string_view to_string(qp_state s) noexcept;

enum class wr_opcode : std::uint8_t {
  send,
  send_with_imm,
  send_with_inv,
  rdma_write,
  rdma_write_with_imm,
  rdma_read,
  atomic_cmp_and_swp,
  atomic_fetch_and_add,
};
CONVEYOR_API std::string_view to_string(wr_opcode op) noexcept;

enum class send_flags : std::uint32_t {
  none = 0,
  signaled = 1u << 0,     // produce a completion (always on if the QP signals all)
  inline_data = 1u << 1,  // copy the payload at post time (soft/shm still check its lkeys)
  fence = 1u << 2,        // wait for earlier READs/atomics to complete first
  solicited = 1u << 3,    // solicited event (SEND variants)
};
constexpr send_flags operator|(send_flags a, send_flags b) noexcept {
  return static_cast<send_flags>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr bool has(send_flags set, send_flags bit) noexcept {
  return (static_cast<std::uint32_t>(set) & static_cast<std::uint32_t>(bit)) != 0;
}

struct send_wr {
  std::uint64_t wr_id = 0;
  wr_opcode opcode = wr_opcode::send;
  send_flags flags = send_flags::signaled;
  std::span<const sge> sg_list;       // local data (READ: the sink; atomics: 8-byte result)
  std::uint64_t remote_addr = 0;      // RDMA and atomics
  std::uint32_t rkey = 0;             // RDMA and atomics
  std::uint32_t imm_data = 0;         // *_with_imm
  std::uint32_t invalidate_rkey = 0;  // send_with_inv
  std::uint64_t compare_add = 0;      // cmp_and_swp: compare; fetch_and_add: add
  std::uint64_t swap = 0;             // cmp_and_swp: swap
};

struct recv_wr {
  std::uint64_t wr_id = 0;
  std::span<const sge> sg_list;
};

struct qp_caps {
  std::uint32_t max_send_wr = 256;
  std::uint32_t max_recv_wr = 256;
  std::uint32_t max_send_sge = 4;
  std::uint32_t max_recv_sge = 4;
  std::uint32_t max_inline_data = 256;
};

// verbs on InfiniBand and RoCE: the reliable connection's transport
// parameters, as ibv_modify_qp takes them. The connection manager applies them
// to this QP when it moves it to RTR and RTS, in connect() and in
// connect_request::accept() alike (each side sets its own QP's). The defaults
// are what the provider used before they were settable. iWARP devices (their
// transport is the kernel's or the NIC's TCP), soft and shm ignore them.
// pd.create_qp refuses a value out of range with errc::invalid_argument.
//   pd.create_qp({.send_cq = &cq, .recv_cq = &cq,
//                 .verbs_transport = {.retry_count = 3, .timeout = 14, .path_mtu = 1024}});
struct verbs_transport_params {
  // Resends of a request that no acknowledgement answered within `timeout`
  // before it completes with retry_exc_err (and the QP fails): 0..7.
  std::uint8_t retry_count = 7;
  // Resends of a request the peer answered "receiver not ready" (a SEND that
  // found no receive posted) before rnr_retry_exc_err: 0..6, or 7 for ever.
  std::uint8_t rnr_retry = 6;
  // How long this side asks a peer whose SEND found no receive to wait before
  // resending: the IB RNR timer code, 1..31 (1 = 0.01 ms, 14 = 1.28 ms,
  // 31 = 491.52 ms) or 0 (655.36 ms). Unset: the connection manager's (0 on Linux).
  std::optional<std::uint8_t> min_rnr_timer{};
  // Local ACK timeout: a request unacknowledged for 4.096 us x 2^timeout is
  // resent (retry_count times): 1..31 (14 = 67 ms, 17 = 537 ms, 19 = 2.1 s), or
  // 0 to wait for ever. Unset: what rdma_cm derives from the path (19 on
  // Linux 6.1 over RoCE). It also sets how long a port may stay
  // down before the QP is failed (device_options::verbs.port_down_grace).
  std::optional<std::uint8_t> timeout{};
  // Largest payload of one packet, in bytes: 256, 512, 1024, 2048 or 4096. The
  // connection uses the smaller of this and the path's MTU
  // (connection().verbs->path_mtu reports the result). 0: the path's MTU.
  // Set the same on both sides: a responder refuses a message whose packets
  // are not its own path MTU (rxe completes the request with rem_inv_req_err).
  std::uint32_t path_mtu = 0;
};

struct qp_init_attr {
  completion_queue* send_cq = nullptr;  // required; must outlive nothing (kept alive)
  completion_queue* recv_cq = nullptr;  // required
  qp_caps cap{};
  bool sq_sig_all = false;  // every send WR completes, whatever its flags
  // Outbound READ/atomic depth wanted (ORD) and inbound depth offered (IRD);
  // the connection negotiates the final values with the peer.
  std::uint32_t max_rd_atomic = 16;
  std::uint32_t max_dest_rd_atomic = 16;
  // verbs on IB/RoCE: retries, timers and path MTU (see verbs_transport_params).
  verbs_transport_params verbs_transport{};
  // Draw receives from this shared receive queue (srq.hpp) instead of a queue
  // of the QP's own: cap.max_recv_wr/max_recv_sge are then ignored and
  // post_recv on the QP is refused (invalid_argument). It must be an SRQ of
  // the same protection domain (else create_qp: invalid_argument); the QP
  // keeps it alive.
  shared_receive_queue* srq = nullptr;
};

// What a connection negotiated (valid once the QP reached RTS), read with
// qp.connection() or from connect()/accept()'s connection_info. The common
// fields mean the same on every provider; facts that exist on one transport
// only sit in that transport's part, which is set exactly on the providers
// that know them (test the part, not the provider's name):
//
//   auto c = qp.connection().value();
//   if (c.iwarp) std::printf("MPA rev %u, CRC %s\n", unsigned{c.iwarp->mpa_revision},
//                            c.iwarp->crc ? "on" : "off");
//   if (c.shm) std::printf("data path %s\n", c.shm->data_path.c_str());

// iWARP (MPA over TCP) as negotiated by Conveyor itself. Filled by `soft`.
// Not by `verbs` on an iWARP device: there the kernel or the NIC runs MPA and
// does not tell rdma-core the revision, CRC, segment size or RTR.
struct iwarp_connection_attr {
  std::uint8_t mpa_revision = 0;  // MPA revision of the Reply: 1 (RFC 5044) or 2 (RFC 6581)
  bool crc = false;               // MPA CRC32c on every FPDU, both directions
  std::uint32_t mss = 0;          // the TCP connection's maximum segment size when it came up
  // Bytes of each FPDU this side sends (header + payload + CRC) when the
  // connection came up; at most `mss` unless `large_fpdus`. Bulk transfers
  // follow the MSS as TCP raises it later, so it may grow.
  std::uint32_t max_fpdu = 0;
  // RFC 6581 ready-to-receive message the connection used: "write" or "read"
  // (zero-length RDMA Write or Read), or "none" (MPA revision 1).
  std::string rtr;
  // Both sides accept FPDUs larger than the MSS (software_device_options::
  // large_fpdus, MPA flag 0x08): this side sends FPDUs of up to 64 KiB
  // (`max_fpdu`, above `mss` across hosts), one GSO segment each.
  bool large_fpdus = false;
  bool operator==(const iwarp_connection_attr&) const = default;
};

// Same-host shared memory. Filled by `shm`.
struct shm_connection_attr {
  // How this side's bulk requests (32 KiB and more) move: "cma" (the peer's
  // engine copies with process_vm_readv/writev) or "staged" (copied through
  // the shared rings, also every smaller payload).
  std::string data_path;
  // This side maps the peer's regions allocated with allocate_memory and
  // serves its own READ/WRITE/atomics to them (docs/SHM.md, "Direct mapping").
  bool direct_mapping = false;
  std::uint32_t slot_payload = 0;  // payload bytes one ring slot carries
  bool operator==(const shm_connection_attr&) const = default;
};

// rdma-core devices. Filled by `verbs` (InfiniBand, RoCE and iWARP devices).
struct verbs_connection_attr {
  // IB/RoCE: the QP's path MTU in bytes (256..4096), the largest payload of
  // one packet: the smaller of verbs_transport_params::path_mtu and the
  // path's. 0 on iWARP devices, whose packets are the kernel's or NIC's TCP
  // segments (not exposed).
  std::uint32_t path_mtu = 0;
  std::uint32_t port_mtu = 0;  // the port's active MTU in bytes (every transport)
  bool operator==(const verbs_connection_attr&) const = default;
};

struct qp_connection_attr {
  // This side's and the peer's endpoint in the provider's address syntax:
  // "ip:port" (soft, verbs); on shm the listener's name or "pid P qp N".
  std::string local_address;
  std::string peer_address;
  std::uint32_t ird = 0;  // inbound READs/atomics this side accepts at once
  std::uint32_t ord = 0;  // outbound READs/atomics this side may have outstanding
  // Atomics and immediate data usable on this connection (soft: both ends are
  // Conveyor and agreed on RFC 7306; shm: always; verbs: the device has them).
  bool extensions = false;
  std::optional<iwarp_connection_attr> iwarp;  // soft
  std::optional<shm_connection_attr> shm;      // shm
  std::optional<verbs_connection_attr> verbs;  // verbs
  bool operator==(const qp_connection_attr&) const = default;
};

// Per-QP counters of `soft`'s iWARP transport (qp_counters::iwarp).
struct iwarp_qp_counters {
  std::uint64_t tx_fpdus = 0, rx_fpdus = 0;  // FPDUs framed / parsed, control FPDUs included
  // Bytes written to / read from the TCP socket: payload plus MPA, DDP and
  // RDMAP framing, CRC and control messages.
  std::uint64_t tx_stream_bytes = 0, rx_stream_bytes = 0;
  std::uint64_t tx_syscalls = 0, rx_syscalls = 0;  // sendmsg / recv and readv calls on the socket
  std::uint64_t terminates_sent = 0, terminates_received = 0;  // RDMAP Terminate messages
  // Payload bytes read from the socket straight into their destination (a
  // region, a posted receive, a READ's sink); the rest of rx_stream_bytes came
  // through the staging buffer and a copy (headers, small FPDUs, payload that
  // arrived with its header).
  std::uint64_t rx_direct_bytes = 0;
};

// Per-QP counters of `shm`'s rings (qp_counters::shm).
struct shm_qp_counters {
  // Request-ring slots this side wrote / executed from the peer's request
  // ring (a request of several slots counts several; responses not counted).
  std::uint64_t tx_slots = 0, rx_slots = 0;
  std::uint64_t doorbells = 0;   // wake-ups sent to a sleeping peer engine (one syscall each)
  std::uint64_t direct_ops = 0;  // READ/WRITE/atomics served by this side through a direct mapping
  // Hints this side set for a cold peer QP in the peer device's hint page (no
  // system call: the peer's engine finds the QP without looking at every one).
  std::uint64_t hints = 0;
};

// Per-QP counters (read with qp.counters(); they only grow). The common ones
// mean the same on every provider that keeps them, soft and shm; verbs keeps
// no per-QP counters (the NIC moves the data) and reports zeros and no parts.
struct qp_counters {
  // Payload bytes this QP sent / received: SEND and WRITE payloads and READ
  // responses, whoever serves them (the engine, or this side through a direct
  // mapping); no headers, no control messages, no atomics.
  std::uint64_t tx_bytes = 0, rx_bytes = 0;
  // Requests of the peer this side's engine served: READs answered, WRITE
  // messages placed, atomics executed (shm: what the peer served itself
  // through a direct mapping counts in the peer's shm->direct_ops instead).
  std::uint64_t reads_served = 0, writes_placed = 0, atomics_served = 0;
  std::optional<iwarp_qp_counters> iwarp;  // soft
  std::optional<shm_qp_counters> shm;      // shm
};

class CONVEYOR_API queue_pair {
 public:
  queue_pair() = default;
  explicit queue_pair(std::shared_ptr<detail::qp_impl> impl) noexcept;
  queue_pair(queue_pair&&) noexcept = default;
  queue_pair& operator=(queue_pair&&) noexcept;
  queue_pair(const queue_pair&) = delete;
  queue_pair& operator=(const queue_pair&) = delete;
  ~queue_pair();  // disconnects (bounded) and flushes

  explicit operator bool() const noexcept { return impl_ != nullptr; }
  std::uint32_t qp_num() const noexcept;
  qp_state state() const noexcept;
  const qp_caps& caps() const noexcept;

  // Posts a batch with one doorbell. On failure, *bad (if given) is the index of
  // the first request not posted; those before it were posted.
  // Returns: ok; again (queue full); invalid_argument (malformed: too many SGEs,
  // inline data too long, misaligned or wrongly sized atomic); unsupported
  // (atomics/immediate data on a connection without them); qp_in_error;
  // invalid_state (not RTS). As in verbs, a bad lkey or an SGE outside its region
  // is not a posting error: the request completes with loc_prot_err and the QP
  // moves to ERROR. post_recv checks its lkeys at once (invalid_argument); a QP
  // created with an SRQ refuses post_recv (invalid_argument: post to the SRQ).
  status post_send(std::span<const send_wr> wrs, std::size_t* bad = nullptr) noexcept;
  status post_recv(std::span<const recv_wr> wrs, std::size_t* bad = nullptr) noexcept;

  // Single-request conveniences (signaled).
  status post_send(const send_wr& wr) noexcept { return post_send(std::span(&wr, 1)); }
  status post_recv(const sge& local, std::uint64_t wr_id) noexcept;
  status post_send_msg(const sge& local, std::uint64_t wr_id) noexcept;
  status post_write(const sge& local, const remote_region& remote, std::uint64_t wr_id) noexcept;
  status post_read(const sge& local, const remote_region& remote, std::uint64_t wr_id) noexcept;
  status post_fetch_add(const sge& result8, const remote_region& remote, std::uint64_t add,
                        std::uint64_t wr_id) noexcept;
  status post_cmp_swap(const sge& result8, const remote_region& remote, std::uint64_t compare,
                       std::uint64_t swap, std::uint64_t wr_id) noexcept;

  // Moves the QP to ERROR (flushing everything outstanding) or, from ERROR or
  // INIT, back to RESET/INIT. Other transitions belong to the connection manager.
  result<void> modify(qp_state target);

  // Negotiated parameters; errc::invalid_state before the connection is up.
  result<qp_connection_attr> connection() const;
  qp_counters counters() const noexcept;

  // Orderly close: the peer sees the connection end; outstanding requests flush.
  void disconnect() noexcept;

 private:
  friend struct detail::handle_access;  // the library reaches the implementation
  std::shared_ptr<detail::qp_impl> impl_;
};

}  // namespace conveyor
