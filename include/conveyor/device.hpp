// conveyor/device.hpp — devices: discovery, opening, attributes.
//
//   for (auto& info : conveyor::device::list()) std::cout << info.name << '\n';
//   auto dev = conveyor::device::open("soft").value();
//   auto cq  = dev.create_cq({.depth = 1024}).value();
//
// A device is one software or hardware RNIC. The `soft` provider's device runs a
// progress engine (one thread by default) that serves incoming one-sided
// operations with no application thread involved; with progress_mode::manual the
// engine instead runs inside completion_queue::poll/wait.
//
// Thread safety: a device handle is thread-compatible; objects created from it
// may be used from different threads as their own headers state.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/cq.hpp"
#include "conveyor/error.hpp"
#include "conveyor/export.hpp"

namespace conveyor {

class protection_domain;

namespace detail {
struct handle_access;
class device_impl;
}  // namespace detail

enum class transport : std::uint8_t { iwarp, roce, infiniband, shm };
CONVEYOR_API std::string_view to_string(transport t) noexcept;

enum class progress_mode : std::uint8_t {
  thread,  // an engine thread per device (default): the target's CPU threads idle
  manual,  // no thread: poll()/wait() on any CQ of the device drive the engine
};

// What a device reports by itself, outside any call or completion (verbs:
// the device's asynchronous events). soft and shm report only
// srq_limit_reached: their failures show as completions and QP state.
enum class device_event_type : std::uint8_t {
  port_active,  // a port's link came up
  port_down,    // a port's link went down: connections through it fail
  qp_error,     // a QP failed outside a completion (fatal, invalid request, access error): it is in
                // ERROR
  cq_error,     // a CQ overflowed: its poll/wait return cq_overflow
  device_fatal,  // the device failed or was removed: nothing created from it works any more; close
                 // it all
  other,         // an address, LID or P_Key change, ...: see the description
  // a shared receive queue's armed limit was reached (srq.hpp): fewer
  // receives than the limit are posted; the limit is disarmed
  srq_limit_reached,
  srq_error,  // verbs: an SRQ failed; the device moves the QPs attached to it to ERROR
};
CONVEYOR_API std::string_view to_string(device_event_type t) noexcept;

struct device_event {
  device_event_type type = device_event_type::other;
  std::uint8_t port = 0;     // port_active/port_down: the port
  std::uint32_t qp_num = 0;  // qp_error: the QP
  // srq_limit_reached, srq_error: the SRQ (shared_receive_queue::srq_num())
  std::uint32_t srq_num = 0;
  std::string description;  // names the device, port, for a QP its number and peer, for an SRQ
                            // its number and limit
};

// The options of a device are common fields plus one part per provider
// family, as qp_connection_attr is: a part applies to its family only and the
// others ignore it (set it anyway; a program need not know which provider it
// will get).
//
//   conveyor::device_options o;
//   o.progress = conveyor::progress_mode::manual;
//   o.software.request_crc = false;          // soft
//   o.verbs.fail_qps_on_port_down = false;   // verbs
//   auto dev = conveyor::device::open(name, o).value();

// soft and shm: the library's own devices (their engine, listener and
// handshakes). verbs ignores them.
struct software_device_options {
  bool request_crc = true;  // soft: ask peers for MPA CRC32c (the peer may ask too)
  // soft: accept FPDUs larger than the TCP MSS and say so in the MPA frame
  // (flag 0x08, Linux siw's experimental GSO bit), and send FPDUs of up to
  // 64 KiB (one GSO segment, not one MSS) to a peer that says the same. Only
  // soft peers do: siw, hardware RNICs and peers with this off get FPDUs of at
  // most one MSS. false: neither offered nor used (CONVEYOR_SOFT_LARGE_FPDUS=0).
  bool large_fpdus = true;
  // The engine thread busy-polls this long after activity before sleeping in
  // epoll_wait: long enough to catch the next request of a request/response
  // exchange without a thread wake-up (tens of microseconds on a VM), short
  // enough that an idle device costs nothing. It never spins while parked.
  std::uint32_t engine_spin_us = 50;
  // While an application thread keeps polling a CQ of this device (and so runs
  // the engine itself), the engine thread parks instead of waking for every
  // arrival; it resumes when polling stops for 1 ms or the poller sleeps.
  bool engine_park = true;
  // A READ may scatter into at most this many SGEs (device_attr::max_sge_rd;
  // 0 keeps the device's limit, max_sge). 1 makes the device behave as Linux
  // siw does, to see how an application fares on one.
  std::uint32_t max_sge_rd = 0;
  // A listener drives every handshake at once, on its own thread; this many
  // half-open ones (accepted, request not yet complete) at most. When one
  // more connection arrives the oldest is closed. Each holds a socket until it
  // completes or device_options::handshake_timeout_ms passes; keep this below
  // the process's descriptor limit (RLIMIT_NOFILE).
  std::uint32_t max_pending_handshakes = 256;
};

// verbs: rdma-core devices. soft and shm ignore them.
struct verbs_device_options {
  // When a port goes down (port_down) and stays down longer than
  // port_down_grace, move every connected QP on it to ERROR, so each
  // outstanding request completes (wr_flush_err) and
  // new posts return qp_in_error, with one qp_error event per QP naming its
  // device, port, number and peer (a QP the device had already failed gets
  // one too). Left to itself, rxe fails a requester whose packets no longer
  // route but leaves the responder's QP in RTS with its receives outstanding
  // for ever, and a NIC fails a QP only after its transport retries: false
  // leaves it to the device (a link that comes back soon enough then keeps
  // the connections).
  bool fail_qps_on_port_down = true;
  // With fail_qps_on_port_down: how long a port may stay down before its
  // connected QPs are failed as above. A link that comes back sooner keeps
  // them (requests in flight meanwhile may still fail by the device's doing:
  // rxe fails a requester whose packets no longer route, and the user then
  // gets a qp_error event for that QP when the port comes back). Unset: each
  // QP's own, what its transport retries would ride out: its local ACK timeout
  // times (retry count + 1) (verbs_transport_params), at most 60 s; 5 s for a
  // QP without those
  // parameters (iWARP: the kernel's TCP retransmits) or that waits for ever
  // (timeout 0). 0 ms: at once, when the port_down event arrives.
  std::optional<std::chrono::milliseconds> port_down_grace{};
};

struct device_options {
  progress_mode progress = progress_mode::thread;  // soft, shm (verbs has no engine)
  std::uint32_t spin_us = 20;  // completion_queue::wait busy-polls this long before sleeping
  // How long the passive side waits for a peer's step: soft and shm, a
  // listener for a connection's request and, after connect_request::accept,
  // the device for the initiator's RTR (soft); verbs, accept for the
  // connection to be established.
  std::uint32_t handshake_timeout_ms = 5000;
  // Called for each device_event, on the device's event thread, in the order
  // the device reported them (every event is also logged). Keep it short: the
  // next event waits. It must not destroy the device or its objects. Empty:
  // events are only logged.
  std::function<void(const device_event&)> on_event;
  software_device_options software{};  // soft, shm
  verbs_device_options verbs{};        // verbs
};

// One port of a device: where it is reachable and whether its link is up.
struct port_attr {
  std::uint8_t num = 1;
  std::string state;                   // "active", "down", "init", ...
  std::string link_layer;              // "tcp", "ethernet", "infiniband", "unix"
  std::uint32_t mtu = 0;               // path MTU in bytes; 0 where it does not apply
  std::vector<std::string> addresses;  // IP addresses (soft), GIDs (verbs), ...
};

enum class atomic_scope : std::uint8_t { none, rdma, global };

struct device_attr {
  std::string name;
  // "soft", "verbs", "shm": for messages and logs. Code that needs to know
  // what a device does reads the facts below (and transport_type), not this.
  std::string provider;
  transport transport_type = transport::iwarp;
  std::uint32_t max_qp = 0;
  std::uint32_t max_cqe = 0;
  std::uint32_t max_qp_wr = 0;
  std::uint32_t max_sge = 0;
  // SGEs an RDMA READ may scatter its data into (ibv's max_sge_rd). iWARP
  // devices often allow one (RDMAP names a READ's sink by one STag); a READ
  // with more is refused at post time with errc::invalid_argument.
  std::uint32_t max_sge_rd = 0;
  std::uint32_t max_inline_data = 0;
  std::uint32_t max_mr = 0;
  std::uint64_t max_mr_size = 0;
  std::uint32_t max_msg_size = 0;
  std::uint32_t max_qp_rd_atom = 0;  // IRD/ORD limit
  // Shared receive queues (srq.hpp): how many, receives and SGEs per queue;
  // 0 when the device has none (pd.create_srq then returns unsupported).
  std::uint32_t max_srq = 0;
  std::uint32_t max_srq_wr = 0;
  std::uint32_t max_srq_sge = 0;
  // post_recv (a QP's and an SRQ's) refuses an SGE whose lkey is not live
  // local_write memory of the PD, or that lies outside its region, with
  // invalid_argument (soft, shm). false: the device finds out only when a
  // message arrives for that receive (verbs: it completes with loc_prot_err).
  bool post_recv_checks_lkeys = false;
  // post_send with send_flags::inline_data checks each SGE as a non-inline
  // one: a stale lkey or a range outside its region completes with
  // loc_prot_err and sends nothing (soft, shm). false: the device copies the
  // bytes without looking at the lkey, as the verbs contract allows (verbs).
  bool inline_checks_lkeys = false;
  // Deregistering memory that an outstanding work request uses is handled: the
  // request touches no more of it and fails (a receive with loc_prot_err, a
  // READ's sink gets no more bytes), and the QP goes to ERROR (soft, shm).
  // false: it is the application's error, as in verbs, and each device
  // answers it its own way.
  bool deregister_stops_outstanding = false;
  // register_memory pins the pages as they are when registered and the device
  // reaches them by DMA (verbs): memory given back to the kernel
  // (madvise(MADV_DONTNEED)) while registered is no longer what the device
  // sees. false: the device reaches registered memory through this process's
  // mapping at each access (soft, shm), so released pages may fault in again.
  bool registration_pins_pages = false;
  // The library itself runs MPA (RFC 5044/6581) for this device's
  // connections: software_device_options::software.request_crc applies and
  // qp_connection_attr::iwarp reports what was negotiated (soft). false on
  // shm (no MPA) and on rdma-core's iWARP devices, where the kernel or the
  // NIC runs it and tells nothing of it.
  bool runs_mpa = false;
  bool atomics = false;  // between two peers that both support them
  // What a remote atomic is atomic against (verbs' atomic_cap): only other
  // RDMA atomics through this device (`rdma`, IBV_ATOMIC_HCA: a CPU store to
  // the word may interleave), or also the owner's CPU and every other accessor
  // (`global`, IBV_ATOMIC_GLOB; soft and shm use one locked instruction on the
  // word). `none` when atomics is false.
  atomic_scope atomic_cap = atomic_scope::none;
  bool immediate_data = false;  // likewise
  // SEND with invalidate can be posted, and a peer's one is honoured for a
  // region registered with access::remote_invalidate (soft, shm). false on
  // verbs: register_memory makes plain MRs, which no peer can invalidate.
  bool send_with_invalidate = true;
  std::vector<port_attr> ports;
};

struct device_info {
  std::string name;
  std::string provider;
  transport transport_type = transport::iwarp;
  bool available = true;
  std::string reason;  // why not available
};

class CONVEYOR_API device {
 public:
  device() = default;
  explicit device(std::shared_ptr<detail::device_impl> impl) noexcept;
  device(device&&) noexcept = default;
  device& operator=(device&&) noexcept = default;
  device(const device&) = delete;
  device& operator=(const device&) = delete;
  ~device();

  // Every device of every provider built into this library.
  static std::vector<device_info> list();
  // Opens a device by name ("soft", or "soft:<label>" for a separate instance)
  // or by provider; errc::not_found names the devices that exist.
  static result<device> open(std::string_view name, const device_options& opts = {});

  explicit operator bool() const noexcept { return impl_ != nullptr; }
  const device_attr& attr() const noexcept;
  const device_options& options() const noexcept;
  std::string_view name() const noexcept { return attr().name; }

  result<protection_domain> alloc_pd();
  result<completion_queue> create_cq(const cq_options& opts = {});

  // Another handle to this same device (its objects, engine and key table):
  // for code that needs a device of its own while this one lives on.
  device share() const noexcept;

 private:
  friend struct detail::handle_access;  // the library reaches the implementation
  std::shared_ptr<detail::device_impl> impl_;
};

}  // namespace conveyor
