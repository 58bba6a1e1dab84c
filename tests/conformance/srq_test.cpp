// Shared receive queues (conveyor/srq.hpp): several QPs of one PD draw their
// receives from one SRQ, each receive is consumed exactly once, a QP with an
// SRQ refuses post_recv, an SRQ of another PD or device is refused, the limit
// event fires once per arm, a QP in ERROR leaves the SRQ's receives to the
// others, and a SEND that spans many segments keeps the receive it started
// with while another QP takes the next ones.
//
// Fixture: an initiator device with one CQ and N QPs, a target device with
// one CQ, one SRQ and N QPs attached to it, connected pairwise through one
// listener. Manual progress: the target's CQ is pumped (the target poller),
// the initiator's engine runs inside the test's waits.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/buffer.hpp"
#include "common/completions.hpp"
#include "common/env.hpp"
#include "common/pattern.hpp"

namespace cvt {
namespace {

using conveyor::access;
using conveyor::device_event;
using conveyor::device_event_type;
using conveyor::errc;
using conveyor::qp_state;
using conveyor::recv_wr;
using conveyor::send_wr;
using conveyor::sge;
using conveyor::srq_attr;
using conveyor::wc_opcode;
using conveyor::wc_status;
using conveyor::work_completion;
using conveyor::wr_opcode;
using std::chrono::milliseconds;

// The srq_limit_reached events the target device delivered, in order.
struct event_log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<device_event> got;

  void push(const device_event& e) {
    if (e.type != device_event_type::srq_limit_reached) return;
    std::lock_guard lk(mu);
    got.push_back(e);
    cv.notify_all();
  }
  // Waits (bounded) until at least n arrived; a copy of them.
  std::vector<device_event> wait_for(std::size_t n, milliseconds timeout) {
    std::unique_lock lk(mu);
    cv.wait_for(lk, timeout, [&] { return got.size() >= n; });
    return got;
  }
  std::vector<device_event> now() {
    std::lock_guard lk(mu);
    return got;
  }
};

// A message's first 8 bytes: which QP sent it and its index there; the rest
// is a pattern seeded by that tag.
std::uint64_t tag_of(std::size_t qp, std::size_t j) {
  return 0x5e0000000000ull | (std::uint64_t(qp) << 16) | j;
}

class srq : public testing::TestWithParam<provider_param> {
 protected:
  bool manual() const { return GetParam().progress == conveyor::progress_mode::manual; }

  void TearDown() override {
    iqp.clear();
    tqp.clear();
    if (tr) tr->stop_pump();
    src = test_region();
    dst = test_region();
    queue = conveyor::shared_receive_queue();
    ir.reset();
    tr.reset();
    icq = conveyor::completion_queue();
    tcq = conveyor::completion_queue();
    ipd = conveyor::protection_domain();
    tpd = conveyor::protection_domain();
    idev = conveyor::device();
    tdev = conveyor::device();
  }

  // Devices, PDs, CQs and the SRQ; skips where the device has no SRQs.
  void open(const srq_attr& a) {
    const auto& p = GetParam();
    auto d = conveyor::device::open(device_name(p.provider, "init"), make_options(p.progress));
    CVT_ASSERT_OK(d);
    idev = std::move(*d);
    auto o = make_options(p.progress);
    o.on_event = [log = events](const device_event& e) { log->push(e); };
    d = conveyor::device::open(device_name(p.provider, "tgt"), o);
    CVT_ASSERT_OK(d);
    tdev = std::move(*d);
    if (tdev.attr().max_srq == 0)
      GTEST_SKIP() << tdev.attr().name << " has no shared receive queues (device_attr::max_srq 0)";
    auto pd = idev.alloc_pd();
    CVT_ASSERT_OK(pd);
    ipd = std::move(*pd);
    pd = tdev.alloc_pd();
    CVT_ASSERT_OK(pd);
    tpd = std::move(*pd);
    auto cq = idev.create_cq({.depth = 1024});
    CVT_ASSERT_OK(cq);
    icq = std::move(*cq);
    cq = tdev.create_cq({.depth = 1024});
    CVT_ASSERT_OK(cq);
    tcq = std::move(*cq);
    ir = std::make_unique<cq_reader>(&icq, "initiator CQ");
    tr = std::make_unique<cq_reader>(&tcq, "target CQ");
    if (manual()) tr->start_pump();
    auto s = tpd.create_srq(a);
    CVT_ASSERT_OK(s);
    queue = std::move(*s);
    auto q = queue.query();
    CVT_ASSERT_OK(q);
    granted = *q;
    ASSERT_GE(granted.max_wr, a.max_wr);
    ASSERT_GE(granted.max_sge, a.max_sge);
    ASSERT_EQ(granted.srq_limit, a.srq_limit);
  }

  // open() + n connected pairs, the target's QPs on the SRQ; registers `slot`
  // bytes per message: `slots` receive buffers on the target, `slots` sources
  // on the initiator.
  void connect(std::size_t n, const srq_attr& a, std::size_t slot, std::size_t slots) {
    ASSERT_NO_FATAL_FAILURE(open(a));
    if (IsSkipped()) return;
    slot_ = slot;
    auto r = make_region(tpd, slot * slots, access::local_write, 0);
    CVT_ASSERT_OK(r);
    dst = std::move(*r);
    r = make_region(ipd, slot * slots, access::none, 0);
    CVT_ASSERT_OK(r);
    src = std::move(*r);

    auto lis = conveyor::listener::bind(tdev);
    CVT_ASSERT_OK(lis);
    const std::string addr = lis->address();
    const auto timeout = scaled(milliseconds(10000));
    for (std::size_t k = 0; k < n; ++k) {
      auto t = tpd.create_qp({.send_cq = &tcq, .recv_cq = &tcq, .srq = &queue});
      CVT_ASSERT_OK(t);
      tqp.push_back(std::move(*t));
      auto i = ipd.create_qp({.send_cq = &icq, .recv_cq = &icq});
      CVT_ASSERT_OK(i);
      iqp.push_back(std::move(*i));
      std::string accept_err;
      std::thread acceptor([&] {
        auto req = lis->accept(timeout);
        if (!req) {
          accept_err = "accept: " + req.error().to_string();
          return;
        }
        if (auto info = req->accept(tqp.back(), {}); !info)
          accept_err = "connect_request.accept: " + info.error().to_string();
      });
      auto info = conveyor::connect(iqp.back(), addr, {.timeout = timeout});
      acceptor.join();
      ASSERT_TRUE(info.has_value()) << "connect " << k << " to " << addr << ": "
                                    << info.error().to_string() << " " << accept_err;
      ASSERT_EQ(accept_err, "");
      ASSERT_EQ(name(tqp.back().state()), name(qp_state::rts));
    }
  }

  // Posts receive i (wr_id 1000 + i) into slot i of dst.
  conveyor::status post_recv(std::size_t i, std::size_t len = 0) {
    const sge s = dst.sge(i * slot_, len == 0 ? slot_ : len);
    return queue.post_recv(s, 1000 + i);
  }

  // Fills source slot `slot` with message (qp, j) of `size` bytes and SENDs it on iqp[qp].
  conveyor::status send(std::size_t qp, std::size_t j, std::size_t slot, std::size_t size) {
    const std::uint64_t tag = tag_of(qp, j);
    auto bytes = src.bytes().subspan(slot * slot_, size);
    fill_pattern(bytes, tag);
    std::memcpy(bytes.data(), &tag, sizeof tag);
    return iqp[qp].post_send_msg(src.sge(slot * slot_, size), tag);
  }

  // Waits for n completions on the target CQ (driving the initiator).
  testing::AssertionResult wait_target(std::size_t n, std::vector<work_completion>& out,
                                       milliseconds timeout = scaled(milliseconds(10000))) {
    cq_reader* d[] = {ir.get()};
    return ok(wait_for(*tr, n, timeout, out, d));
  }
  testing::AssertionResult wait_initiator(std::size_t n, std::vector<work_completion>& out) {
    return ok(wait_for(*ir, n, scaled(milliseconds(10000)), out));
  }

  // "" when receive wc holds message (qp, j) of `size` bytes in its slot and
  // arrived on tqp[qp], else what is wrong.
  std::string check_received(const work_completion& wc, std::size_t size,
                             std::uint64_t* tag_out = nullptr) {
    if (wc.status != wc_status::success || wc.opcode != wc_opcode::recv)
      return "receive " + describe(wc);
    if (wc.wr_id < 1000 || wc.wr_id >= 1000 + dst.size() / slot_)
      return "unknown wr_id " + describe(wc);
    if (wc.byte_len != size) return "byte_len " + describe(wc);
    const auto data = dst.bytes().subspan((wc.wr_id - 1000) * slot_, size);
    std::uint64_t tag = 0;
    std::memcpy(&tag, data.data(), sizeof tag);
    const std::size_t qp = (tag >> 16) & 0xff;
    if ((tag & ~0xffffffull) != tag_of(0, 0) || qp >= tqp.size())
      return "receive " + std::to_string(wc.wr_id) + " holds no message";
    if (wc.qp_num != tqp[qp].qp_num())
      return "message of QP " + std::to_string(qp) + " completed on QP " +
             std::to_string(wc.qp_num);
    if (auto e = check_pattern(data.subspan(8), tag, 8); !e.empty())
      return "receive " + std::to_string(wc.wr_id) + ": " + e;
    if (tag_out) *tag_out = tag;
    return "";
  }

  std::shared_ptr<event_log> events = std::make_shared<event_log>();
  conveyor::device idev, tdev;
  conveyor::protection_domain ipd, tpd;
  conveyor::completion_queue icq, tcq;
  std::unique_ptr<cq_reader> ir, tr;
  conveyor::shared_receive_queue queue;
  srq_attr granted;
  std::vector<conveyor::queue_pair> iqp, tqp;
  test_region src, dst;
  std::size_t slot_ = 0;
};

// Every SEND of two connections consumes one SRQ receive, each exactly once,
// in the SRQ's order, with its own data and its QP's number.
TEST_P(srq, two_qps_share_one_srq_and_each_receive_is_consumed_once) {
  constexpr std::size_t per_qp = 8, size = 100;
  ASSERT_NO_FATAL_FAILURE(connect(2, {.max_wr = 64, .max_sge = 1}, 128, 2 * per_qp));
  if (IsSkipped()) return;
  for (std::size_t i = 0; i < 2 * per_qp; ++i) CVT_ASSERT_POST_OK(post_recv(i));
  for (std::size_t j = 0; j < per_qp; ++j) {
    CVT_ASSERT_POST_OK(send(0, j, j, size));
    CVT_ASSERT_POST_OK(send(1, j, per_qp + j, size));
  }
  std::vector<work_completion> sent, got;
  ASSERT_TRUE(wait_initiator(2 * per_qp, sent));
  EXPECT_TRUE(ok(all_success(sent)));
  ASSERT_TRUE(wait_target(2 * per_qp, got));
  std::set<std::uint64_t> wr_ids, tags;
  std::map<std::size_t, std::uint64_t> last_wr_of_qp;
  for (const auto& wc : got) {
    std::uint64_t tag = 0;
    ASSERT_EQ(check_received(wc, size, &tag), "");
    EXPECT_TRUE(wr_ids.insert(wc.wr_id).second) << "receive consumed twice: " << describe(wc);
    EXPECT_TRUE(tags.insert(tag).second) << "message delivered twice: " << describe(wc);
    // One QP's messages arrive in order and the SRQ hands out receives in
    // order, so each QP's receives follow the SRQ's order too.
    const std::size_t qp = (tag >> 16) & 0xff, j = tag & 0xffff;
    if (j > 0) {
      EXPECT_GT(wc.wr_id, last_wr_of_qp[qp]) << describe(wc);
    }
    last_wr_of_qp[qp] = wc.wr_id;
  }
  EXPECT_EQ(wr_ids.size(), 2 * per_qp);
  EXPECT_EQ(tags.size(), 2 * per_qp);
}

TEST_P(srq, post_recv_on_a_qp_with_an_srq_is_invalid_argument) {
  ASSERT_NO_FATAL_FAILURE(open({.max_wr = 16, .max_sge = 1}));
  if (IsSkipped()) return;
  auto qp = tpd.create_qp({.send_cq = &tcq, .recv_cq = &tcq, .srq = &queue});
  CVT_ASSERT_OK(qp);
  // The QP has no receive queue of its own.
  EXPECT_EQ(qp->caps().max_recv_wr, 0u);
  auto r = make_region(tpd, 64, access::local_write, 1);
  CVT_ASSERT_OK(r);
  std::size_t bad = 99;
  const sge s = r->sge(0, 64);
  const recv_wr wr{.wr_id = 1, .sg_list = std::span(&s, 1)};
  EXPECT_EQ(name(qp->post_recv(std::span(&wr, 1), &bad)), name(errc::invalid_argument));
  EXPECT_EQ(bad, 0u);
  // The SRQ itself takes it.
  CVT_EXPECT_POST_OK(queue.post_recv(s, 1));
}

TEST_P(srq, an_srq_of_another_pd_or_device_is_refused_at_create_qp) {
  ASSERT_NO_FATAL_FAILURE(open({.max_wr = 16, .max_sge = 1}));
  if (IsSkipped()) return;
  auto other = tdev.alloc_pd();
  CVT_ASSERT_OK(other);
  auto cq = tdev.create_cq({.depth = 16});
  CVT_ASSERT_OK(cq);
  CVT_EXPECT_ERRC(other->create_qp({.send_cq = &*cq, .recv_cq = &*cq, .srq = &queue}),
                  errc::invalid_argument);
  // The initiator's device (another device instance on soft and shm; on verbs
  // the same device, another PD): refused either way.
  CVT_EXPECT_ERRC(ipd.create_qp({.send_cq = &icq, .recv_cq = &icq, .srq = &queue}),
                  errc::invalid_argument);
  // The SRQ's own PD takes it.
  auto fine = tpd.create_qp({.send_cq = &*cq, .recv_cq = &*cq, .srq = &queue});
  EXPECT_TRUE(fine.has_value()) << fine.error().to_string();
}

// The limit fires once when a receive taken leaves fewer than it posted, not
// while at or above it, and not again until armed again. Each arm uses another
// limit, and the event names it, so a second event of the first arm would show.
TEST_P(srq, limit_event_fires_once_per_arm_and_only_below_the_limit) {
  ASSERT_NO_FATAL_FAILURE(connect(1, {.max_wr = 16, .max_sge = 1}, 64, 8));
  if (IsSkipped()) return;
  const std::string srq_name = "SRQ " + std::to_string(queue.srq_num());
  for (std::size_t i = 0; i < 8; ++i) CVT_ASSERT_POST_OK(post_recv(i));
  auto armed = queue.arm_limit(4);
  CVT_ASSERT_OK(armed);
  CVT_EXPECT_ERRC(queue.arm_limit(granted.max_wr + 1), errc::invalid_argument);
  auto q = queue.query();
  CVT_ASSERT_OK(q);
  EXPECT_EQ(q->srq_limit, 4u);

  std::vector<work_completion> sent, got;
  std::size_t slot = 0;
  auto one_send = [&] {
    CVT_ASSERT_POST_OK(send(0, slot, slot, 32));
    ++slot;
    ASSERT_TRUE(wait_initiator(1, sent));
    ASSERT_TRUE(wait_target(1, got));
    ASSERT_EQ(check_received(got.back(), 32), "");
  };
  // 8 -> 4 posted: never below 4.
  for (int k = 0; k < 4; ++k) ASSERT_NO_FATAL_FAILURE(one_send());
  q = queue.query();
  CVT_ASSERT_OK(q);
  EXPECT_EQ(q->srq_limit, 4u) << "the limit fired (disarmed) at 4 receives posted";
  EXPECT_TRUE(events->now().empty()) << events->now()[0].description;

  // 3 posted: below 4.
  ASSERT_NO_FATAL_FAILURE(one_send());
  auto ev = events->wait_for(1, scaled(milliseconds(10000)));
  ASSERT_EQ(ev.size(), 1u) << "no srq_limit_reached event";
  EXPECT_EQ(ev[0].srq_num, queue.srq_num());
  EXPECT_NE(ev[0].description.find(srq_name), std::string::npos) << ev[0].description;
  EXPECT_NE(ev[0].description.find("limit 4"), std::string::npos) << ev[0].description;
  q = queue.query();
  CVT_ASSERT_OK(q);
  EXPECT_EQ(q->srq_limit, 0u) << "the limit stays armed after its event";

  // 2 posted: disarmed, nothing fires. Armed at 2: 1 posted fires it.
  ASSERT_NO_FATAL_FAILURE(one_send());
  armed = queue.arm_limit(2);
  CVT_ASSERT_OK(armed);
  ASSERT_NO_FATAL_FAILURE(one_send());
  ev = events->wait_for(2, scaled(milliseconds(10000)));
  ASSERT_EQ(ev.size(), 2u) << "no event for the second arm";
  EXPECT_NE(ev[1].description.find("limit 2"), std::string::npos)
      << "the first arm fired again: " << ev[1].description;
  EXPECT_EQ(ev[1].srq_num, queue.srq_num());
}

// A QP moved to ERROR flushes what it drew (here: nothing), never the SRQ's
// receives: they all serve the other QP, in order.
TEST_P(srq, a_qp_in_error_leaves_the_srq_receives_to_the_other_qp) {
  ASSERT_NO_FATAL_FAILURE(connect(2, {.max_wr = 16, .max_sge = 1}, 64, 8));
  if (IsSkipped()) return;
  for (std::size_t i = 0; i < 6; ++i) CVT_ASSERT_POST_OK(post_recv(i));
  std::vector<work_completion> sent, got;
  CVT_ASSERT_POST_OK(send(0, 0, 0, 40));
  ASSERT_TRUE(wait_initiator(1, sent));
  ASSERT_TRUE(wait_target(1, got));
  ASSERT_EQ(check_received(got[0], 40), "");
  EXPECT_EQ(got[0].wr_id, 1000u);

  auto m = tqp[0].modify(qp_state::error);
  CVT_ASSERT_OK(m);
  // A flush of the SRQ's receives would complete here, before anything that
  // the other QP receives below.
  for (std::size_t j = 0; j < 5; ++j) CVT_ASSERT_POST_OK(send(1, j, 1 + j, 40));
  sent.clear();
  got.clear();
  ASSERT_TRUE(wait_target(5, got)) << "the SRQ's receives were flushed with QP 0";
  for (std::size_t j = 0; j < 5; ++j) {
    EXPECT_EQ(check_received(got[j], 40), "");
    EXPECT_EQ(got[j].wr_id, 1001u + j) << describe(got[j]);
  }
  ASSERT_TRUE(wait_initiator(5, sent));
  EXPECT_TRUE(ok(all_success(sent)));
  EXPECT_EQ(name(iqp[1].state()), name(qp_state::rts));
}

TEST_P(srq, posting_more_than_max_wr_is_again) {
  ASSERT_NO_FATAL_FAILURE(connect(1, {.max_wr = 8, .max_sge = 1}, 64, 1));
  if (IsSkipped()) return;
  // The queue the device granted (verbs devices round it up).
  const std::uint32_t n = granted.max_wr;
  auto buf = make_region(tpd, 64, access::local_write, 2);
  CVT_ASSERT_OK(buf);
  const sge s = buf->sge(0, 64);
  for (std::uint32_t i = 0; i < n; ++i) CVT_ASSERT_POST_OK(queue.post_recv(s, 2000 + i));
  EXPECT_EQ(name(queue.post_recv(s, 2999)), name(errc::again));
  const recv_wr two[] = {{.wr_id = 3000, .sg_list = std::span(&s, 1)},
                         {.wr_id = 3001, .sg_list = std::span(&s, 1)}};
  std::size_t bad = 99;
  EXPECT_EQ(name(queue.post_recv(two, &bad)), name(errc::again));
  EXPECT_EQ(bad, 0u);
  // A SEND takes one: there is room for one more again.
  std::vector<work_completion> sent, got;
  CVT_ASSERT_POST_OK(send(0, 0, 0, 16));
  ASSERT_TRUE(wait_target(1, got));
  EXPECT_EQ(got[0].wr_id, 2000u) << describe(got[0]);
  CVT_EXPECT_POST_OK(queue.post_recv(s, 3002));
  EXPECT_EQ(name(queue.post_recv(s, 3003)), name(errc::again));
  ASSERT_TRUE(wait_initiator(1, sent));
}

TEST_P(srq, a_bad_lkey_or_too_many_sges_is_refused_at_post) {
  ASSERT_NO_FATAL_FAILURE(open({.max_wr = 8, .max_sge = 2}));
  if (IsSkipped()) return;
  auto buf = make_region(tpd, 256, access::local_write, 3);
  CVT_ASSERT_OK(buf);
  const sge ok_sge = buf->sge(0, 64);
  const sge three[] = {ok_sge, ok_sge, ok_sge};
  if (granted.max_sge + 1 <= 3) {  // (verbs devices may grant more SGEs than asked)
    std::size_t bad = 99;
    const recv_wr too_many[] = {{.wr_id = 1, .sg_list = std::span(three, 2)},
                                {.wr_id = 2, .sg_list = std::span(three, granted.max_sge + 1)}};
    EXPECT_EQ(name(queue.post_recv(too_many, &bad)), name(errc::invalid_argument));
    EXPECT_EQ(bad, 1u);
  }
  if (!tdev.attr().post_recv_checks_lkeys)
    GTEST_SKIP() << tdev.attr().name
                 << " checks receive lkeys only when a message arrives "
                    "(device_attr::post_recv_checks_lkeys false)";
  sge bad_key = ok_sge;
  bad_key.lkey ^= 0x5a5a;
  EXPECT_EQ(name(queue.post_recv(bad_key, 10)), name(errc::invalid_argument));
  sge outside = buf->sge(0, 64);
  outside.length = 4096 * 2;  // past the region
  EXPECT_EQ(name(queue.post_recv(outside, 11)), name(errc::invalid_argument));
  // A region of another PD (and device).
  auto foreign = make_region(ipd, 64, access::local_write, 4);
  CVT_ASSERT_OK(foreign);
  EXPECT_EQ(name(queue.post_recv(foreign->sge(0, 64), 12)), name(errc::invalid_argument));
  CVT_EXPECT_POST_OK(queue.post_recv(ok_sge, 13));
}

// SENDs of 256 KiB span many segments (soft: FPDUs of at most one MSS; shm:
// ring slots); two connections send at once, so their segments interleave in
// the target's engine. Each message must land whole in the one receive its
// first segment took.
TEST_P(srq, multi_segment_sends_on_two_qps_keep_the_receive_they_started_with) {
  constexpr std::size_t per_qp = 4, size = 256 * KiB;
  ASSERT_NO_FATAL_FAILURE(connect(2, {.max_wr = 16, .max_sge = 1}, size, 2 * per_qp));
  if (IsSkipped()) return;
  if (tdev.attr().max_msg_size < size) GTEST_SKIP() << "max_msg_size below 256 KiB";
  for (std::size_t i = 0; i < 2 * per_qp; ++i) CVT_ASSERT_POST_OK(post_recv(i));
  for (std::size_t j = 0; j < per_qp; ++j) {
    CVT_ASSERT_POST_OK(send(0, j, j, size));
    CVT_ASSERT_POST_OK(send(1, j, per_qp + j, size));
  }
  std::vector<work_completion> sent, got;
  ASSERT_TRUE(wait_target(2 * per_qp, got, scaled(milliseconds(30000))));
  std::set<std::uint64_t> wr_ids, tags;
  for (const auto& wc : got) {
    std::uint64_t tag = 0;
    EXPECT_EQ(check_received(wc, size, &tag), "");
    EXPECT_TRUE(wr_ids.insert(wc.wr_id).second) << "receive consumed twice: " << describe(wc);
    EXPECT_TRUE(tags.insert(tag).second) << "message delivered twice: " << describe(wc);
  }
  EXPECT_EQ(tags.size(), 2 * per_qp);
  ASSERT_TRUE(wait_initiator(2 * per_qp, sent));
  EXPECT_TRUE(ok(all_success(sent)));
}

INSTANTIATE_TEST_SUITE_P(providers, srq, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
