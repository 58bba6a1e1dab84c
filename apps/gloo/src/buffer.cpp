// buffer.cpp — Gloo's bound buffers: a receive buffer registered for its
// lifetime and announced to the peer (BUF_ANNOUNCE / BUF_RETRACT); a send
// copies its range into a registered shadow, RDMA-WRITEs it into the
// announced buffer and tells the peer (BUF_DONE). docs/GLOO.md ("Bound buffers").
#include "buffer.hpp"

#include <cstring>
#include <map>
#include <span>

#include <gloo/common/error.h>

#include "context.hpp"
#include "pair.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {
namespace {

// Bound buffers (the older Gloo algorithms): a recv buffer is registered for its
// lifetime and announced to the peer; sends RDMA-WRITE into it and then tell it.
class SendBuffer final : public ::gloo::transport::Buffer {
 public:
  SendBuffer(Context& ctx, Pair& pair, int slot, void* ptr, size_t size)
      : Buffer(slot, ptr, size), ctx_(ctx), pair_(pair), st_(std::make_shared<bound_send>()) {
    // The older algorithms reuse a send buffer's memory right after send()
    // without waiting (ReduceScatterHalvingDoubling's distribution phase
    // memcpys into ptrs_[0] while its sends from there are in flight): they
    // rely on Gloo TCP writing to the socket at once. So send() copies the
    // range into this registered shadow, and the WRITE goes from there.
    if (size > 0) {
      auto mr = pair.pd().allocate_memory(size, conveyor::access::local_write);
      if (!mr) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: register: ", mr.error().to_string());
      mr_ = std::move(*mr);
    }
  }
  ~SendBuffer() override {
    std::unique_lock l(ctx_.mu_);
    ctx_.bound_cv_.wait_for(l, ctx_.getTimeout(),
                            [&] { return st_->pending == 0 || pair_.failed_; });
  }
  void send(size_t offset, size_t length, size_t roffset) override {
    GLOO_ENFORCE((offset) <= (size_), "conveyor-gloo: out of range");
    GLOO_ENFORCE((length) <= (size_ - offset), "conveyor-gloo: out of range");
    std::unique_lock l(ctx_.mu_);
    auto deadline = clock_type::now() + ctx_.getTimeout();
    // The shadow may be overwritten only once earlier sends from it are done.
    if (!ctx_.bound_cv_.wait_until(l, deadline, [&] { return st_->pending == 0 || pair_.failed_; }))
      GLOO_THROW_IO_EXCEPTION("Timed out waiting for an earlier send to rank ", pair_.peer());
    if (length > 0)
      std::memcpy(mr_.data() + offset, static_cast<const std::byte*>(ptr_) + offset, length);
    std::map<std::uint64_t, conveyor::remote_region>::iterator it;
    while (true) {
      pair_.check_usable();
      it = pair_.remote_bufs_.find(std::uint64_t(slot_));
      if (it != pair_.remote_bufs_.end()) break;
      if (ctx_.bound_cv_.wait_until(l, deadline) == std::cv_status::timeout)
        GLOO_THROW_IO_EXCEPTION("Timed out waiting for rank ", pair_.peer(),
                                " to create its receive buffer for slot ", slot_);
    }
    GLOO_ENFORCE((roffset + length) <= (it->second.length), "conveyor-gloo: write beyond rank ",
                 pair_.peer(), "'s buffer");
    out_item o;
    o.h.type = wire::msg_type::buf_done;
    o.h.slot = std::uint64_t(slot_);
    o.h.token = roffset;
    o.h.nbytes = length;
    if (length > 0) {
      o.write_lkey = mr_.lkey();
      o.write_src = mr_.addr() + offset;
      o.write_len = length;
      o.write_dst = it->second.addr + roffset;
      o.write_rkey = it->second.rkey;
    }
    o.bsend = st_;
    ++st_->pending;
    pair_.enqueue(std::move(o));
  }
  void waitRecv() override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: waitRecv on a send buffer");
  }
  void waitSend() override {
    std::unique_lock l(ctx_.mu_);
    if (!ctx_.bound_cv_.wait_for(l, ctx_.getTimeout(),
                                 [&] { return st_->pending == 0 || pair_.failed_; }))
      GLOO_THROW_IO_EXCEPTION("Timed out waiting ", ctx_.getTimeout().count(),
                              "ms for send operation to complete (to rank ", pair_.peer(), ")");
    if (st_->pending != 0) throw ::gloo::IoException(pair_.error_);
  }

 private:
  Context& ctx_;
  Pair& pair_;
  std::shared_ptr<bound_send> st_;
  conveyor::memory_region mr_;
};

class RecvBuffer final : public ::gloo::transport::Buffer {
 public:
  RecvBuffer(Context& ctx, Pair& pair, int slot, void* ptr, size_t size)
      : Buffer(slot, ptr, size), ctx_(ctx), pair_(pair), st_(std::make_shared<bound_recv>()) {
    st_->slot = std::uint64_t(slot);
    st_->ptr = static_cast<std::byte*>(ptr);
    st_->size = size;
    if (size > 0) {
      auto mr =
          pair.pd().register_memory(std::span(static_cast<std::byte*>(ptr), size),
                                    conveyor::access::local_write | conveyor::access::remote_write);
      if (!mr) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: register: ", mr.error().to_string());
      st_->mr = std::move(*mr);
    }
    std::lock_guard g(ctx_.mu_);
    pair_.check_usable();
    pair_.bound_recvs_[st_->slot] = st_;
    out_item o;
    o.h.type = wire::msg_type::buf_announce;
    o.h.slot = st_->slot;
    o.h.nbytes = size;
    if (size > 0) {
      o.h.addr = st_->mr.addr();
      o.h.rkey = st_->mr.rkey();
    }
    pair_.enqueue(std::move(o));
  }
  ~RecvBuffer() override {
    std::lock_guard g(ctx_.mu_);
    auto it = pair_.bound_recvs_.find(st_->slot);
    if (it != pair_.bound_recvs_.end() && it->second == st_) {
      pair_.bound_recvs_.erase(it);
      if (!pair_.failed_) {
        out_item o;
        o.h.type = wire::msg_type::buf_retract;
        o.h.slot = st_->slot;
        pair_.enqueue(std::move(o));
      }
    }
    drop(st_->mr);
  }
  void send(size_t, size_t, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: send on a receive buffer");
  }
  void waitRecv() override {
    std::unique_lock l(ctx_.mu_);
    if (!ctx_.bound_cv_.wait_for(l, ctx_.getTimeout(),
                                 [&] { return st_->completions > 0 || pair_.failed_; }))
      GLOO_THROW_IO_EXCEPTION("Timed out waiting ", ctx_.getTimeout().count(),
                              "ms for recv operation to complete (from rank ", pair_.peer(), ")");
    if (st_->completions == 0) throw ::gloo::IoException(pair_.error_);
    --st_->completions;
  }
  void waitSend() override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: waitSend on a receive buffer");
  }

 private:
  Context& ctx_;
  Pair& pair_;
  std::shared_ptr<bound_recv> st_;
};

}  // namespace

std::unique_ptr<::gloo::transport::Buffer> make_send_buffer(Context& ctx, Pair& pair, int slot,
                                                            void* ptr, size_t size) {
  return std::make_unique<SendBuffer>(ctx, pair, slot, ptr, size);
}

std::unique_ptr<::gloo::transport::Buffer> make_recv_buffer(Context& ctx, Pair& pair, int slot,
                                                            void* ptr, size_t size) {
  return std::make_unique<RecvBuffer>(ctx, pair, slot, ptr, size);
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
