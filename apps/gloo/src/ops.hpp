// ops.hpp — what a pair, its context and the buffers share: the limits of the
// data path, the operations in flight and the items a pair queues to post.
// docs/GLOO.md ("Data path").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include <gloo/common/error.h>
#include <conveyor/conveyor.hpp>

#include "wire.hpp"

// Internal: hidden, so the library exports CreateDevice only (as when this was
// one file with an anonymous namespace).
#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t staging_size = 64 * 1024;                      // one receive / send slot
constexpr std::size_t eager_max = staging_size - wire::header_size;  // larger: RDMA WRITE
constexpr std::uint32_t recv_depth = 32;  // receives (= credits) per pair
constexpr std::uint32_t sq_depth = 512;
constexpr std::size_t write_chunk = 4u << 20;  // one WRITE's length at most
constexpr std::size_t max_peer_entries =
    1u << 16;  // RTRs / notifications / announcements a peer may park

// A work request's id: its kind (bits 56..63), the serial of the QP that
// posted it (bits 24..55: the pairs of a context share a completion queue, and
// a replaced or closed QP's late completions must not reach the pair's new
// one) and a staging slot (bits 0..23).
enum class wr_kind : std::uint64_t { send = 1, recv = 2, write = 3 };
inline std::uint64_t make_wr(wr_kind k, std::uint32_t serial, std::uint64_t idx) {
  return (std::uint64_t(k) << 56) | (std::uint64_t(serial) << 24) | idx;
}
inline std::uint32_t wr_serial(std::uint64_t wr_id) {
  return std::uint32_t(wr_id >> 24);
}

// Completion state of one unbound buffer, shared with the operations in flight
// so a completion arriving after the buffer is gone touches nothing freed.
struct buf_state {
  std::mutex m;
  std::condition_variable cv;
  int recv_completions = 0, recv_rank = -1;
  int send_completions = 0, send_rank = -1;
  bool abort_recv = false, abort_send = false;
  std::exception_ptr ex;
  std::string recv_from, send_to;  // for messages: the ranks of the last operation

  void recv_done(int rank) {
    std::lock_guard g(m);
    ++recv_completions;
    recv_rank = rank;
    cv.notify_all();
  }
  void send_done(int rank) {
    std::lock_guard g(m);
    ++send_completions;
    send_rank = rank;
    cv.notify_all();
  }
  void fail(const std::string& msg) {
    std::lock_guard g(m);
    if (!ex) ex = std::make_exception_ptr(::gloo::IoException(msg));
    cv.notify_all();
  }
};

inline void drop(conveyor::memory_region& mr) {
  if (mr) mr.deregister();
}

struct send_op {
  std::shared_ptr<buf_state> st;
  const std::byte* ptr = nullptr;
  std::size_t nbytes = 0;
  std::uint64_t slot = 0;
  conveyor::memory_region mr;  // large sends: the source, for this operation only
};

struct recv_op {
  std::shared_ptr<buf_state> st;
  std::byte* ptr = nullptr;
  bool cancelled = false;  // the buffer is gone: arriving data is dropped, the RTR withdrawn
  std::size_t nbytes = 0;
  std::uint64_t slot = 0;
  conveyor::memory_region mr;  // large receives: the target, for this operation only
};

struct rtr_info {
  std::uint64_t token = 0, nbytes = 0, addr = 0;
  std::uint32_t rkey = 0;
};

struct bound_recv {
  std::uint64_t slot = 0;
  std::byte* ptr = nullptr;
  std::size_t size = 0;
  conveyor::memory_region mr;
  int completions = 0;
};

struct bound_send {
  int pending = 0;
};

// One message to post: optional RDMA WRITE(s) first, then the SEND with `h`.
struct out_item {
  wire::header h;
  const std::byte* payload = nullptr;
  std::size_t payload_len = 0;
  std::uint32_t write_lkey = 0;
  std::uint64_t write_src = 0;
  std::size_t write_len = 0;
  std::uint64_t write_dst = 0;
  std::uint32_t write_rkey = 0;
  std::shared_ptr<send_op> op;        // completes with this SEND
  std::shared_ptr<bound_send> bsend;  // likewise, for a bound buffer
};

struct staging_meta {
  std::shared_ptr<send_op> op;
  std::shared_ptr<bound_send> bsend;
};

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
