// Every opcode at every size, data verified byte for byte.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"

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

class opcodes : public pair_test {};

// Zero-length operations carry no SGE at all (verbs num_sge = 0).
std::span<const sge> sgl(const sge& s, std::size_t size) {
  return size == 0 ? std::span<const sge>() : std::span<const sge>(&s, 1);
}

std::uint64_t load_u64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// A 64-byte region for atomics: pattern `seed` with the 64-bit word at offset 8
// set to `value` (native byte order) before registration.
conveyor::result<test_region> make_atomic_region(conveyor::protection_domain& pd,
                                                 std::uint64_t seed, std::uint64_t value) {
  test_region r;
  r.buf = aligned_buffer(64);
  fill_pattern(r.buf.bytes(), seed);
  std::memcpy(r.buf.data() + 8, &value, 8);
  auto mr = pd.register_memory(r.buf.bytes(), all_rights);
  if (!mr) return std::unexpected(mr.error());
  r.mr = std::move(*mr);
  return r;
}

// Bytes of the atomic region other than the slot at offset 8 must keep their pattern.
std::string check_atomic_neighbours(const test_region& r, std::uint64_t seed) {
  if (auto e = check_pattern(r.bytes().first(8), seed); !e.empty())
    return "bytes before the slot: " + e;
  if (auto e = check_pattern(r.bytes().subspan(16), seed, 16); !e.empty())
    return "bytes after the slot: " + e;
  return {};
}

// --- SEND family --------------------------------------------------------------

TEST_P(opcodes, send_delivers_bytes_at_every_size) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  std::uint64_t id = 100;
  for (std::size_t size : k_sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    if (!size_fits(size)) continue;
    const std::uint64_t sseed = 0x1100 + size, dseed = 0x1200 + size;
    auto src = make_region(init.pd, size, access::local_write, sseed);
    CVT_ASSERT_OK(src);
    auto dst = make_region(tgt.pd, size + 64, access::local_write, dseed);
    CVT_ASSERT_OK(dst);
    ++id;
    CVT_ASSERT_POST_OK(tgt.qp.post_recv(dst->sge(0, size + 64), id));
    const sge s = src->sge(0, size);
    CVT_ASSERT_POST_OK(init.qp.post_send(
        send_wr{.wr_id = id, .opcode = wr_opcode::send, .sg_list = sgl(s, size)}));
    std::vector<work_completion> iw, tw;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(size), iw));
    EXPECT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::send, id)));
    ASSERT_TRUE(wait(tgt.recv_reader(), 1, op_timeout(size), tw));
    ASSERT_TRUE(ok(check_wc(tw[0], wc_status::success, wc_opcode::recv, id)));
    EXPECT_EQ(tw[0].byte_len, size);
    EXPECT_FALSE(tw[0].with_imm);
    EXPECT_FALSE(tw[0].with_inv);
    EXPECT_EQ(tw[0].qp_num, tgt.qp.qp_num());
    EXPECT_EQ(iw[0].qp_num, init.qp.qp_num());
    EXPECT_TRUE(ok(check_pattern(dst->bytes().first(size), sseed))) << "received payload";
    EXPECT_TRUE(ok(check_pattern(dst->bytes().subspan(size), dseed, size)))
        << "bytes past the message changed";
  }
}

TEST_P(opcodes, send_with_imm_delivers_bytes_and_immediate_at_every_size) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_IMMEDIATE();
  std::uint64_t id = 200;
  for (std::size_t size : k_sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    if (!size_fits(size)) continue;
    const std::uint64_t sseed = 0x2100 + size, dseed = 0x2200 + size;
    const std::uint32_t imm = 0xa5000000u ^ static_cast<std::uint32_t>(size * 7 + 1);
    auto src = make_region(init.pd, size, access::local_write, sseed);
    CVT_ASSERT_OK(src);
    auto dst = make_region(tgt.pd, size + 64, access::local_write, dseed);
    CVT_ASSERT_OK(dst);
    ++id;
    CVT_ASSERT_POST_OK(tgt.qp.post_recv(dst->sge(0, size + 64), id));
    const sge s = src->sge(0, size);
    CVT_ASSERT_POST_OK(init.qp.post_send(send_wr{.wr_id = id,
                                                 .opcode = wr_opcode::send_with_imm,
                                                 .sg_list = sgl(s, size),
                                                 .imm_data = imm}));
    std::vector<work_completion> iw, tw;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(size), iw));
    EXPECT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::send, id)));
    ASSERT_TRUE(wait(tgt.recv_reader(), 1, op_timeout(size), tw));
    ASSERT_TRUE(ok(check_wc(tw[0], wc_status::success, wc_opcode::recv, id)));
    EXPECT_EQ(tw[0].byte_len, size);
    EXPECT_TRUE(tw[0].with_imm);
    EXPECT_EQ(tw[0].imm_data, imm);
    EXPECT_TRUE(ok(check_pattern(dst->bytes().first(size), sseed))) << "received payload";
    EXPECT_TRUE(ok(check_pattern(dst->bytes().subspan(size), dseed, size)))
        << "bytes past the message changed";
  }
}

TEST_P(opcodes, send_with_inv_invalidates_the_target_rkey) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  if (!init.dev.attr().send_with_invalidate || !tgt.dev.attr().send_with_invalidate) {
    if (conveyor_peer(param().provider))
      FAIL() << "Conveyor's providers must support send_with_inv";
    GTEST_SKIP() << "send_with_invalidate unsupported by the device";
  }
  std::uint64_t id = 300;
  std::vector<test_region> victims;
  std::vector<std::uint64_t> victim_seeds;
  const std::uint64_t vseed = 0x3300;
  for (std::size_t size : k_sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    if (!size_fits(size)) continue;
    const std::uint64_t sseed = 0x3100 + size, dseed = 0x3200 + size;
    // Only a region registered invalidatable may be revoked by a peer.
    auto victim = make_region(tgt.pd, 4096,
                              access::local_write | access::remote_write | access::remote_read |
                                  access::remote_invalidate,
                              vseed + size);
    CVT_ASSERT_OK(victim);
    const std::uint32_t rkey = victim->mr.rkey();
    auto src = make_region(init.pd, size, access::local_write, sseed);
    CVT_ASSERT_OK(src);
    auto dst = make_region(tgt.pd, size + 64, access::local_write, dseed);
    CVT_ASSERT_OK(dst);
    ++id;
    CVT_ASSERT_POST_OK(tgt.qp.post_recv(dst->sge(0, size + 64), id));
    const sge s = src->sge(0, size);
    CVT_ASSERT_POST_OK(init.qp.post_send(send_wr{.wr_id = id,
                                                 .opcode = wr_opcode::send_with_inv,
                                                 .sg_list = sgl(s, size),
                                                 .invalidate_rkey = rkey}));
    std::vector<work_completion> iw, tw;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(size), iw));
    EXPECT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::send, id)));
    ASSERT_TRUE(wait(tgt.recv_reader(), 1, op_timeout(size), tw));
    ASSERT_TRUE(ok(check_wc(tw[0], wc_status::success, wc_opcode::recv, id)));
    EXPECT_EQ(tw[0].byte_len, size);
    EXPECT_TRUE(tw[0].with_inv);
    EXPECT_EQ(tw[0].invalidated_rkey, rkey);
    EXPECT_TRUE(ok(check_pattern(dst->bytes().first(size), sseed))) << "received payload";
    victims.push_back(std::move(*victim));
    victim_seeds.push_back(vseed + size);
  }
  ASSERT_FALSE(victims.empty());
  // The invalidated key is dead: a WRITE with it is a remote access error and
  // leaves the bytes alone.
  const test_region& v = victims.back();
  auto src = make_region(init.pd, 64, access::local_write, 0x3400);
  CVT_ASSERT_OK(src);
  CVT_ASSERT_POST_OK(init.qp.post_write(src->sge(0, 64), v.remote(0, 64), 399));
  std::vector<work_completion> iw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(64), iw));
  EXPECT_TRUE(ok(check_wc(iw[0], wc_status::rem_access_err, wc_opcode::rdma_write, 399)));
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(std::chrono::milliseconds(5000))));
  EXPECT_TRUE(ok(check_pattern(v.bytes(), victim_seeds.back())))
      << "memory behind an invalidated rkey changed";
}

// A region registered without access::remote_invalidate (a plain verbs MR)
// cannot be revoked by a peer, whatever remote rights it grants: the target
// refuses the Send with Invalidate (the sender's SEND completes with
// rem_access_err, the target's receive with rem_inv_req_err, both QPs fail)
// and the key keeps serving: another QP READs the region afterwards.
TEST_P(opcodes, send_with_inv_of_a_key_not_registered_invalidatable_is_refused_and_key_survives) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  if (!init.dev.attr().send_with_invalidate || !tgt.dev.attr().send_with_invalidate) {
    if (conveyor_peer(param().provider))
      FAIL() << "Conveyor's providers must support send_with_inv";
    GTEST_SKIP() << "send_with_invalidate unsupported by the device";
  }
  // The published main region grants every remote right, not remote_invalidate.
  ASSERT_FALSE(conveyor::has(tgt_main.mr.rights(), access::remote_invalidate));
  auto src = make_region(init.pd, 64, access::local_write, 0x3500);
  CVT_ASSERT_OK(src);
  auto dst = make_region(tgt.pd, 128, access::local_write, 0x3501);
  CVT_ASSERT_OK(dst);
  CVT_ASSERT_POST_OK(tgt.qp.post_recv(dst->sge(0, 128), 351));
  const sge s = src->sge(0, 64);
  CVT_ASSERT_POST_OK(init.qp.post_send(send_wr{.wr_id = 352,
                                               .opcode = wr_opcode::send_with_inv,
                                               .sg_list = sgl(s, 64),
                                               .invalidate_rkey = peer.rkey}));
  std::vector<work_completion> iw, tw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(64), iw));
  EXPECT_TRUE(ok(check_wc(iw[0], wc_status::rem_access_err, wc_opcode::send, 352)));
  ASSERT_TRUE(wait(tgt.recv_reader(), 1, op_timeout(64), tw));
  EXPECT_EQ(tw[0].wr_id, 351u);
  EXPECT_EQ(tw[0].status, wc_status::rem_inv_req_err);
  EXPECT_FALSE(tw[0].with_inv);
  EXPECT_TRUE(wait_state(init.qp, qp_state::error, scaled(std::chrono::milliseconds(5000))));

  // A second connection to the same protection domain READs the region with
  // the same rkey.
  auto lis = conveyor::listener::bind(tgt.dev);
  CVT_ASSERT_OK(lis);
  auto tqp2 = tgt.pd.create_qp({.send_cq = &tgt.scq, .recv_cq = &tgt.scq});
  CVT_ASSERT_OK(tqp2);
  auto iqp2 = init.pd.create_qp({.send_cq = &init.scq, .recv_cq = &init.scq});
  CVT_ASSERT_OK(iqp2);
  const auto timeout = scaled(std::chrono::milliseconds(10000));
  std::string accept_err;
  std::thread acceptor([&] {
    auto req = lis->accept(timeout);
    if (!req) {
      accept_err = req.error().to_string();
      return;
    }
    if (auto r = req->accept(*tqp2); !r) accept_err = r.error().to_string();
  });
  auto info = conveyor::connect(*iqp2, lis->address(), {.timeout = timeout});
  acceptor.join();
  CVT_ASSERT_OK(info);
  ASSERT_EQ(accept_err, "");
  auto sink = make_region(init.pd, 4096, access::local_write, 0x3502);
  CVT_ASSERT_OK(sink);
  CVT_ASSERT_POST_OK(iqp2->post_read(sink->sge(0, 4096), peer.slice(0, 4096), 353));
  std::vector<work_completion> rw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(4096), rw));
  EXPECT_TRUE(ok(check_wc(rw[0], wc_status::success, wc_opcode::rdma_read, 353)))
      << "the key was revoked by a peer although it was not registered invalidatable";
  EXPECT_TRUE(ok(check_pattern(sink->bytes(), opts_.tgt_region_seed))) << "READ data";
}

// --- RDMA WRITE ---------------------------------------------------------------

TEST_P(opcodes, rdma_write_places_bytes_at_every_size) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  std::uint64_t id = 400;
  for (std::size_t size : k_sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    if (!size_fits(size)) continue;
    const std::uint64_t sseed = 0x4100 + size, dseed = 0x4200 + size;
    auto src = make_region(init.pd, size, access::local_write, sseed);
    CVT_ASSERT_OK(src);
    auto dst = make_region(tgt.pd, size + 64, all_rights, dseed);
    CVT_ASSERT_OK(dst);
    ++id;
    const sge s = src->sge(0, size);
    const auto r = dst->remote(0, size);
    CVT_ASSERT_POST_OK(init.qp.post_send(send_wr{.wr_id = id,
                                                 .opcode = wr_opcode::rdma_write,
                                                 .sg_list = sgl(s, size),
                                                 .remote_addr = r.addr,
                                                 .rkey = r.rkey}));
    std::vector<work_completion> iw;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(size), iw));
    ASSERT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::rdma_write, id)));
    ASSERT_TRUE(sync_target(op_timeout(size)));
    EXPECT_TRUE(ok(check_pattern(dst->bytes().first(size), sseed))) << "written bytes";
    EXPECT_TRUE(ok(check_pattern(dst->bytes().subspan(size), dseed, size)))
        << "bytes past the write changed";
  }
}

TEST_P(opcodes, rdma_write_with_imm_consumes_a_recv_and_carries_imm_at_every_size) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_IMMEDIATE();
  auto imm_sink = make_region(tgt.pd, 64, access::local_write, 0x5000);
  CVT_ASSERT_OK(imm_sink);
  std::uint64_t id = 500;
  for (std::size_t size : k_sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    if (!size_fits(size)) continue;
    const std::uint64_t sseed = 0x5100 + size, dseed = 0x5200 + size;
    const std::uint32_t imm = 0x5a000000u ^ static_cast<std::uint32_t>(size * 3 + 5);
    auto src = make_region(init.pd, size, access::local_write, sseed);
    CVT_ASSERT_OK(src);
    auto dst = make_region(tgt.pd, size + 64, all_rights, dseed);
    CVT_ASSERT_OK(dst);
    const std::uint64_t recv_a = ++id, recv_b = ++id, wid = ++id;
    CVT_ASSERT_POST_OK(tgt.qp.post_recv(imm_sink->sge(0, 64), recv_a));
    CVT_ASSERT_POST_OK(tgt.qp.post_recv(sync_sink.sge(0, 64), recv_b));
    const sge s = src->sge(0, size);
    const auto r = dst->remote(0, size);
    CVT_ASSERT_POST_OK(init.qp.post_send(send_wr{.wr_id = wid,
                                                 .opcode = wr_opcode::rdma_write_with_imm,
                                                 .sg_list = sgl(s, size),
                                                 .remote_addr = r.addr,
                                                 .rkey = r.rkey,
                                                 .imm_data = imm}));
    std::vector<work_completion> iw, tw;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(size), iw));
    EXPECT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::rdma_write, wid)));
    ASSERT_TRUE(wait(tgt.recv_reader(), 1, op_timeout(size), tw));
    // The first posted receive is consumed; its completion makes the data visible.
    ASSERT_TRUE(ok(check_wc(tw[0], wc_status::success, wc_opcode::recv_rdma_with_imm, recv_a)));
    EXPECT_TRUE(tw[0].with_imm);
    EXPECT_EQ(tw[0].imm_data, imm);
    EXPECT_EQ(tw[0].byte_len, size)
        << "verbs: byte_len of a WRITE_WITH_IMM receive is the written length";
    EXPECT_TRUE(ok(check_pattern(dst->bytes().first(size), sseed))) << "written bytes";
    EXPECT_TRUE(ok(check_pattern(dst->bytes().subspan(size), dseed, size)))
        << "bytes past the write changed";
    // The next SEND lands in the second receive: exactly one was consumed.
    const std::uint64_t sid = ++id;
    CVT_ASSERT_POST_OK(init.qp.post_send_msg(sync_src.sge(0, 8), sid));
    tw.clear();
    iw.clear();
    ASSERT_TRUE(wait(tgt.recv_reader(), 1, op_timeout(8), tw));
    EXPECT_TRUE(ok(check_wc(tw[0], wc_status::success, wc_opcode::recv, recv_b)));
    EXPECT_EQ(tw[0].byte_len, 8u);
    ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(8), &iw));
  }
}

// --- RDMA READ ----------------------------------------------------------------

TEST_P(opcodes, rdma_read_fetches_bytes_at_every_size) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  std::uint64_t id = 600;
  for (std::size_t size : k_sizes) {
    SCOPED_TRACE("size " + std::to_string(size));
    if (!size_fits(size)) continue;
    const std::uint64_t tseed = 0x6100 + size, sseed = 0x6200 + size;
    auto remote = make_region(tgt.pd, size, all_rights, tseed);
    CVT_ASSERT_OK(remote);
    auto sink = make_region(init.pd, size + 64, access::local_write, sseed);
    CVT_ASSERT_OK(sink);
    ++id;
    const sge s = sink->sge(0, size);
    const auto r = remote->remote(0, size);
    CVT_ASSERT_POST_OK(init.qp.post_send(send_wr{.wr_id = id,
                                                 .opcode = wr_opcode::rdma_read,
                                                 .sg_list = sgl(s, size),
                                                 .remote_addr = r.addr,
                                                 .rkey = r.rkey}));
    std::vector<work_completion> iw;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(size), iw));
    ASSERT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::rdma_read, id)));
    EXPECT_EQ(iw[0].byte_len, size);
    EXPECT_TRUE(ok(check_pattern(sink->bytes().first(size), tseed))) << "read bytes";
    EXPECT_TRUE(ok(check_pattern(sink->bytes().subspan(size), sseed, size)))
        << "bytes past the sink changed";
  }
}

TEST_P(opcodes, rdma_read_at_unaligned_offsets_fetches_the_right_bytes) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  // tgt_main holds pattern tgt_region_seed; read odd slices of it into odd offsets.
  auto sink = make_region(init.pd, 64 * KiB, access::local_write, 0x6300);
  CVT_ASSERT_OK(sink);
  struct slice_case {
    std::size_t remote_off, local_off, len;
  };
  const slice_case cases[] = {{1, 3, 1}, {13, 7, 4093}, {4095, 4097, 8191}, {65535, 1, 40000}};
  std::uint64_t id = 650;
  for (const auto& c : cases) {
    SCOPED_TRACE("remote offset " + std::to_string(c.remote_off) + " len " + std::to_string(c.len));
    ++id;
    CVT_ASSERT_POST_OK(
        init.qp.post_read(sink->sge(c.local_off, c.len), peer.slice(c.remote_off, c.len), id));
    std::vector<work_completion> iw;
    ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(c.len), iw));
    ASSERT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::rdma_read, id)));
    EXPECT_TRUE(ok(check_pattern(sink->bytes().subspan(c.local_off, c.len), opts_.tgt_region_seed,
                                 c.remote_off)));
  }
}

// --- Atomics (RFC 7306) -------------------------------------------------------

TEST_P(opcodes, atomic_cmp_and_swp_swaps_when_the_compare_matches) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_ATOMICS();
  const std::uint64_t initial = 0x0123456789abcdefULL, swap = 0xfedcba9876543210ULL;
  auto target = make_atomic_region(tgt.pd, 0x7100, initial);
  CVT_ASSERT_OK(target);
  auto result = make_region(init.pd, 64, access::local_write, 0x7200);
  CVT_ASSERT_OK(result);
  CVT_ASSERT_POST_OK(
      init.qp.post_cmp_swap(result->sge(8, 8), target->remote(8, 8), initial, swap, 701));
  std::vector<work_completion> iw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(8), iw));
  ASSERT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::comp_swap, 701)));
  EXPECT_EQ(load_u64(result->data() + 8), initial) << "CAS must return the original value";
  EXPECT_TRUE(ok(check_pattern(result->bytes().first(8), 0x7200)))
      << "result bytes outside the 8-byte sink";
  EXPECT_TRUE(ok(check_pattern(result->bytes().subspan(16), 0x7200, 16)));
  ASSERT_TRUE(sync_target(op_timeout(8)));
  EXPECT_EQ(load_u64(target->data() + 8), swap) << "the target word was not swapped";
  EXPECT_TRUE(ok(check_atomic_neighbours(*target, 0x7100)));
}

TEST_P(opcodes, atomic_cmp_and_swp_leaves_the_value_when_the_compare_differs) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_ATOMICS();
  const std::uint64_t initial = 0x1111222233334444ULL;
  auto target = make_atomic_region(tgt.pd, 0x7300, initial);
  CVT_ASSERT_OK(target);
  auto result = make_region(init.pd, 64, access::local_write, 0x7400);
  CVT_ASSERT_OK(result);
  CVT_ASSERT_POST_OK(init.qp.post_cmp_swap(result->sge(0, 8), target->remote(8, 8), initial ^ 1,
                                           0xdeadbeefULL, 702));
  std::vector<work_completion> iw;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(8), iw));
  ASSERT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::comp_swap, 702)));
  EXPECT_EQ(load_u64(result->data()), initial) << "a failed CAS must return the current value";
  ASSERT_TRUE(sync_target(op_timeout(8)));
  EXPECT_EQ(load_u64(target->data() + 8), initial) << "a failed CAS changed the target";
  EXPECT_TRUE(ok(check_atomic_neighbours(*target, 0x7300)));
}

TEST_P(opcodes, atomic_fetch_and_add_returns_the_old_value_and_adds_with_wraparound) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  CVT_REQUIRE_ATOMICS();
  const std::uint64_t initial = 0xfffffffffffffff0ULL, add1 = 0x21, add2 = 0x100000001ULL;
  auto target = make_atomic_region(tgt.pd, 0x7500, initial);
  CVT_ASSERT_OK(target);
  auto result = make_region(init.pd, 64, access::local_write, 0x7600);
  CVT_ASSERT_OK(result);
  CVT_ASSERT_POST_OK(init.qp.post_fetch_add(result->sge(0, 8), target->remote(8, 8), add1, 703));
  CVT_ASSERT_POST_OK(init.qp.post_fetch_add(result->sge(8, 8), target->remote(8, 8), add2, 704));
  std::vector<work_completion> iw;
  ASSERT_TRUE(wait(init.send_reader(), 2, op_timeout(8), iw));
  EXPECT_TRUE(ok(check_wc(iw[0], wc_status::success, wc_opcode::fetch_add, 703)));
  EXPECT_TRUE(ok(check_wc(iw[1], wc_status::success, wc_opcode::fetch_add, 704)));
  EXPECT_EQ(load_u64(result->data()), initial);
  EXPECT_EQ(load_u64(result->data() + 8), initial + add1);
  ASSERT_TRUE(sync_target(op_timeout(8)));
  EXPECT_EQ(load_u64(target->data() + 8), initial + add1 + add2);
  EXPECT_TRUE(ok(check_atomic_neighbours(*target, 0x7500)));
}

INSTANTIATE_TEST_SUITE_P(providers, opcodes, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
