// conveyor::kv::server_loop — the server's one thread. Everything that touches
// the store runs on it: RESP clients on TCP, RDMA write RPCs (their CQ's fd),
// active expiry, AOF fsync and reclamation timers. Other threads (the RDMA
// acceptor) hand work over with post().
//
// Thread safety: post() and stop() from any thread; everything else from the
// loop thread (or before run()). Callbacks may add, modify and remove fds,
// including their own; a removed fd's callback is never called again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace conveyor::kv {

class server_loop {
 public:
  server_loop();  // throws std::system_error if epoll/eventfd cannot be created
  ~server_loop();
  server_loop(const server_loop&) = delete;
  server_loop& operator=(const server_loop&) = delete;

  // Calls `on_ready(events)` on the loop thread whenever `fd` is ready for `events`
  // (EPOLLIN/EPOLLOUT...). modify_fd changes the events; remove_fd stops watching.
  // add_fd throws std::system_error if epoll refuses the fd.
  void add_fd(int fd, unsigned events, std::function<void(unsigned events)> on_ready);
  void modify_fd(int fd, unsigned events);
  void remove_fd(int fd);
  // What every() and before_wait() return: cancel(id) stops that function for
  // good (from anywhere on the loop thread, also from inside it), so that an
  // object whose functions the loop holds can go before the loop does.
  using callback_id = std::uint64_t;
  // Runs `fn` on the loop thread every `period` (first after one period).
  callback_id every(std::chrono::milliseconds period, std::function<void()> fn);
  // Runs `fn` once per loop iteration, after the ready callbacks and before the
  // loop waits again (the RESP server flushes the AOF and then the replies here,
  // so one fsync covers every client of the iteration).
  callback_id before_wait(std::function<void()> fn);
  // The function is never called again; it is destroyed at the start of the
  // loop's next iteration (not while it may be running) or with the loop.
  void cancel(callback_id id);
  // Thread-safe: runs `fn` on the loop thread soon.
  void post(std::function<void()> fn);
  // For a long command that must keep the other clients served (a script past
  // busy-reply-threshold, script.hpp), called from inside a callback: runs the
  // callbacks of the fds ready now, without waiting, then the before_wait
  // functions. Not the fd whose callback is running (its client waits for
  // the command), no timers (expiry must not change the data under a
  // script), no posted work; a call from inside it does nothing.
  void serve_ready_now();
  // Runs until stop() (thread-safe); returns after the current callback.
  void run();
  void stop();

 private:
  struct state;
  static void run_before(state& s);
  state* s_;
};

}  // namespace conveyor::kv
