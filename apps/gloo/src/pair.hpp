// pair.hpp — a Gloo pair: one RC queue pair to one peer rank, its staging
// memory, credits and queue of messages to post; its completions arrive on
// the context's shared queue (context.hpp's poller). pair.cpp has the data
// path, handshake.cpp the listeners and connection setup, progress.cpp the
// completions and incoming messages.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>
#include <conveyor/conveyor.hpp>

#include "address.hpp"
#include "context.hpp"
#include "device.hpp"
#include "ops.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

class Pair final : public ::gloo::transport::Pair {
 public:
  Pair(Context& ctx, int peer);
  ~Pair() override;

  const ::gloo::transport::Address& address() const override { return *self_; }
  void connect(const std::vector<char>& bytes) override;
  void close() override { shutdown(); }
  void setSync(bool, bool) override {}
  std::unique_ptr<::gloo::transport::Buffer> createSendBuffer(int slot, void* ptr,
                                                              size_t size) override;
  std::unique_ptr<::gloo::transport::Buffer> createRecvBuffer(int slot, void* ptr,
                                                              size_t size) override;
  void send(::gloo::transport::UnboundBuffer*, uint64_t, size_t, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: use UnboundBuffer::send");
  }
  void recv(::gloo::transport::UnboundBuffer*, uint64_t, size_t, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: use UnboundBuffer::recv");
  }

  void shutdown();

  // All below: ctx_.mu_ held.
  void check_usable() const {
    if (failed_) throw ::gloo::IoException(error_);
    if (!connected_)
      GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: pair with rank ", peer_,
                                             " is not connected");
  }
  void start_send(const std::shared_ptr<send_op>& op);
  void start_recv(const std::shared_ptr<recv_op>& op);
  void enqueue(out_item it) {
    out_.push_back(std::move(it));
    pump();
  }
  void pump();
  void fail(const std::string& why);
  // A completion of this pair's current QP, from the context's progress
  // thread: handled, or kept until the connection is made.
  void on_completion(const conveyor::work_completion& wc);
  int peer() const { return peer_; }
  // Whether a large send from `st`'s memory is posted and not completed.
  bool sending_from(const std::shared_ptr<buf_state>& st) const {
    for (auto& m : staging_)
      if (m.op && m.op->st == st && m.op->mr) return true;
    return false;
  }
  // Revokes the source regions of `st`'s posted sends (the memory is about to
  // be freed: a WRITE still reading it fails locally instead).
  void drop_sends_from(const std::shared_ptr<buf_state>& st) {
    for (auto& m : staging_)
      if (m.op && m.op->st == st) drop(m.op->mr);
  }
  const std::string& peer_name() const { return peer_name_; }
  conveyor::protection_domain& pd() { return prov_->pd; }

  std::map<std::uint64_t, std::shared_ptr<bound_recv>> bound_recvs_;
  std::map<std::uint64_t, conveyor::remote_region> remote_bufs_;
  std::map<std::uint64_t, std::shared_ptr<recv_op>> recv_ops_;
  std::map<std::uint64_t, std::deque<std::shared_ptr<send_op>>> pending_sends_;
  std::map<std::uint64_t, std::deque<rtr_info>> remote_rtrs_;
  std::deque<out_item> out_;
  std::size_t parked_ = 0;  // entries the peer made us hold (RTRs, notifications)
  bool failed_ = false;
  bool unresponsive_ = false;  // a cancellation waited for this peer in vain: never wait again
  std::string error_;

 private:
  void establish(const std::vector<char>& bytes);
  void make_qp();
  // The current QP's entry leaves the poller's map: its completions are
  // dropped from now on (ctx_.mu_ held).
  void leave_poller();
  template <class Remaining>
  conveyor::qp_connection_attr accept_peer(const std::string& kind, const std::string& target,
                                           clock_type::time_point deadline, Remaining remaining,
                                           std::string& last);
  template <class Remaining>
  conveyor::qp_connection_attr connect_peer(const wire::address& acceptor,
                                            const std::string& target,
                                            clock_type::time_point deadline, Remaining remaining,
                                            std::string& last);
  void handle(const conveyor::work_completion& wc);
  void handle_message(std::uint32_t idx, std::uint32_t len);
  void transmit(const std::shared_ptr<send_op>& op, const rtr_info& r, std::uint8_t flags);
  bool post_item(out_item& it);

  Context& ctx_;
  const int peer_;
  std::string peer_name_;
  std::unique_ptr<Address> self_;
  conveyor::listener soft_lis_, shm_lis_, verbs_lis_;
  Device::provider* prov_ = nullptr;
  poller* poller_ = nullptr;  // the shared queue this pair reserved room in
  std::uint32_t serial_ = 0;  // of the current QP, in every wr_id it posts (mu_)
  std::uint32_t qpn_ = 0;     // its number, under which the poller knows it
  // Completions that arrived before the connection was made (a message the
  // peer sent as soon as its side connected): handled once it is. At most
  // one QP's work requests; cleared when the QP is replaced.
  std::vector<conveyor::work_completion> early_;
  conveyor::queue_pair qp_;
  conveyor::memory_region recv_mem_, send_mem_;
  std::vector<staging_meta> staging_;
  std::vector<std::uint32_t> free_staging_;
  std::uint32_t credits_ = 0, to_return_ = 0, sq_used_ = 0;
  std::uint32_t max_write_ = write_chunk;
  bool connected_ = false;
  std::atomic<bool> stop_{false};  // shut down: nothing is posted or handled any more
};

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
