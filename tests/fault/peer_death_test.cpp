// Peer death and connection loss: every outstanding request completes, with an
// error, in bounded time; nothing hangs.
#include <sys/wait.h>
#include <algorithm>

#include <csignal>
#include <functional>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/caps.hpp"
#include "common/pair.hpp"
#include "common/process.hpp"
#include "common/script.hpp"

namespace cvt {
namespace {

using conveyor::access;
using conveyor::errc;
using conveyor::qp_state;
using conveyor::send_wr;
using conveyor::sge;
using conveyor::wc_opcode;
using conveyor::wc_status;
using conveyor::work_completion;
using conveyor::wr_opcode;
using std::chrono::milliseconds;

// The brief's bound for "every outstanding request completes": 10 s (twice
// that under sanitizers, which slow the engine down).
milliseconds abort_bound() {
  return milliseconds(timeout_scale() > 1.0 ? 20000 : 10000);
}

// Checks the completions of a send queue that lost its connection part-way:
// one per posted request, in posting order, successes first, then only
// retry_exc_err (connection lost) or wr_flush_err (flushed), at least one error.
//
// `is_read` (by request index; given only for kernel iWARP) relaxes one thing for kernel iWARP
// (Linux siw), where a WRITE completes once it is handed to TCP while a READ completes when its
// response arrives: a WRITE posted after a READ may complete before it, and succeed after that READ
// failed; and the request being sent when TCP failed completes with loc_qp_op_err, possibly ahead
// of earlier requests of its kind that are flushed after it. Each kind on its own otherwise keeps
// the rule (in posting order, successes then errors), every request still completes exactly once,
// and *successes counts the requests that all succeeded from the first on.
std::string check_aborted(const std::vector<work_completion>& wcs, std::uint64_t first_id,
                          std::size_t* successes,
                          const std::function<bool(std::size_t)>& is_read = {}) {
  // (The opcode of an error completion is undefined in verbs: the kind comes
  // from what was posted.)
  if (is_read) {
    std::vector<int> state(wcs.size(), -1);  // per request: -1 missing, 0 failed, 1 succeeded
    struct kind_order {
      std::uint64_t last = 0;
      bool any = false, failed = false;
    } reads, others;
    bool failed = false;
    for (std::size_t i = 0; i < wcs.size(); ++i) {
      const auto& wc = wcs[i];
      if (wc.wr_id < first_id || wc.wr_id - first_id >= wcs.size() ||
          state[wc.wr_id - first_id] != -1)
        return "completion " + std::to_string(i) + " is unknown or a duplicate: " + describe(wc) +
               "; completions: " + describe(std::span<const work_completion>(wcs));
      auto& k = is_read(wc.wr_id - first_id) ? reads : others;
      const bool good = wc.status == wc_status::success;
      // siw completes the request it was handing to TCP when the socket
      // failed at once, with loc_qp_op_err, while the READs before it wait in
      // its outbound READ queue to be flushed after it (Linux 6.1
      // siw_qp_sq_process's error path, then siw_sq_flush): that one
      // completion may come ahead of its kind; the rest keep their order.
      const bool tx_failure = wc.status == wc_status::loc_qp_op_err && !k.failed;
      if (!tx_failure) {
        if (k.any && wc.wr_id < k.last)
          return "completion " + std::to_string(i) +
                 " out of order among its kind: " + describe(wc);
        k.any = true;
        k.last = wc.wr_id;
      }
      if (good && k.failed) return "a success after an error of the same kind: " + describe(wc);
      if (!good) {
        if (wc.status != wc_status::retry_exc_err && wc.status != wc_status::wr_flush_err &&
            !tx_failure)
          return "completion " + std::to_string(i) + " has status " + name(wc.status) +
                 ", expected retry_exc_err (connection lost), wr_flush_err or, first of its kind, "
                 "loc_qp_op_err: " +
                 describe(wc);
        k.failed = failed = true;
      }
      state[wc.wr_id - first_id] = good ? 1 : 0;
    }
    if (!failed) return "every request succeeded: the connection loss was not observed";
    std::size_t prefix = 0;
    while (prefix < state.size() && state[prefix] == 1) ++prefix;
    if (successes != nullptr) *successes = prefix;
    return {};
  }
  bool failed = false;
  std::size_t ok_count = 0;
  for (std::size_t i = 0; i < wcs.size(); ++i) {
    const auto& wc = wcs[i];
    if (wc.wr_id != first_id + i)
      return "completion " + std::to_string(i) + " out of order: " + describe(wc);
    if (wc.status == wc_status::success) {
      if (failed) {
        return "a success after an error: " + describe(wc) + "; completions: " +
               describe(std::span<const work_completion>(wcs).first(
                   std::min<std::size_t>(wcs.size(), i + 2)));
      }
      ++ok_count;
      continue;
    }
    failed = true;
    if (wc.status != wc_status::retry_exc_err && wc.status != wc_status::wr_flush_err) {
      return "completion " + std::to_string(i) + " has status " + name(wc.status) +
             ", expected retry_exc_err (connection lost) or wr_flush_err: " + describe(wc);
    }
  }
  if (!failed) return "every request succeeded: the connection loss was not observed";
  if (successes != nullptr) *successes = ok_count;
  return {};
}

// Direct mapping (shm, allocated regions): a request served through the
// mapping of the target's memory completes once its bytes are placed, which
// the target's loss does not undo, and the QP serves what is queued until it
// sees the peer's socket close. True when every request was served that way,
// in posting order, before the QP saw the loss: nothing was left to abort
// (the QP must still end in ERROR; the callers check that).
bool all_served_through_the_mapping(const conveyor::queue_pair& qp,
                                    std::span<const work_completion> wcs, std::uint64_t first_id) {
  const auto c = qp.counters();
  if (!c.shm || c.shm->direct_ops == 0) return false;
  for (std::size_t i = 0; i < wcs.size(); ++i)
    if (wcs[i].wr_id != first_id + i || wcs[i].status != wc_status::success) return false;
  return true;
}

// The cut lands while the READs are being served: those the target finished
// before it succeed (in posting order, with the right bytes), every later one
// fails, at least one does, and the QP ends in ERROR. (The names say
// "unfinished": a READ answered before the cut may succeed.)
class peer_death : public pair_test {
 protected:
  // Posts n 1-MiB READs of tgt_main into a 16 MiB sink, then cuts the target with `cut`.
  template <class Cut>
  void reads_then_cut(Cut cut);
};

template <class Cut>
void peer_death::reads_then_cut(Cut cut) {
  pair_options o;
  o.tgt_region_size = 16 * MiB;
  ASSERT_NO_FATAL_FAILURE(connect_pair(o));
  constexpr std::size_t n = 64;
  auto sink = make_region(init.pd, 16 * MiB, access::local_write, 0xd100);
  CVT_ASSERT_OK(sink);
  std::vector<sge> sgs(n);
  std::vector<send_wr> wrs(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t off = (i % 16) * MiB;
    sgs[i] = sink->sge(off, MiB);
    wrs[i] = send_wr{.wr_id = 50000 + i,
                     .opcode = wr_opcode::rdma_read,
                     .sg_list = std::span<const sge>(&sgs[i], 1),
                     .remote_addr = peer.addr + off,
                     .rkey = peer.rkey};
  }
  CVT_ASSERT_POST_OK(init.qp.post_send(wrs));
  cut();
  std::vector<work_completion> iw;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait(init.send_reader(), n, abort_bound(), iw))
      << "outstanding READs hung after the cut";
  std::cout
      << "[   INFO   ] all " << n << " READs completed "
      << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count()
      << " ms after the cut\n";
  std::size_t good = 0;
  // Name check: the environment (a kernel device on one host can finish
  // before the cut; Conveyor's own providers must not).
  if (GetParam().provider == "verbs" &&
      std::all_of(iw.begin(), iw.end(),
                  [](const work_completion& w) { return w.status == wc_status::success; }))
    GTEST_SKIP()
        << "the device completed all " << n
        << " READs before the cut (a kernel device on one host is that fast): nothing to abort";
  // Kernel iWARP (siw) may complete the READ it was sending when TCP failed
  // ahead of the earlier ones it then flushes (check_aborted's is_read rule).
  std::function<bool(std::size_t)> all_reads;
  if (!completion_means_placed(init.dev.attr())) {
    all_reads = [](std::size_t) { return true; };
    ASSERT_TRUE(ok(drop_siw_repeated_flushes(iw, init.send_reader(), abort_bound())));
  }
  if (all_served_through_the_mapping(init.qp, iw, 50000)) {
    good = n;
    std::cout << "[   INFO   ] all " << n << " served through the mapping of the target's memory\n";
  } else {
    EXPECT_TRUE(ok(check_aborted(iw, 50000, &good, all_reads)));
  }
  // READs that succeeded before the cut brought the right bytes.
  for (std::size_t i = 0; i < good && i < 16; ++i) {
    EXPECT_TRUE(
        ok(check_pattern(sink->bytes().subspan(i * MiB, MiB), opts_.tgt_region_seed, i * MiB)))
        << "READ " << i;
  }
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, abort_bound()));
  EXPECT_EQ(name(init.qp.post_read(sink->sge(0, 64), peer.slice(0, 64), 1)),
            name(errc::qp_in_error));
}

TEST_P(peer_death,
       target_qp_destroyed_while_reads_outstanding_fails_every_unfinished_read_in_bounded_time) {
  reads_then_cut([this] { tgt.qp = conveyor::queue_pair(); });
}

TEST_P(peer_death,
       target_disconnect_while_reads_outstanding_fails_every_unfinished_read_in_bounded_time) {
  reads_then_cut([this] { tgt.qp.disconnect(); });
}

TEST_P(peer_death,
       target_modify_to_error_while_reads_outstanding_fails_every_unfinished_read_in_bounded_time) {
  reads_then_cut([this] {
    auto r = tgt.qp.modify(qp_state::error);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
  });
}

// A separate process serves the initiator; it is SIGKILLed mid-stream.
class peer_process : public testing::TestWithParam<provider_param> {};

TEST_P(peer_process, peer_killed_mid_transfer_fails_every_unfinished_request_within_10s) {
  two_party_script s;
  s.provider = GetParam().provider;
  s.progress = GetParam().progress;
  s.region_size = 16 * MiB;
  std::vector<std::string> args{"target"};
  for (const auto& a : s.to_args()) args.push_back(a);
  args.push_back("--mode=serve");
  args.push_back("--lifetime=" + std::to_string(scaled(milliseconds(120000)).count() / 1000));
  // Fork before this process opens any device.
  auto child = child_process::spawn(args);
  ASSERT_TRUE(child.has_value()) << child.error();
  auto line = child->read_line(scaled(milliseconds(30000)));
  ASSERT_TRUE(line.has_value()) << line.error();
  const auto at = line->find(" address ");
  ASSERT_NE(at, std::string::npos) << *line;
  const std::string addr = line->substr(at + 9);

  auto dev = conveyor::device::open(device_name(s.provider, "init"), make_options(s.progress));
  CVT_ASSERT_OK(dev);
  auto pd = dev->alloc_pd();
  CVT_ASSERT_OK(pd);
  auto cq = dev->create_cq({.depth = 4096});
  CVT_ASSERT_OK(cq);
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq, .cap = {.max_send_wr = 2048}});
  CVT_ASSERT_OK(qp);
  cq_reader reader(&*cq, "initiator CQ");
  auto src = make_region(*pd, 8 * MiB, access::local_write, 0xd200);
  CVT_ASSERT_OK(src);
  auto sink = make_region(*pd, 8 * MiB, access::local_write, 0xd300);
  CVT_ASSERT_OK(sink);
  auto info = conveyor::connect(*qp, addr, {.timeout = scaled(milliseconds(10000))});
  CVT_ASSERT_OK(info);
  ASSERT_GE(info->private_data.size(), conveyor::remote_region::encoded_size);
  auto data = conveyor::remote_region::decode(
      std::span<const std::byte>(info->private_data).first(conveyor::remote_region::encoded_size));
  CVT_ASSERT_OK(data);

  // READs from the lower half, WRITEs to the upper half: READ data stays checkable.
  // 2000 MiB in all, so that the kill lands mid-transfer even when it comes
  // late: with 200 MiB, shm on a loaded machine (and once rxe) finished every
  // request in the ~30 ms between the first completion and the SIGKILL, and
  // the test failed with "the connection loss was not observed".
  constexpr std::size_t n = 2000;
  std::vector<sge> sgs(n);
  std::vector<send_wr> wrs(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t off = ((i / 2) % 8) * MiB;
    const bool read = i % 2 == 0;
    sgs[i] = read ? sink->sge(off, MiB) : src->sge(off, MiB);
    wrs[i] = send_wr{.wr_id = 60000 + i,
                     .opcode = read ? wr_opcode::rdma_read : wr_opcode::rdma_write,
                     .sg_list = std::span<const sge>(&sgs[i], 1),
                     .remote_addr = data->addr + (read ? off : 8 * MiB + off),
                     .rkey = data->rkey};
  }
  ASSERT_LE(n, qp->caps().max_send_wr);
  CVT_ASSERT_POST_OK(qp->post_send(wrs));
  std::vector<work_completion> wcs;
  ASSERT_TRUE(ok(wait_for(reader, 1, scaled(milliseconds(30000)), wcs)))
      << "no progress before the kill";
  child->kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(ok(wait_for(reader, n - 1, abort_bound(), wcs)))
      << "outstanding requests hung after the peer was killed";
  std::cout
      << "[   INFO   ] " << n << " requests done "
      << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count()
      << " ms after SIGKILL\n";
  std::size_t good = 0;
  // Kernel iWARP completes WRITEs locally, ahead of earlier READs (see check_aborted).
  std::function<bool(std::size_t)> is_read;
  if (!completion_means_placed(dev->attr())) {
    is_read = [](std::size_t i) { return i % 2 == 0; };
    ASSERT_TRUE(ok(drop_siw_repeated_flushes(wcs, reader, abort_bound())));
  }
  if (all_served_through_the_mapping(*qp, wcs, 60000)) {
    good = n;
    std::cout << "[   INFO   ] all " << n << " served through the mapping of the target's memory\n";
  } else {
    EXPECT_TRUE(ok(check_aborted(wcs, 60000, &good, is_read)));
    std::cout << "[   INFO   ] the first " << good << " succeeded\n";
  }
  // (The first 16 READs cover every offset.)
  for (std::size_t i = 0; i < good && i < 16; i += 2) {
    const std::size_t off = ((i / 2) % 8) * MiB;
    EXPECT_TRUE(ok(check_pattern(sink->bytes().subspan(off, MiB), s.region_seed, off)))
        << "READ " << i;
  }
  // The QP is dead for good.
  const auto deadline = std::chrono::steady_clock::now() + abort_bound();
  while (qp->state() != qp_state::error && std::chrono::steady_clock::now() < deadline) {
    reader.poll_once();
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(name(qp->state()), name(qp_state::error));
  EXPECT_EQ(name(qp->post_read(sink->sge(0, 64), data->slice(0, 64), 1)), name(errc::qp_in_error));
  auto st = child->wait_exit(scaled(milliseconds(10000)));
  ASSERT_TRUE(st.has_value()) << st.error();
  EXPECT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL) << child_process::describe_status(*st);
}

INSTANTIATE_TEST_SUITE_P(providers, peer_death, testing::ValuesIn(all_params()), param_name);
INSTANTIATE_TEST_SUITE_P(providers, peer_process, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
