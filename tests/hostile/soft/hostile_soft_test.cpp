// Hostile peers against the soft provider (and the shm cases of the same
// findings): scripted raw peers speak MPA/DDP/RDMAP over TCP and lie in it.
// Every case checks that the target survives, that no byte of its memory
// outside the regions the peer was entitled to changed (canary gaps around
// every region), that the peer got the right Terminate (or error status), and
// that a legitimate client is served right after on the same device.
#include "protocol/raw_peer.hpp"

#include <conveyor/conveyor.hpp>

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <future>
#include <optional>
#include <thread>

using namespace conveyor;
using namespace conveyor::wire;
using namespace std::chrono_literals;
using cvp::raw_peer;

namespace {

constexpr std::byte canary{0xC5};
constexpr std::size_t gap = 4096;

// One allocation holding every region, each with a canary gap before and after.
struct arena {
  std::vector<std::byte> mem;
  std::size_t used = gap;
  explicit arena(std::size_t size) : mem(size, canary) {}
  std::span<std::byte> carve(std::size_t len) {
    auto s = std::span(mem).subspan(used, len);
    used += len + gap;
    return s;
  }
  // True if every byte outside `allowed` still holds the canary.
  bool untouched_except(std::initializer_list<std::span<std::byte>> allowed) const {
    for (std::size_t i = 0; i < mem.size(); ++i) {
      bool inside = false;
      for (auto s : allowed)
        if (mem.data() + i >= s.data() && mem.data() + i < s.data() + s.size()) inside = true;
      if (!inside && mem[i] != canary) {
        ADD_FAILURE() << "byte " << i << " outside the entitled regions changed";
        return false;
      }
    }
    return true;
  }
};

// A target: QP on PD A; regions: `a` (every right, PD A, not remotely
// invalidatable: a plain verbs MR), `inv` (every right and remote_invalidate,
// PD A), `local` (local write only, PD A), `b` (every right and
// remote_invalidate, PD B).
struct target {
  device dev;
  protection_domain pd_a, pd_b;
  completion_queue cq;
  queue_pair qp;
  arena mem{12 * 1024 * 1024};
  std::span<std::byte> a_buf, local_buf, b_buf, recv_buf, inv_buf;
  memory_region a, local, b, recv, inv;
  listener lis;

  explicit target(std::string_view provider = "soft", std::uint32_t max_dest_rd_atomic = 16) {
    device_options o;
    o.software.request_crc = false;
    dev = device::open(provider, o).value();
    pd_a = dev.alloc_pd().value();
    pd_b = dev.alloc_pd().value();
    cq = dev.create_cq({.depth = 1024}).value();
    qp = pd_a.create_qp({.send_cq = &cq, .recv_cq = &cq, .max_dest_rd_atomic = max_dest_rd_atomic})
             .value();
    const conveyor::access all = conveyor::access::local_write | conveyor::access::remote_write |
                                 conveyor::access::remote_read | conveyor::access::remote_atomic;
    a_buf = mem.carve(8 * 1024 * 1024);
    local_buf = mem.carve(64 * 1024);
    b_buf = mem.carve(64 * 1024);
    recv_buf = mem.carve(4096);
    inv_buf = mem.carve(64 * 1024);
    a = pd_a.register_memory(a_buf, all).value();
    local = pd_a.register_memory(local_buf, conveyor::access::local_write).value();
    b = pd_b.register_memory(b_buf, all | conveyor::access::remote_invalidate).value();
    inv = pd_a.register_memory(inv_buf, all | conveyor::access::remote_invalidate).value();
    recv = pd_a.register_memory(recv_buf, conveyor::access::local_write).value();
    lis = listener::bind(dev).value();  // an ephemeral address in the provider's syntax
    addr = lis.address();
  }
  std::string addr;
  std::future<result<connection_info>> accept_async(queue_pair& q) {
    return std::async(std::launch::async, [this, &q] {
      auto req = lis.accept(5s);
      if (!req) return result<connection_info>(std::unexpected(req.error()));
      return req->accept(q, {});
    });
  }
  bool wait_error() {
    for (int i = 0; i < 500 && qp.state() != qp_state::error; ++i)
      std::this_thread::sleep_for(10ms);
    return qp.state() == qp_state::error;
  }
};

// A legitimate Conveyor client connects to a fresh QP of `pd` on the target
// and WRITEs then READs back `region` (a remote right region of that PD).
void legit_client_is_served(target& t, protection_domain& pd, const memory_region& region,
                            std::string_view provider = "soft") {
  queue_pair tq = pd.create_qp({.send_cq = &t.cq, .recv_cq = &t.cq}).value();
  auto fut = t.accept_async(tq);
  device cdev = device::open(provider).value();
  auto cpd = cdev.alloc_pd().value();
  auto ccq = cdev.create_cq({.depth = 64}).value();
  auto cqp = cpd.create_qp({.send_cq = &ccq, .recv_cq = &ccq}).value();
  std::vector<std::byte> out(256), in(256);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::byte(i * 7 + 1);
  auto mo = cpd.register_memory(std::span(out), conveyor::access::local_write).value();
  auto mi = cpd.register_memory(std::span(in), conveyor::access::local_write).value();
  auto info = conveyor::connect(cqp, t.addr, {});
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  ASSERT_TRUE(fut.get().has_value());
  const remote_region r = region.remote().slice(128, 256);
  ASSERT_EQ(cqp.post_write(mo.as_sge(), r, 1), errc::ok);
  auto w1 = ccq.wait_one(5s);
  ASSERT_TRUE(w1.has_value());
  EXPECT_EQ(w1->status, wc_status::success);
  ASSERT_EQ(cqp.post_read(mi.as_sge(), r, 2), errc::ok);
  auto w2 = ccq.wait_one(5s);
  ASSERT_TRUE(w2.has_value());
  EXPECT_EQ(w2->status, wc_status::success);
  EXPECT_EQ(in, out) << "the legitimate client's READ did not return its WRITE";
}

// Connects a raw peer (MPA v2, Write RTR; `ext` offers RFC 7306) to t.qp.
raw_peer connect_raw(target& t, std::future<result<connection_info>>& fut, std::uint16_t ord = 4,
                     bool ext = false, int rcvbuf = 0, mpa_frame* reply = nullptr,
                     bool send_rtr = true) {
  fut = t.accept_async(t.qp);
  raw_peer p = raw_peer::connect_to(t.lis.port(), rcvbuf);
  mpa_frame f;
  f.flags = ext ? mpa_flag::ext_offer : 0;
  f.revision = 2;
  f.v2 = mpa_v2_words{4, ord, true, false, true, false};
  if (!p.send_all(encode_mpa(f))) return raw_peer(-1);
  auto rep = p.read_mpa(true);
  if (!rep) return raw_peer(-1);
  if (reply) *reply = *rep;
  p.set_crc(rep->crc());
  if (!send_rtr) return p;
  std::vector<std::byte> rtr(fpdu_size(ddp::tagged_hdr));
  write_tagged_header(rtr.data(), rdmap_op::write, true, 1, 0, 0);
  finish_fpdu(rtr, p.crc());
  p.send_all(rtr);
  return p;
}

// True if the socket has a byte to read (or EOF) within `t`.
bool readable_within(const raw_peer& p, std::chrono::milliseconds t) {
  pollfd f{p.fd(), POLLIN, 0};
  return ::poll(&f, 1, static_cast<int>(t.count())) == 1;
}

std::optional<terminate_msg> read_until_terminate(raw_peer& p) {
  for (int i = 0; i < 1000000; ++i) {
    auto f = p.read_fpdu();
    if (!f) return std::nullopt;
    auto h = parse_fpdu_header(*f);
    if (!h) return std::nullopt;
    if (h->opcode == rdmap_op::terminate)
      if (auto t = decode_terminate(
              std::span(*f).subspan(untagged_header_size, h->header_len - untagged_header_size)))
        return *t;
  }
  return std::nullopt;
}

std::uint64_t addr_of(std::span<std::byte> s) {
  return reinterpret_cast<std::uint64_t>(s.data());
}

// The raw peer sends one Send with Invalidate naming `key` into the posted receive.
std::optional<terminate_msg> send_with_invalidate(target& t, raw_peer& p, std::uint32_t key) {
  EXPECT_EQ(t.qp.post_recv(t.recv.slice(0, 64), 77), errc::ok);
  const std::string s = "invalidate this";
  auto payload = std::as_bytes(std::span(s.data(), s.size()));
  EXPECT_TRUE(
      p.send_all(encode_untagged(rdmap_op::send_inv, true, qn::send, 1, 0, key, payload, p.crc())));
  return read_until_terminate(p);
}

}  // namespace

// ---- accept() does not wait for the RTR --------------------------------------

// accept() returns once the Reply is out, before the initiator's RTR (as
// rdma_accept): the QP is RTS and takes work, but sends nothing until the RTR
// has arrived (RFC 6581); then the queued SEND goes out, and the connection
// works both ways.
TEST(soft_accept, work_posted_before_the_rtr_waits_for_it) {
  target t;
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw(t, fut, 4, false, 0, nullptr, /*send_rtr=*/false);
  ASSERT_GE(p.fd(), 0);
  ASSERT_EQ(fut.wait_for(5s), std::future_status::ready) << "accept() waited for the RTR";
  auto info = fut.get();
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  EXPECT_EQ(t.qp.state(), qp_state::rts);
  ASSERT_EQ(t.qp.post_send_msg(t.a.slice(0, 16), 9), errc::ok);
  EXPECT_FALSE(readable_within(p, 300ms)) << "the target sent before the initiator's RTR";
  std::vector<std::byte> rtr(fpdu_size(ddp::tagged_hdr));
  write_tagged_header(rtr.data(), rdmap_op::write, true, 1, 0, 0);
  finish_fpdu(rtr, p.crc());
  ASSERT_TRUE(p.send_all(rtr));
  auto f = p.read_fpdu();
  ASSERT_TRUE(f.has_value()) << "the queued SEND never came";
  auto h = parse_fpdu_header(*f);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, rdmap_op::send);
  EXPECT_EQ(h->payload_len, 16u);
  // And the other way: a WRITE from the peer lands (seen once the SEND after
  // it completes: RDMA places the WRITE first).
  ASSERT_EQ(t.qp.post_recv(t.recv.slice(0, 64), 78), errc::ok);
  std::vector<std::byte> data(16, std::byte{0x7E});
  ASSERT_TRUE(p.send_all(
      encode_tagged(rdmap_op::write, true, t.a.rkey(), addr_of(t.a_buf) + 64, data, p.crc())));
  ASSERT_TRUE(p.send_all(encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, data, p.crc())));
  std::optional<work_completion> recv;
  for (int i = 0; i < 10 && !recv; ++i)
    if (auto wc = t.cq.wait_one(1s); wc && wc->wr_id == 78) recv = *wc;
  ASSERT_TRUE(recv.has_value()) << "the peer's SEND after its WRITE did not arrive";
  EXPECT_EQ(recv->status, wc_status::success);
  EXPECT_EQ(t.a_buf[64], std::byte{0x7E});
  EXPECT_EQ(t.qp.state(), qp_state::rts);
}

// A peer whose RTR is not one: the accepted QP fails, its queued work is
// flushed and the socket is closed.
TEST(soft_accept, a_bad_rtr_fails_the_accepted_qp_and_flushes_its_work) {
  target t;
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw(t, fut, 4, false, 0, nullptr, /*send_rtr=*/false);
  ASSERT_GE(p.fd(), 0);
  ASSERT_TRUE(fut.get().has_value());
  ASSERT_EQ(t.qp.post_send_msg(t.a.slice(0, 16), 9), errc::ok);
  // A SEND where the zero-length Write RTR belongs.
  const std::string s = "not an RTR";
  ASSERT_TRUE(p.send_all(encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0,
                                         std::as_bytes(std::span(s.data(), s.size())), p.crc())));
  auto wc = t.cq.wait_one(5s);
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 9u);
  EXPECT_EQ(wc->status, wc_status::wr_flush_err);
  EXPECT_TRUE(t.wait_error());
  EXPECT_TRUE(p.sees_eof(5s)) << "the target kept the connection";
  EXPECT_TRUE(t.mem.untouched_except({}));
  legit_client_is_served(t, t.pd_a, t.a);
}

// ---- finding 3: Send with Invalidate -----------------------------------------

// A raw peer's Send with Invalidate naming `key`, which the target may not
// invalidate: a Terminate (RDMAP remote protection, cannot invalidate), the
// receive completes with rem_inv_req_err and no invalidation, the QP ends in
// ERROR, and nothing but the receive buffer was written.
namespace {
void expect_invalidate_refused(target& t, std::uint32_t key) {
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw(t, fut);
  ASSERT_GE(p.fd(), 0);
  ASSERT_TRUE(fut.get().has_value());
  auto term = send_with_invalidate(t, p, key);
  ASSERT_TRUE(term.has_value()) << "no Terminate";
  EXPECT_EQ(term->layer, term_layer::rdmap);
  EXPECT_EQ(term->etype, term::rdmap_remote_prot);
  EXPECT_EQ(term->ecode, term::rdmap_cannot_invalidate);
  auto wc = t.cq.wait_one(5s);
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->wr_id, 77u);
  EXPECT_EQ(wc->status, wc_status::rem_inv_req_err);
  EXPECT_FALSE(wc->with_inv);
  EXPECT_TRUE(t.wait_error());
  EXPECT_TRUE(t.mem.untouched_except({t.recv_buf}));
}
}  // namespace

TEST(soft_send_invalidate, a_key_of_another_protection_domain_is_refused_and_survives) {
  target t;
  ASSERT_NO_FATAL_FAILURE(expect_invalidate_refused(t, t.b.rkey()));
  // PD B's region still works for a client of PD B, and PD A serves clients too.
  legit_client_is_served(t, t.pd_b, t.b);
  legit_client_is_served(t, t.pd_a, t.a);
}

TEST(soft_send_invalidate, a_local_only_region_is_refused_and_survives) {
  target t;
  ASSERT_NO_FATAL_FAILURE(expect_invalidate_refused(t, t.local.lkey()));
  // The local key still works: a receive on it is accepted.
  queue_pair q2 = t.pd_a.create_qp({.send_cq = &t.cq, .recv_cq = &t.cq}).value();
  EXPECT_EQ(q2.post_recv(t.local.slice(0, 64), 1), errc::ok);
  legit_client_is_served(t, t.pd_a, t.a);
}

TEST(soft_send_invalidate, a_remote_key_not_registered_invalidatable_is_refused_and_survives) {
  target t;
  // `a` grants every remote right, as a store's exported region does, but was
  // not registered with remote_invalidate.
  ASSERT_NO_FATAL_FAILURE(expect_invalidate_refused(t, t.a.rkey()));
  // The key still serves another client: WRITE then READ with it.
  legit_client_is_served(t, t.pd_a, t.a);
}

TEST(soft_send_invalidate, an_unknown_key_costs_the_connection) {
  target t;
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw(t, fut);
  ASSERT_TRUE(fut.get().has_value());
  auto term = send_with_invalidate(t, p, t.a.rkey() ^ 0x5A5Au);
  ASSERT_TRUE(term.has_value()) << "a wrong key was silently ignored (free key-space sweep)";
  EXPECT_EQ(term->layer, term_layer::rdmap);
  EXPECT_EQ(term->etype, term::rdmap_remote_op);
  EXPECT_EQ(term->ecode, term::rdmap_cannot_invalidate);
  EXPECT_TRUE(t.wait_error());
  EXPECT_TRUE(p.sees_eof(5s));
  EXPECT_TRUE(t.mem.untouched_except({t.recv_buf}));
  legit_client_is_served(t, t.pd_a, t.a);
}

TEST(soft_send_invalidate, an_own_remote_key_is_invalidated) {
  target t;
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw(t, fut);
  ASSERT_TRUE(fut.get().has_value());
  ASSERT_EQ(t.qp.post_recv(t.recv.slice(0, 64), 77), errc::ok);
  auto payload = std::vector<std::byte>(8, std::byte{1});
  ASSERT_TRUE(p.send_all(
      encode_untagged(rdmap_op::send_inv, true, qn::send, 1, 0, t.inv.rkey(), payload, p.crc())));
  auto wc = t.cq.wait_one(5s);
  ASSERT_TRUE(wc.has_value());
  EXPECT_EQ(wc->status, wc_status::success);
  EXPECT_TRUE(wc->with_inv);
  EXPECT_EQ(wc->invalidated_rkey, t.inv.rkey());
  // The key is dead now: a WRITE to it is refused.
  std::vector<std::byte> data(16, std::byte{0xEE});
  ASSERT_TRUE(p.send_all(
      encode_tagged(rdmap_op::write, true, t.inv.rkey(), addr_of(t.inv_buf), data, p.crc())));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->layer, term_layer::ddp);
  EXPECT_EQ(term->ecode, term::ddp_t_inv_stag);
  EXPECT_TRUE(t.mem.untouched_except({t.recv_buf}));
  legit_client_is_served(t, t.pd_b, t.b);
}

// A Conveyor initiator may name any key: on both providers the target refuses
// every key it may not invalidate, fails the request (the initiator's SEND
// completes with the matching status) and the QP. shm has no Terminate; its
// error response carries the same statuses.
void conveyor_initiator_with_bad_invalidate_keys(const char* provider) {
  struct bad_key {
    const char* what;
    std::uint32_t (*key)(target&);
    wc_status initiator;
  };
  const bad_key cases[] = {
      {"other PD", [](target& t) { return t.b.rkey(); }, wc_status::rem_access_err},
      {"local only", [](target& t) { return t.local.lkey(); }, wc_status::rem_access_err},
      {"not invalidatable", [](target& t) { return t.a.rkey(); }, wc_status::rem_access_err},
      {"unknown", [](target& t) { return t.a.rkey() ^ 0x5A5Au; }, wc_status::rem_inv_req_err},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    target t(provider);
    auto fut = t.accept_async(t.qp);
    device cdev = device::open(provider).value();
    auto cpd = cdev.alloc_pd().value();
    auto ccq = cdev.create_cq({.depth = 64}).value();
    auto cqp = cpd.create_qp({.send_cq = &ccq, .recv_cq = &ccq}).value();
    std::vector<std::byte> msg(32, std::byte{3});
    auto mm = cpd.register_memory(std::span(msg), conveyor::access::local_write).value();
    ASSERT_TRUE(conveyor::connect(cqp, t.addr, {}).has_value());
    ASSERT_TRUE(fut.get().has_value());
    ASSERT_EQ(t.qp.post_recv(t.recv.slice(0, 64), 77), errc::ok);
    const sge s = mm.as_sge();
    send_wr wr{.wr_id = 5,
               .opcode = wr_opcode::send_with_inv,
               .flags = send_flags::signaled,
               .sg_list = std::span(&s, 1),
               .invalidate_rkey = c.key(t)};
    ASSERT_EQ(cqp.post_send(wr), errc::ok);
    auto iw = ccq.wait_one(5s);
    ASSERT_TRUE(iw.has_value());
    EXPECT_EQ(iw->wr_id, 5u);
    EXPECT_EQ(iw->status, c.initiator);
    auto tw = t.cq.wait_one(5s);
    ASSERT_TRUE(tw.has_value());
    EXPECT_EQ(tw->wr_id, 77u);
    EXPECT_EQ(tw->status, wc_status::rem_inv_req_err);
    EXPECT_TRUE(t.wait_error());
    EXPECT_TRUE(t.mem.untouched_except({t.recv_buf}));
    legit_client_is_served(t, t.pd_b, t.b, provider);
    legit_client_is_served(t, t.pd_a, t.a, provider);
    // The local-only key still works locally.
    queue_pair q2 = t.pd_a.create_qp({.send_cq = &t.cq, .recv_cq = &t.cq}).value();
    EXPECT_EQ(q2.post_recv(t.local.slice(0, 64), 1), errc::ok);
  }
}

TEST(shm_send_invalidate, keys_of_another_pd_or_not_invalidatable_or_unknown_are_refused) {
  conveyor_initiator_with_bad_invalidate_keys("shm");
}

TEST(soft_send_invalidate, a_conveyor_initiator_gets_the_matching_status) {
  conveyor_initiator_with_bad_invalidate_keys("soft");
}

// ---- finding 8: the responder's IRD is min(its max_dest_rd_atomic, the initiator's ORD)

TEST(soft_ird, the_responder_ird_never_exceeds_its_max_dest_rd_atomic) {
  target t("soft", /*max_dest_rd_atomic=*/2);
  std::future<result<connection_info>> fut;
  mpa_frame rep;
  // The initiator asks for ORD 16, does not read, and sends 3 large READs.
  raw_peer p = connect_raw(t, fut, /*ord=*/16, false, /*rcvbuf=*/4096, &rep);
  ASSERT_GE(p.fd(), 0);
  auto info = fut.get();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->attr.ird, 2u) << "connection info reports the negotiated IRD";
  ASSERT_TRUE(rep.v2.has_value());
  EXPECT_EQ(rep.v2->ird, 2u) << "the MPA reply advertises the negotiated IRD";
  for (std::uint32_t i = 0; i < 3; ++i) {
    read_request rr{0x77, 0, static_cast<std::uint32_t>(t.a_buf.size()), t.a.rkey(),
                    addr_of(t.a_buf)};
    ASSERT_TRUE(p.send_all(encode_read_request(rr, 1 + i, p.crc())));
  }
  std::this_thread::sleep_for(200ms);
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value()) << "a third READ was accepted with IRD 2";
  EXPECT_EQ(term->layer, term_layer::rdmap);
  EXPECT_EQ(term->etype, term::rdmap_remote_op);
  EXPECT_TRUE(t.wait_error());
  EXPECT_TRUE(t.mem.untouched_except({}));
  legit_client_is_served(t, t.pd_a, t.a);
}

TEST(shm_ird, the_responder_ird_never_exceeds_its_max_dest_rd_atomic) {
  target t("shm", /*max_dest_rd_atomic=*/2);
  auto fut = t.accept_async(t.qp);
  device cdev = device::open("shm").value();
  auto cpd = cdev.alloc_pd().value();
  auto ccq = cdev.create_cq({.depth = 64}).value();
  auto cqp = cpd.create_qp({.send_cq = &ccq, .recv_cq = &ccq, .max_rd_atomic = 16}).value();
  auto info = conveyor::connect(cqp, t.addr, {});
  ASSERT_TRUE(info.has_value());
  auto tinfo = fut.get();
  ASSERT_TRUE(tinfo.has_value());
  EXPECT_EQ(tinfo->attr.ird, 2u);
  EXPECT_EQ(info->attr.ord, 2u) << "the initiator's ORD follows the responder's IRD";
}

// ---- finding 4: atomics count against IRD like READs (RFC 7306) ---------------

TEST(soft_atomic_ird, an_atomic_beyond_the_ird_gets_the_read_terminate_and_is_not_executed) {
  target t;
  std::future<result<connection_info>> fut;
  // ORD 1 makes the target's IRD 1; a small window and no reading keep the
  // first (large) READ's response queued.
  raw_peer p = connect_raw(t, fut, /*ord=*/1, /*ext=*/true, /*rcvbuf=*/4096);
  ASSERT_GE(p.fd(), 0);
  auto info = fut.get();
  ASSERT_TRUE(info.has_value());
  ASSERT_TRUE(info->attr.extensions);
  ASSERT_EQ(info->attr.ird, 1u);
  read_request rr{0x77, 0, static_cast<std::uint32_t>(t.a_buf.size()), t.a.rkey(),
                  addr_of(t.a_buf)};
  ASSERT_TRUE(p.send_all(encode_read_request(rr, 1, p.crc())));
  std::this_thread::sleep_for(100ms);
  atomic_request a;
  a.kind = atomic_kind::fetch_add;
  a.request_id = 1;
  a.stag = t.a.rkey();
  a.to = addr_of(t.a_buf) + 64;
  a.add_swap = 0x1111;
  ASSERT_TRUE(p.send_all(encode_atomic_request(a, 1, p.crc())));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value()) << "the atomic bypassed the IRD";
  EXPECT_EQ(term->layer, term_layer::rdmap);
  EXPECT_EQ(term->etype, term::rdmap_remote_op);
  EXPECT_EQ(term->ecode, term::rdmap_catastrophic_stream);
  EXPECT_TRUE(t.wait_error());
  EXPECT_TRUE(t.mem.untouched_except({})) << "the refused atomic was executed";
  legit_client_is_served(t, t.pd_a, t.a);
}

TEST(soft_atomic_ird, a_flood_of_atomics_from_a_peer_that_never_reads_is_bounded) {
  target t;
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw(t, fut, /*ord=*/4, /*ext=*/true, /*rcvbuf=*/4096);
  ASSERT_GE(p.fd(), 0);
  ASSERT_TRUE(fut.get().has_value());
  // 400k requests: far more responses than the socket buffers hold.
  std::vector<std::byte> burst;
  std::uint32_t msn = 1;
  bool sent_all = true;
  for (int round = 0; round < 100 && sent_all; ++round) {
    burst.clear();
    for (int i = 0; i < 4000; ++i, ++msn) {
      atomic_request a;
      a.request_id = msn;
      a.stag = t.a.rkey();
      a.to = addr_of(t.a_buf) + 8 * (msn % 1024);
      a.add_swap = 1;
      auto f = encode_atomic_request(a, msn, p.crc());
      burst.insert(burst.end(), f.begin(), f.end());
    }
    sent_all = p.send_all(burst);  // fails once the target stops reading
  }
  const std::uint64_t sent = msn - 1;
  // The target refuses the request that finds its IRD full. Its Terminate
  // sits behind the responses this peer never read, so the peer may only see
  // the connection reset once the target's linger is over; either way the
  // stream ends long before every request is answered.
  std::uint64_t responses = 0;
  std::optional<terminate_msg> term;
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    auto f = p.read_fpdu();
    if (!f) break;
    last = std::chrono::steady_clock::now();
    auto h = parse_fpdu_header(*f);
    ASSERT_TRUE(h.has_value());
    if (h->opcode == rdmap_op::atomic_response) ++responses;
    if (h->opcode == rdmap_op::terminate) {
      term = decode_terminate(
                 std::span(*f).subspan(untagged_header_size, h->header_len - untagged_header_size))
                 .value();
      break;
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - last, 4s)
      << "the stream did not end: the target kept answering";
  EXPECT_LT(responses, sent) << "every one of " << sent << " atomics was answered";
  if (term) {
    EXPECT_EQ(term->etype, term::rdmap_remote_op);
    EXPECT_EQ(term->ecode, term::rdmap_catastrophic_stream);
  }
  EXPECT_TRUE(t.wait_error());
  EXPECT_TRUE(t.mem.untouched_except({t.a_buf.subspan(0, 8 * 1024)}));
  legit_client_is_served(t, t.pd_a, t.a);
}

// ---- finding 7: after a Terminate the target stops reading, lingers, closes ---

TEST(soft_terminate_linger, junk_after_a_terminate_is_not_read_and_the_socket_closes) {
  target t;
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw(t, fut);
  ASSERT_GE(p.fd(), 0);
  ASSERT_TRUE(fut.get().has_value());
  std::vector<std::byte> data(64, std::byte{0xEE});
  ASSERT_TRUE(p.send_all(encode_tagged(rdmap_op::write, true, t.a.rkey() ^ 0x00010000u,
                                       addr_of(t.a_buf), data, p.crc())));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  ASSERT_TRUE(t.wait_error());
  // The socket's bytes, framing and junk included (rx_bytes counts only payload).
  auto stream_bytes = [&] { return t.qp.counters().iwarp.value().rx_stream_bytes; };
  const std::uint64_t rx_before = stream_bytes();
  // Flood junk; the application never destroys or disconnects the QP.
  std::vector<std::byte> junk(64 * 1024, std::byte{0x42});
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t accepted = 0;
  bool closed = false;
  while (std::chrono::steady_clock::now() - start < 8s) {
    const ssize_t n = ::send(p.fd(), junk.data(), junk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      accepted += static_cast<std::uint64_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      std::this_thread::sleep_for(1ms);
    } else {
      closed = true;  // EPIPE / ECONNRESET: the target closed its socket
      break;
    }
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(closed) << "the target kept the socket open (accepted " << accepted << " bytes)";
  EXPECT_LT(took, 5s) << "linger longer than its bound";
  EXPECT_LT(stream_bytes() - rx_before, 1u << 20)
      << "the target kept reading and discarding after its Terminate";
  EXPECT_LT(accepted, 64u << 20) << "TCP took far more than its buffers hold";
  EXPECT_TRUE(t.mem.untouched_except({}));
  legit_client_is_served(t, t.pd_a, t.a);
}

// ---- finding 9: a flush racing the completion of a SEND -----------------------

// The application moves the QP to ERROR while the peer's SENDs are being
// placed: every receive completes exactly once (success or flush), never twice.
TEST(soft_flush_race, a_receive_completes_once_when_a_flush_races_its_send) {
  for (int iter = 0; iter < 15; ++iter) {
    SCOPED_TRACE(iter);
    target t;
    std::future<result<connection_info>> fut;
    raw_peer p = connect_raw(t, fut);
    ASSERT_GE(p.fd(), 0);
    ASSERT_TRUE(fut.get().has_value());
    constexpr int n = 200;
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(t.qp.post_recv(t.recv.slice(0, 4096), 1000 + i), errc::ok);
    std::vector<std::byte> stream;
    std::vector<std::byte> payload(2000, std::byte{0x33});
    for (int i = 0; i < n; ++i) {
      auto f = encode_untagged(rdmap_op::send, true, qn::send, 1 + i, 0, 0, payload, p.crc());
      stream.insert(stream.end(), f.begin(), f.end());
    }
    std::thread flusher([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(50 * (iter % 10)));
      (void)t.qp.modify(qp_state::error);
    });
    p.send_all(stream);
    flusher.join();
    std::vector<int> seen(n, 0);
    for (;;) {
      auto wc = t.cq.wait_one(100ms);
      if (!wc) break;
      ASSERT_GE(wc->wr_id, 1000u);
      ASSERT_LT(wc->wr_id, 1000u + n);
      ++seen[wc->wr_id - 1000];
    }
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(seen[i], 1) << "receive " << i << " completed " << seen[i] << " times";
    EXPECT_TRUE(t.mem.untouched_except({t.recv_buf}));
  }
}
