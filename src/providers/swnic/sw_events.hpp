// The software devices' event delivery: device_events (so far only
// srq_limit_reached) go to device_options::on_event on a thread of the
// device's own, started at the first event, so that whoever raises one (an
// engine step, inside a poll in manual progress) never runs the user's
// callback, and never while it holds a queue lock. Events are logged at info
// level and delivered in the order they were raised.
#pragma once

#include <conveyor/device.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace conveyor::swnic {

class event_delivery {
 public:
  explicit event_delivery(std::function<void(const device_event&)> cb) : cb_(std::move(cb)) {}
  ~event_delivery();  // delivers what is queued, then joins the thread
  event_delivery(const event_delivery&) = delete;
  event_delivery& operator=(const event_delivery&) = delete;

  // Queues e (allocates; control path only). Takes only this queue's lock.
  void post(device_event e) noexcept;

 private:
  void run() noexcept;

  std::function<void(const device_event&)> cb_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<device_event> q_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace conveyor::swnic
