// conveyor/cq.hpp — completion queues and work completions.
//
//   auto cq = dev.create_cq({.depth = 1024}).value();
//   std::array<work_completion, 16> wcs;
//   auto n = cq.poll(wcs);                       // non-blocking batch
//   auto wc = cq.wait_one(1s);                   // blocking, bounded, no busy loop
//
// Completion semantics: on soft, shm and InfiniBand/RoCE a SEND or WRITE
// completion means the peer acknowledged it, i.e. the data was placed at the
// target (soft confirms it as an InfiniBand RC ACK would; see
// docs/ARCHITECTURE.md), so a remote access error completes the request that
// caused it. iWARP hardware and Linux siw (verbs) may complete a WRITE once it
// is handed to the transport, as iWARP allows: there a later READ or a SEND the
// peer answers is what proves placement, and a remote access error shows as the
// QP going to ERROR (its later requests flush) rather than on that WRITE.
// READ and atomic completions mean the data is in local memory. Completions of one QP's send
// queue are delivered in posting order (likewise for its receive queue).
//
// Overflow is never silent: once the provider could not store a completion, poll
// and wait return errc::cq_overflow and the QPs that lost completions go to ERROR.
//
// Thread safety: poll/wait/arm may be called from any thread; completions are
// handed out once each. The handle itself is move-only and thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <span>

#include "conveyor/error.hpp"
#include "conveyor/export.hpp"

namespace conveyor {

namespace detail {
struct handle_access;
class cq_impl;
}  // namespace detail

enum class wc_opcode : std::uint8_t {
  send,
  rdma_write,
  rdma_read,
  comp_swap,
  fetch_add,
  recv,                // a SEND arrived
  recv_rdma_with_imm,  // an RDMA_WRITE_WITH_IMM arrived (consumes a receive)
};
CONVEYOR_API std::string_view to_string(wc_opcode op) noexcept;

struct work_completion {
  std::uint64_t wr_id = 0;
  wc_status status = wc_status::success;
  wc_opcode opcode = wc_opcode::send;
  bool with_imm = false;       // imm_data is valid
  bool with_inv = false;       // the SEND carried an invalidate; invalidated_rkey is valid
  std::uint32_t byte_len = 0;  // bytes received / read
  std::uint32_t imm_data = 0;
  std::uint32_t invalidated_rkey = 0;
  std::uint32_t qp_num = 0;      // the local QP this completion belongs to
  std::uint32_t vendor_err = 0;  // provider detail (soft: the Terminate control word)
};

struct cq_options {
  std::uint32_t depth = 1024;  // completions the queue holds before overflowing
};

class CONVEYOR_API completion_queue {
 public:
  completion_queue() = default;
  explicit completion_queue(std::shared_ptr<detail::cq_impl> impl) noexcept;
  completion_queue(completion_queue&&) noexcept = default;
  completion_queue& operator=(completion_queue&&) noexcept = default;
  completion_queue(const completion_queue&) = delete;
  completion_queue& operator=(const completion_queue&) = delete;
  ~completion_queue();

  explicit operator bool() const noexcept { return impl_ != nullptr; }
  std::uint32_t depth() const noexcept;

  // Non-blocking: moves up to out.size() completions into out; returns the count
  // (0 when empty) or errc::cq_overflow. In manual-progress mode this also drives
  // the device's engine. Never allocates, never blocks.
  std::expected<std::size_t, errc> poll(std::span<work_completion> out) noexcept;

  // Blocking: returns as soon as at least one completion is available (up to
  // out.size()), or errc::timed_out after `timeout`. Spins briefly, then sleeps
  // on an event descriptor; never busy-waits for the whole timeout.
  std::expected<std::size_t, errc> wait(std::span<work_completion> out,
                                        std::chrono::nanoseconds timeout) noexcept;
  std::expected<work_completion, errc> wait_one(std::chrono::nanoseconds timeout) noexcept;

  // Event integration (ibv_req_notify_cq + completion channel): fd() is readable
  // after arm() once a new completion arrives (or at once if some are queued).
  // Typical loop: arm(); epoll_wait(...); poll() until empty; arm() again.
  // With progress_mode::manual (soft, shm) nothing runs the device's engine
  // but poll() and wait(), so fd() is also readable after arm() once the
  // engine has work (a peer's message or response): the loop wakes, and its
  // poll() runs the engine, which may or may not complete anything yet.
  int fd() const noexcept;
  void arm() noexcept;

 private:
  friend struct detail::handle_access;  // the library reaches the implementation
  std::shared_ptr<detail::cq_impl> impl_;
};

}  // namespace conveyor
