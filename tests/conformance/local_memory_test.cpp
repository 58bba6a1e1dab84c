// Local memory after it stops being a region: a receive or READ sink
// deregistered while its request is outstanding, and inline data copied from
// an SGE that no live region covers.
//
// A deregistered region is revoked at once: no byte lands in it afterwards
// (the memory may be freed and reused by then), the request completes with
// loc_prot_err, the QP goes to ERROR, and a fresh QP works as before. Each
// sink here is a registered sub-range of a larger buffer the test keeps alive,
// so a stray write shows as changed bytes (inside or around the old region)
// instead of a crash.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/caps.hpp"
#include "common/pair.hpp"

namespace cvt {
namespace {

using conveyor::access;
using conveyor::qp_state;
using conveyor::send_flags;
using conveyor::send_wr;
using conveyor::sge;
using conveyor::wc_opcode;
using conveyor::wc_status;
using conveyor::work_completion;
using conveyor::wr_opcode;
using std::chrono::milliseconds;

constexpr std::byte canary{0xC5};

// A buffer of guard + len + guard bytes, all canary, of which the middle
// `len` bytes are registered.
struct guarded_sink {
  static constexpr std::size_t guard = 4096;
  aligned_buffer buf;
  conveyor::memory_region mr;
  std::size_t len = 0;

  ~guarded_sink() { mr = conveyor::memory_region(); }  // before the buffer
  std::byte* sink() const noexcept { return buf.data() + guard; }
  sge whole() const noexcept { return mr.slice(0, len); }
};

testing::AssertionResult make_guarded(conveyor::protection_domain& pd, std::size_t len,
                                      guarded_sink& out) {
  out.len = len;
  out.buf = aligned_buffer(len + 2 * guarded_sink::guard);
  std::memset(out.buf.data(), static_cast<int>(canary), out.buf.capacity());
  auto mr = pd.register_memory(std::span<std::byte>(out.sink(), len), access::local_write);
  if (!mr) return testing::AssertionFailure() << mr.error().to_string();
  out.mr = std::move(*mr);
  return testing::AssertionSuccess();
}

// How many bytes of `b` differ from the canary (and the first one's offset).
std::string canary_damage(std::span<const std::byte> b) {
  std::size_t n = 0, first = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != canary && n++ == 0) first = i;
  if (n == 0) return {};
  return std::to_string(n) + " of " + std::to_string(b.size()) +
         " bytes were written, the first at offset " + std::to_string(first);
}

class local_memory : public pair_test {
 protected:
  // Skips the test (the caller returns when IsSkipped() or on the failure) unless the device
  // says it handles memory deregistered under an outstanding request
  // (device_attr::deregister_stops_outstanding: soft and shm promise it, and
  // these cases hold them to it). Elsewhere it is the application's error
  // (the verbs contract) and the kernel's providers answer it each their own
  // way (rxe: local QP operation error; siw: general error, the sender told
  // success, and a READ's response still lands in the pages the registration
  // had pinned), so there is no one behaviour to hold them to.
  void skip_unless_deregister_is_handled() {
    if (!device_attr_of(param().provider).deregister_stops_outstanding) {
      if (conveyor_peer(param().provider))
        FAIL() << "Conveyor's providers promise deregister_stops_outstanding";
      GTEST_SKIP() << "the device does not handle deregistering memory an outstanding request "
                      "uses (device_attr::deregister_stops_outstanding): the application's "
                      "error there";
    }
  }

  // After the failure: a new connection with new regions READs and SENDs as usual.
  void expect_fresh_pair_works() {
    reset_pair();
    ASSERT_NO_FATAL_FAILURE(connect_pair());
    auto sink = make_region(init.pd, 4096, access::local_write, 0x1f00);
    CVT_ASSERT_OK(sink);
    CVT_ASSERT_POST_OK(init.qp.post_read(sink->sge(0, 4096), peer.slice(0, 4096), 0xf1));
    std::vector<work_completion> wc;
    ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(4096), &wc));
    EXPECT_TRUE(ok(check_equal(sink->bytes(), tgt_main.bytes().first(4096))));
    auto rbuf = make_region(tgt.pd, 64, access::local_write, 0x1f01);
    CVT_ASSERT_OK(rbuf);
    CVT_ASSERT_POST_OK(tgt.qp.post_recv(rbuf->sge(0, 64), 0xf2));
    CVT_ASSERT_POST_OK(init.qp.post_send_msg(sync_src.sge(0, 64), 0xf3));
    ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(64)));
    std::vector<work_completion> tw;
    ASSERT_TRUE(wait_ok(tgt.recv_reader(), 1, op_timeout(64), &tw));
    EXPECT_TRUE(ok(check_wc(tw[0], wc_status::success, wc_opcode::recv, 0xf2)));
    EXPECT_TRUE(ok(check_equal(rbuf->bytes(), sync_src.bytes().first(64))));
  }
};

TEST_P(local_memory, receive_into_deregistered_region_writes_nothing_and_is_loc_prot_err) {
  skip_unless_deregister_is_handled();
  if (IsSkipped() || HasFatalFailure()) return;
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  guarded_sink s;
  ASSERT_TRUE(make_guarded(tgt.pd, 3000, s));
  CVT_ASSERT_POST_OK(tgt.qp.post_recv(s.whole(), 0x51));
  s.mr.deregister();

  auto src = make_region(init.pd, 3000, access::local_write, 0x5e00);
  CVT_ASSERT_OK(src);
  CVT_ASSERT_POST_OK(init.qp.post_send_msg(src->sge(0, 3000), 0x52));

  std::vector<work_completion> tw, iw;
  ASSERT_TRUE(wait(tgt.recv_reader(), 1, scaled(milliseconds(10000)), tw));
  EXPECT_TRUE(ok(check_wc(tw[0], wc_status::loc_prot_err, wc_opcode::recv, 0x51)));
  ASSERT_TRUE(wait(init.send_reader(), 1, scaled(milliseconds(10000)), iw));
  EXPECT_TRUE(ok(check_wc(iw[0], wc_status::rem_op_err, wc_opcode::send, 0x52)));
  const std::string damage = canary_damage(s.buf.all());
  EXPECT_TRUE(damage.empty()) << "the deregistered receive buffer: " << damage;
  EXPECT_TRUE(wait_state(tgt.qp, qp_state::error, scaled(milliseconds(5000))));
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(milliseconds(5000))));
  expect_fresh_pair_works();
}

TEST_P(local_memory, read_sink_deregistered_while_outstanding_gets_no_more_bytes) {
  // Large enough that the response is still streaming when the sink goes
  // (with manual progress nothing of it has been placed yet).
  constexpr std::size_t len = 64 * MiB;
  skip_unless_deregister_is_handled();
  if (IsSkipped() || HasFatalFailure()) return;
  pair_options o;
  o.tgt_region_size = len;
  ASSERT_NO_FATAL_FAILURE(connect_pair(o));
  guarded_sink s;
  ASSERT_TRUE(make_guarded(init.pd, len, s));
  CVT_ASSERT_POST_OK(init.qp.post_read(s.whole(), peer.slice(0, len), 0x61));
  s.mr.deregister();
  // What the sink holds once deregistration returned: nothing may change it.
  const std::vector<std::byte> at_dereg(s.buf.all().begin(), s.buf.all().end());

  std::vector<work_completion> iw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(len), iw));
  EXPECT_TRUE(ok(check_equal(s.buf.all(), at_dereg)))
      << "bytes landed in the READ's sink after its deregistration";
  EXPECT_TRUE(canary_damage(s.buf.all().first(guarded_sink::guard)).empty());
  EXPECT_TRUE(canary_damage(s.buf.all().last(guarded_sink::guard)).empty());
  if (iw[0].status == wc_status::success) {
    // Only if the whole response was placed before the deregistration began.
    EXPECT_TRUE(ok(check_equal(std::span<const std::byte>(s.sink(), len), tgt_main.bytes())));
    GTEST_SKIP() << "the READ completed before its sink was deregistered";
  }
  EXPECT_TRUE(ok(check_wc(iw[0], wc_status::loc_prot_err, wc_opcode::rdma_read, 0x61)));
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(milliseconds(5000))));
  expect_fresh_pair_works();
}

TEST_P(local_memory, write_source_deregistered_while_outstanding_sends_none_of_its_later_bytes) {
  // Large enough that the WRITE is still being gathered (soft) or served by
  // the peer (shm over cross-memory attach) when its source goes.
  constexpr std::size_t len = 64 * MiB;
  constexpr std::byte before{0x5A}, after{0xB7};
  skip_unless_deregister_is_handled();
  if (IsSkipped() || HasFatalFailure()) return;
  pair_options o;
  o.tgt_region_size = len;
  ASSERT_NO_FATAL_FAILURE(connect_pair(o));
  // The target's region holds its pattern (computed, not read: the target's
  // engine writes it from another thread).
  const std::vector<std::byte> tgt_before = make_pattern(len, o.tgt_region_seed);
  guarded_sink s;
  ASSERT_TRUE(make_guarded(init.pd, len, s));
  std::memset(s.sink(), static_cast<int>(before), len);
  CVT_ASSERT_POST_OK(init.qp.post_write(s.whole(), peer.slice(0, len), 0x62));
  s.mr.deregister();
  // The memory is reused at once: none of these bytes may reach the peer.
  std::memset(s.sink(), static_cast<int>(after), len);

  std::vector<work_completion> iw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(len), iw));
  // Read the target's memory only once its side is synchronised with this
  // thread: its QP in ERROR, or a SEND it received after the WRITE.
  if (iw[0].status != wc_status::success) {
    EXPECT_TRUE(ok(check_wc(iw[0], wc_status::loc_prot_err, wc_opcode::rdma_write, 0x62)));
    EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(milliseconds(5000))));
    ASSERT_TRUE(wait_state(tgt.qp, qp_state::error, scaled(milliseconds(5000))));
  } else {
    ASSERT_TRUE(sync_target(op_timeout(8)));
  }
  // Every target byte is its old value or the source's value before deregistration.
  const auto got = tgt_main.bytes();
  std::size_t leaked = 0, first = 0;
  for (std::size_t i = 0; i < len; ++i)
    if (got[i] != tgt_before[i] && got[i] != before && leaked++ == 0) first = i;
  EXPECT_EQ(leaked, 0u) << "bytes of the source written after its deregistration reached the "
                           "peer, the first at offset "
                        << first;
  if (iw[0].status == wc_status::success) {
    EXPECT_EQ(std::count(got.begin(), got.begin() + len, before), std::ptrdiff_t(len));
    GTEST_SKIP() << "the WRITE completed before its source was deregistered";
  }
  expect_fresh_pair_works();
}

class local_inline : public local_memory {
 protected:
  // Inline data from `s` (no live region covers it): refused, nothing sent.
  void expect_inline_refused(const sge& s) {
    // Devices that copy inline data without looking at the lkey (the verbs
    // contract) have no refusal to observe; the others promise one.
    if (!init.dev.attr().inline_checks_lkeys) {
      if (conveyor_peer(param().provider))
        FAIL() << "Conveyor's providers promise inline_checks_lkeys";
      GTEST_SKIP() << "the device does not check the lkey of inline data "
                      "(device_attr::inline_checks_lkeys)";
    }
    const std::vector<std::byte> main_before(tgt_main.bytes().begin(), tgt_main.bytes().end());
    CVT_ASSERT_POST_OK(
        init.qp.post_send(send_wr{.wr_id = 0x71,
                                  .opcode = wr_opcode::rdma_write,
                                  .flags = send_flags::signaled | send_flags::inline_data,
                                  .sg_list = std::span<const sge>(&s, 1),
                                  .remote_addr = peer.addr,
                                  .rkey = peer.rkey}));
    std::vector<work_completion> iw;
    ASSERT_TRUE(wait(init.send_reader(), 1, scaled(milliseconds(10000)), iw));
    EXPECT_TRUE(ok(check_wc(iw[0], wc_status::loc_prot_err, wc_opcode::rdma_write, 0x71)));
    EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(milliseconds(5000))));
    ASSERT_TRUE(sync_target_after_error());
    EXPECT_TRUE(ok(check_equal(tgt_main.bytes(), main_before)))
        << "inline bytes reached the target";
    expect_fresh_pair_works();
  }
  // The target saw whatever the failed QP sent before it closed.
  testing::AssertionResult sync_target_after_error() {
    return wait_state(tgt.qp, qp_state::error, scaled(milliseconds(5000)));
  }
};

TEST_P(local_inline, inline_data_from_a_deregistered_region_is_loc_prot_err) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto src = make_region(init.pd, 4096, access::local_write, 0x7100);
  CVT_ASSERT_OK(src);
  const sge s = src->sge(0, 64);
  src->mr.deregister();  // the buffer stays: a stray copy would send its bytes
  expect_inline_refused(s);
}

TEST_P(local_inline, inline_data_from_unregistered_memory_is_loc_prot_err) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  aligned_buffer plain(4096);
  std::memset(plain.data(), 0x3c, plain.size());
  // The address is real memory; the key names no region (0 is never a key).
  expect_inline_refused(sge{reinterpret_cast<std::uint64_t>(plain.data()), 64, 0});
}

// device_attr::registration_pins_pages false: the device reaches registered
// memory through its owner's mapping at each access, so pages given back with
// madvise(MADV_DONTNEED) and written again are what a peer's READ returns (the
// kv store releases its data pages on the strength of it). A device that pins
// the pages at registration keeps seeing the old ones: nothing to hold it to.
TEST_P(local_memory, pages_released_and_written_again_are_what_a_read_returns_unless_pinned) {
  if (device_attr_of(param().provider).registration_pins_pages)
    GTEST_SKIP() << "the device pins registered pages (device_attr::registration_pins_pages)";
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  constexpr std::size_t len = 4 * 4096;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  struct unmap_at_end {
    void* p;
    ~unmap_at_end() { ::munmap(p, len); }
  } unmap{p};  // declared before the region: the region goes first
  const std::span<std::byte> mem(static_cast<std::byte*>(p), len);
  std::memset(p, 0x11, len);
  auto mr = tgt.pd.register_memory(mem, access::local_write | access::remote_read);
  CVT_ASSERT_OK(mr);
  ASSERT_EQ(::madvise(p, len, MADV_DONTNEED), 0);
  std::memset(p, 0x22, len);
  auto sink = make_region(init.pd, len, access::local_write, 0x5a00);
  CVT_ASSERT_OK(sink);
  CVT_ASSERT_POST_OK(init.qp.post_read(sink->sge(0, len), mr->remote(), 0x5a));
  ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(len)));
  EXPECT_TRUE(ok(check_equal(sink->bytes(), mem)))
      << "a READ after the pages were released and written again";
}

INSTANTIATE_TEST_SUITE_P(providers, local_memory, testing::ValuesIn(all_params()), param_name);
INSTANTIATE_TEST_SUITE_P(providers, local_inline, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
