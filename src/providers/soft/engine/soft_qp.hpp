// The soft provider's queue pair: an iWARP RC endpoint over one TCP socket.
//
// Send side: post_send copies the work request into a preallocated SQ slot and,
// under the QP's send lock, frames FPDUs straight from the registered buffers
// (iovecs, no bounce copy) and hands them to the socket with sendmsg, many
// frames per call. What the socket does not take waits for EPOLLOUT in the
// engine. SEND/WRITE completions are reported once the peer has provably
// placed them: a zero-length RDMA Read (standard iWARP, like an RTR) follows
// signaled SEND/WRITEs and its response confirms everything before it, so a
// remote protection error completes the very request that caused it.
//
// Receive side (engine only): a byte-stream parser; headers come through a
// staging buffer read in large batches, bulk payload is received directly into
// its final buffer (readv into the region, then the trailer, then a small
// look-ahead). Every tagged access re-validates its key per step, so
// deregistration takes effect at once.
#pragma once

#include "providers/soft/net/tcp.hpp"
#include "providers/soft/wire/wire.hpp"
#include "providers/swnic/sw_qp.hpp"

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace conveyor::soft {

class soft_pd;
class soft_device;
class soft_qp;

// Between an accepted QP and the device's RTR reader (soft_cm.cpp): the
// reader acts on the QP only under mu and while qp is set; the QP clears it
// (cancel_rtr_wait) before it is torn down or reset.
struct rtr_link {
  std::mutex mu;
  soft_qp* qp = nullptr;
};

struct conn_params {
  bool crc = false;
  bool ext = false;
  std::uint32_t ird = 0;         // inbound reads we accept
  std::uint32_t ord = 0;         // outbound reads we may have outstanding
  bool answer_read_rtr = false;  // the responder got a zero-length Read RTR to answer
  bool large_fpdus = false;      // the peer accepts FPDUs larger than the MSS, and so do we
};

class soft_qp final : public swnic::sw_qp {
 public:
  explicit soft_qp(swnic::qp_args&& a);
  ~soft_qp() override;

  void disconnect() noexcept override;
  result<connection_info> connect(std::string_view address, const connect_options& opts) override;

  // Engine callback.
  void on_events(std::uint32_t events) noexcept;
  // Engine: read and handle whatever the socket holds, without waiting for
  // epoll to report it; true when bytes came in (or the connection ended).
  bool poll_inbound() noexcept;
  // Connection manager: the handshake is done; take the socket and go to RTS.
  // sent_read_rtr: we (initiator) sent a zero-length Read RTR and await its response.
  void start(net::fd_guard fd, const conn_params& p, qp_connection_attr attr, bool sent_read_rtr);
  // Responder (accept): the Reply is sent, the initiator's RTR is still to
  // come (RFC 6581: nothing may be sent before it). The QP is RTS at once:
  // work posted now waits in the queues; nothing goes out until
  // resume_after_rtr. `fd` (still owned by the RTR reader) gives the MSS.
  void await_rtr(int fd, const conn_params& p, qp_connection_attr attr,
                 std::shared_ptr<rtr_link> link);
  // The reader (holding link->mu, link->qp == this): the RTR arrived; take
  // the socket and go on as start() does. false (the socket is closed) when
  // the QP left the wait meanwhile (ERROR, reset).
  bool resume_after_rtr(net::fd_guard fd) noexcept;
  // The reader (holding link->mu): no valid RTR in time; the QP goes to ERROR.
  void fail_rtr(const std::string& why) noexcept;
  // How long a QP in ERROR keeps its socket for the Terminate to leave.
  static constexpr std::chrono::milliseconds linger_time{1000};

 private:
  enum class wqe_st : std::uint8_t { queued, unconfirmed, awaiting, done };
  struct swqe : swnic::wqe_base {
    wqe_st st = wqe_st::queued;
    std::uint32_t msn = 0;            // untagged MSN used (send/read/atomic) for Terminate matching
    std::uint64_t atomic_result = 0;  // fetched original value
    bool src_revoked = false;         // its source was deregistered while it was being sent
  };
  // An outbound READ/atomic/confirm waiting for its response.
  struct outstanding {
    enum kind_t : std::uint8_t { user_read, confirm, atomic } kind;
    std::uint32_t wqe;  // SQ index (user_read/atomic)
    std::uint64_t id;   // atomic request id; confirm read serial
    std::uint32_t sink_stag;
    std::uint64_t sink_to;
    std::uint64_t len, got;
    // Absolute SQ position: the peer processes in order, so this response proves
    // every SEND/WRITE posted before it was placed.
    std::uint64_t sq_pos;
  };
  // An inbound request we answer (the IRQ).
  struct response {
    enum kind_t : std::uint8_t { read, atomic } kind;
    std::uint32_t sink_stag;
    std::uint64_t sink_to;
    std::uint64_t len, sent;
    std::uint32_t src_stag;
    std::uint64_t src_to;
    std::uint32_t request_id;
    std::uint64_t original;
  };
  // One sendmsg batch.
  static constexpr int max_iov = 512;
  static constexpr std::size_t arena_size = 32 * 1024;
  // A whole batch (max_batch_bytes): 1 and 8 MiB READs with CRC ran at
  // 0.75x / 0.71x of sending from the region with a quarter of it (four
  // sendmsg a batch), 0.86x / 0.77x with all of it
  // (docs/performance/2026-12-04-soft-read-crc-copy.md).
  // Only its touched pages are resident: the QP's largest batch of READ
  // responses.
  static constexpr std::size_t stage_size = 1024 * 1024;
  // READ-response chunks one batch may carry; tx_progress_locked holds a
  // guard on every one of them across sendmsg.
  static constexpr std::size_t max_batch_keys = 64;
  struct mark {
    std::size_t end;
    enum kind_t : std::uint8_t { sq, resp, term } kind;
    std::uint32_t idx;
  };
  // A region the batch's unsent bytes are read from at sendmsg: a READ
  // response's source (remote_read) or a SEND/WRITE's source (sq_idx).
  struct batch_key {
    std::uint32_t key;
    std::uint64_t addr, len;
    std::size_t end;
    std::uint32_t sq_idx = no_sq;
    static constexpr std::uint32_t no_sq = ~std::uint32_t(0);
  };

  // ---- sw_qp hooks ----
  swnic::wqe_base& sq_entry_locked(std::uint32_t idx) noexcept override;
  bool sq_accept_locked(std::uint32_t idx) noexcept override;
  bool sq_transmit_locked() noexcept override;
  void to_error() noexcept override { enter_error(wc_status::wr_flush_err, 0); }
  void wait_rx_placement() const noexcept override { wait_placement(); }
  void teardown_for_reset() noexcept override;
  void reset_locked() noexcept override;
  void provider_counters(qp_counters& c) const noexcept override;

  // ---- send side (under tx_mu_) ----
  void tx_progress_locked() noexcept;
  bool build_batch_locked() noexcept;
  bool frame_sq_locked(std::uint32_t idx) noexcept;
  bool frame_response_locked(response& r) noexcept;
  bool add_control_locked(std::span<const std::byte> fpdu) noexcept;
  bool add_data_fpdu_locked(bool tagged, wire::rdmap_op op, bool last, std::uint32_t stag,
                            std::uint64_t to, std::uint32_t q, std::uint32_t msn, std::uint32_t mo,
                            std::uint32_t inv, std::span<const iovec> payload,
                            std::size_t payload_len) noexcept;
  void after_send_locked(std::size_t sent_now) noexcept;
  void refresh_fpdu_size_locked(std::uint64_t pending) noexcept;
  // The FPDU size to send with on socket fd: one MSS, or 64 KiB with large_fpdus.
  std::size_t fpdu_limit(int fd) const noexcept;
  void retire_locked() noexcept;
  void complete_send_locked(swqe& w, wc_status st) noexcept;
  // Whether every local SGE of SQ entry idx still names a live region.
  bool sq_sources_live_locked(const swqe& w, std::uint32_t idx) noexcept;
  // Frames [cur_off_, cur_off_+chunk) of a SEND/WRITE: its sources checked and
  // held while framed, then named in batch_keys_ for sendmsg. False: the
  // batch is full, or (w.src_revoked) a source was deregistered mid-message.
  bool frame_sq_chunk_locked(swqe& w, std::uint32_t idx, std::uint64_t chunk, bool tagged,
                             wire::rdmap_op op, bool last, std::uint32_t inv) noexcept;
  std::size_t gather_sq(const swqe& w, std::uint32_t idx, std::uint64_t off, std::uint64_t len,
                        iovec* out, int max) noexcept;
  void confirm_before_locked(std::uint64_t sq_pos) noexcept;

  // ---- receive side (engine) ----
  void rx_progress() noexcept;
  bool rx_header() noexcept;   // parse + validate + plan; false on fatal
  bool rx_payload() noexcept;  // false when it must wait for the socket
  bool rx_trailer() noexcept;
  bool rx_message_done() noexcept;
  bool rx_fill(std::size_t want) noexcept;  // read more into staging; false on EAGAIN/EOF
  // What the receive side queued for the send side (READ and atomic responses,
  // requests waiting for the ORD a response freed) leaves in one sendmsg before
  // the next socket read and when the round ends, not one per message parsed:
  // a batch of READ requests read at once gets its responses in one call.
  void send_kicked() noexcept;
  // In ERROR the QP reads no more (a peer cannot make it accept and discard
  // bytes forever): the socket leaves epoll's read set, and the socket is
  // closed once the peer hangs up or linger_time has passed, time for our
  // Terminate and FIN to leave. rx_mu_ held.
  void stop_reading_locked() noexcept;
  void linger_step(std::uint32_t events) noexcept;
  void close_socket() noexcept;  // after the engine detached it
  // Where payload bytes [off, off+len) of the current FPDU go: at most
  // max_place_iov pieces in out, each under a key guard held until
  // rx_release. place_flushed: the request is gone (flushed meanwhile) or the
  // peer's tagged access is refused; place_revoked: a local sink (a READ's or
  // a receive's) was deregistered, see local_sink_revoked.
  static constexpr int max_place_iov = 32;
  static constexpr int place_flushed = -1, place_revoked = -2;
  int plan_payload(std::uint64_t off, std::uint64_t len, iovec* out) noexcept;
  // Maps [moff, moff+len) of a local SGE list onto out, acquiring each piece's
  // lkey with local_write into rx_guards_ (a lock that a flush takes is held).
  int plan_local(const sge* s, std::uint32_t nsge, std::uint64_t moff, std::uint64_t len,
                 iovec* out) noexcept;
  // The READ response or SEND being placed lost its local sink: the request
  // completes with loc_prot_err, the QP fails and the peer gets a Terminate
  // (rem_op_err there), as on shm.
  void local_sink_revoked() noexcept;
  // rx_payload: plan_payload refused the step (why < 0).
  void placement_refused(int why) noexcept;
  void handle_read_request(const wire::read_request& rr) noexcept;
  void handle_atomic_request(const wire::atomic_request& a) noexcept;
  void handle_terminate(const wire::terminate_msg& t) noexcept;
  void fail_with_terminate(const wire::terminate_msg& t, wc_status local_status) noexcept;
  void protocol_violation(wire::term_layer layer, std::uint8_t etype, std::uint8_t ecode,
                          wc_status local_status) noexcept;

  // ---- errors and teardown ----
  void enter_error(wc_status first_status, std::uint32_t vendor) noexcept;
  // Ends a wait for the RTR: the reader no longer touches this QP. Called
  // without tx_mu_ (the reader takes it under link->mu).
  void cancel_rtr_wait() noexcept;
  // start()'s second half: the connected log line, the engine, transmission.
  void go_live() noexcept;
  void flush_locked(wc_status first_status, std::uint32_t vendor) noexcept;

  soft_device* dev_;

  // connection
  int fd_ = -1;
  std::atomic<bool> attached_{false};
  conn_params cp_;
  bool awaiting_rtr_ = false;           // tx_mu_: accepted, RTR not yet read
  std::shared_ptr<rtr_link> rtr_link_;  // tx_mu_
  std::size_t max_fpdu_ = 1460;         // tx_mu_ once connected
  // TCP's MSS starts bounded by half the initial window (32 KiB on loopback)
  // and grows with it (to 65483 there): bulk framing re-reads it, as Linux siw
  // does, so FPDUs follow it (tx_mu_).
  std::uint64_t tx_framed_ = 0;     // payload bytes framed
  std::uint64_t mss_check_at_ = 0;  // re-read the MSS when tx_framed_ gets here

  // SQ (tx_mu_; the base's sq_head_/sq_next_/sq_tail_: retire / transmit / post)
  std::vector<swqe> sq_;
  std::uint64_t cur_off_ = 0;          // bytes of the current SQ message already framed
  bool cur_imm_sent_ = false;          // send_with_imm: the Immediate Data part went out
  std::deque<outstanding> out_reads_;  // in order of request
  std::deque<outstanding> out_atomics_;
  std::uint32_t ord_used_ = 0;
  std::uint64_t confirm_next_ = 1;  // id the next confirm read will carry
  bool need_confirm_ = false;
  std::uint32_t tx_msn_[4] = {1, 1, 1, 1};
  std::deque<response> irq_;     // inbound reads/atomics to answer, in order
  std::size_t irq_framing_ = 0;  // responses of irq_ already fully framed
  std::vector<std::byte> term_bytes_;
  bool term_pending_ = false, term_sent_ = false;
  std::uint32_t atomic_req_id_ = 1;
  // current batch
  iovec iov_[max_iov];
  int niov_ = 0, iov_pos_ = 0;
  std::size_t batch_bytes_ = 0, batch_sent_ = 0;
  std::unique_ptr<std::byte[]> arena_;
  std::size_t arena_used_ = 0;
  // READ response payloads copied before they are summed (CRC on only): the
  // CRC covers the bytes sent even while the region's owner rewrites them.
  // Reserved when a connection with CRC starts; refilled from each batch's start.
  std::unique_ptr<std::byte[]> stage_;
  std::size_t stage_used_ = 0;
  std::vector<mark> marks_;
  std::vector<batch_key> batch_keys_;
  bool want_write_ = false;

  // receive state (engine thread only; rx_mu_ for teardown)
  std::mutex rx_mu_;
  std::unique_ptr<std::byte[]> rxbuf_;
  std::size_t rx_beg_ = 0, rx_end_ = 0;
  enum class rx_phase : std::uint8_t { header, payload, trailer } rx_phase_ = rx_phase::header;
  wire::fpdu_header h_{};
  std::uint32_t rx_crc_ = 0;
  // The keys held during one placement step: the tagged WRITE's, or the
  // lkey of every piece of a READ's sink or a receive (a deregistration waits
  // for this step and no longer, and no byte lands in it afterwards).
  detail::key_table::guard rx_guards_[max_place_iov];
  int rx_nguards_ = 0;
  // A step copying payload into a posted request's buffers (a READ response's
  // sink, a SEND's receive) runs from plan_payload to rx_release without a
  // lock. A flush by another thread waits for it (wait_placement), so no
  // buffer is written after the completion that hands it back to the
  // application (modify(error) while a response streamed in: a write into the
  // sink after its flush completion, seen by TSan as a write into freed memory).
  std::atomic<bool> placing_{false};
  std::atomic<std::thread::id> placer_{};
  void begin_placement() noexcept;
  void rx_release() noexcept;  // ends the step: the key guard and the placement
  void wait_placement() const noexcept;
  std::uint64_t rx_done_ = 0;  // payload bytes of this FPDU placed
  std::byte rx_trailer_[8]{};
  std::size_t rx_trailer_got_ = 0;
  // The last FPDU with payload had a bulk payload: the next header is read
  // alone (with a small look-ahead), so that a bulk payload behind it goes
  // straight into its region. Control FPDUs (READ requests, the zero-length
  // READ confirming a signaled WRITE) and the short last FPDU of a bulk
  // message keep it for a few FPDUs: a 64 KiB WRITE ends in a 76-byte FPDU on
  // loopback, which sent the next 64 KiB WRITE through staging and a copy. A
  // run of them ends it (a burst of READ requests is read in large batches).
  bool rx_last_big_ = false;
  bool rx_bulk_open_ = false;            // the last FPDU was bulk and not its message's last
  std::uint32_t rx_ctl_run_ = 0;         // such FPDUs since the last bulk one
  bool rx_drained_ = false;              // a read this round came back short
  int rx_reads_ = 0;                     // socket reads this round
  bool tx_kicked_ = false;               // send_kicked has something to send
  std::atomic<bool> rx_eof_{false};      // the peer closed or the socket failed
  std::atomic<bool> rx_stopped_{false};  // ERROR: not reading, lingering
  int linger_fd_ = -1;                   // timerfd of the linger deadline (rx_mu_)
  std::uint32_t rx_msn_[4] = {1, 1, 1, 1};
  std::uint64_t rx_msg_off_ = 0;  // untagged: bytes of the current message so far
  bool rx_in_send_ = false;
  std::uint64_t rx_pending_imm_ = 0;
  bool rx_has_pending_imm_ = false;
  std::uint64_t rx_ctl_value_ = 0;  // immediate value / atomic original
  std::uint32_t rx_ctl_id_ = 0;     // atomic response request id

  // counters
  // (the base counts payload bytes; c_*_stream_ are the socket's bytes)
  std::atomic<std::uint64_t> c_tx_fpdus_{0}, c_rx_fpdus_{0}, c_tx_sys_{0}, c_rx_sys_{0},
      c_term_tx_{0}, c_term_rx_{0}, c_tx_stream_{0}, c_rx_stream_{0}, c_rx_direct_{0};
};

}  // namespace conveyor::soft
