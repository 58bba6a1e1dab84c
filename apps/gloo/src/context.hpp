// context.hpp — a Gloo context: its pairs, and the matching of unbound
// buffers' operations across them (recv-from-any, notifications, debts);
// one mutex for all protocol state of its pairs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include "ops.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

class Device;
class Pair;

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

  // A NOTIFY from `rank` for `slot` (mu_ held).
  void on_notify(Pair& p, std::uint64_t slot);
  // Fails the recv-from-any operations that could be served by `rank` (mu_ held).
  void fail_any(int rank, const std::string& msg);

  std::shared_ptr<Device> device_;
  std::mutex mu_;  // all protocol state of every pair of this context
  std::condition_variable bound_cv_;
  std::uint64_t next_token_ = 1;

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
  friend class Pair;
};

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
