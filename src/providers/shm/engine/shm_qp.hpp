// The shm provider's queue pair: an RC endpoint over one shared segment (see
// shm_segment.hpp) and one Unix socket (doorbell and liveness).
//
// Send side (tx_mu_): post_send stores the request in a preallocated SQ slot
// and writes it into this side's request ring at once (small payloads staged in
// the slot, bulk as a descriptor the target serves by cross-memory attach).
// What does not fit waits for ring space and is written by the engine.
// Completions: a request is done when the peer's consumer tail passed it (and,
// for staged READs and atomics, when its response arrived). A request the peer
// refused carries the peer's status; everything after it is flushed.
//
// Receive side (engine only): executes the peer's requests in order, validating
// every remote key against this device's key table (live, same PD, in bounds,
// right granted) before touching a byte, and answers READs and atomics.
#pragma once

#include "providers/shm/shm_attach.hpp"
#include "providers/shm/shm_peer_maps.hpp"
#include "providers/shm/wire/segment.hpp"
#include "providers/swnic/sw_qp.hpp"

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace conveyor::shm {

class shm_pd;
class shm_device;

// What the connection manager hands a QP when the handshake is done.
struct conn_setup {
  int sock = -1;        // connected Unix socket (owned from now on)
  void* map = nullptr;  // the mapped segment (owned)
  int side = 0;         // 0 initiator, 1 target
  pid_t peer_pid = 0;
  pid_t attach_pid = 0;  // declared as our tracer for this connection (release_peer_attach)
  bool cma_tx = false;   // the peer serves our bulk requests by cross-memory attach
  bool cma_rx = false;   // we serve the peer's by cross-memory attach
  qp_connection_attr attr;
  // Hints (shm_segment.hpp, hint_page): the peer device's page as mapped here
  // and the peer QP's bit in it (null / no_hint: we do not hint the peer), and
  // whether the peer hints us.
  std::shared_ptr<peer_mapping> peer_hints;
  std::uint32_t peer_hint_bit = no_hint;
  bool hinted = false;
};

class shm_qp final : public swnic::sw_qp {
 public:
  explicit shm_qp(swnic::qp_args&& a);
  ~shm_qp() override;

  void disconnect() noexcept override;
  result<connection_info> connect(std::string_view address, const connect_options& opts) override;

  // ---- engine (under the engine's lock) ----
  int progress() noexcept;              // work done
  void set_sleeping(bool on) noexcept;  // this side is about to block / woke up
  // Hints: our bit in the device's hint page (no_hint: none), whether the peer
  // sets it (fixed from start() to disconnect()), and the cold flag asking it to.
  std::uint32_t hint_bit() const noexcept { return hint_bit_; }
  bool hinted() const noexcept { return hinted_; }
  void set_cold(bool on) noexcept;
  // Socket readiness: drains doorbells; false once the peer is gone (stop polling it).
  bool on_socket(std::uint32_t events) noexcept;
  // The engine's view of this QP (engine::mu_): hot QPs are polled at every
  // step, cold ones a few a step in turn (engine::poll_step_locked).
  bool eng_hot = false;
  std::int64_t eng_idle_since_ns = 0;  // 0: it moved at the last look
  int socket_fd() const noexcept { return sock_; }

  // ---- the device, when a region of it is deregistered (engine's lock held) ----
  // Fails what still uses `key` locally before the deregistration returns
  // (shm_qp.cpp, "deregistration fence").
  void fence_local_key(std::uint32_t key) noexcept;

  // ---- connection manager ----
  void start(conn_setup&& s);

 private:
  struct swqe : swnic::wqe_base {
    bool cma = false, needs_resp = false, resp_done = false, done = false;
    std::uint64_t pos_begin = 0, pos_end = 0;  // request ring positions it occupies
  };
  using rwqe = swnic::rwqe;
  enum class exec { done, blocked, failed };
  // A peer region this side may map (direct mapping, docs/SHM.md).
  struct peer_map {
    enum class st : std::uint8_t { pending, mapped, none } state = st::pending;
    std::byte* ptr = nullptr;  // hold's data
    std::shared_ptr<peer_mapping> hold;
    std::size_t map_len = 0;
    std::uint64_t base = 0, len = 0, gen = 0;
    access rights = access::none;
    std::uint32_t word = 0;
  };

  // sw_qp hooks
  swnic::wqe_base& sq_entry_locked(std::uint32_t idx) noexcept override;
  bool sq_accept_locked(std::uint32_t idx) noexcept override;
  bool sq_transmit_locked() noexcept override { return tx_progress_locked(); }
  void sq_doorbell() noexcept override { notify_peer(); }
  void to_error() noexcept override { enter_error(wc_status::wr_flush_err); }
  void teardown_for_reset() noexcept override { disconnect(); }
  void reset_locked() noexcept override;
  void provider_counters(qp_counters& c) const noexcept override;

  // send side (tx_mu_)
  bool tx_progress_locked() noexcept;                         // wrote something
  bool transmit_locked(swqe& w, std::uint32_t idx) noexcept;  // false: ring full
  std::uint64_t gather_locked(const swqe& w, std::uint32_t idx, std::uint64_t off, std::byte* dst,
                              std::uint64_t len) noexcept;
  bool retire_locked() noexcept;
  void flush_locked(wc_status first) noexcept;
  void fence_peer_locked() noexcept;  // the peer's cross-memory accesses are over
  bool check_peer_error_locked() noexcept;
  // direct mapping (tx_mu_)
  bool try_direct_locked(swqe& w, std::uint32_t idx) noexcept;  // served it now
  // The mapping a READ, WRITE or atomic of w would be served through (null: none).
  const peer_map* direct_map_locked(const swqe& w) const noexcept;
  void on_map_answer_locked(std::uint32_t rkey, const std::byte* payload) noexcept;
  std::shared_ptr<peer_mapping> map_peer_memfd(int fd, std::uint64_t ino, std::size_t len, int prot,
                                               bool populate) noexcept;
  void unmap_peer_locked() noexcept;

  // receive side (engine)
  int rx_requests() noexcept;
  int rx_responses() noexcept;
  exec run_request(const msg_header& m, const std::byte* payload) noexcept;
  exec rx_send(const msg_header& m, const std::byte* payload) noexcept;
  exec rx_immediate(const msg_header& m) noexcept;
  exec rx_write(const msg_header& m, const std::byte* payload) noexcept;
  exec rx_read(const msg_header& m, const std::byte* payload) noexcept;
  exec rx_atomic(const msg_header& m) noexcept;
  exec rx_map(const msg_header& m) noexcept;
  // process_vm_writev (into_peer) or _readv on the peer's memory, unless the
  // peer fenced us (shm_segment.hpp, cma_fence): -1 then.
  ssize_t peer_cma(bool into_peer, const iovec* local, unsigned nl, const iovec* remote,
                   unsigned nr) noexcept;
  bool take_recv(rwqe& out, sge* sges) noexcept;
  void complete_recv(const rwqe& r, wc_status st, wc_opcode op, std::uint64_t len, bool imm,
                     std::uint32_t imm_data, bool inv, std::uint32_t inv_key) noexcept;
  bool scatter_local(const sge* sges, std::uint32_t nsge, std::uint64_t off, const std::byte* src,
                     std::uint64_t len, access need) noexcept;
  bool resp_space(std::uint32_t n) noexcept;
  std::uint64_t req_free_locked() const noexcept;  // our request ring's free slots

  void reset_rx() noexcept;  // no receive-side state outlives the request it belongs to

  // errors and teardown
  void fail_request(wc_status remote, wc_status local) noexcept;  // refuse the current request
  void enter_error(wc_status first) noexcept;
  void notify_peer() noexcept;

  ring_ctl& req_out() const noexcept { return seg_.hdr->req[seg_.side]; }
  ring_ctl& req_in() const noexcept { return seg_.hdr->req[1 - seg_.side]; }
  ring_ctl& resp_out() const noexcept { return seg_.hdr->resp[seg_.side]; }
  // Stores our response ring's head only when it moved: the peer polls that
  // word, so each store of an unchanged value would still pull its cache line
  // away from the peer (two cross-core misses per request that has no response).
  void publish_resp_head() noexcept {
    if (rsp_head_ == rsp_shown_) return;
    rsp_shown_ = rsp_head_;
    resp_out().head.store(rsp_head_, std::memory_order_seq_cst);
  }
  ring_ctl& resp_in() const noexcept { return seg_.hdr->resp[1 - seg_.side]; }

  shm_device* dev_;

  // connection
  int sock_ = -1;
  seg_view seg_;
  pid_t peer_pid_ = 0;
  pid_t attach_pid_ = 0;  // our ptrace declaration for the peer, released at disconnect
  bool cma_tx_ = false, cma_rx_ = false;
  std::atomic<bool> attached_{false};
  std::atomic<bool> peer_gone_{false};
  bool connected_ = false;

  // SQ (tx_mu_; the base's sq_head_/sq_next_/sq_tail_: retire / transmit / post)
  std::vector<swqe> sq_;
  std::uint64_t tx_off_ = 0;     // bytes of sq_next_ already in the ring
  bool tx_imm_pending_ = false;  // WRITE_WITH_IMM: data written, immediate not yet
  std::uint64_t tx_head_ = 0;    // our request ring's head (we produce it)
  std::uint32_t ord_used_ = 0;   // READs/atomics transmitted and not retired (<= attr_.ord)
  std::uint64_t seen_tail_ = 0;  // the peer's consumer tail last retired against

  // direct mapping of the peer's allocated regions (tx_mu_)
  bool direct_ok_ = false;  // we may map: our probe reached the peer, neither side opted out
  int pidfd_ = -1;
  const std::atomic<std::uint64_t>* peer_rev_ = nullptr;  // the peer's revocation page
  std::shared_ptr<peer_mapping> peer_rev_map_;            // ... and its mapping
  std::uint64_t peer_rev_ino_ = 0;
  std::unordered_map<std::uint32_t, peer_map> pmaps_;

  // receive side (engine only)
  std::uint64_t rx_tail_ = 0;    // the peer's request ring: next to execute
  std::uint64_t rsp_tail_ = 0;   // the peer's response ring: next to consume
  std::uint64_t rsp_head_ = 0;   // our response ring: next to fill
  std::uint64_t rsp_shown_ = 0;  // ... as last stored in the ring's head word
  // Every field the peer writes is copied out of the segment once, validated
  // once, and only that copy is used until its request retires:
  //  - a request that blocks (response ring full) is resumed from rx_req_, never
  //    from its slot, which the peer may rewrite meanwhile; rx_read_off_ is the
  //    progress of rx_req_ alone and is cleared with it;
  //  - a SEND of several slots is held to its first slot's (validated) total,
  //    id and immediate: rx_send_total_ bounds every later slot and is what the
  //    receive completion reports.
  bool rx_held_ = false;
  msg_header rx_req_{};
  std::uint64_t rx_read_off_ = 0;  // staged READ response bytes of rx_req_ already queued
  bool rx_in_send_ = false;        // a staged SEND is under way
  std::uint64_t rx_send_total_ = 0, rx_send_done_ = 0, rx_send_id_ = 0;
  std::uint8_t rx_send_flags_ = 0;
  std::uint32_t rx_send_imm_ = 0;
  rwqe rx_recv_{};
  sge rx_recv_sge_[16]{};
  // IRD: where each staged READ/atomic response we produced ends in our
  // response ring, until the peer's consumer tail passes it; at most attr_.ird.
  std::deque<std::uint64_t> irq_ends_;
  bool irq_full() noexcept;         // prunes what the peer consumed; true at attr_.ird
  bool rsp_bad_ = false;            // the peer moved our response ring's tail past what we produced
  std::atomic<bool> dirty_{false};  // we changed shared state: the peer may need a doorbell
  wc_status pending_local_ = wc_status::success;

  // counters
  std::atomic<std::uint64_t> c_tx_msgs_{0}, c_rx_msgs_{0}, c_bells_{0}, c_hints_{0};
  // The direct path's counts, written only under tx_mu_: a plain load and
  // store each (bump_locked), no locked read-modify-write on every operation.
  std::atomic<std::uint64_t> c_direct_{0}, c_direct_tx_{0}, c_direct_rx_{0};
  static void bump_locked(std::atomic<std::uint64_t>& c, std::uint64_t n) noexcept {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  // Hints (kept after everything the data path touches, whose layout they
  // would otherwise spread over more cache lines): our bit, whether the peer
  // sets it, and the word of the peer's hint page that holds the peer QP's bit.
  const std::uint32_t hint_bit_;
  bool hinted_ = false;
  std::atomic<std::uint64_t>* peer_hint_word_ = nullptr;
  std::uint64_t peer_hint_mask_ = 0;
  std::shared_ptr<peer_mapping> peer_hint_map_;
};

}  // namespace conveyor::shm
