// tools/conveyor/perf_session.hpp — what both sides of `conveyor perf` share:
// the handshake carried in connection private data, the control messages, and
// the endpoint (device, CQs, regions, QPs).
//
// Connections: the client connects one control QP, then --qps data QPs. Each
// connect carries a hello (magic "CVPF", protocol version, the client's
// parameters and its two regions); the server answers with its two regions, or
// rejects with a reason the client prints (version mismatch, size over the
// server's --max-size, ...). Control messages (64 bytes, SEND/RECV on the
// control QP) frame every measured phase: begin -> ready, ..., end -> result.
// Nothing on the data QPs is ever a control message.
#pragma once

#include <conveyor/conveyor.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "perf_options.hpp"

namespace conveyor::tool {

// 2: the hello carries the client's regions as address and rkey (50 bytes in
// all, within the 55 an InfiniBand/RoCE connect may carry). 3: up to
// perf_max_qps data QPs, their credit words at ctl_layout::credit_off. 4: the
// hello carries the slots per QP (--slots; 54 bytes in all).
inline constexpr std::uint16_t perf_protocol_version = 4;

// Everything that goes wrong ends the run with one message for the user.
struct perf_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& what);

template <class T>
T check(result<T> r, std::string_view what) {
  if (!r) fail(std::string(what) + ": " + r.error().to_string());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}
void check(status s, std::string_view what);

// The client's hello, in every connect's private data.
struct perf_hello {
  std::uint16_t version = perf_protocol_version;
  std::uint16_t qps = 1;
  std::uint16_t index = 0;  // 0 = control QP, 1.. = data QPs
  std::uint32_t tx_depth = 1;
  std::uint32_t rx_depth = 1;
  std::uint32_t slots = 0;  // --slots (0: the default, one per outstanding request)
  std::uint64_t max_size = 0;
  remote_region data, ctl;  // the client's regions (lengths: from the layout)
  // At most max_encoded bytes (the private data limit of an IB/RoCE connect).
  static constexpr std::size_t max_encoded = 55;
  std::vector<std::byte> encode() const;
  // nullopt + why when the bytes are not a hello of this version.
  static std::optional<perf_hello> decode(std::span<const std::byte> b, std::string& why);
};

// The server's answer in the accept's private data.
struct perf_welcome {
  remote_region data, ctl;
  std::vector<std::byte> encode() const;
  static std::optional<perf_welcome> decode(std::span<const std::byte> b);
};

enum class ctl_kind : std::uint32_t { begin = 1, ready, end, result, bye };

// One control message (fixed 96 bytes on the wire, little-endian).
struct ctl_msg {
  ctl_kind kind = ctl_kind::bye;
  perf_test test = perf_test::write;
  perf_mode mode = perf_mode::bw;
  bool verify = false;
  std::uint64_t size = 0;
  std::uint64_t count = 0;  // end: operations done per QP (sum); result: receives seen
  std::uint64_t seed = 0;
  std::uint64_t user_us = 0, sys_us = 0;  // result: the server's CPU during the phase
  std::uint64_t errors = 0;               // result: bytes/values that failed verification
  std::uint64_t min_per_qp = 0;           // end: the fewest operations any one data QP did
  // begin and ready: where the sender runs (see placement).
  std::uint64_t host = 0;  // a hash of the machine's boot id; 0: unknown
  std::uint32_t cpu = 0;   // the CPU it is pinned to (--cpu) + 1; 0: not pinned
  static constexpr std::size_t wire_size = 96;
  void encode(std::span<std::byte, wire_size> out) const noexcept;
  static ctl_msg decode(std::span<const std::byte, wire_size> in) noexcept;
};

// The bytes of slot `slot` of a phase with seed `seed`: what the sender writes
// and the receiver checks.
void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t slot);
bool check_pattern(std::span<const std::byte> in, std::uint64_t seed, std::uint64_t slot);

// Layout of the data region: per QP `slots` slots of `slot_size` bytes each.
struct data_layout {
  std::uint64_t slot_size = 64;
  std::uint32_t slots = 1;
  std::uint32_t qps = 1;
  // `slots` per QP when it is not 0; otherwise one per outstanding request
  // (`depth`) within 64 MiB a QP, and at least two.
  static data_layout make(std::uint64_t max_size, std::uint32_t depth, std::uint32_t qps,
                          std::uint32_t slots = 0);
  // Plus one spare slot: the source of latency runs' requests and echoes, never
  // a receive buffer or a target.
  std::uint64_t bytes() const { return slot_size * (static_cast<std::uint64_t>(slots) * qps + 1); }
  std::uint64_t spare() const { return slot_size * slots * qps; }
  std::uint64_t offset(std::uint32_t qp, std::uint64_t n) const {
    return (static_cast<std::uint64_t>(qp) * slots + n % slots) * slot_size;
  }
};

// Layout of the control region.
struct ctl_layout {
  static constexpr std::size_t recv_slots = 8;                              // 8 x 96 B < credit_off
  static constexpr std::size_t recv_off = 0;                                // receive buffers
  static constexpr std::size_t send_off = recv_slots * ctl_msg::wire_size;  // one send buffer
  // 8 bytes per data QP: on the client the server's credit for that QP, on the
  // server the word its credit WRITE is sent from.
  static constexpr std::size_t credit_off = 4096;
  static constexpr std::size_t bytes = credit_off + 8 * perf_max_qps;
};

// Page-aligned zeroed memory.
struct aligned_buffer {
  explicit aligned_buffer(std::size_t n);
  ~aligned_buffer();
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  std::span<std::byte> span() const { return {ptr, size}; }
  std::byte* ptr;
  std::size_t size;
};

// Reads 8 bytes that a peer's RDMA WRITE may be landing in (as ib_write_lat
// polls memory the NIC writes by DMA); exempt from ThreadSanitizer, which cannot
// know that the engine thread stands for hardware.
std::uint64_t load_remote_written(const std::byte* p) noexcept;

// The idle turn of a latency loop's busy wait (thread progress). It spins with
// a CPU pause for spin_for after the last reset() and only then yields the
// core on every turn. Yielding on every turn from the start (as the bandwidth
// loops do) hands the core to any other runnable process until the next
// scheduler tick (4 ms on the build VM), and a round trip almost always misses its
// first few polls: on a loaded machine 8-byte round trips then measured
// milliseconds. spin_for is a few shm round trips. When the peer is pinned to
// the same CPU (placement::shares_cpu_with) the spin only keeps it off the
// core, so every turn yields at once. Manual progress: the loop is the engine
// and never yields.
class latency_spin {
 public:
  static constexpr std::chrono::microseconds spin_for{5};
  explicit latency_spin(bool manual, bool peer_on_this_cpu = false)
      : manual_(manual), spin_(!peer_on_this_cpu) {}
  void reset() noexcept { since_ = std::chrono::steady_clock::now(); }
  void relax() noexcept {
    // Manual progress: this thread's polls move the bytes, so it spins, unless
    // the peer shares its CPU: then the peer must run to answer at all (a
    // poller that never yields held it off for a whole 8 ms time slice).
    if (manual_ && spin_) return;
    if (spin_ && std::chrono::steady_clock::now() - since_ < spin_for) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      return;
    }
    std::this_thread::yield();
  }
  bool spins_first() const noexcept {
    return spin_ && !manual_;
  }

 private:
  bool manual_;
  bool spin_;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

// One side's objects.
class perf_endpoint {
 public:
  // Takes the opened device (see open_perf_device).
  perf_endpoint(device dev, const perf_options& o, const data_layout& layout);

  const perf_options& opts() const { return opts_; }
  // Messages up to this size go inline: --inline within what every data QP
  // was granted (a device may grant less than asked, or none).
  std::uint32_t inline_size() const { return inline_size_; }
  const data_layout& layout() const { return layout_; }
  device& dev() { return dev_; }
  protection_domain& pd() { return pd_; }
  completion_queue& send_cq() { return scq_; }
  completion_queue& recv_cq() { return rcq_; }
  completion_queue& ctl_cq() { return ccq_; }
  memory_region& data_mr() { return data_mr_; }
  memory_region& ctl_mr() { return ctl_mr_; }
  std::vector<queue_pair>& qps() { return qps_; }
  queue_pair& ctl_qp() { return ctl_qp_; }
  bool manual() const { return opts_.progress == progress_mode::manual; }

  // Creates the control QP and `n` data QPs (state INIT).
  void create_qps(std::uint32_t n, std::uint32_t tx_depth, std::uint32_t rx_depth);
  // Posts the control receive buffers.
  void post_ctl_recvs();

  void send_ctl(const ctl_msg& m);
  // Waits for the next control message (reposting its buffer); fails after the timeout.
  ctl_msg recv_ctl(std::chrono::milliseconds timeout);
  // Waits up to `slice` for a control message.
  std::optional<ctl_msg> wait_ctl(std::chrono::milliseconds slice);
  // Non-blocking: a control message if one arrived.
  std::optional<ctl_msg> try_recv_ctl();

  // "QP 12 rts, tx/rx bytes ..." for failure messages.
  std::string describe() const;

 private:
  std::optional<ctl_msg> take_ctl(const work_completion& wc);

  perf_options opts_;
  std::uint32_t inline_size_ = 0;
  data_layout layout_;
  device dev_;
  protection_domain pd_;
  completion_queue scq_, rcq_, ccq_;
  std::unique_ptr<aligned_buffer> ctl_buf_;
  memory_region data_mr_, ctl_mr_;
  queue_pair ctl_qp_;
  std::vector<queue_pair> qps_;
  std::vector<work_completion> pending_;  // control completions seen while waiting for another
};

// Opens the device the options name; fails with a hint when it does not exist.
device open_perf_device(const perf_options& o);
// The device name to open for these options ("soft", "verbs:rxe0", ...).
std::string device_to_open(const perf_options& o);
device_options device_options_for(const perf_options& o);
// Pins the calling process to o.cpu (before the device starts its thread).
void apply_cpu_pinning(const perf_options& o);
// Lifts the soft limit on open descriptors to the hard one: each connected QP
// holds one or more (a socket on soft), and --qps goes to perf_max_qps.
void raise_fd_limit();

// Where one side of a run executes: which machine (a hash of the kernel's boot
// id, the same in every network namespace of it) and which CPU it is pinned to
// (--cpu, + 1; 0 when not pinned). The two sides exchange it in begin/ready.
struct placement {
  std::uint64_t host = 0;
  std::uint32_t cpu = 0;
  static placement here(const perf_options& o);
  // Both known, both pinned, the same machine and the same CPU: the two
  // sides take turns on one core.
  bool shares_cpu_with(const placement& peer) const noexcept {
    return host != 0 && cpu != 0 && host == peer.host && cpu == peer.cpu;
  }
};

// User+system CPU seconds of this process.
struct cpu_times {
  double user = 0, sys = 0;
  static cpu_times now();
  cpu_times operator-(const cpu_times& b) const { return {user - b.user, sys - b.sys}; }
};

}  // namespace conveyor::tool
