// The verbs provider's translation of rdma-core async events into
// device_events (providers/verbs/verbs_events.hpp): every kind, without a
// device. Built only when rdma-core's headers are present.
#include "providers/verbs/verbs_events.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace cvy = conveyor;
using cvy::device_event_type;
using cvy::verbs::async_effect;
using cvy::verbs::async_event_fields;
using cvy::verbs::translate_async_event;
using level = cvy::detail::log_level;

namespace {

constexpr std::string_view qp_where = "device rxe0 port 1 QP 17 peer 10.11.0.1:40000";

async_event_fields qp_event(ibv_event_type t, std::string_view where = qp_where) {
  return {.type = t, .ibdev = "rxe0", .device_port = 1, .qp_num = 17, .qp_where = where};
}

}  // namespace

TEST(verbs_events, qp_errors_are_qp_error_naming_device_port_qp_and_peer) {
  for (auto t : {IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR}) {
    const auto r = translate_async_event(qp_event(t));
    SCOPED_TRACE(ibv_event_type_str(t));
    EXPECT_EQ(r.event.type, device_event_type::qp_error);
    EXPECT_EQ(r.event.qp_num, 17u);
    EXPECT_EQ(r.event.port, 1);
    EXPECT_TRUE(r.event.description.contains(qp_where)) << r.event.description;
    EXPECT_TRUE(r.event.description.contains(ibv_event_type_str(t))) << r.event.description;
    EXPECT_EQ(r.effect, async_effect::fail_qp);
    EXPECT_EQ(r.level, level::warn);
  }
}

TEST(verbs_events, qp_error_on_a_foreign_qp_names_it_by_number_and_changes_nothing) {
  const auto r = translate_async_event(qp_event(IBV_EVENT_QP_FATAL, ""));
  EXPECT_EQ(r.event.type, device_event_type::qp_error);
  EXPECT_TRUE(r.event.description.contains("device rxe0 port 1 QP 17")) << r.event.description;
  EXPECT_EQ(r.effect, async_effect::none);
}

TEST(verbs_events, cq_error_is_cq_error_and_fails_the_cq) {
  const auto r =
      translate_async_event({.type = IBV_EVENT_CQ_ERR, .ibdev = "siw0", .device_port = 1});
  EXPECT_EQ(r.event.type, device_event_type::cq_error);
  EXPECT_TRUE(r.event.description.contains("device siw0 port 1")) << r.event.description;
  EXPECT_TRUE(r.event.description.contains("cq_overflow")) << r.event.description;
  EXPECT_EQ(r.effect, async_effect::fail_cq);
  EXPECT_EQ(r.level, level::warn);
}

TEST(verbs_events, port_error_is_port_down_for_the_events_port_and_fails_its_qps) {
  // The event's port, not the device's: a two-port NIC reports port 2 going down.
  const auto r = translate_async_event(
      {.type = IBV_EVENT_PORT_ERR, .ibdev = "mlx5_0", .device_port = 1, .event_port = 2});
  EXPECT_EQ(r.event.type, device_event_type::port_down);
  EXPECT_EQ(r.event.port, 2);
  EXPECT_EQ(r.event.qp_num, 0u);
  EXPECT_TRUE(r.event.description.contains("device mlx5_0 port 2")) << r.event.description;
  EXPECT_EQ(r.effect, async_effect::port_down);
  EXPECT_EQ(r.level, level::warn);
}

TEST(verbs_events, port_active_is_port_active_and_changes_nothing) {
  const auto r = translate_async_event(
      {.type = IBV_EVENT_PORT_ACTIVE, .ibdev = "rxe0", .device_port = 1, .event_port = 1});
  EXPECT_EQ(r.event.type, device_event_type::port_active);
  EXPECT_EQ(r.event.port, 1);
  EXPECT_TRUE(r.event.description.contains("device rxe0 port 1")) << r.event.description;
  EXPECT_EQ(r.effect, async_effect::none);
  EXPECT_EQ(r.level, level::info);
}

TEST(verbs_events, address_changes_are_other_naming_the_port) {
  for (auto t : {IBV_EVENT_LID_CHANGE, IBV_EVENT_GID_CHANGE, IBV_EVENT_PKEY_CHANGE,
                 IBV_EVENT_SM_CHANGE, IBV_EVENT_CLIENT_REREGISTER}) {
    SCOPED_TRACE(ibv_event_type_str(t));
    const auto r =
        translate_async_event({.type = t, .ibdev = "rxe0", .device_port = 1, .event_port = 1});
    EXPECT_EQ(r.event.type, device_event_type::other);
    EXPECT_EQ(r.event.port, 1);
    EXPECT_TRUE(r.event.description.contains("device rxe0 port 1")) << r.event.description;
    EXPECT_EQ(r.effect, async_effect::none);
  }
}

TEST(verbs_events, device_fatal_is_device_fatal_and_fails_every_qp) {
  const auto r = translate_async_event({.type = IBV_EVENT_DEVICE_FATAL, .ibdev = "rxe0"});
  EXPECT_EQ(r.event.type, device_event_type::device_fatal);
  EXPECT_TRUE(r.event.description.contains("device rxe0")) << r.event.description;
  EXPECT_EQ(r.effect, async_effect::device_fatal);
  EXPECT_EQ(r.level, level::error);
}

TEST(verbs_events, a_removed_device_is_device_fatal_naming_it) {
  const auto e = cvy::verbs::device_removed_event("rxe0");
  EXPECT_EQ(e.type, device_event_type::device_fatal);
  EXPECT_EQ(e.qp_num, 0u);
  EXPECT_TRUE(e.description.contains("device rxe0")) << e.description;
  EXPECT_TRUE(e.description.contains("removed")) << e.description;
}

TEST(verbs_events, informational_qp_events_are_other_and_change_nothing) {
  for (auto t : {IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED, IBV_EVENT_PATH_MIG,
                 IBV_EVENT_PATH_MIG_ERR, IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_WQ_FATAL}) {
    SCOPED_TRACE(ibv_event_type_str(t));
    const auto r = translate_async_event(qp_event(t));
    EXPECT_EQ(r.event.type, device_event_type::other);
    EXPECT_TRUE(r.event.description.contains("device rxe0")) << r.event.description;
    EXPECT_EQ(r.effect, async_effect::none);
    EXPECT_EQ(r.level, level::debug);
  }
}

TEST(verbs_events, srq_limit_reached_is_srq_limit_reached_naming_the_srq_and_its_limit) {
  const auto r = translate_async_event({.type = IBV_EVENT_SRQ_LIMIT_REACHED,
                                        .ibdev = "rxe0",
                                        .device_port = 1,
                                        .srq_num = 5,
                                        .srq_limit = 64});
  EXPECT_EQ(r.event.type, device_event_type::srq_limit_reached);
  EXPECT_EQ(r.event.srq_num, 5u);
  EXPECT_EQ(r.event.qp_num, 0u);
  EXPECT_TRUE(r.event.description.contains("device rxe0 SRQ 5")) << r.event.description;
  EXPECT_TRUE(r.event.description.contains("limit 64 reached")) << r.event.description;
  EXPECT_TRUE(r.event.description.contains("disarmed")) << r.event.description;
  EXPECT_EQ(r.effect, async_effect::none);
  EXPECT_EQ(r.level, level::info);
  // A limit the provider did not know of (armed elsewhere): no number made up.
  const auto u =
      translate_async_event({.type = IBV_EVENT_SRQ_LIMIT_REACHED, .ibdev = "rxe0", .srq_num = 5});
  EXPECT_EQ(u.event.type, device_event_type::srq_limit_reached);
  EXPECT_FALSE(u.event.description.contains("limit 0")) << u.event.description;
}

TEST(verbs_events, srq_error_is_srq_error_naming_the_srq) {
  const auto r = translate_async_event(
      {.type = IBV_EVENT_SRQ_ERR, .ibdev = "siw0", .device_port = 1, .srq_num = 9});
  EXPECT_EQ(r.event.type, device_event_type::srq_error);
  EXPECT_EQ(r.event.srq_num, 9u);
  EXPECT_TRUE(r.event.description.contains("device siw0 SRQ 9")) << r.event.description;
  EXPECT_TRUE(r.event.description.contains("ERROR")) << r.event.description;
  EXPECT_EQ(r.effect, async_effect::none);
  EXPECT_EQ(r.level, level::warn);
}

TEST(verbs_events, every_event_kind_names_the_device_and_the_event) {
  for (int i = IBV_EVENT_CQ_ERR; i <= IBV_EVENT_WQ_FATAL; ++i) {
    const auto t = static_cast<ibv_event_type>(i);
    SCOPED_TRACE(ibv_event_type_str(t));
    const auto r = translate_async_event(qp_event(t));
    EXPECT_TRUE(r.event.description.contains("device rxe0")) << r.event.description;
    EXPECT_TRUE(r.event.description.contains(ibv_event_type_str(t))) << r.event.description;
  }
}

TEST(verbs_events, a_qp_failed_by_its_port_going_down_is_a_qp_error_naming_everything) {
  const auto e = cvy::verbs::qp_failed_event(qp_where, 1, 17, "port 1 went down");
  EXPECT_EQ(e.type, device_event_type::qp_error);
  EXPECT_EQ(e.port, 1);
  EXPECT_EQ(e.qp_num, 17u);
  EXPECT_TRUE(e.description.contains(qp_where)) << e.description;
  EXPECT_TRUE(e.description.contains("port 1 went down")) << e.description;
  EXPECT_TRUE(e.description.contains("flush")) << e.description;
  // The device failed it first (rxe: a requester whose packets no longer route).
  const auto a = cvy::verbs::qp_failed_event(qp_where, 1, 17, "port 1 went down", true);
  EXPECT_EQ(a.type, device_event_type::qp_error);
  EXPECT_TRUE(a.description.contains(qp_where)) << a.description;
  EXPECT_TRUE(a.description.contains("already in ERROR")) << a.description;
}

TEST(verbs_events, deliver_calls_the_callback_once_with_the_event) {
  std::vector<cvy::device_event> got;
  std::function<void(const cvy::device_event&)> cb = [&](const cvy::device_event& e) {
    got.push_back(e);
  };
  const auto t =
      translate_async_event({.type = IBV_EVENT_PORT_ERR, .ibdev = "rxe0", .event_port = 1});
  EXPECT_TRUE(cvy::verbs::deliver_event(cb, t.event));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type, device_event_type::port_down);
  EXPECT_EQ(got[0].description, t.event.description);
}

TEST(verbs_events, deliver_without_a_callback_is_fine) {
  EXPECT_TRUE(cvy::verbs::deliver_event({}, cvy::device_event{}));
}

TEST(verbs_events, a_throwing_callback_is_caught_and_reported) {
  int calls = 0;
  std::function<void(const cvy::device_event&)> throws_std = [&](const cvy::device_event&) {
    ++calls;
    throw std::runtime_error("user bug");
  };
  std::function<void(const cvy::device_event&)> throws_int = [&](const cvy::device_event&) {
    ++calls;
    throw 42;
  };
  EXPECT_FALSE(cvy::verbs::deliver_event(throws_std, cvy::device_event{}));
  EXPECT_FALSE(cvy::verbs::deliver_event(throws_int, cvy::device_event{}));
  EXPECT_EQ(calls, 2);
}
