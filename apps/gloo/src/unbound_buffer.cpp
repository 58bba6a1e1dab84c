// unbound_buffer.cpp — Gloo's unbound buffer: checks ranges, hands its
// operations to the context (context.cpp) and waits for their completions;
// destroying it cancels what is still outstanding.
#include "unbound_buffer.hpp"

#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>

#include "context.hpp"
#include "device.hpp"
#include "ops.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {
namespace {

class UnboundBuffer final : public ::gloo::transport::UnboundBuffer {
 public:
  UnboundBuffer(std::shared_ptr<Context> ctx, void* ptr, size_t size)
      : ::gloo::transport::UnboundBuffer(ptr, size),
        ctx_(std::move(ctx)),
        st_(std::make_shared<buf_state>()) {}
  ~UnboundBuffer() override { ctx_->cancel(st_); }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return wait(true, rank, timeout);
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return wait(false, rank, timeout);
  }
  void abortWaitRecv() override {
    std::lock_guard g(st_->m);
    st_->abort_recv = true;
    st_->cv.notify_all();
  }
  void abortWaitSend() override {
    std::lock_guard g(st_->m);
    st_->abort_send = true;
    st_->cv.notify_all();
  }
  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override {
    nbytes = checked(offset, nbytes);
    {
      std::lock_guard g(st_->m);
      st_->send_to = std::to_string(dst);
    }
    ctx_->send(st_, dst, slot, static_cast<const std::byte*>(ptr) + offset, nbytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override {
    recv(std::vector<int>{src}, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override {
    nbytes = checked(offset, nbytes);
    GLOO_ENFORCE(!srcs.empty(), "conveyor-gloo: recv from no rank");
    {
      std::lock_guard g(st_->m);
      std::string s;
      for (int r : srcs) s += (s.empty() ? "" : ",") + std::to_string(r);
      st_->recv_from = s;
    }
    ctx_->recv(st_, std::move(srcs), slot, static_cast<std::byte*>(ptr) + offset, nbytes);
  }

 private:
  size_t checked(size_t offset, size_t nbytes) const {
    if (nbytes == kUnspecifiedByteCount) {
      GLOO_ENFORCE((offset) <= (size), "conveyor-gloo: out of range");
      nbytes = size - offset;
    }
    // As Gloo's TCP transport: an empty range may lie anywhere (it is never touched).
    if (nbytes > 0)
      GLOO_ENFORCE(offset <= size && nbytes <= size - offset, "conveyor-gloo: range [", offset,
                   ", +", nbytes, ") beyond a buffer of ", size);
    return nbytes;
  }

  bool wait(bool is_recv, int* rank, std::chrono::milliseconds timeout) {
    if (timeout == ::gloo::transport::kUnsetTimeout) timeout = ctx_->getTimeout();
    std::unique_lock l(st_->m);
    auto& count = is_recv ? st_->recv_completions : st_->send_completions;
    auto& abort = is_recv ? st_->abort_recv : st_->abort_send;
    auto ready = [&] { return count > 0 || abort || st_->ex; };
    // Look for the completion for a short while before sleeping on the
    // condition variable, taking completions from the context's queue
    // itself while the progress thread is not (it then leaves the queue to
    // this thread): no thread hand-off per message on either side, and no
    // wake-up of this one (docs/GLOO.md, "Waiting"). Bounded: yields between
    // empty looks, sleeps after the wait spin.
    const auto spin = ctx_->device_->wait_spin();
    bool slept = false;
    std::size_t helped = 0;
    if (!ready() && spin.count() > 0) {
      auto spin_end = clock_type::now() + spin;
      helped = ctx_->wait_poll() ? ctx_->begin_wait() : 0;
      while (!ready() && clock_type::now() < spin_end) {
        l.unlock();
        if (helped == 0 || !ctx_->help_poll(helped)) std::this_thread::yield();
        l.lock();
      }
      slept = !ready();
      ctx_->end_spin(helped, slept);
    }
    struct sleep_end {
      Context& c;
      bool on;
      std::size_t n;
      ~sleep_end() {
        if (on) c.end_sleep(n);
      }
    } se{*ctx_, slept, helped};
    if (!st_->cv.wait_for(l, timeout, ready)) {
      GLOO_THROW_IO_EXCEPTION("Timed out waiting ", timeout.count(), "ms for ",
                              is_recv ? "recv" : "send", " operation to complete (",
                              is_recv ? "from rank " : "to rank ",
                              is_recv ? st_->recv_from : st_->send_to, ")");
    }
    if (st_->ex) std::rethrow_exception(st_->ex);
    if (count == 0) {  // aborted
      abort = false;
      return false;
    }
    --count;
    if (rank) *rank = is_recv ? st_->recv_rank : st_->send_rank;
    return true;
  }

  std::shared_ptr<Context> ctx_;
  std::shared_ptr<buf_state> st_;
};

}  // namespace

std::unique_ptr<::gloo::transport::UnboundBuffer> make_unbound_buffer(std::shared_ptr<Context> ctx,
                                                                      void* ptr, size_t size) {
  return std::make_unique<UnboundBuffer>(std::move(ctx), ptr, size);
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
