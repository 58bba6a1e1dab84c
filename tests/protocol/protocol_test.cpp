// Protocol tests: scripted raw-socket peers speak MPA/DDP/RDMAP to Conveyor's
// soft provider byte by byte and check both its bytes and its reactions. They
// stand in for the peers the project must interoperate with (Linux siw, older
// MPA revision 1 stacks) and for peers that break the rules.
#include "raw_peer.hpp"

#include <conveyor/conveyor.hpp>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <thread>

using namespace conveyor;
using namespace conveyor::wire;
using namespace std::chrono_literals;
using cvp::raw_peer;

namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

// A Conveyor target: device, PD, a 64 KiB region with every right, CQ, QP, listener.
struct target {
  device dev;
  protection_domain pd;
  completion_queue cq;
  queue_pair qp;
  std::vector<std::byte> mem = std::vector<std::byte>(64 * 1024);
  memory_region mr;
  listener lis;

  explicit target(bool request_crc = true) {
    device_options o;
    o.software.request_crc = request_crc;
    dev = device::open("soft", o).value();
    pd = dev.alloc_pd().value();
    cq = dev.create_cq({.depth = 256}).value();
    qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
    mr = pd.register_memory(std::span(mem), access::local_write | access::remote_write |
                                                access::remote_read | access::remote_atomic)
             .value();
    lis = listener::bind(dev, "127.0.0.1:0").value();
  }
  // Accepts one request in the background; the future holds the result.
  std::future<result<connection_info>> accept_async(std::vector<std::byte> pd_out = {}) {
    return std::async(std::launch::async, [this, pd_out] {
      auto req = lis.accept(5s);
      if (!req) return result<connection_info>(std::unexpected(req.error()));
      return req->accept(qp, pd_out);
    });
  }
};

// Sends an MPA request from the raw peer.
bool send_request(raw_peer& p, std::uint8_t flags, std::uint8_t rev, std::optional<mpa_v2_words> v2,
                  std::string_view pd) {
  mpa_frame f;
  f.reply = false;
  f.flags = flags;
  f.revision = rev;
  f.v2 = v2;
  f.private_data = bytes_of(pd);
  return p.send_all(encode_mpa(f));
}

std::uint64_t addr_of(const memory_region& mr) {
  return mr.addr();
}

// READs [0, len) of the target's region through the raw peer (into its sink
// STag 0x77) and gathers the responses' payloads into out. The response also
// orders the engine's placement before the caller's look at the region.
testing::AssertionResult read_back(raw_peer& p, const target& t, std::uint32_t len,
                                   std::uint32_t msn, std::vector<std::byte>& out) {
  read_request rr{0x77, 0, len, t.mr.rkey(), addr_of(t.mr)};
  if (!p.send_all(encode_read_request(rr, msn, false)))
    return testing::AssertionFailure() << "the READ request was not sent";
  out.clear();
  for (bool last = false; !last;) {
    auto resp = p.read_fpdu();
    if (!resp.has_value()) return testing::AssertionFailure() << "no READ response";
    auto h = parse_fpdu_header(*resp);
    if (!h.has_value()) return testing::AssertionFailure() << "a response that does not parse";
    if (h->opcode != rdmap_op::read_response)
      return testing::AssertionFailure()
             << "opcode " << static_cast<int>(h->opcode) << " instead of a READ response";
    out.insert(out.end(), resp->begin() + static_cast<long>(h->header_len),
               resp->begin() + static_cast<long>(h->header_len + h->payload_len));
    last = h->last;
  }
  return testing::AssertionSuccess();
}

}  // namespace

TEST(mpa, revision_1_initiator_gets_a_revision_1_reply_and_its_frames_are_served) {
  target t;
  auto fut = t.accept_async(bytes_of("hello-v1"));
  raw_peer p = raw_peer::connect_to(t.lis.port());
  ASSERT_GE(p.fd(), 0);
  ASSERT_TRUE(send_request(p, 0, 1, std::nullopt, "rev1-client"));
  auto rep = p.read_mpa(true);
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->revision, 1);
  EXPECT_FALSE(rep->enhanced()) << "H must not be set towards a revision 1 peer";
  EXPECT_FALSE(rep->v2.has_value());
  EXPECT_FALSE(rep->rejected());
  EXPECT_FALSE(rep->markers());
  EXPECT_EQ(rep->private_data, bytes_of("hello-v1")) << "no IRD/ORD words in revision 1";
  auto info = fut.get();
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  EXPECT_EQ(info->private_data, bytes_of("rev1-client"));
  ASSERT_TRUE(info->attr.iwarp) << "soft reports what MPA negotiated";
  EXPECT_EQ(info->attr.iwarp->mpa_revision, 1);
  EXPECT_EQ(info->attr.iwarp->rtr, "none");
  p.set_crc(rep->crc());
  EXPECT_TRUE(rep->crc()) << "the target's device requests CRC";

  // An RDMA Write of 16 bytes lands in the region.
  std::vector<std::byte> data(16);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::byte(0xA0 + i);
  ASSERT_TRUE(p.send_all(
      encode_tagged(rdmap_op::write, true, t.mr.rkey(), addr_of(t.mr) + 100, data, p.crc())));
  // A Read Request for those bytes comes back as one Read Response.
  read_request rr{0x77, 0x1000, 16, t.mr.rkey(), addr_of(t.mr) + 100};
  ASSERT_TRUE(p.send_all(encode_read_request(rr, 1, p.crc())));
  auto resp = p.read_fpdu();
  ASSERT_TRUE(resp.has_value());
  EXPECT_TRUE(check_fpdu_crc(*resp)) << "CRC of the Read Response";
  auto h = parse_fpdu_header(*resp);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, rdmap_op::read_response);
  EXPECT_TRUE(h->tagged);
  EXPECT_TRUE(h->last);
  EXPECT_EQ(h->stag, 0x77u) << "the response goes to the sink STag";
  EXPECT_EQ(h->to, 0x1000u);
  ASSERT_EQ(h->payload_len, 16u);
  EXPECT_TRUE(
      std::equal(data.begin(), data.end(), resp->begin() + static_cast<long>(h->header_len)));
  EXPECT_EQ(0, std::memcmp(t.mem.data() + 100, data.data(), 16));
}

TEST(mpa, request_asking_for_markers_is_answered_with_a_reject) {
  target t;
  auto fut = std::async(std::launch::async, [&] { return t.lis.accept(1s); });
  raw_peer p = raw_peer::connect_to(t.lis.port());
  ASSERT_TRUE(
      send_request(p, mpa_flag::markers, 2, mpa_v2_words{4, 4, true, false, true, false}, ""));
  auto rep = p.read_mpa(true);
  ASSERT_TRUE(rep.has_value());
  EXPECT_TRUE(rep->rejected());
  EXPECT_FALSE(rep->markers());
  // The refused request never reaches accept(): the listener drops it itself.
  auto r = fut.get();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::timed_out) << r.error().to_string();
}

TEST(mpa, conveyor_request_is_revision_2_enhanced_peer_to_peer_and_offers_extensions) {
  cvp::raw_listener rl;
  target t;  // used as the initiator's device here
  auto fut = std::async(std::launch::async, [&] {
    return connect(t.qp, "127.0.0.1:" + std::to_string(rl.port()),
                   {.private_data = bytes_of("ulp"), .timeout = 3s});
  });
  raw_peer p = rl.accept_one();
  std::vector<std::byte> raw;
  auto req = p.read_mpa(false, &raw);
  ASSERT_TRUE(req.has_value());
  EXPECT_EQ(req->revision, 2);
  EXPECT_TRUE(req->enhanced());
  ASSERT_TRUE(req->v2.has_value());
  EXPECT_TRUE(req->v2->peer2peer);
  EXPECT_TRUE(req->v2->write_rtr || req->v2->read_rtr);
  EXPECT_FALSE(req->markers());
  EXPECT_TRUE(req->crc());
  EXPECT_TRUE(req->flags & mpa_flag::ext_offer);
  EXPECT_EQ(req->private_data, bytes_of("ulp"));
  EXPECT_LE(raw.size() - mpa_header_size, 256u);
  // Answer like Linux siw: re-use the request's flag byte (an echo), choose Write RTR.
  mpa_frame rep;
  rep.reply = true;
  rep.flags = req->flags;
  rep.revision = 2;
  rep.v2 = mpa_v2_words{8, 8, true, false, true, false};
  ASSERT_TRUE(p.send_all(encode_mpa(rep)));
  p.set_crc(true);
  // The initiator's first FPDU must be the zero-length Write RTR with STag 1.
  auto rtr = p.read_fpdu();
  ASSERT_TRUE(rtr.has_value());
  auto h = parse_fpdu_header(*rtr);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->opcode, rdmap_op::write);
  EXPECT_EQ(h->payload_len, 0u);
  EXPECT_EQ(h->stag, 1u) << "STag 0 is refused by hardware peers";
  EXPECT_TRUE(check_fpdu_crc(*rtr));
  auto info = fut.get();
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  EXPECT_FALSE(info->attr.extensions) << "an echoed offer must not enable RFC 7306";
  EXPECT_EQ(info->attr.ord, 8u);
  // Atomics and immediate data are unsupported on this connection, cleanly.
  std::uint64_t result_slot = 0;
  auto rmr = t.pd.register_memory(std::span(&result_slot, 1), access::local_write).value();
  EXPECT_EQ(t.qp.post_fetch_add(rmr.as_sge(), {0x1000, 8, 0x20000}, 1, 1), errc::unsupported);
  send_wr imm{.wr_id = 2,
              .opcode = wr_opcode::rdma_write_with_imm,
              .flags = send_flags::signaled,
              .sg_list = {},
              .remote_addr = 0x1000,
              .rkey = 0x20000};
  EXPECT_EQ(t.qp.post_send(imm), errc::unsupported);
  EXPECT_EQ(t.qp.state(), qp_state::rts);
}

namespace {
// Connects a raw peer to a Conveyor target with MPA v2 + Write RTR.
raw_peer connect_raw_v2(target& t, bool crc, std::uint16_t ord,
                        std::future<result<connection_info>>& fut, int rcvbuf = 0) {
  fut = t.accept_async();
  raw_peer p = raw_peer::connect_to(t.lis.port(), rcvbuf);
  send_request(p, crc ? mpa_flag::crc : 0, 2, mpa_v2_words{4, ord, true, false, true, false}, "");
  auto rep = p.read_mpa(true);
  if (!rep) return raw_peer(-1);
  p.set_crc(rep->crc());
  std::vector<std::byte> rtr(fpdu_size(ddp::tagged_hdr));
  write_tagged_header(rtr.data(), rdmap_op::write, true, 1, 0, 0);
  finish_fpdu(rtr, p.crc());
  p.send_all(rtr);
  return p;
}

// Reads FPDUs until a Terminate arrives (or EOF); returns it.
std::optional<terminate_msg> read_until_terminate(raw_peer& p) {
  for (int i = 0; i < 100000; ++i) {
    auto f = p.read_fpdu();
    if (!f) return std::nullopt;
    auto h = parse_fpdu_header(*f);
    if (!h) return std::nullopt;
    if (h->opcode == rdmap_op::terminate) {
      EXPECT_EQ(h->qn, qn::terminate);
      EXPECT_EQ(h->msn, 1u) << "a Terminate is QN 2, MSN 1";
      if (p.crc()) {
        EXPECT_TRUE(check_fpdu_crc(*f));
      }
      auto t = decode_terminate(
          std::span(*f).subspan(untagged_header_size, h->header_len - untagged_header_size));
      if (!t) return std::nullopt;
      return *t;
    }
  }
  return std::nullopt;
}
}  // namespace

TEST(terminate, bad_crc_gets_an_llp_crc_terminate_and_the_connection_closes) {
  target t;
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, true, 4, fut);
  ASSERT_GE(p.fd(), 0);
  ASSERT_TRUE(fut.get().has_value());
  std::vector<std::byte> before(t.mem.begin(), t.mem.begin() + 64);
  std::vector<std::byte> data(32, std::byte{0x5A});
  auto f = encode_tagged(rdmap_op::write, true, t.mr.rkey(), addr_of(t.mr), data, true);
  f.back() ^= std::byte{0x01};  // corrupt the CRC
  ASSERT_TRUE(p.send_all(f));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->layer, term_layer::llp);
  EXPECT_EQ(term->ecode, term::llp_crc);
  EXPECT_TRUE(p.sees_eof(5s));
  // Poll until the target QP reports ERROR (the engine handles it asynchronously).
  for (int i = 0; i < 500 && t.qp.state() != qp_state::error; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(t.qp.state(), qp_state::error);
}

TEST(terminate, write_with_a_bad_stag_is_refused_before_any_byte_is_placed) {
  target t(false);
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, false, 4, fut);
  ASSERT_TRUE(fut.get().has_value());
  std::vector<std::byte> before(t.mem);
  std::vector<std::byte> data(4000, std::byte{0xEE});
  ASSERT_TRUE(p.send_all(
      encode_tagged(rdmap_op::write, true, t.mr.rkey() ^ 0x00010000u, addr_of(t.mr), data, false)));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->layer, term_layer::ddp);
  EXPECT_EQ(term->etype, term::ddp_tagged);
  EXPECT_EQ(term->ecode, term::ddp_t_inv_stag);
  EXPECT_EQ(term->ddp_header.size(), ddp::tagged_hdr) << "the offending DDP header is included";
  EXPECT_TRUE(p.sees_eof(5s));
  EXPECT_EQ(t.mem, before) << "the target's memory changed";
}

TEST(terminate, unknown_ddp_version_gets_a_terminate) {
  target t(false);
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, false, 4, fut);
  ASSERT_TRUE(fut.get().has_value());
  auto f = encode_tagged(rdmap_op::write, true, t.mr.rkey(), addr_of(t.mr), {}, false);
  f[2] = std::byte((std::to_integer<std::uint8_t>(f[2]) & ~0x03) | 0x02);  // DV = 2
  ASSERT_TRUE(p.send_all(f));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->layer, term_layer::ddp);
  EXPECT_TRUE(p.sees_eof(5s));
}

TEST(terminate, reads_beyond_the_advertised_ird_get_a_terminate) {
  target t(false);
  std::future<result<connection_info>> fut;
  // A small receive window and no reading: the target's responses back up, so
  // its inbound read queue (IRD 1) is still occupied when more requests arrive.
  raw_peer p = connect_raw_v2(t, false, /*ord=*/1, fut, /*rcvbuf=*/4096);
  auto info = fut.get();
  ASSERT_TRUE(info.has_value());
  ASSERT_EQ(info->attr.ird, 1u) << "our IRD follows the initiator's ORD";
  for (std::uint32_t i = 0; i < 400; ++i) {
    read_request rr{0x77, 0, 64 * 1024, t.mr.rkey(), addr_of(t.mr)};
    ASSERT_TRUE(p.send_all(encode_read_request(rr, 1 + i, false)));
  }
  std::this_thread::sleep_for(300ms);
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->layer, term_layer::rdmap);
  EXPECT_EQ(term->etype, term::rdmap_remote_op);
  EXPECT_TRUE(p.sees_eof(5s));
}

TEST(terminate, send_without_a_posted_receive_gets_ddp_no_buffer) {
  target t(false);
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, false, 4, fut);
  ASSERT_TRUE(fut.get().has_value());
  auto payload = bytes_of("nobody is listening");
  ASSERT_TRUE(p.send_all(encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, payload, false)));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->layer, term_layer::ddp);
  EXPECT_EQ(term->etype, term::ddp_untagged);
  EXPECT_EQ(term->ecode, term::ddp_u_no_buffer);
}

TEST(terminate, wrong_msn_gets_a_terminate) {
  target t(false);
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, false, 4, fut);
  ASSERT_TRUE(fut.get().has_value());
  std::vector<std::byte> buf(64);
  ASSERT_EQ(t.qp.post_recv(t.mr.slice(0, 64), 1), errc::ok);
  auto payload = bytes_of("msn");
  ASSERT_TRUE(p.send_all(encode_untagged(rdmap_op::send, true, qn::send, 5, 0, 0, payload, false)));
  auto term = read_until_terminate(p);
  ASSERT_TRUE(term.has_value());
  EXPECT_EQ(term->layer, term_layer::ddp);
  EXPECT_EQ(term->ecode, term::ddp_u_msn_range);
}

// A peer on an MTU 1500 link frames 1.4 KiB FPDUs. The target must read them
// many per system call: a readv per FPDU straight into the region (right for
// 64 KiB loopback FPDUs) cost five times a TCP stream's CPU per GB over veth.
// The first FPDU arrives with most of its payload still to come, which is what
// sent every later one down the one-readv-each path.
TEST(placement, mss_sized_fpdus_are_read_many_per_system_call) {
  target t(false);
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, false, 4, fut);
  ASSERT_TRUE(fut.get().has_value());
  constexpr std::size_t n = 24, plen = 1428;  // MSS 1448 less the tagged header and CRC
  std::vector<std::byte> data(n * plen);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 131 + 7);
  std::vector<std::byte> stream;
  for (std::size_t i = 0; i < n; ++i) {
    auto f = encode_tagged(rdmap_op::write, i + 1 == n, t.mr.rkey(), addr_of(t.mr) + i * plen,
                           std::span(data).subspan(i * plen, plen), false);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  const std::size_t first = 2 + ddp::tagged_hdr + 100;  // length, header, 100 payload bytes
  ASSERT_TRUE(p.send_all(std::span(stream).first(first)));
  auto stream_in = [&] {
    return t.qp.counters().iwarp.value_or(iwarp_qp_counters{}).rx_stream_bytes;
  };
  for (int i = 0; i < 5000 && stream_in() < first; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(stream_in(), first);
  std::this_thread::sleep_for(20ms);  // the engine waits for the rest of the first FPDU
  ASSERT_TRUE(p.send_all(std::span(stream).subspan(first)));
  for (int i = 0; i < 5000 && t.qp.counters().rx_bytes < data.size(); ++i)
    std::this_thread::sleep_for(1ms);
  const auto c = t.qp.counters();
  ASSERT_EQ(c.rx_bytes, data.size());
  ASSERT_TRUE(c.iwarp.has_value());
  EXPECT_EQ(c.iwarp->rx_fpdus, n);
  // Two sends, one to two reads each, plus the reads that find the socket
  // drained; one readv per FPDU would be 24 or more.
  EXPECT_LE(c.iwarp->rx_syscalls, 8u) << "FPDUs read one system call each";
  // The bytes landed where each FPDU said: READ them back.
  std::vector<std::byte> back;
  ASSERT_TRUE(read_back(p, t, static_cast<std::uint32_t>(data.size()), 1, back));
  EXPECT_TRUE(back == data) << "placed bytes differ";
  EXPECT_TRUE(std::equal(data.begin(), data.end(), t.mem.begin())) << "placed bytes differ";
}

// A burst of READ requests read in one system call is answered in one batch:
// the responder queued each response and sent it at once, one sendmsg per
// 4 KiB READ, which held small READs to 0.1-0.2 of what the socket carries
// (bench/compare's READ 4 KiB row). Every response still carries the bytes
// its request named, in order.
namespace {
// Rewrites [m, m + len) without pause until killed (a forked child: no locks,
// no allocation; TSan does not see another process's stores, nor need to).
[[noreturn]] __attribute__((no_sanitize("thread"))) void rewrite_forever(void* m, std::size_t len) {
  auto* w = static_cast<volatile std::uint64_t*>(m);
  for (std::uint64_t v = 1;; ++v)
    for (std::size_t i = 0; i < len / 8; ++i) w[i] = v * 0x0101010101010101ull;
}
}  // namespace

// A READ response's CRC covers the bytes it carries even while the region's
// owner rewrites them (RDMA allows that: the reader gets whichever bytes).
// soft summed the region and then let sendmsg copy it again, so a store in
// between sent an FPDU whose CRC did not match its bytes, which a reader must
// treat as corruption (LLP CRC Terminate: conveyor-kv's readers lost their
// connections with CRC on). Here another process rewrites the region without
// pause while the peer READs it.
TEST(crc, read_responses_of_a_region_being_rewritten_carry_matching_crcs) {
  target t(true);
  constexpr std::size_t len = 64 * 1024;
  struct mapping {
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ~mapping() {
      if (p != MAP_FAILED) ::munmap(p, len);
    }
  } m;
  ASSERT_NE(m.p, MAP_FAILED);
  auto mr = t.pd.register_memory(std::span(static_cast<std::byte*>(m.p), len),
                                 access::local_write | access::remote_read);
  ASSERT_TRUE(mr.has_value()) << mr.error().to_string();
  struct writer {
    pid_t pid = -1;
    ~writer() {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  } w;
  w.pid = ::fork();
  ASSERT_GE(w.pid, 0);
  if (w.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::alarm(120);
    rewrite_forever(m.p, len);
  }
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, true, 1, fut);
  ASSERT_GE(p.fd(), 0);
  ASSERT_TRUE(fut.get().has_value());
  ASSERT_TRUE(p.crc()) << "CRC was not negotiated";
  std::size_t fpdus = 0, bad = 0;
  for (std::uint32_t i = 0; i < 200; ++i) {
    read_request rr{0x77, 0, len, mr->rkey(), mr->addr()};
    ASSERT_TRUE(p.send_all(encode_read_request(rr, 1 + i, true)));
    for (bool last = false; !last;) {
      auto f = p.read_fpdu();
      ASSERT_TRUE(f.has_value()) << "READ " << i << ": the connection ended";
      auto h = parse_fpdu_header(*f);
      ASSERT_TRUE(h.has_value());
      ASSERT_EQ(h->opcode, rdmap_op::read_response) << "READ " << i;
      ++fpdus;
      if (!check_fpdu_crc(*f)) ++bad;
      last = h->last;
    }
  }
  EXPECT_EQ(bad, 0u) << "READ response FPDUs whose CRC does not match their bytes, of " << fpdus;
}

TEST(placement, a_burst_of_read_requests_is_answered_in_few_system_calls) {
  target t(false);
  std::future<result<connection_info>> fut;
  constexpr std::uint32_t n = 16, len = 512;  // 16: the target's IRD
  raw_peer p = connect_raw_v2(t, false, /*ord=*/n, fut);
  auto info = fut.get();
  ASSERT_TRUE(info.has_value());
  ASSERT_GE(info->attr.ird, n);
  for (std::size_t i = 0; i < t.mem.size(); ++i) t.mem[i] = std::byte(i * 37 + 11);
  std::vector<std::byte> burst;
  for (std::uint32_t i = 0; i < n; ++i) {
    // Request i reads [i * len, (i + 1) * len) into the peer's sink 0x77 at offset i * len.
    read_request rr{0x77, std::uint64_t(i) * len, len, t.mr.rkey(), addr_of(t.mr) + i * len};
    auto f = encode_read_request(rr, 1 + i, false);
    burst.insert(burst.end(), f.begin(), f.end());
  }
  const auto before = t.qp.counters().iwarp.value_or(iwarp_qp_counters{});
  ASSERT_TRUE(p.send_all(burst));  // one segment: the target reads it in one call
  for (std::uint32_t i = 0; i < n; ++i) {
    SCOPED_TRACE("response " + std::to_string(i));
    auto resp = p.read_fpdu();
    ASSERT_TRUE(resp.has_value());
    auto h = parse_fpdu_header(*resp);
    ASSERT_TRUE(h.has_value());
    ASSERT_EQ(h->opcode, rdmap_op::read_response);
    ASSERT_TRUE(h->last);
    EXPECT_EQ(h->stag, 0x77u);
    EXPECT_EQ(h->to, std::uint64_t(i) * len);
    ASSERT_EQ(h->payload_len, len);
    EXPECT_TRUE(std::equal(resp->begin() + static_cast<long>(h->header_len),
                           resp->begin() + static_cast<long>(h->header_len + len),
                           t.mem.begin() + static_cast<long>(i) * len))
        << "response bytes differ from the region";
  }
  const auto after = t.qp.counters().iwarp.value_or(iwarp_qp_counters{});
  EXPECT_EQ(after.tx_fpdus - before.tx_fpdus, n);
  // One or two reads of the burst, a sendmsg each (and a retry if the socket
  // took part of one): one sendmsg per response would be 16.
  EXPECT_LE(after.tx_syscalls - before.tx_syscalls, 4u) << "a sendmsg per READ response";
}

// A 64 KiB WRITE from a peer whose FPDUs hold at most 65000 bytes is a bulk
// FPDU and a short tail. The tail must not send the next message's payload
// through the staging buffer: the target reads the next header alone and the
// bulk payload behind it straight into the region (rx_direct_bytes). It did
// read all of it into staging and copy it, which made a 64 KiB WRITE
// ping-pong 10% slower.
TEST(placement, a_bulk_message_after_one_with_a_short_tail_is_placed_directly) {
  target t(false);
  std::future<result<connection_info>> fut;
  raw_peer p = connect_raw_v2(t, false, 4, fut);
  ASSERT_TRUE(fut.get().has_value());
  constexpr std::size_t bulk = 65000, len = 64 * 1024;
  auto message = [&](std::uint8_t seed) {
    std::vector<std::byte> data(len), stream;
    for (std::size_t i = 0; i < len; ++i) data[i] = std::byte(i * 7 + seed);
    for (std::size_t off = 0; off < len; off += bulk) {
      const std::size_t n = std::min(bulk, len - off);
      auto f = encode_tagged(rdmap_op::write, off + n == len, t.mr.rkey(), addr_of(t.mr) + off,
                             std::span(data).subspan(off, n), false);
      stream.insert(stream.end(), f.begin(), f.end());
    }
    return std::pair(data, stream);
  };
  auto counters = [&] { return t.qp.counters(); };
  for (std::uint8_t k = 1; k <= 3; ++k) {
    SCOPED_TRACE("message " + std::to_string(k));
    auto [data, stream] = message(k);
    const auto before = counters();
    ASSERT_TRUE(p.send_all(stream));
    for (int i = 0; i < 5000 && counters().rx_bytes < before.rx_bytes + len; ++i)
      std::this_thread::sleep_for(1ms);
    const auto after = counters();
    ASSERT_EQ(after.rx_bytes, before.rx_bytes + len);
    ASSERT_TRUE(after.iwarp.has_value() && before.iwarp.has_value());
    EXPECT_EQ(after.iwarp->rx_fpdus - before.iwarp->rx_fpdus, 2u);
    // The first message follows nothing bulk: it may come through staging.
    // Every later one: all of its bulk FPDU but the header read's look-ahead.
    if (k > 1) {
      EXPECT_GE(after.iwarp->rx_direct_bytes - before.iwarp->rx_direct_bytes, bulk - 128)
          << "the bulk payload went through the staging buffer";
    }
    // READ it back: the bytes are where the FPDUs said.
    std::vector<std::byte> back;
    ASSERT_TRUE(read_back(p, t, static_cast<std::uint32_t>(len), k, back));
    EXPECT_TRUE(back == data) << "placed bytes differ";
  }
}
