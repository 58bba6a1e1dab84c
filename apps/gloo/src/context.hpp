// context.hpp — a Gloo context: its pairs, the completion queue they share
// and the one progress thread that drives them all (per provider in use),
// and the matching of unbound buffers' operations across them (recv-from-any,
// notifications, debts); one mutex for all protocol state of its pairs.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include "device.hpp"
#include "ops.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

class Pair;

// One provider's completion queue, shared by the pairs of a context that use
// that provider, and the thread that waits on it and hands each completion to
// its pair (progress.cpp). A context has one per provider it uses (more only
// where the device's max_cqe cannot hold every pair's work requests).
struct poller {
  Device::provider* prov = nullptr;
  conveyor::completion_queue cq;
  std::uint32_t room = 0;  // completions not reserved by a pair (mu_)
  bool dead = false;       // the queue failed (overflow): no new pairs (mu_)
  // qp_num -> the pair and the serial of its current QP (mu_).
  std::map<std::uint32_t, std::pair<Pair*, std::uint32_t>> by_qp;
  std::atomic<bool> stop{false};
  std::thread thread;

  // Taking completions from `cq` and handing them to their pairs happens
  // under q_mu, so one QP's completions reach the protocol in queue order
  // whichever thread takes them. The progress thread holds it, also while
  // asleep in cq.wait; a thread waiting for an unbound buffer's operation
  // only ever try_locks it (Context::help_poll).
  std::mutex q_mu;
  // Waiters polling the queue themselves (spinning) and waiters asleep on
  // their buffer; while some spin and none sleeps, the progress thread
  // leaves the queue to them (parks on park_cv) and takes it back once none
  // has polled for a lease (the wait spin) or one goes to sleep
  // (docs/GLOO.md, "Waiting").
  std::mutex park_mu;
  std::condition_variable park_cv;
  std::atomic<int> spinners{0};        // written under park_mu
  std::atomic<int> sleepers{0};        // written under park_mu
  clock_type::time_point last_spin{};  // park_mu: when the last spinner left
};

class Context final : public ::gloo::transport::Context,
                      public std::enable_shared_from_this<Context> {
 public:
  Context(std::shared_ptr<Device> dev, int rank, int size)
      : ::gloo::transport::Context(rank, size), device_(std::move(dev)) {
    if (pairs_.size() != std::size_t(size)) pairs_.resize(size);
  }
  ~Context() override;

  std::unique_ptr<::gloo::transport::Pair>& createPair(int rank) override;
  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                        size_t size) override;

  Pair& pair(int rank);

  // Operations of unbound buffers (all under mu_).
  void send(const std::shared_ptr<buf_state>& st, int dst, std::uint64_t slot, const std::byte* ptr,
            std::size_t n);
  void recv(const std::shared_ptr<buf_state>& st, std::vector<int> srcs, std::uint64_t slot,
            std::byte* ptr, std::size_t n);
  void cancel(const std::shared_ptr<buf_state>& st);

  // A thread waiting for an unbound buffer's operation: begin_wait counts it
  // as spinning on the context's queues; help_poll takes and hands out one
  // batch of completions from each queue nobody else is taking from (false:
  // none taken); end_spin counts it out, asleep when `sleeping` (the progress
  // thread then takes the queues back at once); end_sleep after that sleep.
  // Each takes the number of queues begin_wait counted the thread on.
  std::size_t begin_wait();
  bool help_poll(std::size_t n);
  void end_spin(std::size_t n, bool sleeping);
  void end_sleep(std::size_t n);

  // A NOTIFY from `rank` for `slot` (mu_ held).
  void on_notify(Pair& p, std::uint64_t slot);
  // Fails the recv-from-any operations that could be served by `rank` (mu_ held).
  void fail_any(int rank, const std::string& msg);

  // A completion queue of `prov` with room for one more pair's work requests
  // (reserved), its progress thread started with it (mu_ held).
  poller& poller_for(Device::provider& prov);
  // Gives a pair's reservation back (mu_ held).
  static void release(poller& p) { p.room += per_pair_cqes; }
  static constexpr std::uint32_t per_pair_cqes = sq_depth + recv_depth;

  std::shared_ptr<Device> device_;
  std::mutex mu_;  // all protocol state of every pair of this context
  std::condition_variable bound_cv_;
  std::uint64_t next_token_ = 1;
  std::uint32_t next_serial_ = 1;    // of the QPs the pairs make (mu_)
  std::atomic<int> local_peers_{0};  // connected pairs whose peer is on this host

  // Whether a waiting thread takes completions itself (Device::wait_poll).
  bool wait_poll() const {
    int m = device_->wait_poll();
    return m >= 0 ? m > 0 : local_peers_.load(std::memory_order_relaxed) + 1 <= device_->cpus();
  }

 private:
  struct any_recv {
    std::shared_ptr<buf_state> st;
    std::vector<int> ranks;
    std::uint64_t slot;
    std::byte* ptr;
    std::size_t n;
  };
  std::list<any_recv> pending_any_;
  // Notifications not yet matched, per slot in arrival order (recv-from-any
  // takes the oldest), and notifications already accounted for by a directed recv.
  std::map<std::uint64_t, std::deque<int>> available_;
  std::map<std::pair<std::uint64_t, int>, std::uint64_t> debt_;
  // Appended under mu_ only; stopped and joined in ~Context, after the pairs
  // have left them (stable addresses: the pairs point into it).
  std::list<poller> pollers_;
  std::atomic<std::size_t> npollers_{0};  // pollers_'s first entries a waiter may use
  static constexpr std::size_t max_helped = 4;
  std::array<poller*, max_helped> helped_{};  // set before npollers_ is raised
  void poll_loop(poller& p);
  void park(poller& p);
  // Hands a batch taken from p.cq to the pairs (q_mu held; takes mu_).
  void deliver(poller& p, std::span<const conveyor::work_completion> wcs);
  friend class Pair;
};

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
