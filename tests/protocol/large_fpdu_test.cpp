// Large FPDUs (software_device_options::large_fpdus, MPA flag 0x08): with a
// small TCP MSS (TCP_MAXSEG on loopback, as an MTU of 1500 gives across
// hosts), FPDUs are sized to a 64 KiB GSO segment only between peers that both
// said they accept them, and stay within one MSS otherwise. Checked on the
// wire: a relay between two soft devices measures every FPDU in each
// direction, and scripted raw peers play Linux siw (whose Reply echoes the
// Request's flag byte) and a Conveyor peer.
#include "raw_peer.hpp"

#include <conveyor/conveyor.hpp>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <thread>

using namespace conveyor;
using namespace conveyor::wire;
using namespace std::chrono_literals;
using cvp::raw_peer;

namespace large_fpdu_test {
namespace {

// An MSS this small makes every bulk FPDU of an MSS-bound sender a few hundred
// bytes: large ones are unmistakable.
constexpr int small_mss = 1000;

void fill(std::span<std::byte> b, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : b) {
    x = x * 1664525u + 1013904223u;
    c = std::byte(x >> 24);
  }
}

// Largest FPDU and count per direction, measured whole (length, ULPDU, pad, CRC).
struct direction_stats {
  std::atomic<std::size_t> fpdus{0};
  std::atomic<std::size_t> largest{0};
};

// A TCP relay on 127.0.0.1 between a soft initiator and a soft listener, both
// of its connections with TCP_MAXSEG small_mss. It forwards the MPA frame, then
// one whole FPDU at a time, recording each one's size before forwarding it (so
// by the time the receiver has an FPDU, the stats have it).
class fpdu_relay {
 public:
  explicit fpdu_relay(std::uint16_t target_port) : target_port_(target_port) {
    lis_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int m = small_mss;
    setsockopt(lis_, IPPROTO_TCP, TCP_MAXSEG, &m, sizeof m);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(lis_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(lis_, 1);
    socklen_t l = sizeof a;
    getsockname(lis_, reinterpret_cast<sockaddr*>(&a), &l);
    port_ = ntohs(a.sin_port);
    starter_ = std::thread([this] { start(); });
  }
  ~fpdu_relay() {
    stop_.store(true);
    starter_.join();
    for (int fd : {a_, b_})
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    for (auto& t : pumps_) t.join();
    for (int fd : {lis_, a_, b_})
      if (fd >= 0) ::close(fd);
  }
  std::uint16_t port() const { return port_; }
  direction_stats to_target, to_initiator;

 private:
  void start() {
    pollfd p{lis_, POLLIN, 0};
    while (!stop_.load() && ::poll(&p, 1, 100) == 0) {
    }
    if (stop_.load()) return;
    a_ = ::accept4(lis_, nullptr, nullptr, SOCK_CLOEXEC);
    if (a_ < 0) return;
    b_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int m = small_mss, one = 1;
    setsockopt(b_, IPPROTO_TCP, TCP_MAXSEG, &m, sizeof m);
    setsockopt(b_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(a_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in t{};
    t.sin_family = AF_INET;
    t.sin_port = htons(target_port_);
    t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(b_, reinterpret_cast<sockaddr*>(&t), sizeof t) != 0) {
      ::shutdown(a_, SHUT_RDWR);
      return;
    }
    pumps_.emplace_back([this] { pump(a_, b_, to_target); });
    pumps_.emplace_back([this] { pump(b_, a_, to_initiator); });
  }
  static bool read_exact(int fd, std::byte* p, std::size_t n) {
    while (n > 0) {
      const ssize_t r = ::recv(fd, p, n, 0);
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        return false;
      }
      p += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  static bool write_all(int fd, const std::byte* p, std::size_t n) {
    while (n > 0) {
      const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        return false;
      }
      p += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  static void pump(int from, int to, direction_stats& st) {
    std::vector<std::byte> buf(mpa_header_size + mpa_max_private_data);
    if (read_exact(from, buf.data(), mpa_header_size)) {
      const std::size_t pd = get_be16(buf.data() + 18);
      if (pd <= mpa_max_private_data && read_exact(from, buf.data() + mpa_header_size, pd) &&
          write_all(to, buf.data(), mpa_header_size + pd)) {
        buf.resize(fpdu_size(max_ulpdu));
        while (read_exact(from, buf.data(), mpa_len_size)) {
          const std::size_t n = fpdu_size(get_be16(buf.data()));
          if (!read_exact(from, buf.data() + mpa_len_size, n - mpa_len_size)) break;
          st.fpdus.fetch_add(1);
          std::size_t cur = st.largest.load();
          while (n > cur && !st.largest.compare_exchange_weak(cur, n)) {
          }
          if (!write_all(to, buf.data(), n)) break;
        }
      }
    }
    ::shutdown(to, SHUT_WR);
  }

  std::uint16_t target_port_;
  std::uint16_t port_ = 0;
  int lis_ = -1, a_ = -1, b_ = -1;
  std::atomic<bool> stop_{false};
  std::thread starter_;
  std::vector<std::thread> pumps_;
};

constexpr std::size_t write_len = 1 << 20, read_len = 1 << 20, send_len = 256 << 10;
constexpr std::size_t region = write_len + read_len + send_len;

// One soft endpoint: device (with or without large FPDUs), PD, CQ, QP, region.
struct endpoint {
  device dev;
  protection_domain pd;
  completion_queue cq;
  queue_pair qp;
  std::vector<std::byte> mem = std::vector<std::byte>(region);
  memory_region mr;

  endpoint(bool large, bool crc) {
    device_options o;
    o.software.large_fpdus = large;
    o.software.request_crc = crc;
    dev = device::open("soft", o).value();
    pd = dev.alloc_pd().value();
    cq = dev.create_cq({.depth = 64}).value();
    qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
    mr = pd.register_memory(std::span(mem),
                            access::local_write | access::remote_write | access::remote_read)
             .value();
  }
  testing::AssertionResult completes(std::uint64_t wr_id, wc_opcode op) {
    auto wc = cq.wait_one(10s);
    if (!wc) return testing::AssertionFailure() << "no completion for wr_id " << wr_id;
    if (wc->wr_id != wr_id || wc->status != wc_status::success || wc->opcode != op)
      return testing::AssertionFailure()
             << "wr_id " << wc->wr_id << " status " << to_string(wc->status) << " opcode "
             << static_cast<int>(wc->opcode) << ", expected wr_id " << wr_id;
    return testing::AssertionSuccess();
  }
};

struct soft_case {
  bool init_large, tgt_large, crc;
};
std::string case_name(const testing::TestParamInfo<soft_case>& i) {
  return std::string(i.param.init_large ? "initiator_on" : "initiator_off") +
         (i.param.tgt_large ? "_target_on" : "_target_off") + (i.param.crc ? "_crc" : "_no_crc");
}

class soft_pair : public testing::TestWithParam<soft_case> {};

// Two soft devices across the relay (MSS <= 1000 both ways): WRITE and SEND
// from the initiator, a READ answered by the target, every byte compared.
// Both accepting: FPDUs above the MSS, up to 64 KiB, in both directions (READ
// responses are the target's). Either side off: no FPDU above either MSS.
TEST_P(soft_pair, fpdus_are_larger_than_the_mss_only_when_both_sides_accept_them) {
  const auto c = GetParam();
  const bool large = c.init_large && c.tgt_large;
  endpoint a(c.init_large, c.crc), b(c.tgt_large, c.crc);
  auto lis = listener::bind(b.dev, "127.0.0.1:0").value();
  fpdu_relay relay(lis.port());
  ASSERT_EQ(b.qp.post_recv(b.mr.slice(write_len + read_len, send_len), 7), errc::ok);
  auto fut = std::async(std::launch::async, [&]() -> result<connection_info> {
    auto req = lis.accept(5s);
    if (!req) return std::unexpected(req.error());
    return req->accept(b.qp, {});
  });
  auto ci = connect(a.qp, "127.0.0.1:" + std::to_string(relay.port()), {.timeout = 5s});
  ASSERT_TRUE(ci.has_value()) << ci.error().to_string();
  auto ti = fut.get();
  ASSERT_TRUE(ti.has_value()) << ti.error().to_string();
  ASSERT_TRUE(ci->attr.iwarp && ti->attr.iwarp);
  const auto& ia = *ci->attr.iwarp;
  const auto& ta = *ti->attr.iwarp;
  ASSERT_LE(ia.mss, std::uint32_t(small_mss)) << "TCP_MAXSEG did not take";
  ASSERT_LE(ta.mss, std::uint32_t(small_mss)) << "TCP_MAXSEG did not take";
  EXPECT_EQ(ia.large_fpdus, large);
  EXPECT_EQ(ta.large_fpdus, large);
  EXPECT_EQ(ia.crc, c.crc);
  if (large) {
    EXPECT_EQ(ia.max_fpdu, 65536u);
    EXPECT_EQ(ta.max_fpdu, 65536u);
  } else {
    EXPECT_LE(ia.max_fpdu, ia.mss);
    EXPECT_LE(ta.max_fpdu, ta.mss);
  }

  auto src = a.mr.data();
  fill(std::span(src, write_len), 1);
  fill(std::span(src + write_len + read_len, send_len), 3);
  fill(std::span(b.mr.data() + write_len, read_len), 2);
  const auto peer = b.mr.remote();
  ASSERT_EQ(a.qp.post_write(a.mr.slice(0, write_len), peer.slice(0, write_len), 1), errc::ok);
  ASSERT_TRUE(a.completes(1, wc_opcode::rdma_write));
  ASSERT_EQ(a.qp.post_read(a.mr.slice(write_len, read_len), peer.slice(write_len, read_len), 2),
            errc::ok);
  ASSERT_TRUE(a.completes(2, wc_opcode::rdma_read));
  ASSERT_EQ(a.qp.post_send_msg(a.mr.slice(write_len + read_len, send_len), 3), errc::ok);
  ASSERT_TRUE(a.completes(3, wc_opcode::send));
  ASSERT_TRUE(b.completes(7, wc_opcode::recv));

  EXPECT_EQ(0, std::memcmp(b.mr.data(), src, write_len)) << "WRITE";
  EXPECT_EQ(0, std::memcmp(src + write_len, b.mr.data() + write_len, read_len)) << "READ";
  EXPECT_EQ(0,
            std::memcmp(b.mr.data() + write_len + read_len, src + write_len + read_len, send_len))
      << "SEND";

  const std::size_t up = relay.to_target.largest.load();
  const std::size_t down = relay.to_initiator.largest.load();
  const std::size_t up_n = relay.to_target.fpdus.load();
  const std::size_t down_n = relay.to_initiator.fpdus.load();
  if (large) {
    EXPECT_GT(up, ia.mss) << "initiator's WRITE/SEND FPDUs";
    EXPECT_GT(down, ta.mss) << "target's READ response FPDUs";
    EXPECT_LE(up, 65536u);
    EXPECT_LE(down, 65536u);
    // 1.25 MiB in ~64 KiB FPDUs, plus RTR, READ request and confirmations.
    EXPECT_LT(up_n, 64u);
    EXPECT_LT(down_n, 64u);
  } else {
    EXPECT_LE(up, ia.mss) << "an initiator FPDU above its MSS";
    EXPECT_LE(down, ta.mss) << "a target FPDU above its MSS";
    EXPECT_GT(up_n, (write_len + send_len) / ia.mss);
    EXPECT_GT(down_n, read_len / ta.mss);
  }
  auto ac = a.qp.counters();
  ASSERT_TRUE(ac.iwarp);
  EXPECT_EQ(ac.iwarp->tx_fpdus + 1, up_n)
      << "the initiator's counter and the wire agree (the handshake's RTR is not counted)";
}

INSTANTIATE_TEST_SUITE_P(large_fpdus, soft_pair,
                         testing::Values(soft_case{true, true, true}, soft_case{true, true, false},
                                         soft_case{false, true, true},
                                         soft_case{true, false, true}),
                         case_name);

// ---- raw peers: siw's echo, a Conveyor responder, a raw initiator ----------

// A soft initiator (large_fpdus as given) connected to a raw listener with a
// small MSS that answers with reply_flags (H is added by the encoder); the
// raw side gets the RTR. Returns the peer; `req_flags` gets the Request's.
struct raw_responder_conn {
  endpoint ep;
  raw_peer p;
  std::uint8_t req_flags = 0;
  connection_info info;
  explicit raw_responder_conn(bool large) : ep(large, true) {}
};

std::unique_ptr<raw_responder_conn> connect_to_raw(bool large,
                                                   std::uint8_t (*reply_flags)(std::uint8_t)) {
  auto c = std::make_unique<raw_responder_conn>(large);
  cvp::raw_listener rl(small_mss);
  auto fut = std::async(std::launch::async, [&] {
    return connect(c->ep.qp, "127.0.0.1:" + std::to_string(rl.port()), {.timeout = 5s});
  });
  c->p = rl.accept_one();
  auto req = c->p.read_mpa(false);
  if (!req) return nullptr;
  c->req_flags = req->flags;
  mpa_frame rep;
  rep.reply = true;
  rep.revision = 2;
  rep.flags = reply_flags(req->flags);
  rep.v2 = mpa_v2_words{8, 8, true, false, true, false};
  if (!c->p.send_all(encode_mpa(rep))) return nullptr;
  c->p.set_crc(true);
  auto rtr = c->p.read_fpdu();
  if (!rtr) return nullptr;
  auto info = fut.get();
  if (!info) return nullptr;
  c->info = std::move(*info);
  return c;
}

// Posts an unsignaled 256 KiB WRITE from the soft side and reads its FPDUs:
// the largest one, and the payload (compared with the source).
testing::AssertionResult write_fpdus(raw_responder_conn& c, std::size_t& largest) {
  constexpr std::size_t n = 256 << 10;
  fill(std::span(c.ep.mr.data(), n), 9);
  const sge src = c.ep.mr.slice(0, n);
  send_wr w{.wr_id = 1,
            .opcode = wr_opcode::rdma_write,
            .flags = {},
            .sg_list = std::span(&src, 1),
            .remote_addr = 0x10000,
            .rkey = 0x1234};
  if (c.ep.qp.post_send(w) != errc::ok) return testing::AssertionFailure() << "post_send";
  std::vector<std::byte> got;
  largest = 0;
  for (bool last = false; !last;) {
    auto f = c.p.read_fpdu();
    if (!f) return testing::AssertionFailure() << "no FPDU after " << got.size() << " bytes";
    if (!check_fpdu_crc(*f)) return testing::AssertionFailure() << "bad CRC";
    auto h = parse_fpdu_header(*f);
    if (!h || h->opcode != rdmap_op::write || h->stag != 0x1234 || h->to != 0x10000 + got.size())
      return testing::AssertionFailure() << "not the next WRITE FPDU at " << got.size();
    largest = std::max(largest, f->size());
    got.insert(got.end(), f->begin() + static_cast<long>(h->header_len),
               f->begin() + static_cast<long>(h->header_len + h->payload_len));
    last = h->last;
  }
  if (got.size() != n || std::memcmp(got.data(), c.ep.mr.data(), n) != 0)
    return testing::AssertionFailure() << "payload differs (" << got.size() << " bytes)";
  return testing::AssertionSuccess();
}

TEST(large_fpdus, soft_request_offers_0x08_and_siw_s_echo_keeps_fpdus_within_the_mss) {
  // Linux siw (siw_cm.c, siw_proc_mpareq) answers with the Request's flag
  // byte: 0x08 and ext_offer come back, without ext_ack.
  auto c = connect_to_raw(true, [](std::uint8_t f) -> std::uint8_t { return f; });
  ASSERT_TRUE(c);
  EXPECT_EQ(c->req_flags & (mpa_flag::large_fpdus | mpa_flag::ext_offer),
            mpa_flag::large_fpdus | mpa_flag::ext_offer);
  EXPECT_FALSE(c->info.attr.iwarp->large_fpdus);
  EXPECT_FALSE(c->info.attr.extensions);
  const int mss = c->p.mss();
  ASSERT_GT(mss, 0);
  ASSERT_LE(mss, small_mss);
  std::size_t largest = 0;
  ASSERT_TRUE(write_fpdus(*c, largest));
  EXPECT_LE(largest, c->info.attr.iwarp->mss);
  EXPECT_LE(largest, std::size_t(mss));
}

TEST(large_fpdus, a_reply_with_ext_ack_and_0x08_gets_64_kib_fpdus) {
  auto c = connect_to_raw(true, [](std::uint8_t f) -> std::uint8_t {
    return static_cast<std::uint8_t>((f & mpa_flag::crc) | mpa_flag::ext_ack |
                                     mpa_flag::large_fpdus);
  });
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->info.attr.iwarp->large_fpdus);
  EXPECT_EQ(c->info.attr.iwarp->max_fpdu, 65536u);
  std::size_t largest = 0;
  ASSERT_TRUE(write_fpdus(*c, largest));
  EXPECT_GT(largest, std::size_t(c->p.mss()));
  EXPECT_EQ(largest, 65536u) << "full FPDUs of 64 KiB: 16 + 65516 + 4";
}

TEST(large_fpdus, an_initiator_with_large_fpdus_off_neither_offers_nor_sends_them) {
  auto c = connect_to_raw(false, [](std::uint8_t f) -> std::uint8_t {
    return static_cast<std::uint8_t>((f & mpa_flag::crc) | mpa_flag::ext_ack |
                                     mpa_flag::large_fpdus);
  });
  ASSERT_TRUE(c);
  EXPECT_EQ(c->req_flags & mpa_flag::large_fpdus, 0);
  EXPECT_FALSE(c->info.attr.iwarp->large_fpdus);
  std::size_t largest = 0;
  ASSERT_TRUE(write_fpdus(*c, largest));
  EXPECT_LE(largest, std::size_t(c->p.mss()));
}

// A raw initiator with a small MSS against a soft target (large_fpdus as
// given) asking with req_flags; READs 64 KiB back. The Reply's flags and the
// largest READ response FPDU are returned.
struct target_result {
  std::uint8_t reply_flags = 0;
  std::size_t largest = 0;
  bool large_attr = false;
  int mss = 0;
};
testing::AssertionResult read_from_target(bool large, std::uint8_t req_flags, target_result& r) {
  endpoint t(large, false);
  auto lis = listener::bind(t.dev, "127.0.0.1:0").value();
  auto fut = std::async(std::launch::async, [&]() -> result<connection_info> {
    auto req = lis.accept(5s);
    if (!req) return std::unexpected(req.error());
    return req->accept(t.qp, {});
  });
  raw_peer p = raw_peer::connect_to(lis.port(), 0, small_mss);
  if (p.fd() < 0) return testing::AssertionFailure() << "connect";
  r.mss = p.mss();
  mpa_frame f;
  f.flags = req_flags;
  f.revision = 2;
  f.v2 = mpa_v2_words{4, 4, true, false, true, false};
  if (!p.send_all(encode_mpa(f))) return testing::AssertionFailure() << "request";
  auto rep = p.read_mpa(true);
  if (!rep) return testing::AssertionFailure() << "no reply";
  r.reply_flags = rep->flags;
  p.set_crc(rep->crc());
  std::vector<std::byte> rtr(fpdu_size(ddp::tagged_hdr));
  write_tagged_header(rtr.data(), rdmap_op::write, true, 1, 0, 0);
  finish_fpdu(rtr, p.crc());
  p.send_all(rtr);
  auto info = fut.get();
  if (!info) return testing::AssertionFailure() << info.error().to_string();
  r.large_attr = info->attr.iwarp->large_fpdus;
  constexpr std::uint32_t n = 64 << 10;
  fill(std::span(t.mr.data(), n), 5);
  // The RTR lands before the READ: the QP is live once accept returned and the
  // pump saw the RTR; the READ request waits in the socket until then.
  if (!p.send_all(encode_read_request({0x77, 0, n, t.mr.rkey(), t.mr.addr()}, 1, p.crc())))
    return testing::AssertionFailure() << "READ request";
  std::vector<std::byte> got;
  for (bool last = false; !last;) {
    auto resp = p.read_fpdu();
    if (!resp) return testing::AssertionFailure() << "no READ response";
    auto h = parse_fpdu_header(*resp);
    if (!h || h->opcode != rdmap_op::read_response)
      return testing::AssertionFailure() << "not a READ response";
    r.largest = std::max(r.largest, resp->size());
    got.insert(got.end(), resp->begin() + static_cast<long>(h->header_len),
               resp->begin() + static_cast<long>(h->header_len + h->payload_len));
    last = h->last;
  }
  if (got.size() != n || std::memcmp(got.data(), t.mr.data(), n) != 0)
    return testing::AssertionFailure() << "READ payload differs";
  return testing::AssertionSuccess();
}

TEST(large_fpdus, soft_target_answers_0x08_with_ext_ack_and_0x08_and_sends_64_kib_fpdus) {
  target_result r;
  ASSERT_TRUE(read_from_target(true, mpa_flag::ext_offer | mpa_flag::large_fpdus, r));
  EXPECT_EQ(r.reply_flags & (mpa_flag::ext_ack | mpa_flag::ext_offer | mpa_flag::large_fpdus),
            mpa_flag::ext_ack | mpa_flag::large_fpdus);
  EXPECT_TRUE(reply_accepts_large_fpdus(r.reply_flags));
  EXPECT_TRUE(r.large_attr);
  ASSERT_LE(r.mss, small_mss);
  EXPECT_EQ(r.largest, 65536u);
}

TEST(large_fpdus, soft_target_keeps_fpdus_within_the_mss_for_an_initiator_without_0x08) {
  // Linux siw's Request (try_gso is false in mainline: siw_main.c): no 0x08.
  target_result r;
  ASSERT_TRUE(read_from_target(true, mpa_flag::crc, r));
  EXPECT_TRUE(r.reply_flags & mpa_flag::large_fpdus) << "the target still says it accepts them";
  EXPECT_FALSE(r.large_attr);
  ASSERT_GT(r.mss, 0);
  EXPECT_LE(r.largest, std::size_t(r.mss));
}

TEST(large_fpdus, soft_target_with_large_fpdus_off_neither_answers_0x08_nor_sends_them) {
  target_result r;
  ASSERT_TRUE(read_from_target(false, mpa_flag::ext_offer | mpa_flag::large_fpdus, r));
  EXPECT_EQ(r.reply_flags & mpa_flag::large_fpdus, 0);
  EXPECT_FALSE(r.large_attr);
  EXPECT_LE(r.largest, std::size_t(r.mss));
}

// Receiving is never negotiated (as on Linux siw, whose receive path takes the
// FPDU's length from mpa_len alone): a 64 KiB WRITE FPDU from a peer whose
// Request had no 0x08, on a connection with an MSS of 1000, is placed whole and
// its CRC checked; a READ of the same bytes comes back intact.
TEST(large_fpdus, soft_receives_a_64_kib_fpdu_from_a_peer_that_did_not_offer_them) {
  endpoint t(true, true);
  auto lis = listener::bind(t.dev, "127.0.0.1:0").value();
  auto fut = std::async(std::launch::async, [&]() -> result<connection_info> {
    auto req = lis.accept(5s);
    if (!req) return std::unexpected(req.error());
    return req->accept(t.qp, {});
  });
  raw_peer p = raw_peer::connect_to(lis.port(), 0, small_mss);
  ASSERT_GE(p.fd(), 0);
  mpa_frame f;
  f.flags = mpa_flag::crc;
  f.revision = 2;
  f.v2 = mpa_v2_words{4, 4, true, false, true, false};
  ASSERT_TRUE(p.send_all(encode_mpa(f)));
  auto rep = p.read_mpa(true);
  ASSERT_TRUE(rep.has_value());
  p.set_crc(true);
  std::vector<std::byte> rtr(fpdu_size(ddp::tagged_hdr));
  write_tagged_header(rtr.data(), rdmap_op::write, true, 1, 0, 0);
  finish_fpdu(rtr, true);
  ASSERT_TRUE(p.send_all(rtr));
  auto info = fut.get();
  ASSERT_TRUE(info.has_value()) << info.error().to_string();
  EXPECT_FALSE(info->attr.iwarp->large_fpdus);
  ASSERT_LE(p.mss(), small_mss);
  std::vector<std::byte> data(max_ulpdu - ddp::tagged_hdr - 1);  // ULPDU_Length 65534
  fill(data, 11);
  const auto fpdu = encode_tagged(rdmap_op::write, true, t.mr.rkey(), t.mr.addr() + 8, data, true);
  ASSERT_EQ(fpdu.size(), fpdu_size(max_ulpdu - 1));
  ASSERT_TRUE(p.send_all(fpdu));
  const auto n = static_cast<std::uint32_t>(data.size());
  ASSERT_TRUE(p.send_all(encode_read_request({0x77, 0, n, t.mr.rkey(), t.mr.addr() + 8}, 1, true)));
  std::vector<std::byte> got;
  for (bool last = false; !last;) {
    auto resp = p.read_fpdu();
    ASSERT_TRUE(resp.has_value()) << "no READ response: the large FPDU was refused?";
    auto h = parse_fpdu_header(*resp);
    ASSERT_TRUE(h.has_value());
    ASSERT_EQ(h->opcode, rdmap_op::read_response);
    EXPECT_LE(resp->size(), std::size_t(p.mss())) << "the target's own FPDUs stay within the MSS";
    got.insert(got.end(), resp->begin() + static_cast<long>(h->header_len),
               resp->begin() + static_cast<long>(h->header_len + h->payload_len));
    last = h->last;
  }
  EXPECT_EQ(got, data);
  EXPECT_EQ(0, std::memcmp(t.mr.data() + 8, data.data(), data.size()));
  EXPECT_EQ(t.qp.state(), qp_state::rts);
}

}  // namespace
}  // namespace large_fpdu_test
