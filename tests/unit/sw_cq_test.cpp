// Unit tests for the software completion queue and the QP state machine table.
#include "providers/swnic/sw_cq.hpp"

#include <gtest/gtest.h>
#include <poll.h>

#include <array>
#include <chrono>
#include <thread>

using namespace conveyor;
using namespace std::chrono_literals;

namespace {
std::shared_ptr<detail::sw_cq> make_cq(std::uint32_t depth) {
  return detail::sw_cq::create(depth, nullptr, nullptr, 10).value();
}
work_completion wc_with(std::uint64_t id) {
  work_completion wc;
  wc.wr_id = id;
  return wc;
}
}  // namespace

TEST(sw_cq, completions_come_out_in_order_in_batches) {
  auto cq = make_cq(16);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(cq->push(wc_with(i)));
  std::array<work_completion, 4> out;
  std::uint64_t next = 0;
  for (;;) {
    auto n = cq->poll(out).value();
    if (n == 0) break;
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(out[i].wr_id, next++);
  }
  EXPECT_EQ(next, 10u);
}

TEST(sw_cq, overflow_is_reported_never_silent) {
  auto cq = make_cq(2);
  EXPECT_TRUE(cq->push(wc_with(1)));
  EXPECT_TRUE(cq->push(wc_with(2)));
  EXPECT_FALSE(cq->push(wc_with(3)));
  std::array<work_completion, 4> out;
  auto r = cq->poll(out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), errc::cq_overflow);
}

TEST(sw_cq, wait_times_out_within_bounds_without_completions) {
  auto cq = make_cq(4);
  std::array<work_completion, 1> out;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = cq->wait(out, 100ms);
  const auto el = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), errc::timed_out);
  EXPECT_GE(el, 100ms);
  EXPECT_LT(el, 2s);
}

TEST(sw_cq, wait_wakes_when_another_thread_pushes) {
  auto cq = make_cq(4);
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    cq->push(wc_with(77));
  });
  std::array<work_completion, 1> out;
  auto r = cq->wait(out, 5s);
  t.join();
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(*r, 1u);
  EXPECT_EQ(out[0].wr_id, 77u);
}

TEST(sw_cq, armed_fd_becomes_readable_on_completion) {
  auto cq = make_cq(4);
  cq->arm();
  pollfd p{cq->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "fd readable with nothing queued";
  cq->push(wc_with(5));
  EXPECT_EQ(::poll(&p, 1, 1000), 1);
  std::array<work_completion, 2> out;
  EXPECT_EQ(cq->poll(out).value(), 1u);
  EXPECT_EQ(cq->poll(out).value(), 0u);  // drains the descriptor
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "fd still readable after the queue was drained";
}

TEST(sw_cq, arm_with_queued_completions_signals_at_once) {
  auto cq = make_cq(4);
  cq->push(wc_with(1));
  cq->arm();
  pollfd p{cq->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 1);
}

TEST(sw_cq, zero_depth_is_invalid) {
  auto r = detail::sw_cq::create(0, nullptr, nullptr, 0);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::invalid_argument);
}

TEST(qp_state_machine, verbs_transitions) {
  using detail::qp_transition_allowed;
  EXPECT_TRUE(qp_transition_allowed(qp_state::reset, qp_state::init));
  EXPECT_TRUE(qp_transition_allowed(qp_state::init, qp_state::rtr));
  EXPECT_TRUE(qp_transition_allowed(qp_state::rtr, qp_state::rts));
  EXPECT_FALSE(qp_transition_allowed(qp_state::reset, qp_state::rts));
  EXPECT_FALSE(qp_transition_allowed(qp_state::init, qp_state::rts));
  EXPECT_FALSE(qp_transition_allowed(qp_state::error, qp_state::rts));
  EXPECT_FALSE(qp_transition_allowed(qp_state::error, qp_state::init));
  for (auto s : {qp_state::reset, qp_state::init, qp_state::rtr, qp_state::rts, qp_state::error}) {
    EXPECT_TRUE(qp_transition_allowed(s, qp_state::error)) << to_string(s);
    EXPECT_TRUE(qp_transition_allowed(s, qp_state::reset)) << to_string(s);
  }
}

TEST(statuses, every_status_and_code_has_a_name) {
  for (int i = 0; i <= static_cast<int>(wc_status::general_err); ++i)
    EXPECT_NE(to_string(static_cast<wc_status>(i)), "unknown status");
  for (int i = 0; i <= static_cast<int>(errc::io_error); ++i)
    EXPECT_NE(to_string(static_cast<errc>(i)), "unknown error");
}
