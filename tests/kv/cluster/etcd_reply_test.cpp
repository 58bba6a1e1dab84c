// etcd's gateway replies read by pure functions (apps/kv/src/cluster/etcd_reply.*),
// without a server: what etcd sends reads as it should, and the inputs
// fuzz_etcd_reply showed to be mishandled stay refused (the same inputs are
// in tests/fuzz/corpus/etcd_reply/regress_*).
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <string>

#include "cluster/etcd_reply.hpp"

namespace {

using namespace conveyor::kv::cluster;
using conveyor::errc;
using std::chrono::milliseconds;

const std::string created = R"({"result":{"header":{"revision":"12"},"created":true}})";

std::string created_at(const std::string& revision) {
  return R"({"result":{"header":{"revision":")" + revision + R"("},"created":true}})";
}

// A watch on "p/" from `from` fed these lines, finished after its time bound.
conveyor::result<watch_result> watch(std::int64_t from, std::initializer_list<std::string> lines) {
  etcd_reply::watch_collector seen(from);
  for (const auto& l : lines) {
    auto m = etcd_reply::parse_watch_line(l, "p/", from);
    if (!m) return std::unexpected(m.error());
    if (seen.take(std::move(*m))) break;
  }
  return seen.finish(/*ran_out=*/true, milliseconds(100));
}

TEST(etcd_reply, errors_say_what_is_wrong_and_leave_the_endpoint_to_the_caller) {
  auto r = etcd_reply::parse_put("{}");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::protocol_error);
  EXPECT_EQ(r.error().context, "header is not an object");
  r = etcd_reply::parse_put("[1]");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().context, "the reply is not a JSON object");
  auto w = etcd_reply::parse_watch_line("not json", "p/", 0);
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.error().context, "a stream line is not JSON");
}

TEST(etcd_reply, etcds_error_object_maps_its_grpc_code) {
  auto e = etcd_reply::parse_error(
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})");
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  EXPECT_EQ(e->code, errc::not_found);
  EXPECT_EQ(e->message, "etcdserver: requested lease not found");
  EXPECT_FALSE(etcd_reply::parse_error(R"({"message":"x","code":"5"})").has_value());
  EXPECT_FALSE(etcd_reply::parse_error("<html>").has_value());
}

TEST(etcd_reply, a_watch_resumes_one_past_its_last_event_or_where_it_began) {
  auto w =
      watch(10, {created, R"({"result":{"events":[{"kv":{"key":"cC94","mod_revision":"12"}}]}})"});
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  EXPECT_EQ(w->next_revision, 13);
  w = watch(10, {created});  // quiet, from a revision: resume there
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  EXPECT_EQ(w->next_revision, 10);
  w = watch(0, {created});  // quiet, from now: resume after where it began
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  EXPECT_EQ(w->next_revision, 13);
}

// Found with fuzz_etcd_reply (UBSan, on a hand-written input): next_revision
// was the event's revision + 1, which overflows for an event at INT64_MAX.
TEST(etcd_reply, an_event_at_the_last_int64_revision_is_a_protocol_error) {
  const std::string max = std::to_string(INT64_MAX);
  auto w = watch(10, {created, R"({"result":{"events":[{"kv":{"key":"cC94","mod_revision":")" +
                                   max + R"("}}]}})"});
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.error().code, errc::protocol_error) << w.error().to_string();
}

// Found with fuzz_etcd_reply (its next_revision property, on hand-written
// inputs): a quiet watch from now resumed at the start revision + 1
// whatever it was: a negative one gave a revision the next call refuses, a
// missing one (0) replayed history from revision 1, INT64_MAX overflowed.
TEST(etcd_reply, a_quiet_watch_from_now_needs_the_revision_it_began_at) {
  for (const std::string& rev : {std::string("-5"), std::string("0"), std::to_string(INT64_MAX)}) {
    auto w = watch(0, {created_at(rev)});
    ASSERT_FALSE(w.has_value()) << rev;
    EXPECT_EQ(w.error().code, errc::protocol_error) << w.error().to_string();
  }
  auto w = watch(0, {R"({"result":{"created":true}})"});
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.error().code, errc::protocol_error);
  // From a revision, the start revision is not used.
  EXPECT_TRUE(watch(10, {created_at("-5")}).has_value());
}

}  // namespace
