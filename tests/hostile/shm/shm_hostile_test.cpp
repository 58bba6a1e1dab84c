// Hostile peers against the shm provider's target. The target runs in a forked
// child (a crash must be observable: the child's exit status says it); this
// process is first a raw peer that performs the handshake of shm_cm.cpp, maps
// the segment and writes whatever it likes into slots and ring indices, then a
// legitimate Conveyor client that must be served right after.
//
// Each case asserts: the target is alive (exits 0 at the end, not by a
// signal), the guard bytes around its registered regions are untouched, the
// right error status (the target's refusal word in the segment) and QP state
// (reported by the child), and that a legitimate client is served after.
//
// The target child: shm_target_child.hpp. The Yama ptrace declaration:
// shm_ptrace_test.cpp.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include "providers/shm/engine/shm_qp.hpp"
#include "providers/shm/wire/segment.hpp"
#include "shm_target_child.hpp"

namespace {

using namespace cvt_shm_hostile;
namespace shm = conveyor::shm;

// ---------------------------------------------------------------- raw peer ----
// The initiator's side of the handshake, by hand, with a segment it controls.
class raw_peer {
 public:
  ~raw_peer() { close(); }

  // sealed=false: the segment memfd is created without seals (finding 1).
  ::testing::AssertionResult connect(const std::string& addr, bool sealed) {
    fd_ = ::memfd_create("raw-peer-seg", MFD_CLOEXEC | (sealed ? MFD_ALLOW_SEALING : 0));
    if (fd_ < 0 || ::ftruncate(fd_, static_cast<off_t>(shm::seg_size)) != 0)
      return ::testing::AssertionFailure() << "memfd";
    if (sealed && ::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
      return ::testing::AssertionFailure() << "seals";
    void* p = ::mmap(nullptr, shm::seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return ::testing::AssertionFailure() << "mmap";
    map_ = static_cast<std::byte*>(p);
    hdr_ = new (p) shm::seg_header();
    hdr_->magic = shm::seg_magic;
    hdr_->version = shm::seg_version;
    hdr_->slots = shm::ring_slots;
    hdr_->slot_bytes = shm::slot_size;
    view_ = {hdr_, map_, 0};

    sock_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, addr.data(), addr.size());
    sa.sun_path[0] = '\0';
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + addr.size());
    bool up = false;
    for (int i = 0; i < 500 && !up; ++i) {
      up = ::connect(sock_, reinterpret_cast<sockaddr*>(&sa), len) == 0;
      if (!up) std::this_thread::sleep_for(10ms);
    }
    if (!up) return ::testing::AssertionFailure() << "connect " << addr;
    timeval tv{10, 0};
    ::setsockopt(sock_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    shm::hs_msg req;
    req.kind = shm::hs_kind::request;
    req.ird = req.ord = 16;  // probe_addr 0: the target cannot reach us, it stages
    iovec iov{&req, sizeof req};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))]{};
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd_, sizeof(int));
    if (::sendmsg(sock_, &mh, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req))
      return ::testing::AssertionFailure() << "send request";
    shm::hs_msg rep;
    std::size_t got = 0;
    while (got < sizeof rep) {
      const ssize_t r = ::recv(sock_, reinterpret_cast<char*>(&rep) + got, sizeof rep - got, 0);
      if (r <= 0) return ::testing::AssertionFailure() << "no accept (connection closed)";
      got += static_cast<std::size_t>(r);
    }
    if (rep.kind != shm::hs_kind::accept)
      return ::testing::AssertionFailure() << "rejected: kind " << int(rep.kind);
    shm::hs_msg ready;
    ready.kind = shm::hs_kind::ready;
    if (::send(sock_, &ready, sizeof ready, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof ready))
      return ::testing::AssertionFailure() << "send ready";
    return ::testing::AssertionSuccess();
  }

  void bell() const {
    const char b = 1;
    [[maybe_unused]] auto r = ::send(sock_, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  shm::ring_ctl& req() const { return hdr_->req[0]; }    // ours, the target consumes it
  shm::ring_ctl& resp() const { return hdr_->resp[1]; }  // the target's responses to us
  std::byte* req_slot(std::uint64_t pos) const { return view_.slot(0, pos); }
  std::byte* resp_slot(std::uint64_t pos) const { return view_.slot(3, pos); }
  void put(std::uint64_t pos, const shm::msg_header& m, const void* payload = nullptr,
           std::size_t n = 0) const {
    std::memcpy(req_slot(pos), &m, sizeof m);
    if (n) std::memcpy(req_slot(pos) + shm::slot_header, payload, n);
  }
  int memfd() const { return fd_; }
  void drop_mapping() {
    if (map_) ::munmap(map_, shm::seg_size);
    map_ = nullptr;
  }
  // Waits (bounded) until pred() holds, ringing now and then.
  template <class F>
  bool wait_for(F pred, std::chrono::milliseconds t = 5s) const {
    const auto end = clk::now() + t;
    while (clk::now() < end) {
      if (pred()) return true;
      bell();
      std::this_thread::sleep_for(1ms);
    }
    return pred();
  }
  void close() {
    drop_mapping();
    if (sock_ >= 0) ::close(sock_);
    if (fd_ >= 0) ::close(fd_);
    sock_ = fd_ = -1;
  }

 private:
  int fd_ = -1, sock_ = -1;
  std::byte* map_ = nullptr;
  shm::seg_header* hdr_ = nullptr;
  shm::seg_view view_;
};

// --------------------------------------------------------- legitimate client ----
// WRITE, READ back and SEND through a real Conveyor QP: the target still serves.
::testing::AssertionResult legit_client(const std::string& addr, const ready_info& r) {
  auto dev = conveyor::device::open("shm:legit-" + std::to_string(::getpid()), {});
  if (!dev) return ::testing::AssertionFailure() << "device";
  auto pd = dev->alloc_pd();
  auto cq = dev->create_cq({.depth = 64});
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
  if (!qp) return ::testing::AssertionFailure() << "qp";
  std::vector<std::byte> src(8192), back(8192);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
  auto smr = pd->register_memory(src, access::local_write);
  auto bmr = pd->register_memory(back, access::local_write);
  auto info = conveyor::connect(*qp, addr, {.timeout = 10s});
  if (!info) return ::testing::AssertionFailure() << "connect: " << info.error().to_string();
  const conveyor::remote_region rr{r.addr + 4096, 8192, r.rkey};
  if (qp->post_write(smr->as_sge(), rr, 1) != errc::ok ||
      qp->post_read(bmr->as_sge(), rr, 2) != errc::ok ||
      qp->post_send_msg(smr->slice(0, 64), 3) != errc::ok)
    return ::testing::AssertionFailure() << "post";
  for (int k = 0; k < 3; ++k) {
    auto wc = cq->wait_one(10s);
    if (!wc) return ::testing::AssertionFailure() << "no completion " << k;
    if (wc->status != wc_status::success)
      return ::testing::AssertionFailure()
             << "wr " << wc->wr_id << " status " << static_cast<int>(wc->status);
  }
  if (back != src) return ::testing::AssertionFailure() << "READ returned other bytes";
  qp->disconnect();
  return ::testing::AssertionSuccess();
}

// The legitimate client's connection as the child saw it: its SEND arrived.
void expect_legit_served(target_child& t, const ready_info& r, int conn) {
  EXPECT_TRUE(legit_client(t.address(), r));
  const auto lines = t.until("canary");
  EXPECT_TRUE(contains(lines, "connected")) << joined(lines);
  EXPECT_TRUE(contains(lines, "wc " + std::to_string(100 + conn) + " 0 64"))
      << "the legitimate SEND: " << joined(lines);
  EXPECT_TRUE(contains(lines, "canary ok")) << joined(lines);
  const auto done = t.line();
  EXPECT_EQ(done.value_or("(none)"), "done");
}

// After a hostile peer: the target is alive, its canary region intact, and it
// still serves a legitimate client (its connection number 1).
void expect_target_survived(target_child& t, const ready_info& r) {
  const auto lines = t.until("canary");
  ASSERT_FALSE(lines.empty()) << "the target died: " << t.finish();
  EXPECT_TRUE(contains(lines, "canary ok")) << joined(lines);
  expect_legit_served(t, r, 1);
  EXPECT_EQ(t.finish(), "exit 0");
}

// ------------------------------------------------------------------- cases ----

// Finding 1: an unsealed segment is refused at the handshake. Before the fix
// the target mapped it, and a shrink (ftruncate) made its engine die of SIGBUS.
TEST(shm_hostile, unsealed_segment_is_refused_and_shrinking_cannot_kill_the_target) {
  target_child t(3);
  const auto r = parse_ready(t.line());
  ASSERT_TRUE(r) << "target setup";
  {
    raw_peer p;
    const auto c = p.connect(t.address(), /*sealed=*/false);
    if (c) {  // the target accepted an unsealed segment: shrink it under its feet
      p.drop_mapping();
      ASSERT_EQ(::ftruncate(p.memfd(), 0), 0);
      for (int i = 0; i < 50; ++i) {
        p.bell();
        std::this_thread::sleep_for(2ms);
      }
    }
    EXPECT_FALSE(c) << "the target accepted a segment without seals";
    const auto lines = t.until("canary");
    ASSERT_FALSE(lines.empty()) << "the target died: " << t.finish();
    // The listener's handshake thread refuses the segment (and logs why): accept()
    // sees no request from this peer at all and times out.
    EXPECT_TRUE(lines.front().rfind("accept-failed", 0) == 0 &&
                lines.front().find("timed out") != std::string::npos)
        << joined(lines);
    EXPECT_TRUE(contains(lines, "canary ok")) << joined(lines);
  }
  {
    // Sealed, the shrink itself is refused by the kernel.
    raw_peer p;
    ASSERT_TRUE(p.connect(t.address(), /*sealed=*/true));
    EXPECT_NE(::ftruncate(p.memfd(), 0), 0);
    p.close();
    const auto lines = t.until("canary");
    EXPECT_TRUE(contains(lines, "canary ok")) << joined(lines);
  }
  expect_legit_served(t, *r, 2);
  EXPECT_EQ(t.finish(), "exit 0");
}

// Finding 2: a staged READ blocks on a full response ring; the peer rewrites
// the request slot (a 16-byte READ at the region's end) before making room.
// The target must go on with the request it validated: before the fix it
// resumed with the stale progress offset on the rewritten slot and streamed
// bytes from past the region (the guard after it).
TEST(shm_hostile, read_resumed_after_a_full_response_ring_uses_the_validated_request) {
  target_child t(2);
  const auto r = parse_ready(t.line());
  ASSERT_TRUE(r) << "target setup";
  {
    raw_peer p;
    ASSERT_TRUE(p.connect(t.address(), true));
    ASSERT_EQ(t.line().value_or(""), "connected");
    shm::msg_header m{};
    m.op = shm::msg_op::read;
    m.flags = shm::msg_flag::first | shm::msg_flag::last;
    m.rkey = r->rkey;
    m.raddr = r->addr;
    m.total = region_len;
    p.put(0, m);
    p.req().head.store(1);
    std::uint64_t tail = 0, bytes = 0, leaked = 0, wrong = 0;
    bool last = false, rewritten = false;
    const auto end = clk::now() + 10s;
    while (!last && clk::now() < end) {
      if (!p.wait_for([&] { return p.resp().head.load() - tail == shm::ring_slots; }, 200ms) &&
          p.resp().head.load() == tail)
        continue;
      if (!rewritten) {  // the ring is full and the READ half done: change the request
        shm::msg_header x = m;
        x.raddr = r->addr + region_len - 16;
        x.total = 16;
        p.put(0, x);
        rewritten = true;
      }
      const std::uint64_t h = p.resp().head.load();
      for (; tail < h && !last; ++tail) {
        shm::msg_header rr;
        std::memcpy(&rr, p.resp_slot(tail), sizeof rr);
        const std::byte* d = p.resp_slot(tail) + shm::slot_header;
        const std::size_t n = std::min<std::size_t>(rr.len, shm::slot_payload);
        for (std::size_t i = 0; i < n; ++i) {
          if (d[i] == guard_byte && region_byte(rr.off + i) != guard_byte) ++leaked;
          if (d[i] != region_byte(rr.off + i)) ++wrong;
        }
        bytes += n;
        last = (rr.flags & shm::msg_flag::last) != 0;
      }
      p.resp().tail.store(tail);
      p.bell();
    }
    EXPECT_TRUE(rewritten) << "the response ring never filled";
    EXPECT_EQ(leaked, 0u) << "guard bytes from past the region reached the peer";
    EXPECT_EQ(wrong, 0u);
    EXPECT_TRUE(last);
    EXPECT_EQ(bytes, region_len) << "the READ the target validated, whole";
    EXPECT_TRUE(p.wait_for([&] { return p.req().tail.load() == 1; }));
    EXPECT_EQ(p.req().err_status.load(), 0u);
  }
  expect_target_survived(t, *r);
}

// IRD on shm: a peer that keeps more READs waiting for their responses than the
// IRD the handshake agreed (16 here) has the first one past it refused
// (rem_op_err at its position, as soft answers with a Terminate) instead of
// holding the target to whatever the ring can carry.
TEST(shm_hostile, reads_beyond_the_negotiated_ird_are_refused) {
  target_child t(2);
  const auto r = parse_ready(t.line());
  ASSERT_TRUE(r) << "target setup";
  {
    raw_peer p;
    ASSERT_TRUE(p.connect(t.address(), true));
    ASSERT_EQ(t.line().value_or(""), "connected");
    constexpr std::uint64_t ird = 16, n = 20;
    for (std::uint64_t k = 0; k < n; ++k) {
      shm::msg_header m{};
      m.op = shm::msg_op::read;
      m.flags = shm::msg_flag::first | shm::msg_flag::last;
      m.rkey = r->rkey;
      m.raddr = r->addr + 64 * k;
      m.total = 64;
      m.id = k;
      p.put(k, m);
    }
    p.req().head.store(n);  // and never consume a response
    ASSERT_TRUE(p.wait_for([&] { return p.req().err_status.load() != 0; }))
        << "the target answered " << p.resp().head.load() << " READs past its IRD";
    EXPECT_EQ(p.req().err_status.load(), static_cast<std::uint32_t>(wc_status::rem_op_err) + 1);
    EXPECT_EQ(p.req().err_pos.load(), ird) << "the first READ past the IRD is the one refused";
    EXPECT_EQ(p.resp().head.load(), ird) << "responses produced";
  }
  expect_target_survived(t, *r);
}

// Finding 6: a two-slot SEND whose last slot claims a 4 GiB total. Before the
// fix the receive completed with byte_len 4294967295 for a 4 KiB buffer; now
// the SEND is refused (rem_inv_req_err at the lying slot) and the QP fails.
TEST(shm_hostile, multi_slot_send_with_inconsistent_total_is_refused) {
  target_child t(2);
  const auto r = parse_ready(t.line());
  ASSERT_TRUE(r) << "target setup";
  {
    raw_peer p;
    ASSERT_TRUE(p.connect(t.address(), true));
    ASSERT_EQ(t.line().value_or(""), "connected");
    std::byte payload[100];
    std::memset(payload, 0x42, sizeof payload);
    shm::msg_header m{};
    m.op = shm::msg_op::send;
    m.flags = shm::msg_flag::first;
    m.len = 100;
    m.total = 100;
    p.put(0, m, payload, sizeof payload);
    m.flags = shm::msg_flag::last;
    m.len = 0;
    m.off = 100;
    m.total = 0xFFFFFFFFull;
    p.put(1, m);
    p.req().head.store(2);
    EXPECT_TRUE(
        p.wait_for([&] { return p.req().err_status.load() != 0 || p.req().tail.load() == 2; }));
    EXPECT_EQ(p.req().err_status.load(),
              static_cast<std::uint32_t>(wc_status::rem_inv_req_err) + 1);
    EXPECT_EQ(p.req().err_pos.load(), 1u);
    const auto lines = t.until("canary");
    ASSERT_FALSE(lines.empty()) << "the target died: " << t.finish();
    for (const auto& l : lines) EXPECT_NE(l, "wc 100 0 4294967295") << joined(lines);
    EXPECT_TRUE(contains(lines, "state error")) << joined(lines);
    EXPECT_TRUE(contains(lines, "canary ok")) << joined(lines);
    bool recv_failed = false;
    for (const auto& l : lines)
      recv_failed |= l.rfind("wc 100 ", 0) == 0 && l.rfind("wc 100 0 ", 0) != 0;
    EXPECT_TRUE(recv_failed) << "the receive completes in error: " << joined(lines);
  }
  expect_legit_served(t, *r, 1);
  EXPECT_EQ(t.finish(), "exit 0");
}

// Finding 2's rule for ring indices: a request head far past what was executed,
// and a response tail past what the target produced, are lies that fail the
// QP (rem_op_err in the refusal word), never a reason to touch memory.
TEST(shm_hostile, lying_ring_indices_fail_the_qp) {
  target_child t(3);
  const auto r = parse_ready(t.line());
  ASSERT_TRUE(r) << "target setup";
  const auto rem_op = static_cast<std::uint32_t>(wc_status::rem_op_err) + 1;
  {
    raw_peer p;
    ASSERT_TRUE(p.connect(t.address(), true));
    ASSERT_EQ(t.line().value_or(""), "connected");
    p.req().head.store(shm::ring_slots * 7 + 3);
    EXPECT_TRUE(p.wait_for([&] { return p.req().err_status.load() != 0; }));
    EXPECT_EQ(p.req().err_status.load(), rem_op);
    const auto lines = t.until("canary");
    ASSERT_FALSE(lines.empty()) << "the target died: " << t.finish();
    EXPECT_TRUE(contains(lines, "state error")) << joined(lines);
    EXPECT_TRUE(contains(lines, "canary ok")) << joined(lines);
  }
  {
    raw_peer p;
    ASSERT_TRUE(p.connect(t.address(), true));
    ASSERT_EQ(t.line().value_or(""), "connected");
    shm::msg_header m{};
    m.op = shm::msg_op::read;
    m.flags = shm::msg_flag::first | shm::msg_flag::last;
    m.rkey = r->rkey;
    m.raddr = r->addr;
    m.total = region_len;
    p.put(0, m);
    p.resp().tail.store(1u << 20);  // "consumed" a million responses never sent
    p.req().head.store(1);
    EXPECT_TRUE(p.wait_for([&] { return p.req().err_status.load() != 0; }));
    EXPECT_EQ(p.req().err_status.load(), rem_op);
    EXPECT_LE(p.resp().head.load(), shm::ring_slots) << "the target wrote no more than a ring";
    const auto lines = t.until("canary");
    ASSERT_FALSE(lines.empty()) << "the target died: " << t.finish();
    EXPECT_TRUE(contains(lines, "state error")) << joined(lines);
    EXPECT_TRUE(contains(lines, "canary ok")) << joined(lines);
  }
  expect_legit_served(t, *r, 2);
  EXPECT_EQ(t.finish(), "exit 0");
}

}  // namespace
