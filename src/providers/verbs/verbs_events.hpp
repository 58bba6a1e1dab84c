// What the verbs provider makes of one asynchronous event of rdma-core
// (ibv_get_async_event): the device_event the user's on_event gets, the log
// level, and what the provider must do to its own objects. A pure function of
// the event's fields, so every kind is unit-tested without an RDMA device
// (tests/unit/verbs_events_test.cpp); verbs_device.cpp applies the effect.
#pragma once

#include "conveyor/device.hpp"
#include "core/log.hpp"

#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace conveyor::verbs {

// What the provider does besides logging and delivering the event.
enum class async_effect : std::uint8_t {
  none,
  fail_qp,       // the QP is in ERROR: mark it so (posts refuse with qp_in_error)
  fail_cq,       // the CQ overflowed: polls report cq_overflow, its QPs go to ERROR
  port_down,     // the port's link is down: its connected QPs go to ERROR (flushing)
  device_fatal,  // the device is gone: every QP goes to ERROR (flushing)
};

struct async_event_fields {
  ibv_event_type type = IBV_EVENT_DEVICE_FATAL;
  std::string_view ibdev{};      // "rxe0"
  std::uint8_t device_port = 1;  // the port the device works on
  std::uint8_t event_port = 0;   // port events: ev.element.port_num
  std::uint32_t qp_num = 0;      // QP events: ev.element.qp->qp_num
  // QP events: the QP's own description ("device rxe0 port 1 QP 17 peer
  // 10.11.0.1:40000"); empty when the QP is not Conveyor's.
  std::string_view qp_where{};
  std::uint32_t srq_num = 0;    // SRQ events: the SRQ's handle (shared_receive_queue::srq_num)
  std::uint32_t srq_limit = 0;  // SRQ_LIMIT_REACHED: the limit the provider had armed (0: unknown)
};

struct async_translation {
  device_event event;
  detail::log_level level = detail::log_level::debug;
  async_effect effect = async_effect::none;
};

async_translation translate_async_event(const async_event_fields& f);

// The qp_error event for a connected QP whose port went down (or whose device
// failed): the provider moved it to ERROR, or the device had already done so
// (rxe fails a requester whose packets no longer route before the port event
// arrives) — either way the user hears of it, once.
device_event qp_failed_event(std::string_view qp_where, std::uint8_t port, std::uint32_t qp_num,
                             std::string_view cause, bool already_in_error = false);

// The device_fatal event for a device whose kernel device went away (its
// uverbs node vanished: `rdma link delete`, hot unplug) without a
// DEVICE_FATAL event: drivers without disassociate support (rxe, siw) send
// none, and the kernel finishes removing the device only once the
// application has closed every object of it.
device_event device_removed_event(std::string_view ibdev);

// Hands `e` to `cb` when set. A callback that throws never ends the caller's
// thread: returns false then (the caller logs it), true otherwise.
bool deliver_event(const std::function<void(const device_event&)>& cb,
                   const device_event& e) noexcept;

}  // namespace conveyor::verbs
