// Memory registration through every span the API takes: fixed-extent spans,
// read-only (const) memory, and SGEs of slices longer than an SGE can say.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/pair.hpp"

namespace cvt {
namespace {

using conveyor::access;
using conveyor::errc;
using conveyor::wc_opcode;
using conveyor::wc_status;
using conveyor::work_completion;

class registration : public pair_test {};

TEST_P(registration, a_fixed_extent_span_registers_its_whole_extent) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  std::array<std::uint64_t, 8> words{};
  auto mr = init.pd.register_memory(std::span<std::uint64_t, 8>(words), access::local_write);
  CVT_ASSERT_OK(mr);
  EXPECT_EQ(mr->size(), sizeof words);
  EXPECT_EQ(mr->data(), reinterpret_cast<std::byte*>(words.data()));
}

// A const span is read-only memory: a peer may READ it, nothing may write it.
TEST_P(registration, read_only_memory_takes_remote_read_and_refuses_write_rights) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  static const std::array<std::byte, 4096> image = [] {
    std::array<std::byte, 4096> a{};
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::byte(i * 7 + 3);
    return a;
  }();
  for (access bad : {access::local_write, access::local_write | access::remote_write,
                     access::local_write | access::remote_atomic}) {
    auto r = tgt.pd.register_memory(std::span<const std::byte, 4096>(image), bad);
    ASSERT_FALSE(r.has_value()) << "const memory registered with write rights";
    EXPECT_EQ(name(r.error().code), name(errc::invalid_argument)) << r.error().to_string();
  }
  auto ro = tgt.pd.register_memory(std::span<const std::byte>(image), access::remote_read);
  CVT_ASSERT_OK(ro);
  EXPECT_EQ(ro->rights(), access::remote_read);
  auto sink = make_region(init.pd, image.size(), access::local_write, 0x4400);
  CVT_ASSERT_OK(sink);
  CVT_ASSERT_POST_OK(init.qp.post_read(sink->sge(0, image.size()), ro->remote(), 71));
  std::vector<work_completion> wc;
  ASSERT_TRUE(wait(init.send_reader(), 1, op_timeout(image.size()), wc));
  ASSERT_TRUE(ok(check_wc(wc[0], wc_status::success, wc_opcode::rdma_read, 71)));
  EXPECT_EQ(std::memcmp(sink->bytes().data(), image.data(), image.size()), 0)
      << "READ of read-only memory returned other bytes";
}

// An SGE's length is 32 bits: a slice longer than that saturates and the post
// is refused, instead of moving the low 32 bits' worth of bytes.
TEST_P(registration, a_slice_longer_than_an_sge_can_carry_is_refused_not_truncated) {
  ASSERT_NO_FATAL_FAILURE(connect_pair());
  auto src = make_region(init.pd, 4096, access::none, 0x4500);
  CVT_ASSERT_OK(src);
  const std::size_t huge = (std::size_t(1) << 32) + 16;  // would truncate to 16
  const conveyor::sge s = src->mr.slice(0, huge);
  EXPECT_EQ(s.length, 0xFFFFFFFFu);
  EXPECT_EQ(name(init.qp.post_write(s, peer.slice(0, 16), 72)), name(errc::invalid_argument));
  EXPECT_TRUE(expect_no_completion(init.send_reader(), std::chrono::milliseconds(100)));
  EXPECT_EQ(name(init.qp.state()), name(conveyor::qp_state::rts)) << "a refused post failed the QP";
}

INSTANTIATE_TEST_SUITE_P(providers, registration, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
