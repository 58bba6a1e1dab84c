// A listener's accept side, shared by the soft (TCP, MPA) and shm (Unix
// socket) providers: one thread with its own epoll accepts connections and
// drives every handshake at once, non-blocking, so no peer can hold up another
// (a peer that connects and stays silent, or drips its request a byte at a
// time, costs the listener one socket until its deadline, nothing more).
//
// Bounds, all of them on what a peer can make the listener hold:
//   - max_pending half-open handshakes; when a new connection arrives and the
//     table is full, the oldest half-open one is closed (it is the one nearest
//     its deadline, and a legitimate peer completes in one round trip);
//   - a deadline per handshake, from the moment its connection was accepted;
//   - max_ready complete requests waiting for accept(); one more is refused
//     (the provider's busy answer) rather than queued;
//   - the provider's own per-connection buffer (one request's bytes).
// Out of descriptors (EMFILE), the listener drops its oldest half-open
// handshake to make room, or stops accepting for a moment when it holds none.
//
// accept() hands out complete requests only. A handshake that fails (bytes
// that are not a request, the peer's close, the deadline, eviction) is closed,
// logged at info level and counted; it is the peer's failure, not the
// listener's, and never reaches accept().
//
// A pump without a listening socket (listen_fd -1) drives the handshakes given
// to it with adopt() under the same bounds: soft's responder hands it the
// last step of an accepted connection (waiting for the initiator's RTR), so
// connect_request::accept() never waits for a peer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/impl.hpp"

namespace conveyor::detail {

// The kernel's accept queue in front of a pump's listening socket. The pump
// takes connections from it at once and applies its own bounds (max_pending,
// max_ready), so the queue is as long as the kernel allows: a short one makes
// a burst of connects wait for TCP's one-second SYN retransmission (the
// listener's `backlog` bounds requests waiting for accept(), not this queue).
constexpr int kernel_accept_queue = 4096;  // the kernel caps it at net.core.somaxconn

struct handshake_limits {
  std::size_t max_pending = 256;
  std::chrono::milliseconds deadline{5000};
  std::size_t max_ready = 64;
};

// One connection's handshake in progress. It owns its socket (non-blocking).
class pending_handshake {
 public:
  enum class step { more, done, failed };
  virtual ~pending_handshake() = default;
  virtual int fd() const noexcept = 0;
  // The socket is readable, or closed: take what is there without blocking and
  // never read past the request. failed: `why` says what went wrong.
  virtual step on_readable(std::string& why) = 0;
  // After done: the request accept() hands out, or null when the handshake
  // finished its own business (an adopted one) and nothing is handed out.
  // Called on the pump's thread, without its lock.
  virtual std::unique_ptr<conn_request_impl> take() = 0;
  // After done, when the ready queue is full: refuse the peer (best effort,
  // never blocking), then the object is destroyed.
  virtual void refuse_busy() noexcept = 0;
};

struct handshake_counters {
  std::uint64_t accepted = 0;   // connections taken from the kernel
  std::uint64_t completed = 0;  // requests queued for accept()
  std::uint64_t failed = 0;     // not a request, peer closed
  std::uint64_t timed_out = 0;  // deadline passed
  std::uint64_t evicted = 0;    // closed to make room (max_pending or EMFILE)
  std::uint64_t busy = 0;       // complete but refused: max_ready reached
  std::uint64_t pending = 0;    // half-open now
};

class handshake_pump {
 public:
  // make: wraps an accepted socket (non-blocking, close-on-exec) in the
  // provider's handshake; it owns the descriptor from then on.
  using make_fn = std::function<std::unique_ptr<pending_handshake>(int fd)>;
  // listen_fd stays owned by the caller and must outlive the pump; -1: no
  // listening socket, handshakes come from adopt() only. `what` names the
  // listener in messages ("accept on 127.0.0.1:7471").
  handshake_pump(int listen_fd, std::string what, handshake_limits limits, make_fn make);
  ~handshake_pump();  // stops the thread; closes every pending handshake and unaccepted request
  handshake_pump(const handshake_pump&) = delete;
  handshake_pump& operator=(const handshake_pump&) = delete;

  result<std::unique_ptr<conn_request_impl>> accept(std::chrono::milliseconds timeout);
  // Drives `hs` (its socket non-blocking) like an accepted connection: same
  // deadline from now, same max_pending bound (the oldest goes first). Any
  // thread. Fails (destroying hs) only when the pump's thread could not start.
  result<void> adopt(std::unique_ptr<pending_handshake> hs);
  // Whether the thread runs (resource_exhausted naming why not).
  result<void> started() const;
  handshake_counters counters() const;

 private:
  struct entry {
    std::unique_ptr<pending_handshake> hs;
    std::chrono::steady_clock::time_point deadline;
  };
  void run();
  void accept_new();
  void add_pending(std::unique_ptr<pending_handshake> hs);
  void take_adopted();
  void drop(std::list<entry>::iterator it, const char* why,
            std::uint64_t handshake_counters::*counter, const std::string& detail = {});
  void on_event(int fd);
  void expire();

  int listen_fd_;
  std::string what_;
  handshake_limits limits_;
  make_fn make_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::string start_error_;
  // Thread-owned: the half-open table, oldest first.
  std::list<entry> pending_;
  std::unordered_map<int, std::list<entry>::iterator> by_fd_;
  bool listen_armed_ = true;
  std::chrono::steady_clock::time_point rearm_at_{};
  // Shared with accept().
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<conn_request_impl>> ready_;
  std::vector<std::unique_ptr<pending_handshake>> adopted_;  // not yet in pending_
  handshake_counters counters_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace conveyor::detail
