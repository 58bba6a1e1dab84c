// tests/common/completions.hpp — reading completion queues in tests.
//
// A cq_reader wraps one completion_queue and buffers what it polled, so a test
// can drive several CQs (manual progress) without losing completions. With
// start_pump() a background thread calls cq.wait() with short timeouts until
// stopped: that is the "target poller" a manual-progress target needs to serve
// one-sided operations. wait_for() waits for N completions with a deadline and
// reports what it saw, with status names, when something is wrong.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

namespace cvt {

std::string describe(const conveyor::work_completion& wc);
std::string describe(std::span<const conveyor::work_completion> wcs);

class cq_reader {
 public:
  cq_reader(conveyor::completion_queue* cq, std::string name);
  ~cq_reader();
  cq_reader(const cq_reader&) = delete;
  cq_reader& operator=(const cq_reader&) = delete;

  // Background thread: cq.wait(slice) in a loop, buffering completions.
  void start_pump(std::chrono::milliseconds slice = std::chrono::milliseconds(5));
  void stop_pump();
  bool pumped() const noexcept { return pump_.joinable(); }

  // Non-blocking: drains the CQ into the buffer (no-op while pumped). In manual
  // progress mode this drives the device's engine.
  void poll_once();
  // Blocks up to `slice` for at least one buffered completion.
  void wait_some(std::chrono::nanoseconds slice);

  std::size_t buffered() const;
  std::vector<conveyor::work_completion> take(std::size_t max);
  // A poll/wait error other than timed_out (e.g. cq_overflow); sticky.
  std::optional<conveyor::errc> sticky_error() const;

  const std::string& name() const noexcept { return name_; }
  conveyor::completion_queue* cq() const noexcept { return cq_; }

 private:
  void push(std::span<const conveyor::work_completion> wcs);
  void record(conveyor::errc e);

  conveyor::completion_queue* cq_;
  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<conveyor::work_completion> q_;
  std::optional<conveyor::errc> err_;
  std::atomic<bool> stop_{false};
  std::thread pump_;
};

// Waits until `n` completions were taken from `target` (appended to `out`) or
// `timeout` passed, polling the `drive` readers in between (manual progress:
// the initiator's engine only runs inside poll/wait). "" on success, else a
// description naming the CQ, what arrived (with status names) and what is missing.
std::string wait_for(cq_reader& target, std::size_t n, std::chrono::nanoseconds timeout,
                     std::vector<conveyor::work_completion>& out,
                     std::span<cq_reader* const> drive = {});

// Linux 6.1 siw flushes a READ twice when the QP fails after the READ entered
// its outbound READ queue but before it was sent (its flush completes both the
// queue entry and the queued send). For kernel iWARP only: drops each second
// wr_flush_err that follows the first completion of the same request, says so
// on stdout, and takes one more completion from `reader` for each dropped, so
// `wcs` again holds one completion per request. "" or what went wrong.
std::string drop_siw_repeated_flushes(std::vector<conveyor::work_completion>& wcs,
                                      cq_reader& reader, std::chrono::nanoseconds timeout);

// "" when every completion has status success, else the list with status names.
std::string all_success(std::span<const conveyor::work_completion> wcs);
// "" when wc has this status, opcode and wr_id.
std::string check_wc(const conveyor::work_completion& wc, conveyor::wc_status status,
                     conveyor::wc_opcode opcode, std::uint64_t wr_id);

inline testing::AssertionResult ok(const std::string& err) {
  if (err.empty()) return testing::AssertionSuccess();
  return testing::AssertionFailure() << err;
}

}  // namespace cvt
