// The software devices' event thread (sw_events.hpp).
#include "providers/swnic/sw_events.hpp"

#include "core/log.hpp"

namespace conveyor::swnic {

event_delivery::~event_delivery() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void event_delivery::post(device_event e) noexcept {
  if (detail::log_enabled(detail::log_level::info))
    detail::log_line(detail::log_level::info, e.description);
  if (!cb_) return;
  try {
    std::lock_guard lk(mu_);
    if (stop_) return;
    q_.push_back(std::move(e));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  } catch (...) {
    detail::log_line(detail::log_level::error, "device event dropped (out of memory or threads)");
    return;
  }
  cv_.notify_one();
}

void event_delivery::run() noexcept {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
    if (q_.empty()) return;  // stopping, everything delivered
    device_event e = std::move(q_.front());
    q_.pop_front();
    lk.unlock();
    try {
      cb_(e);
    } catch (...) {
      detail::log_line(detail::log_level::error,
                       e.description + ": the on_event callback threw; the event is dropped");
    }
    lk.lock();
  }
}

}  // namespace conveyor::swnic
