// Stateful libFuzzer target for the shm provider's target side: each input is a
// hostile peer. It performs the handshake of shm_cm.cpp with a real shm QP (in
// this process, manual progress), then the input is a program of actions on the
// live segment: write request slots (any header, payload bytes), move the
// request ring's head, consume or lie about the response ring's tail, rewrite
// the slot the target is working on, poke the other words of the header, and
// drive the target's engine between actions.
//
// The target's memory: canary-guarded regions of two PDs with different rights
//   A  PD1, local_write | remote read/write/atomic  (the peer may change it)
//   B  PD1, remote_read only
//   C  PD2, every right (another protection domain)
//   D  PD1, local_write only (no remote right)
//   R  PD1, receive buffers (the peer's SENDs land here)
// with marker-filled guards before and between them, and an inaccessible tail
// right after A (larger than a response ring: a READ running past A faults).
// Properties, after every input:
//  - no byte outside A and R changed (guards, B, C, D byte for byte);
//  - no response the target wrote into the segment carries guard, C or D bytes
//    (24 in a row or more)
//    (those carry a per-process marker the peer cannot know);
//  - the target neither crashes nor trips a sanitizer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "fuzz_check.hpp"
#include "fuzz_socket.hpp"
#include "providers/shm/wire/segment.hpp"

namespace {

using namespace std::chrono_literals;
using conveyor::access;
namespace shm = conveyor::shm;

constexpr std::size_t region = 64 * 1024, recv_len = 16 * 1024, guard = 8 * 1024;
// A is larger than a response ring's worth (256 x 8128 bytes): a staged READ of
// it blocks half way, and the peer can rewrite the request meanwhile.
constexpr std::size_t big_region = 3 << 20, tail_guard = 3 << 20;
constexpr int n_areas = 5;  // A B C D R
constexpr std::size_t recv_slice = 4096;

// A multiplicative bijection: property checks compare hashes, so that the
// fuzzer's comparison tracing never hands it the marker itself.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}

struct world {
  conveyor::device dev;
  conveyor::protection_domain pd1, pd2;
  conveyor::completion_queue cq;
  std::unique_ptr<conveyor::listener> lis;
  std::string addr;
  std::byte* mem = nullptr;
  std::size_t mem_len = 0;
  std::byte* area[n_areas]{};
  std::size_t area_len[n_areas]{};
  std::vector<conveyor::memory_region> mrs;
  std::uint32_t keys[n_areas]{};
  std::vector<std::byte> reference;  // the whole buffer as set up (but the tail)
  std::uint64_t marker = 0;
  std::uint64_t marker_hash[8]{};  // of each byte rotation

  world() {
    conveyor::device_options o;
    o.progress = conveyor::progress_mode::manual;
    ::setenv("CONVEYOR_SHM_CMA", "off", 1);  // no cross-memory attach: the peer is this process
    dev = std::move(*conveyor::device::open("shm:fuzz-" + std::to_string(::getpid()), o));
    pd1 = std::move(*dev.alloc_pd());
    pd2 = std::move(*dev.alloc_pd());
    cq = std::move(*dev.create_cq({.depth = 4096}));
    addr = "@cvt-fuzz-shm-" + std::to_string(::getpid());
    lis = std::make_unique<conveyor::listener>(std::move(*conveyor::listener::bind(dev, addr)));
    // In memory: guard B guard C guard D guard R guard A tail. The tail is
    // inaccessible and longer than a response ring's worth: an access that runs
    // past A faults at once.
    mem_len = guard + 3 * (region + guard) + recv_len + guard + big_region + tail_guard;
    mem = static_cast<std::byte*>(
        ::mmap(nullptr, mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ::mprotect(mem + mem_len - tail_guard, tail_guard, PROT_NONE);
    std::random_device rd;
    marker = (std::uint64_t(rd()) << 32 | rd()) | 0x0101010101010101ull;
    for (std::size_t i = 0; i < mem_len - tail_guard; ++i)
      mem[i] = static_cast<std::byte>(marker >> (8 * (i % 8)));
    for (int r = 0; r < 8; ++r) {
      std::uint64_t w;
      std::byte b[8];
      for (int k = 0; k < 8; ++k) b[k] = static_cast<std::byte>(marker >> (8 * ((r + k) % 8)));
      std::memcpy(&w, b, 8);
      marker_hash[r] = mix(w);
    }
    std::byte* p = mem + guard;
    for (int a : {1, 2, 3, 4, 0}) {
      area[a] = p;
      area_len[a] = a == 0 ? big_region : a == 4 ? recv_len : region;
      p += area_len[a] + guard;
    }
    // B is readable by the peer: fill it with bytes that are not the marker.
    for (std::size_t i = 0; i < region; ++i) area[1][i] = static_cast<std::byte>(i * 13 + 5);
    reset_writable();
    reference.assign(mem, mem + mem_len - tail_guard);
  }
  // Registered afresh for every input: a peer may legitimately invalidate a
  // key (SEND with Invalidate), and each input starts from the same state.
  void register_all() {
    mrs.clear();
    const access remote = access::remote_read | access::remote_write | access::remote_atomic;
    // A and C are invalidatable; B and the local areas never are.
    const access rights[n_areas] = {access::local_write | remote | access::remote_invalidate,
                                    access::remote_read,
                                    access::local_write | remote | access::remote_invalidate,
                                    access::local_write, access::local_write};
    for (int a = 0; a < n_areas; ++a) {
      auto& pd = a == 2 ? pd2 : pd1;
      auto mr = pd.register_memory(std::span(area[a], area_len[a]), rights[a]);
      FUZZ_CHECK(mr.has_value());
      mrs.push_back(std::move(*mr));
      keys[a] = mrs.back().rkey();
    }
  }
  void reset_writable() {
    // A starts as zeros: dropping its pages is the cheap way back (page aligned).
    ::madvise(area[0], big_region, MADV_DONTNEED);
    std::memset(area[4], 0, recv_len);
  }
  // Every byte but those of A and R (R lies before A) as set up.
  bool outside_untouched() const {
    const std::size_t r = static_cast<std::size_t>(area[4] - mem);
    const std::size_t a = static_cast<std::size_t>(area[0] - mem);
    const std::size_t keep[][2] = {{0, r}, {r + recv_len, a}};
    for (const auto& k : keep)
      if (std::memcmp(mem + k[0], reference.data() + k[0], k[1] - k[0]) != 0) return false;
    return true;
  }
  // No 24 bytes of marker (a guard, C or D) anywhere in [p, p+n): any 24 such
  // bytes hold two consecutive aligned words, equal and each a rotation of the
  // marker, so the aligned words are enough to look at.
  bool no_marker(const std::byte* p, std::size_t n) const {
    for (std::size_t i = 0; i + 16 <= n; i += 8) {
      std::uint64_t w, w2;
      std::memcpy(&w, p + i, 8);
      std::memcpy(&w2, p + i + 8, 8);
      if (w != w2) continue;
      const std::uint64_t h = mix(w);
      for (auto mh : marker_hash)
        if (h == mh) return false;
    }
    return true;
  }
};

world& the_world() {
  static world w;
  return w;
}

// The input, read as a stream of little-endian fields (zeros when exhausted).
struct reader {
  const std::uint8_t* p;
  std::size_t n;
  bool empty() const { return n == 0; }
  template <class T>
  T get() {
    T v{};
    const std::size_t k = std::min(sizeof v, n);
    std::memcpy(&v, p, k);
    p += k;
    n -= k;
    return v;
  }
};

class peer {
 public:
  bool connect(world& w) {
    fd_ = shm_memfd();
    if (fd_ < 0) return false;
    void* m = ::mmap(nullptr, shm::seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) return false;
    map_ = static_cast<std::byte*>(m);
    hdr_ = new (m) shm::seg_header();
    hdr_->magic = shm::seg_magic;
    hdr_->version = shm::seg_version;
    hdr_->slots = shm::ring_slots;
    hdr_->slot_bytes = shm::slot_size;
    view_ = {hdr_, map_, 0};
    sock_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, w.addr.data(), w.addr.size());
    sa.sun_path[0] = '\0';
    if (conveyor::fuzz::connect_within(
            sock_, reinterpret_cast<sockaddr*>(&sa),
            static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + w.addr.size()),
            std::chrono::seconds(2)) != 0)
      return false;
    // Request and ready at once: the target reads both from the socket buffer.
    shm::hs_msg req;
    req.kind = shm::hs_kind::request;
    req.ird = req.ord = 16;
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
    ssize_t sent;
    do sent = ::sendmsg(sock_, &mh, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != static_cast<ssize_t>(sizeof req)) return false;
    shm::hs_msg ready;
    ready.kind = shm::hs_kind::ready;
    return conveyor::fuzz::send_all(sock_, std::as_bytes(std::span(&ready, 1)));
  }
  ~peer() {
    if (map_) ::munmap(map_, shm::seg_size);
    if (sock_ >= 0) ::close(sock_);
    if (fd_ >= 0) ::close(fd_);
  }
  void bell() const {
    const char b = 1;
    [[maybe_unused]] auto r = ::send(sock_, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  shm::seg_header* hdr() const { return hdr_; }
  std::byte* slot(int ring, std::uint64_t pos) const { return view_.slot(ring, pos); }

 private:
  static int shm_memfd() {
    const int fd = ::memfd_create("fuzz-peer-seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    if (::ftruncate(fd, static_cast<off_t>(shm::seg_size)) != 0 ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  int fd_ = -1, sock_ = -1;
  std::byte* map_ = nullptr;
  shm::seg_header* hdr_ = nullptr;
  shm::seg_view view_;
};

void pump(world& w, int rounds) {
  conveyor::work_completion wcs[64];
  for (int i = 0; i < rounds; ++i) (void)w.cq.poll(wcs);
}

std::uint64_t pick_addr(world& w, reader& in, int* area) {
  const std::uint8_t sel = in.get<std::uint8_t>();
  const auto off = in.get<std::int32_t>();
  *area = sel % 8;
  if (*area >= n_areas) return in.get<std::uint64_t>();  // anything at all
  return reinterpret_cast<std::uint64_t>(w.area[*area]) +
         static_cast<std::int64_t>(off % static_cast<std::int32_t>(big_region + region));
}

void write_request(world& w, peer& p, reader& in, std::uint64_t pos) {
  shm::msg_header m{};
  m.op = static_cast<shm::msg_op>(1 + in.get<std::uint8_t>() % 12);
  m.flags = in.get<std::uint8_t>();
  m.nsge = in.get<std::uint8_t>() % 20;
  const auto len = in.get<std::uint16_t>();
  m.len = len > 0xF000 ? in.get<std::uint32_t>() : len % (shm::slot_payload + 64);
  int area = 0;
  m.raddr = pick_addr(w, in, &area);
  const std::uint8_t ksel = in.get<std::uint8_t>();
  m.rkey = ksel < 200 ? w.keys[ksel % n_areas] : in.get<std::uint32_t>();
  const auto total = in.get<std::uint32_t>();
  m.total = (total >> 31) ? in.get<std::uint64_t>() : total % (big_region + region);
  m.off = in.get<std::uint16_t>();
  if (m.off & 0x8000) m.off = in.get<std::uint64_t>();
  m.id = in.get<std::uint8_t>();
  m.imm = in.get<std::uint8_t>() < 128 ? w.keys[m.flags % n_areas] : in.get<std::uint32_t>();
  m.cmp = in.get<std::uint64_t>();
  m.swap = in.get<std::uint64_t>();
  std::byte* s = p.slot(0, pos);
  std::memcpy(s, &m, sizeof m);
  // Payload: a few bytes from the input (SGE pairs for descriptor ops), the
  // rest of the slot keeps whatever it held.
  const std::size_t n = std::min<std::size_t>(in.get<std::uint8_t>(), in.n);
  std::memcpy(s + shm::slot_header, in.p, n);
  in.p += n;
  in.n -= n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  world& w = the_world();
  w.reset_writable();
  w.register_all();
  auto qp = w.pd1.create_qp({.send_cq = &w.cq, .recv_cq = &w.cq});
  FUZZ_CHECK(qp.has_value());
  for (std::size_t k = 0; k < recv_len / recv_slice; ++k)
    FUZZ_CHECK(qp->post_recv(w.mrs[4].slice(k * recv_slice, recv_slice), k) == conveyor::errc::ok);
  {
    peer p;
    FUZZ_CHECK(p.connect(w));
    auto req = w.lis->accept(2s);
    FUZZ_CHECK(req.has_value());
    auto info = req->accept(*qp, {});
    FUZZ_CHECK(info.has_value());
    reader in{data, size};
    std::uint64_t head = 0, rtail = 0;
    shm::ring_ctl& rq = p.hdr()->req[0];
    shm::ring_ctl& rs = p.hdr()->resp[1];
    for (int step = 0; step < 64 && !in.empty(); ++step) {
      switch (in.get<std::uint8_t>() % 8) {
        case 0:
        case 1:  // a request at the head, published
          write_request(w, p, in, head);
          rq.head.store(++head);
          break;
        case 2:  // several slots, then publish
          for (int k = 1 + in.get<std::uint8_t>() % 4; k > 0; --k) write_request(w, p, in, head++);
          rq.head.store(head);
          break;
        case 3:  // rewrite the slot the target works on (its tail)
          write_request(w, p, in, rq.tail.load());
          break;
        case 4: {  // consume responses, honestly or not
          const auto v = in.get<std::uint8_t>();
          if (v < 200) {
            const std::uint64_t h = rs.head.load();
            rtail = std::min(h, rtail + v);
          } else {
            rtail = in.get<std::uint64_t>();
          }
          rs.tail.store(rtail);
          break;
        }
        case 5:  // an arbitrary request head
          head =
              in.get<std::uint8_t>() < 128 ? head + in.get<std::int8_t>() : in.get<std::uint64_t>();
          rq.head.store(head);
          break;
        case 6: {  // the other words the peer can write
          const auto which = in.get<std::uint8_t>() % 5;
          const auto v = in.get<std::uint64_t>();
          if (which == 0) p.hdr()->sleeping0.store(static_cast<std::uint32_t>(v));
          if (which == 1) p.hdr()->sleeping1.store(static_cast<std::uint32_t>(v));
          if (which == 2) p.hdr()->req[1].tail.store(v);
          if (which == 3) p.hdr()->resp[0].tail.store(v);
          if (which == 4) rq.err_status.store(static_cast<std::uint32_t>(v));
          break;
        }
        default:
          break;
      }
      p.bell();
      pump(w, 1 + in.get<std::uint8_t>() % 4);
    }
    pump(w, 8);
    // What the target wrote for us: no marker bytes in any response slot.
    const std::uint64_t produced = std::min<std::uint64_t>(rs.head.load(), shm::ring_slots);
    for (std::uint64_t k = 0; k < produced; ++k)
      FUZZ_CHECK(w.no_marker(p.slot(3, k) + shm::slot_header, shm::slot_payload));
    qp->disconnect();
  }
  pump(w, 2);
  FUZZ_CHECK(w.outside_untouched());
  return 0;
}
