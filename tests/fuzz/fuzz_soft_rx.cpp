// Stateful libFuzzer target for the soft provider's receive path: each input
// becomes the byte stream of a raw peer connected over loopback TCP to a real
// soft QP (MPA handshake done by the harness, RFC 7306 offered, CRC and the
// large-FPDU flag 0x08 chosen by the first byte: with 0x08 the target answers
// READs with 64 KiB FPDUs). The rest of the input is a program of operations that the
// harness encodes with the project's wire codecs: WRITEs, READ requests,
// SENDs (with and without invalidate, solicited), atomics, immediate data,
// unsolicited READ/atomic responses, Terminates and raw bytes, naming regions
// of two protection domains and several rights, or bogus keys, at arbitrary
// offsets, with MSNs right or wrong. The placement, READ and atomic
// responders and the Terminate handling all run on it.
//
// Property: no byte outside the regions the stream was entitled to write
// (PD A's remote-write/atomic region and the posted receive buffers)
// changes: canary gaps surround every region, and the read-only, local-only
// and other-PD regions must stay as they were.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "fuzz_check.hpp"
#include "fuzz_socket.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace conveyor;
using namespace conveyor::wire;
using namespace std::chrono_literals;

constexpr std::byte canary{0xC5};
constexpr std::size_t gap = 512;
constexpr std::size_t arena_size = 128 * 1024;

struct reader {
  const std::uint8_t* p;
  std::size_t n;
  bool empty() const { return n == 0; }
  std::uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() << 8 | u8()); }
  std::uint32_t u32() { return std::uint32_t(u16()) << 16 | u16(); }
  std::uint64_t u64() { return std::uint64_t(u32()) << 32 | u32(); }
  std::span<const std::byte> take(std::size_t k) {
    k = std::min(k, n);
    auto s = std::span(reinterpret_cast<const std::byte*>(p), k);
    p += k;
    n -= k;
    return s;
  }
};

struct world {
  device dev;
  protection_domain pd_a, pd_b;
  completion_queue cq;
  listener lis;
  std::vector<std::byte> arena = std::vector<std::byte>(arena_size, canary);
  // Regions in the arena: offset, size.
  struct span_t {
    std::size_t off, len;
  };
  span_t rw{gap, 32 * 1024};                            // PD A, remote write/read/atomic
  span_t ro{rw.off + rw.len + gap, 8 * 1024};           // PD A, remote read only
  span_t local{ro.off + ro.len + gap, 8 * 1024};        // PD A, local write only
  span_t other{local.off + local.len + gap, 8 * 1024};  // PD B, every right
  span_t recv{other.off + other.len + gap, 8 * 256};    // PD A, receive buffers
  std::vector<std::byte> snapshot;                      // what the non-entitled bytes must hold

  world() {
    device_options o;
    o.software.request_crc = false;
    o.handshake_timeout_ms = 2000;
    dev = device::open("soft", o).value();
    pd_a = dev.alloc_pd().value();
    pd_b = dev.alloc_pd().value();
    cq = dev.create_cq({.depth = 4096}).value();
    lis = listener::bind(dev, "127.0.0.1:0").value();
    // Give the read-only and other-PD regions recognisable contents.
    for (std::size_t i = 0; i < ro.len; ++i) arena[ro.off + i] = std::byte(i * 13 + 1);
    for (std::size_t i = 0; i < other.len; ++i) arena[other.off + i] = std::byte(i * 7 + 3);
    snapshot = arena;
  }
  std::span<std::byte> bytes(span_t s) { return std::span(arena).subspan(s.off, s.len); }
  std::uint64_t addr(span_t s) const {
    return reinterpret_cast<std::uint64_t>(arena.data() + s.off);
  }
  bool entitled(std::size_t i) const {
    return (i >= rw.off && i < rw.off + rw.len) || (i >= recv.off && i < recv.off + recv.len);
  }
};

world& the_world() {
  static world w;
  return w;
}

// A raw peer's connection, or -errno. Each input's peer closes first, so its
// port would sit in TIME_WAIT for a minute: linger 0 makes the close an abort
// instead, or tens of thousands of inputs use up the ephemeral ports.
int connect_raw(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  const linger no_linger{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_linger, sizeof no_linger);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (const int e = conveyor::fuzz::connect_within(fd, reinterpret_cast<sockaddr*>(&a), sizeof a,
                                                   std::chrono::seconds(2));
      e != 0) {
    ::close(fd);
    return e;
  }
  return fd;
}

void drain(int fd) {
  std::byte buf[16384];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

// The keys and addresses a program may name.
struct names {
  std::uint32_t key[6];
  std::uint64_t base[6];
  std::size_t len[6];
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  world& w = the_world();
  reader in{data, size};
  const std::uint8_t mode = in.u8();
  const bool crc = mode & 1;
  const bool large = mode & 2;

  const conveyor::access all = conveyor::access::local_write | conveyor::access::remote_write |
                               conveyor::access::remote_read | conveyor::access::remote_atomic;
  // Fresh registrations each input: a Send with Invalidate may have revoked one
  // (rw and other are invalidatable; ro, local and recv never are).
  auto rw =
      w.pd_a.register_memory(w.bytes(w.rw), all | conveyor::access::remote_invalidate).value();
  auto ro = w.pd_a.register_memory(w.bytes(w.ro), conveyor::access::remote_read).value();
  auto local = w.pd_a.register_memory(w.bytes(w.local), conveyor::access::local_write).value();
  auto other =
      w.pd_b.register_memory(w.bytes(w.other), all | conveyor::access::remote_invalidate).value();
  auto recv = w.pd_a.register_memory(w.bytes(w.recv), conveyor::access::local_write).value();
  auto qp = w.pd_a.create_qp({.send_cq = &w.cq, .recv_cq = &w.cq, .max_dest_rd_atomic = 4}).value();
  for (std::uint32_t i = 0; i < 8; ++i) (void)qp.post_recv(recv.slice(i * 256, 256), i);
  const names nm{
      {rw.rkey(), ro.rkey(), local.lkey(), other.rkey(), recv.lkey(), 0x00FF1234u},
      {w.addr(w.rw), w.addr(w.ro), w.addr(w.local), w.addr(w.other), w.addr(w.recv), 0x1000},
      {w.rw.len, w.ro.len, w.local.len, w.other.len, w.recv.len, 4096}};

  const int fd = connect_raw(w.lis.port());
  if (fd < 0) std::fprintf(stderr, "connect to the listener: %s\n", std::strerror(-fd));
  FUZZ_CHECK(fd >= 0);
  {
    mpa_frame f;
    f.flags = static_cast<std::uint8_t>((crc ? mpa_flag::crc : 0) | mpa_flag::ext_offer |
                                        (large ? mpa_flag::large_fpdus : 0));
    f.revision = 2;
    f.v2 = mpa_v2_words{8, 8, true, false, true, false};
    auto req = encode_mpa(f);
    std::vector<std::byte> rtr(fpdu_size(ddp::tagged_hdr));
    write_tagged_header(rtr.data(), rdmap_op::write, true, 1, 0, 0);
    finish_fpdu(rtr, crc);
    req.insert(req.end(), rtr.begin(), rtr.end());
    FUZZ_CHECK(fuzz::send_all(fd, req));
  }
  auto creq = w.lis.accept(2s);
  FUZZ_CHECK(creq.has_value());
  auto info = creq->accept(qp, {});
  FUZZ_CHECK(info.has_value());
  FUZZ_CHECK(info->attr.extensions);
  FUZZ_CHECK(info->attr.iwarp && info->attr.iwarp->large_fpdus == large);

  // The program.
  std::vector<std::byte> stream;
  std::uint32_t msn[4] = {1, 1, 1, 1};
  auto pick = [&](std::uint8_t sel, std::uint32_t& key, std::uint64_t& base, std::size_t& len) {
    const std::size_t i = sel % 6;
    key = nm.key[i];
    base = nm.base[i];
    len = nm.len[i];
    if (sel & 0x80) key ^= 1u << (sel & 31);  // a near miss
  };
  auto put = [&](std::vector<std::byte> f) { stream.insert(stream.end(), f.begin(), f.end()); };
  for (int ops = 0; !in.empty() && ops < 64; ++ops) {
    const std::uint8_t op = in.u8();
    const std::uint8_t sel = in.u8();
    const std::uint8_t flags = in.u8();
    std::uint32_t key;
    std::uint64_t base;
    std::size_t len;
    pick(sel, key, base, len);
    // Offsets mostly inside the region, sometimes just outside or wild.
    const std::uint16_t o16 = in.u16();
    std::uint64_t to = base + (flags & 0x40 ? o16 : o16 % (len + 16));
    if ((flags & 0x30) == 0x30) to = in.u64();
    const bool wrong_msn = (flags & 0x0F) == 0x0F;
    switch (op % 10) {
      case 0: {  // WRITE
        const std::size_t n = in.u8() * 8u;
        put(encode_tagged(rdmap_op::write, flags & 1, key, to, in.take(n), crc));
        break;
      }
      case 1: {  // READ request
        const std::uint32_t q = qn::read_request;
        read_request rr{in.u32(), in.u64(), static_cast<std::uint32_t>(in.u16()), key, to};
        put(encode_read_request(rr, wrong_msn ? msn[q] + 7 : msn[q], crc));
        ++msn[q];
        break;
      }
      case 2: {  // SEND family
        static constexpr rdmap_op sends[] = {rdmap_op::send, rdmap_op::send_inv, rdmap_op::send_se,
                                             rdmap_op::send_se_inv};
        const rdmap_op sop = sends[flags & 3];
        const std::size_t n = in.u8() * 2u;
        const std::uint32_t mo = flags & 0x80 ? in.u16() : 0;
        put(encode_untagged(sop, !(flags & 0x04), qn::send, wrong_msn ? msn[0] + 3 : msn[0], mo,
                            key, in.take(n), crc));
        if (!(flags & 0x04)) ++msn[0];
        break;
      }
      case 3: {  // atomic request
        atomic_request a;
        a.kind = flags & 1 ? atomic_kind::cmp_swap : atomic_kind::fetch_add;
        a.request_id = in.u32();
        a.stag = key;
        a.to = flags & 2 ? to : (to & ~std::uint64_t(7));
        a.add_swap = in.u64();
        a.compare = in.u64();
        put(encode_atomic_request(a, wrong_msn ? msn[qn::atomic] + 5 : msn[qn::atomic], crc));
        ++msn[qn::atomic];
        break;
      }
      case 4:  // immediate data
        put(encode_immediate(in.u64(), flags & 1, wrong_msn ? msn[0] + 2 : msn[0], crc));
        ++msn[0];
        break;
      case 5: {  // unsolicited READ response
        const std::size_t n = in.u8() * 4u;
        put(encode_tagged(rdmap_op::read_response, flags & 1, key, to, in.take(n), crc));
        break;
      }
      case 6:  // unsolicited atomic response
        put(encode_atomic_response({in.u32(), in.u64()}, msn[qn::atomic], crc));
        break;
      case 7: {  // Terminate with fuzzed fields
        terminate_msg t;
        t.layer = static_cast<term_layer>(flags % 3);
        t.etype = in.u8() & 0xF;
        t.ecode = in.u8();
        if (flags & 0x08) {
          auto h = in.take(flags & 0x10 ? ddp::tagged_hdr : ddp::untagged_hdr);
          t.ddp_header.assign(h.begin(), h.end());
        }
        if (flags & 0x20) {
          auto h = in.take(read_request_hdr);
          t.rdmap_header.assign(h.begin(), h.end());
        }
        put(encode_terminate(t, crc));
        break;
      }
      case 8: {  // raw bytes
        auto raw = in.take(in.u8());
        stream.insert(stream.end(), raw.begin(), raw.end());
        break;
      }
      default: {  // flip a byte of what is already there
        if (!stream.empty()) stream[in.u16() % stream.size()] ^= std::byte(in.u8() | 1);
        break;
      }
    }
  }

  // Feed it, then end the stream: the target sees EOF after the last byte
  // (or stops at its first Terminate), so its QP ends in ERROR either way.
  (void)fuzz::send_all(fd, stream);
  ::shutdown(fd, SHUT_WR);
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (qp.state() != qp_state::error && std::chrono::steady_clock::now() < until) {
    drain(fd);
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 1);
  }
  FUZZ_CHECK(qp.state() == qp_state::error);
  drain(fd);
  qp = queue_pair{};  // destroy: the engine no longer touches anything of it
  ::close(fd);
  // Completions are not checked here, only drained.
  work_completion wcs[64];
  while (true) {
    auto n = w.cq.poll(wcs);
    if (!n || *n == 0) break;
  }
  for (std::size_t i = 0; i < w.arena.size(); ++i)
    if (!w.entitled(i)) FUZZ_CHECK(w.arena[i] == w.snapshot[i]);
  return 0;
}
