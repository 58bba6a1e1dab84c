// A completion queue in software, shared by the software providers: a ring
// with a per-CQ lock (never a global one), an eventfd for blocking waits and
// user event loops, and sticky overflow reporting.
#pragma once

#include "core/impl.hpp"

#include <atomic>
#include <mutex>
#include <vector>

namespace conveyor::detail {

// Drives a provider's engine from poll()/wait() in manual-progress mode.
class progress_source {
 public:
  virtual ~progress_source() = default;
  virtual void progress() noexcept = 0;
  virtual int wait_fd() const noexcept = 0;  // readable when progress() has work
  // The calling application thread stops polling (it is about to sleep).
  virtual void idle() noexcept {}
  // Manual progress: the caller is about to sleep on wait_fd(). Arranges to be
  // woken by new work; true if work turned up meanwhile (poll instead, and no
  // end_wait). Otherwise end_wait() follows once the caller wakes.
  virtual bool prepare_wait() noexcept { return false; }
  virtual void end_wait() noexcept {}
};

class sw_cq final : public cq_impl {
 public:
  // `keep` keeps the device alive. `engine` (may be null) is progressed by poll
  // when the queue is empty; with `manual`, wait() also sleeps on its descriptor
  // because nothing else will progress it.
  static result<std::shared_ptr<sw_cq>> create(std::uint32_t depth, std::shared_ptr<void> keep,
                                               progress_source* engine, std::uint32_t spin_us,
                                               bool manual = false);
  sw_cq(std::uint32_t depth, int efd, std::shared_ptr<void> keep, progress_source* engine,
        std::uint32_t spin_us, bool manual);
  ~sw_cq() override;

  std::uint32_t depth() const noexcept override { return depth_; }
  std::expected<std::size_t, errc> poll(std::span<work_completion> out) noexcept override;
  std::expected<std::size_t, errc> wait(std::span<work_completion> out,
                                        std::chrono::nanoseconds timeout) noexcept override;
  // Manual progress: an epoll descriptor over the event descriptor and the
  // engine's wait_fd(), so that an application sleeping on fd() is woken by
  // work for the engine too (nothing else would run it); otherwise the
  // event descriptor itself.
  int fd() const noexcept override { return wfd_ >= 0 ? wfd_ : efd_; }
  // Manual progress: also arranges for the engine's new work to wake fd()
  // (progress_source::prepare_wait; the next poll() ends that wait).
  void arm() noexcept override;

  // Provider side: false if the queue was full (the completion is lost and the
  // queue reports overflow from now on).
  bool push(const work_completion& wc) noexcept;
  bool overflowed() const noexcept { return overflow_.load(std::memory_order_relaxed); }
  // The object `keep` pointed to: the device whose CQ this is. A QP may use only
  // CQs of its own device (polling one in manual mode drives that device's engine).
  const void* owner() const noexcept { return keep_.get(); }

 private:
  std::size_t take(std::span<work_completion> out) noexcept;
  void notify() noexcept;
  void arm_event() noexcept;  // arm() without the manual-progress wait
  void signal() noexcept;     // fd() readable now

  const std::uint32_t depth_;
  const int efd_;
  std::shared_ptr<void> keep_;
  const std::uint32_t spin_us_;
  progress_source* engine_;
  const bool manual_;
  std::mutex mu_;
  std::vector<work_completion> ring_;
  std::size_t head_ = 0, count_ = 0;
  std::atomic<std::size_t> approx_count_{0};
  std::atomic<bool> overflow_{false};
  std::atomic<bool> armed_{false};
  std::atomic<bool> signaled_{false};
  int wfd_ = -1;  // manual progress with an engine: what fd() returns
  // arm() left the engine prepared for a sleeper on fd(): poll() ends it.
  std::atomic<bool> fd_waiting_{false};
};

}  // namespace conveyor::detail
