// The verbs provider's transport policy (providers/verbs/verbs_transport.hpp):
// which verbs_transport_params create_qp accepts, what they make of the
// connection manager's RTR/RTS attributes, and the port-down grace period with
// its clock. Pure functions: no rdma-core, no device.
#include "providers/verbs/verbs_transport.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace cvy = conveyor;
using cvy::verbs::apply_transport_params;
using cvy::verbs::check_transport_params;
using cvy::verbs::port_down_clock;
using cvy::verbs::port_down_grace;
using cvy::verbs::rc_attrs;
using cvy::verbs::retry_span;
using std::chrono::milliseconds;

namespace {

TEST(verbs_transport, the_defaults_are_the_values_used_before_they_were_settable) {
  const cvy::verbs_transport_params p;
  EXPECT_EQ(p.retry_count, 7);
  EXPECT_EQ(p.rnr_retry, 6);
  EXPECT_FALSE(p.timeout.has_value());
  EXPECT_FALSE(p.min_rnr_timer.has_value());
  EXPECT_EQ(p.path_mtu, 0u);
  EXPECT_EQ(check_transport_params(p), "");
  EXPECT_EQ(check_transport_params(cvy::qp_init_attr{}.verbs_transport), "");
  // The connection manager's timers and MTU stay; the counts are the old constants.
  const rc_attrs cm{
      .retry_cnt = 1, .rnr_retry = 1, .min_rnr_timer = 12, .timeout = 17, .path_mtu_bytes = 1024};
  const auto r = apply_transport_params(cm, p);
  EXPECT_EQ(r.retry_cnt, 7);
  EXPECT_EQ(r.rnr_retry, 6);
  EXPECT_EQ(r.min_rnr_timer, 12);
  EXPECT_EQ(r.timeout, 17);
  EXPECT_EQ(r.path_mtu_bytes, 1024u);
}

TEST(verbs_transport, values_out_of_range_are_refused_with_the_field_named) {
  auto refused = [](cvy::verbs_transport_params p, std::string_view field) {
    const auto why = check_transport_params(p);
    EXPECT_TRUE(why.contains(field)) << "'" << why << "' should name " << field;
  };
  refused({.retry_count = 8}, "retry_count 8");
  refused({.rnr_retry = 9}, "rnr_retry 9");
  refused({.min_rnr_timer = 32}, "min_rnr_timer 32");
  refused({.timeout = 32}, "timeout 32");
  refused({.path_mtu = 1500}, "path_mtu 1500");
  refused({.path_mtu = 128}, "path_mtu 128");
  refused({.path_mtu = 8192}, "path_mtu 8192");
  // The edges of every range are accepted.
  for (std::uint32_t mtu : {0u, 256u, 512u, 1024u, 2048u, 4096u})
    EXPECT_EQ(check_transport_params({.path_mtu = mtu}), "") << mtu;
  EXPECT_EQ(
      check_transport_params({.retry_count = 0, .rnr_retry = 7, .min_rnr_timer = 0, .timeout = 0}),
      "");
  EXPECT_EQ(check_transport_params(
                {.retry_count = 7, .rnr_retry = 0, .min_rnr_timer = 31, .timeout = 31}),
            "");
}

TEST(verbs_transport, set_values_replace_the_connection_managers_and_the_mtu_only_shrinks) {
  const rc_attrs cm{
      .retry_cnt = 7, .rnr_retry = 6, .min_rnr_timer = 0, .timeout = 17, .path_mtu_bytes = 1024};
  const auto r = apply_transport_params(
      cm, {.retry_count = 2, .rnr_retry = 7, .min_rnr_timer = 14, .timeout = 12, .path_mtu = 512});
  EXPECT_EQ(r.retry_cnt, 2);
  EXPECT_EQ(r.rnr_retry, 7);
  EXPECT_EQ(r.min_rnr_timer, 14);
  EXPECT_EQ(r.timeout, 12);
  EXPECT_EQ(r.path_mtu_bytes, 512u);
  // Asking for more than the path carries keeps the path's MTU.
  EXPECT_EQ(apply_transport_params(cm, {.path_mtu = 4096}).path_mtu_bytes, 1024u);
}

TEST(verbs_transport, retry_span_is_the_ack_timeout_times_the_tries) {
  EXPECT_FALSE(retry_span(0, 7).has_value()) << "timeout 0 waits for ever";
  // 4.096 us x 2^14 = 67.1 ms; 8 tries = 536.9 ms (rounded up).
  EXPECT_EQ(retry_span(14, 7), milliseconds(537));
  EXPECT_EQ(retry_span(14, 0), milliseconds(68));
  // 4.096 us x 2^17 = 536.9 ms; 8 tries = 4295 ms.
  EXPECT_EQ(retry_span(17, 7), milliseconds(4295));
  EXPECT_EQ(retry_span(1, 0), milliseconds(1));
  EXPECT_GT(retry_span(31, 7)->count(), 60'000) << "no overflow at the top of the range";
}

TEST(verbs_transport, port_down_grace_is_the_option_else_what_the_qps_retries_ride_out) {
  EXPECT_EQ(port_down_grace(milliseconds(250), true, 17, 7), milliseconds(250));
  EXPECT_EQ(port_down_grace(milliseconds(0), true, 17, 7), milliseconds(0)) << "0: at once";
  EXPECT_EQ(port_down_grace(milliseconds(-5), true, 17, 7), milliseconds(0));
  EXPECT_EQ(port_down_grace(std::nullopt, true, 17, 7), milliseconds(4295));
  EXPECT_EQ(port_down_grace(std::nullopt, true, 14, 3), milliseconds(269));
  EXPECT_EQ(port_down_grace(std::nullopt, true, 31, 7), cvy::verbs::max_port_down_grace)
      << "bounded";
  EXPECT_EQ(port_down_grace(std::nullopt, true, 0, 7), cvy::verbs::untimed_port_down_grace)
      << "a QP that waits for ever still fails: rxe's responder must not hang";
  EXPECT_EQ(port_down_grace(std::nullopt, false, 17, 7), cvy::verbs::untimed_port_down_grace)
      << "iWARP";
  EXPECT_LE(cvy::verbs::untimed_port_down_grace, cvy::verbs::max_port_down_grace);
}

TEST(verbs_transport,
     port_down_clock_expires_a_qp_only_after_its_grace_and_forgets_a_port_that_came_back) {
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::time_point{} + std::chrono::hours(1);
  port_down_clock c;
  EXPECT_FALSE(c.any_down());
  EXPECT_FALSE(c.expired(1, milliseconds(0), t0)) << "a port that is up never expires";
  EXPECT_FALSE(c.up(1, t0).has_value()) << "up without down";
  c.down(1, t0);
  EXPECT_TRUE(c.any_down());
  EXPECT_EQ(c.down_since(1), t0);
  EXPECT_FALSE(c.down_since(2).has_value());
  EXPECT_TRUE(c.expired(1, milliseconds(0), t0));
  EXPECT_FALSE(c.expired(1, milliseconds(500), t0 + milliseconds(499)));
  EXPECT_TRUE(c.expired(1, milliseconds(500), t0 + milliseconds(500)));
  EXPECT_FALSE(c.expired(2, milliseconds(0), t0 + milliseconds(500))) << "another port";
  // A second port_down while down keeps the first time.
  c.down(1, t0 + milliseconds(300));
  EXPECT_TRUE(c.expired(1, milliseconds(500), t0 + milliseconds(500)));
  // Back after 400 ms: nothing expires any more; going down again restarts the time.
  EXPECT_EQ(c.up(1, t0 + milliseconds(400)), milliseconds(400));
  EXPECT_FALSE(c.any_down());
  EXPECT_FALSE(c.expired(1, milliseconds(500), t0 + milliseconds(10'000)));
  c.down(1, t0 + milliseconds(1000));
  EXPECT_FALSE(c.expired(1, milliseconds(500), t0 + milliseconds(1499)));
  EXPECT_TRUE(c.expired(1, milliseconds(500), t0 + milliseconds(1500)));
  c.down(200, t0);
  EXPECT_TRUE(c.expired(200, milliseconds(1), t0 + milliseconds(1)));
}

}  // namespace
