// conveyor-demo — two processes, one RDMA connection, every verb once.
//
//   conveyor-demo --role target    --address 127.0.0.1:7471 [--crc on|off] [--device soft]
//   conveyor-demo --role initiator --address 127.0.0.1:7471 [--crc on|off] [--device soft]
//
// --device names the device to open on this side: "soft" (the default),
// "verbs:rxe0", "verbs:siw0", ... (see `conveyor devices`). Operations the
// device lacks (atomics and immediate data on iWARP NICs) are skipped with a
// note, and the initiator tells the target which ran so it checks the rest.
//
// The target registers a 16 MiB buffer and an 8-byte atomic slot with every
// remote right, publishes both keys in the connection's private data and then
// only waits for messages: the initiator's RDMA WRITEs, READs and atomics are
// served by the target's engine, with no target application thread involved.
// The target checks each two-sided message (SEND, SEND_WITH_IMM,
// WRITE_WITH_IMM) and answers it with a small SEND (the "ack"); on the final
// "done" message it checks every byte the initiator wrote, answers, prints one
// line and exits.
//
// The initiator runs each operation a modest number of times, verifies every
// byte (reads back what it wrote, checks every atomic's returned value, gets the
// target's verdict for each message) and prints a table. Any failure ends
// either side with a message and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <conveyor/conveyor.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace cvy = conveyor;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

// ------------------------------------------------------------------ layout ----
// Where the initiator writes inside the target's 16 MiB buffer. Both roles
// compile the same constants, so the target knows what to expect.
constexpr std::size_t kib = 1024, mib = 1024 * 1024;
constexpr std::size_t region_size = 16 * mib;

constexpr std::size_t bulk_off = 0, bulk_size = 1 * mib, bulk_iters = 14;         // [0, 14 MiB)
constexpr std::size_t small_off = 14 * mib, small_size = 64, small_iters = 1000;  // 62.5 KiB
constexpr std::size_t imm_off = 15 * mib, imm_size = 4 * kib, imm_iters = 200;    // 800 KiB
constexpr std::size_t send_size = 4 * kib, send_iters = 200;
constexpr std::size_t send_imm_size = 256, send_imm_iters = 200;
constexpr std::size_t atomic_iters = 1000;
constexpr std::uint64_t atomic_initial = 0x1000'0000'0000'0000ull;
constexpr std::uint64_t swap_step = 0x10001;
constexpr std::uint64_t atomic_final = atomic_initial + atomic_iters + atomic_iters * swap_step;

static_assert(bulk_off + bulk_size * bulk_iters <= small_off);
static_assert(small_off + small_size * small_iters <= imm_off);
static_assert(imm_off + imm_size * imm_iters <= region_size);

// Messages (SEND payloads) start with this header; acks are just the header
// followed by a short text.
enum msg_kind : std::uint32_t {
  kind_send = 1,
  kind_send_imm = 2,
  kind_write_imm = 3,
  kind_done = 9
};
constexpr std::uint32_t msg_magic = 0x43565944;  // "CVYD"
constexpr std::uint32_t ack_magic = 0x43565941;  // "CVYA"
struct msg_header {
  std::uint32_t magic = 0;
  std::uint32_t kind = 0;
  std::uint32_t seq = 0;
  std::uint32_t status = 0;  // acks: 0 = verified, 1 = mismatch
};
constexpr std::size_t ack_size = 256;       // header + text
constexpr std::size_t recv_slot = 8 * kib;  // target receive buffers
constexpr std::size_t recv_slots = 16;

std::uint32_t imm_for(std::uint32_t seq) {
  return 0xC0DE0000u | seq;
}
// The done message's seq: which optional operations the initiator ran.
constexpr std::uint32_t ran_atomics = 1, ran_immediate = 2;

// The byte pattern: 64-bit words derived from their position (and a salt).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
void fill_pattern(std::byte* p, std::size_t len, std::uint64_t first_word, std::uint64_t salt) {
  for (std::size_t i = 0; i < len / 8; ++i) {
    std::uint64_t v = mix((first_word + i) ^ salt);
    std::memcpy(p + i * 8, &v, 8);
  }
}
// Offset of the first byte that differs from the pattern, or npos.
std::size_t check_pattern(const std::byte* p, std::size_t len, std::uint64_t first_word,
                          std::uint64_t salt) {
  for (std::size_t i = 0; i < len / 8; ++i) {
    std::uint64_t want = mix((first_word + i) ^ salt), got;
    std::memcpy(&got, p + i * 8, 8);
    if (got != want) return i * 8;
  }
  return std::string::npos;
}
std::size_t first_nonzero(const std::byte* p, std::size_t len) {
  for (std::size_t i = 0; i < len; ++i)
    if (p[i] != std::byte{0}) return i;
  return std::string::npos;
}
// The region's pattern is a function of the offset inside the target buffer.
constexpr std::uint64_t region_salt = 0x5EED;
std::uint64_t msg_salt(std::uint32_t kind, std::uint32_t seq) {
  return (std::uint64_t{kind} << 32) | seq;
}

struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& what) {
  throw failure(what);
}

template <class T>
T check(cvy::result<T> r, std::string_view what) {
  if (!r) fail(std::string(what) + ": " + r.error().to_string());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}
void check(cvy::status s, std::string_view what) {
  if (s != cvy::errc::ok)
    fail(std::string(what) + ": post failed: " + std::string(cvy::to_string(s)));
}

// Page-aligned, zeroed memory for registration.
struct buffer {
  explicit buffer(std::size_t n)
      : ptr(static_cast<std::byte*>(::operator new (n, std::align_val_t{4096}))), size(n) {
    std::memset(ptr, 0, n);
  }
  ~buffer() { ::operator delete (ptr, std::align_val_t{4096}); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  std::span<std::byte> span() const { return {ptr, size}; }
  std::byte* ptr;
  std::size_t size;
};

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

// Waits for one completion on `cq`; a timeout or an error status is a failure.
cvy::work_completion wait_wc(cvy::completion_queue& cq, std::string_view what,
                             std::chrono::nanoseconds timeout = 10s) {
  auto wc = cq.wait_one(timeout);
  if (!wc)
    fail(std::string(what) +
         ": waiting for a completion: " + std::string(cvy::to_string(wc.error())));
  if (wc->status != cvy::wc_status::success)
    fail(std::string(what) + ": completion " + std::string(cvy::to_string(wc->opcode)) + " wr_id " +
         std::to_string(wc->wr_id) + " failed: " + std::string(cvy::to_string(wc->status)) +
         " (vendor_err " + hex32(wc->vendor_err) + ")");
  return *wc;
}

cvy::device_options device_opts(bool crc) {
  cvy::device_options o;
  o.request_crc = crc;
  return o;
}

constexpr cvy::access all_rights = cvy::access::local_write | cvy::access::remote_write |
                                   cvy::access::remote_read | cvy::access::remote_atomic;

// ------------------------------------------------------------------ target ----
int run_target(const std::string& device, const std::string& address, bool crc) {
  auto dev = check(cvy::device::open(device, device_opts(crc)), "open device " + device);
  auto pd = check(dev.alloc_pd(), "alloc_pd");
  auto send_cq = check(dev.create_cq({.depth = 64}), "create send CQ");
  auto recv_cq = check(dev.create_cq({.depth = 256}), "create recv CQ");

  buffer region(region_size);
  buffer atomic_page(4096);  // the slot is its first 8 bytes: 8-byte aligned
  std::uint64_t initial = atomic_initial;
  std::memcpy(atomic_page.ptr, &initial, 8);
  buffer recv_buf(recv_slot * recv_slots);
  buffer ack_buf(ack_size);

  auto region_mr = check(pd.register_memory(region.span(), all_rights), "register 16 MiB region");
  auto atomic_mr =
      check(pd.register_memory(atomic_page.span().first(8), all_rights), "register atomic slot");
  auto recv_mr = check(pd.register_memory(recv_buf.span(), cvy::access::local_write),
                       "register receive buffers");
  auto ack_mr =
      check(pd.register_memory(ack_buf.span(), cvy::access::local_write), "register ack buffer");

  auto qp = check(pd.create_qp({.send_cq = &send_cq, .recv_cq = &recv_cq}), "create QP");
  for (std::size_t i = 0; i < recv_slots; ++i)
    check(qp.post_recv(recv_mr.slice(i * recv_slot, recv_slot), i), "post_recv");

  auto lis = check(cvy::listener::bind(dev, address), "listen on " + address);
  auto req = check(lis.accept(60s), "accept on " + address);

  // Private data: the region's key, then the atomic slot's key (2 x 28 bytes).
  std::array<std::byte, 2 * cvy::remote_region::encoded_size> pdata{};
  region_mr.remote().encode_to(std::span(pdata).first<cvy::remote_region::encoded_size>());
  atomic_mr.remote().encode_to(std::span(pdata).last<cvy::remote_region::encoded_size>());
  const std::string peer = req.peer_address();  // (accept() consumes the request)
  check(req.accept(qp, pdata), "accept connection from " + peer);

  std::size_t messages = 0;
  std::uint32_t ran = 0;  // what the initiator ran (its done message says)
  auto send_ack = [&](const msg_header& for_msg, const std::string& text) {
    msg_header h{ack_magic, for_msg.kind, for_msg.seq, text.empty() ? 0u : 1u};
    std::memcpy(ack_buf.ptr, &h, sizeof h);
    std::size_t n = std::min(text.size(), ack_size - sizeof h - 1);
    std::memcpy(ack_buf.ptr + sizeof h, text.data(), n);
    ack_buf.ptr[sizeof h + n] = std::byte{0};
    check(qp.post_send_msg(ack_mr.slice(0, sizeof h + n + 1), for_msg.seq), "post ack");
    wait_wc(send_cq, "ack send");
  };

  // Verifies the final contents: what the initiator wrote, zeros elsewhere.
  auto verify_region = [&](std::uint32_t what_ran) -> std::string {
    struct extent {
      std::size_t off, len;
    };
    const bool imm_ran = (what_ran & ran_immediate) != 0;
    const extent written[] = {{bulk_off, bulk_size * bulk_iters},
                              {small_off, small_size * small_iters},
                              {imm_off, imm_ran ? imm_size * imm_iters : 0}};
    std::size_t pos = 0;
    for (const auto& e : written) {
      if (auto z = first_nonzero(region.ptr + pos, e.off - pos); z != std::string::npos)
        return "byte " + std::to_string(pos + z) + " was never written but is not zero";
      if (auto d = check_pattern(region.ptr + e.off, e.len, e.off / 8, region_salt);
          d != std::string::npos)
        return "byte " + std::to_string(e.off + d) + " differs from what the initiator wrote";
      pos = e.off + e.len;
    }
    if (auto z = first_nonzero(region.ptr + pos, region_size - pos); z != std::string::npos)
      return "byte " + std::to_string(pos + z) + " was never written but is not zero";
    std::uint64_t slot;
    std::memcpy(&slot, atomic_page.ptr, 8);
    const std::uint64_t want_slot = (what_ran & ran_atomics) != 0 ? atomic_final : atomic_initial;
    if (slot != want_slot) {
      char b[96];
      std::snprintf(b, sizeof b, "atomic slot is 0x%016llx, expected 0x%016llx",
                    static_cast<unsigned long long>(slot),
                    static_cast<unsigned long long>(want_slot));
      return b;
    }
    return {};
  };

  // The loop: only two-sided traffic reaches this thread.
  for (;;) {
    auto wc = wait_wc(recv_cq, "target: waiting for the initiator's next message", 60s);
    ++messages;
    const std::byte* slot = recv_buf.ptr + wc.wr_id * recv_slot;
    msg_header h{};
    std::string problem;
    if (wc.opcode == cvy::wc_opcode::recv_rdma_with_imm) {
      // WRITE_WITH_IMM: no payload in the receive buffer; the immediate names the chunk.
      std::uint32_t seq = wc.imm_data;
      h = {msg_magic, kind_write_imm, seq, 0};
      if (!wc.with_imm)
        problem = "WRITE_WITH_IMM completion without immediate data";
      else if (seq >= imm_iters)
        problem = "WRITE_WITH_IMM immediate " + std::to_string(seq) + " out of range";
      else if (wc.byte_len != imm_size)
        problem = "WRITE_WITH_IMM byte_len " + std::to_string(wc.byte_len) + ", expected " +
                  std::to_string(imm_size);
      else {
        std::size_t off = imm_off + seq * imm_size;
        if (auto d = check_pattern(region.ptr + off, imm_size, off / 8, region_salt);
            d != std::string::npos)
          problem =
              "WRITE_WITH_IMM #" + std::to_string(seq) + ": byte " + std::to_string(d) + " differs";
      }
    } else if (wc.opcode == cvy::wc_opcode::recv) {
      if (wc.byte_len < sizeof h)
        fail("message of " + std::to_string(wc.byte_len) + " bytes is too short");
      std::memcpy(&h, slot, sizeof h);
      if (h.magic != msg_magic) fail("message without the demo's magic");
      std::size_t want = h.kind == kind_send       ? send_size
                         : h.kind == kind_send_imm ? send_imm_size
                                                   : sizeof h;
      if (wc.byte_len != want)
        problem = "message kind " + std::to_string(h.kind) + " #" + std::to_string(h.seq) +
                  " has " + std::to_string(wc.byte_len) + " bytes, expected " +
                  std::to_string(want);
      else if (h.kind == kind_send_imm && (!wc.with_imm || wc.imm_data != imm_for(h.seq)))
        problem = "SEND_WITH_IMM #" + std::to_string(h.seq) + ": immediate data missing or wrong";
      else if (h.kind == kind_send && wc.with_imm)
        problem = "plain SEND #" + std::to_string(h.seq) + " completed with immediate data";
      else if (auto d = check_pattern(slot + sizeof h, want - sizeof h, 0, msg_salt(h.kind, h.seq));
               d != std::string::npos)
        problem = "message #" + std::to_string(h.seq) + ": payload byte " + std::to_string(d) +
                  " differs";
    } else {
      fail("unexpected receive completion opcode " + std::string(cvy::to_string(wc.opcode)));
    }
    check(qp.post_recv(recv_mr.slice(wc.wr_id * recv_slot, recv_slot), wc.wr_id), "repost receive");

    if (h.kind == kind_done && problem.empty()) {
      ran = h.seq;
      problem = verify_region(ran);
    }
    send_ack(h, problem);
    if (!problem.empty()) fail("target: " + problem);
    if (h.kind != kind_done) continue;

    // Done. The answer's completion succeeded, so nothing is outstanding here:
    // we close first (returning destroys the QP) and the initiator, which waits
    // for that, closes after us.
    auto c = qp.counters();
    const std::size_t verified = bulk_size * bulk_iters + small_size * small_iters +
                                 ((ran & ran_immediate) != 0 ? imm_size * imm_iters : 0);
    const std::uint64_t slot_value = (ran & ran_atomics) != 0 ? atomic_final : atomic_initial;
    if (dev.attr().provider == "verbs") {
      // The NIC serves one-sided operations; verbs keeps no per-QP counters.
      std::printf(
          "target: OK: verified %zu bytes written by the initiator and the atomic slot "
          "(0x%016llx); %zu messages; the NIC (%s) served the one-sided operations\n",
          verified, static_cast<unsigned long long>(slot_value), messages, dev.attr().name.c_str());
    } else {
      std::printf(
          "target: OK: verified %zu bytes written by the initiator and the atomic slot "
          "(0x%016llx); %zu messages; the engine alone served %llu writes, %llu reads "
          "(placement confirmations included), %llu atomics\n",
          verified, static_cast<unsigned long long>(slot_value), messages,
          static_cast<unsigned long long>(c.writes_placed),
          static_cast<unsigned long long>(c.reads_served),
          static_cast<unsigned long long>(c.atomics_served));
    }
    return 0;
  }
}

// --------------------------------------------------------------- initiator ----
struct row {
  std::string op;
  std::size_t size = 0;
  std::vector<double> us;  // per-iteration latency
  std::string verified;
};

struct initiator {
  cvy::device dev;
  cvy::protection_domain pd;
  cvy::completion_queue send_cq, recv_cq;
  buffer src{region_size}, sink{region_size}, msg{recv_slot}, acks{ack_size * recv_slots},
      atomic_result{4096};
  cvy::memory_region src_mr, sink_mr, msg_mr, acks_mr, atomic_result_mr;
  cvy::queue_pair qp;
  cvy::remote_region region, slot;
  std::vector<row> rows;
  std::vector<std::string> skipped;
  bool atomics_ok = true, immediate_ok = true;

  // Posts one send WR and waits for its completion; returns the latency in µs.
  double run_one(const cvy::send_wr& wr, std::string_view what) {
    auto t0 = clock_type::now();
    check(qp.post_send(wr), what);
    auto wc = wait_wc(send_cq, what);
    if (wc.wr_id != wr.wr_id) fail(std::string(what) + ": completion for the wrong request");
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
  }

  // Waits for the target's ack of (kind, seq) and reposts its receive.
  // The last answer is not followed by a repost: the target may have closed.
  void expect_ack(std::uint32_t kind, std::uint32_t seq, std::string_view what,
                  bool repost = true) {
    auto wc = wait_wc(recv_cq, std::string(what) + ": waiting for the target's answer");
    const std::byte* p = acks.ptr + wc.wr_id * ack_size;
    msg_header h;
    if (wc.byte_len < sizeof h) fail(std::string(what) + ": short answer from the target");
    std::memcpy(&h, p, sizeof h);
    if (h.magic != ack_magic || h.kind != kind || h.seq != seq)
      fail(std::string(what) + ": the target answered a different message");
    if (h.status != 0)
      fail(std::string(what) +
           ": the target says: " + std::string(reinterpret_cast<const char*>(p + sizeof h)));
    if (repost)
      check(qp.post_recv(acks_mr.slice(wc.wr_id * ack_size, ack_size), wc.wr_id), "repost receive");
  }

  void connect(const std::string& device, const std::string& address, bool crc) {
    dev = check(cvy::device::open(device, device_opts(crc)), "open device " + device);
    pd = check(dev.alloc_pd(), "alloc_pd");
    send_cq = check(dev.create_cq({.depth = 64}), "create send CQ");
    recv_cq = check(dev.create_cq({.depth = 64}), "create recv CQ");
    fill_pattern(src.ptr, region_size, 0, region_salt);
    src_mr = check(pd.register_memory(src.span(), cvy::access::local_write), "register source");
    sink_mr = check(pd.register_memory(sink.span(), cvy::access::local_write), "register sink");
    msg_mr =
        check(pd.register_memory(msg.span(), cvy::access::local_write), "register message buffer");
    acks_mr =
        check(pd.register_memory(acks.span(), cvy::access::local_write), "register ack buffers");
    atomic_result_mr =
        check(pd.register_memory(atomic_result.span().first(8), cvy::access::local_write),
              "register atomic result");

    // The target may still be starting: retry a refused connection for a while,
    // with a fresh QP each time.
    const auto until = clock_type::now() + 15s;
    for (;;) {
      qp = check(pd.create_qp({.send_cq = &send_cq, .recv_cq = &recv_cq}), "create QP");
      for (std::size_t i = 0; i < recv_slots; ++i)
        check(qp.post_recv(acks_mr.slice(i * ack_size, ack_size), i), "post_recv");
      auto info = cvy::connect(qp, address);
      if (info) {
        if (info->private_data.size() < 2 * cvy::remote_region::encoded_size)
          fail("the target's private data is too short (" +
               std::to_string(info->private_data.size()) + " bytes)");
        std::span<const std::byte> pdv(info->private_data);
        region = check(cvy::remote_region::decode(pdv.first(cvy::remote_region::encoded_size)),
                       "decode region key");
        slot = check(cvy::remote_region::decode(pdv.subspan(cvy::remote_region::encoded_size)),
                     "decode slot key");
        if (region.length != region_size || slot.length != 8)
          fail("the target published unexpected region sizes");
        const bool soft = dev.attr().provider == "soft";
        // soft negotiates RFC 7306 (atomics, immediate data) and CRC with its peer
        // and reports both; a NIC's capabilities are the device's own.
        if (soft && !info->attr.extensions)
          fail("the connection did not negotiate RFC 7306 extensions (atomics, immediate data)");
        const auto& a = info->attr;
        if (a.iwarp && a.iwarp->crc != crc)  // MPA CRC is negotiated: on if either side asks
          fail(std::string("asked for CRC ") + (crc ? "on" : "off") +
               " but the connection has it " + (a.iwarp->crc ? "on" : "off"));
        atomics_ok = dev.attr().atomics && (!soft || a.extensions);
        immediate_ok = dev.attr().immediate_data && (!soft || a.extensions);
        // What the connection negotiated: the common facts and the transport's own.
        const std::string ird_ord =
            "IRD/ORD " + std::to_string(a.ird) + "/" + std::to_string(a.ord);
        std::string facts = ird_ord;
        if (a.iwarp)
          facts = "MPA rev " + std::to_string(a.iwarp->mpa_revision) + ", CRC " +
                  (a.iwarp->crc ? "on" : "off") + ", " + ird_ord + ", MSS " +
                  std::to_string(a.iwarp->mss);
        else if (a.shm)
          facts = "data path " + (a.shm->direct_mapping ? "direct mapping" : a.shm->data_path) +
                  ", " + ird_ord;
        else if (a.verbs)
          facts = ird_ord + (a.verbs->path_mtu != 0
                                 ? ", path MTU " + std::to_string(a.verbs->path_mtu)
                                 : ", port MTU " + std::to_string(a.verbs->port_mtu));
        std::printf("initiator: connected %s -> %s (%s)\n", a.local_address.c_str(),
                    a.peer_address.c_str(), facts.c_str());
        return;
      }
      if (info.error().code != cvy::errc::connection_refused || clock_type::now() > until)
        fail("connect to " + address + ": " + info.error().to_string());
      // Destroying the failed QP flushes its posted receives into recv_cq
      // (wr_flush_err): drop those completions before the next attempt.
      qp = cvy::queue_pair{};
      std::array<cvy::work_completion, 16> flushed;
      while (recv_cq.poll(flushed).value_or(0) > 0 || send_cq.poll(flushed).value_or(0) > 0) {
      }
      std::this_thread::sleep_for(50ms);
    }
  }

  cvy::send_wr rdma(cvy::wr_opcode op, const cvy::sge& local, std::uint64_t remote_off,
                    std::uint64_t id) {
    return {.wr_id = id,
            .opcode = op,
            .sg_list = std::span(&local, 1),
            .remote_addr = region.addr + remote_off,
            .rkey = region.rkey};
  }

  void writes(std::string name, std::size_t off, std::size_t size, std::size_t iters) {
    row r{std::move(name), size, {}, "read back"};
    for (std::size_t i = 0; i < iters; ++i) {
      auto local = src_mr.slice(off + i * size, size);
      r.us.push_back(run_one(rdma(cvy::wr_opcode::rdma_write, local, off + i * size, i), r.op));
    }
    rows.push_back(std::move(r));
  }

  void reads(std::string name, std::size_t off, std::size_t size, std::size_t iters) {
    row r{std::move(name), size, {}, "byte for byte"};
    for (std::size_t i = 0; i < iters; ++i) {
      std::size_t o = off + i * size;
      auto local = sink_mr.slice(o, size);
      r.us.push_back(run_one(rdma(cvy::wr_opcode::rdma_read, local, o, i), r.op));
      if (std::memcmp(sink.ptr + o, src.ptr + o, size) != 0)
        fail(r.op + " #" + std::to_string(i) + ": the bytes read back differ from those written");
    }
    rows.push_back(std::move(r));
  }

  void sends(std::string name, std::uint32_t kind, std::size_t size, std::size_t iters) {
    row r{std::move(name), size, {}, "by target"};
    for (std::uint32_t i = 0; i < iters; ++i) {
      msg_header h{msg_magic, kind, i, 0};
      std::memcpy(msg.ptr, &h, sizeof h);
      fill_pattern(msg.ptr + sizeof h, size - sizeof h, 0, msg_salt(kind, i));
      auto local = msg_mr.slice(0, size);
      cvy::send_wr wr{
          .wr_id = i,
          .opcode = kind == kind_send_imm ? cvy::wr_opcode::send_with_imm : cvy::wr_opcode::send,
          .sg_list = std::span(&local, 1),
          .imm_data = kind == kind_send_imm ? imm_for(i) : 0};
      auto t0 = clock_type::now();
      run_one(wr, r.op);
      expect_ack(kind, i, r.op);
      r.us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    rows.push_back(std::move(r));
  }

  void writes_with_imm() {
    row r{"WRITE_WITH_IMM", imm_size, {}, "by target"};
    for (std::uint32_t i = 0; i < imm_iters; ++i) {
      std::size_t o = imm_off + i * imm_size;
      auto local = src_mr.slice(o, imm_size);
      auto wr = rdma(cvy::wr_opcode::rdma_write_with_imm, local, o, i);
      wr.imm_data = i;
      auto t0 = clock_type::now();
      run_one(wr, r.op);
      expect_ack(kind_write_imm, i, r.op);
      r.us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    rows.push_back(std::move(r));
  }

  std::uint64_t atomic_value() const {
    std::uint64_t v;
    std::memcpy(&v, atomic_result.ptr, 8);
    return v;
  }

  void atomics() {
    auto result = atomic_result_mr.as_sge();
    row fa{"FETCH_ADD", 8, {}, "returned values"};
    std::uint64_t expect = atomic_initial;
    for (std::uint64_t i = 0; i < atomic_iters; ++i, ++expect) {
      cvy::send_wr wr{.wr_id = i,
                      .opcode = cvy::wr_opcode::atomic_fetch_and_add,
                      .sg_list = std::span(&result, 1),
                      .remote_addr = slot.addr,
                      .rkey = slot.rkey,
                      .compare_add = 1};
      fa.us.push_back(run_one(wr, fa.op));
      if (atomic_value() != expect)
        fail("FETCH_ADD #" + std::to_string(i) + " returned " + std::to_string(atomic_value()) +
             ", expected " + std::to_string(expect));
    }
    rows.push_back(std::move(fa));

    row cs{"CMP_SWAP", 8, {}, "returned values"};
    for (std::uint64_t i = 0; i < atomic_iters; ++i, expect += swap_step) {
      cvy::send_wr wr{.wr_id = i,
                      .opcode = cvy::wr_opcode::atomic_cmp_and_swp,
                      .sg_list = std::span(&result, 1),
                      .remote_addr = slot.addr,
                      .rkey = slot.rkey,
                      .compare_add = expect,
                      .swap = expect + swap_step};
      cs.us.push_back(run_one(wr, cs.op));
      if (atomic_value() != expect)
        fail("CMP_SWAP #" + std::to_string(i) + " returned " + std::to_string(atomic_value()) +
             ", expected " + std::to_string(expect));
    }
    // One that must not swap: a wrong compare value leaves the slot as it is.
    cvy::send_wr miss{.wr_id = 9999,
                      .opcode = cvy::wr_opcode::atomic_cmp_and_swp,
                      .sg_list = std::span(&result, 1),
                      .remote_addr = slot.addr,
                      .rkey = slot.rkey,
                      .compare_add = expect + 1,
                      .swap = 0};
    run_one(miss, "CMP_SWAP with a wrong compare value");
    if (atomic_value() != expect)
      fail("CMP_SWAP with a wrong compare value returned the wrong old value");
    rows.push_back(std::move(cs));
  }

  void done() {
    // seq: what ran, so the target checks exactly that.
    const std::uint32_t ran = (atomics_ok ? ran_atomics : 0u) | (immediate_ok ? ran_immediate : 0u);
    msg_header h{msg_magic, kind_done, ran, 0};
    std::memcpy(msg.ptr, &h, sizeof h);
    auto local = msg_mr.slice(0, sizeof h);
    cvy::send_wr wr{.wr_id = 0, .opcode = cvy::wr_opcode::send, .sg_list = std::span(&local, 1)};
    run_one(wr, "done message");
    expect_ack(kind_done, ran, "final check of the target's memory", /*repost=*/false);
    // The target closes first, once its answer has completed: closing here at
    // once could end the connection while the target still waits for that
    // completion. Its close flushes our posted receives.
    const auto until = clock_type::now() + 5s;
    std::array<cvy::work_completion, 16> wcs;
    while (clock_type::now() < until && qp.state() != cvy::qp_state::error) {
      auto n = recv_cq.wait(wcs, 100ms);
      if (n && *n > 0 && wcs[0].status != cvy::wc_status::success) break;
    }
  }
};

std::string human_size(std::size_t n) {
  if (n >= mib && n % mib == 0) return std::to_string(n / mib) + " MiB";
  if (n >= kib && n % kib == 0) return std::to_string(n / kib) + " KiB";
  return std::to_string(n) + " B";
}

void print_table(const std::vector<row>& rows) {
  // (Literal header: "µ" is two bytes, so printf widths would misalign it.)
  std::printf("\n%-15s | %8s | %10s | p50 latency µs | bandwidth MB/s | verified\n", "operation",
              "size", "iterations");
  std::printf("%s\n", std::string(15 + 3 + 8 + 3 + 10 + 3 + 14 + 3 + 14 + 3 + 15, '-').c_str());
  for (const auto& r : rows) {
    std::vector<double> s = r.us;
    std::sort(s.begin(), s.end());
    double p50 = s[s.size() / 2];
    double total_us = 0;
    for (double v : r.us) total_us += v;
    double mbs =
        static_cast<double>(r.size) * static_cast<double>(r.us.size()) / total_us;  // B/µs = MB/s
    std::printf("%-15s | %8s | %10zu | %14.1f | %14.1f | %s\n", r.op.c_str(),
                human_size(r.size).c_str(), r.us.size(), p50, mbs, r.verified.c_str());
  }
}

int run_initiator(const std::string& device, const std::string& address, bool crc) {
  auto t0 = clock_type::now();
  initiator in;
  in.connect(device, address, crc);
  in.writes("RDMA WRITE", small_off, small_size, small_iters);
  in.writes("RDMA WRITE", bulk_off, bulk_size, bulk_iters);
  in.reads("RDMA READ", small_off, small_size, small_iters);
  in.reads("RDMA READ", bulk_off, bulk_size, bulk_iters);
  in.sends("SEND", kind_send, send_size, send_iters);
  if (in.immediate_ok) {
    in.sends("SEND_WITH_IMM", kind_send_imm, send_imm_size, send_imm_iters);
    in.writes_with_imm();
  } else {
    in.skipped.push_back("SEND_WITH_IMM, WRITE_WITH_IMM: " + in.dev.attr().name +
                         " has no immediate data");
  }
  if (in.atomics_ok)
    in.atomics();
  else
    in.skipped.push_back("FETCH_ADD, CMP_SWAP: " + in.dev.attr().name + " has no atomics");
  in.done();
  print_table(in.rows);
  for (const auto& s : in.skipped) std::printf("skipped: %s\n", s.c_str());
  std::printf(
      "\ninitiator: OK: every byte verified (%.1f s). Latency is post to completion; for "
      "SEND, SEND_WITH_IMM and WRITE_WITH_IMM it includes the target's check and answer.\n",
      std::chrono::duration<double>(clock_type::now() - t0).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role, address, crc_s = "on", device = "soft";
  CLI::App app{
      "Conveyor demo: a target registers memory and idles while an initiator runs every "
      "verb against it. Start the target first; the initiator retries a refused "
      "connection for 15 s.",
      "conveyor-demo"};
  app.add_option("--role", role, "target or initiator")
      ->required()
      ->check(CLI::IsMember({"target", "initiator"}));
  app.add_option("--address", address, "IP:PORT to listen on (target) or connect to (initiator)")
      ->required();
  app.add_option("--crc", crc_s, "ask the peer for MPA CRC32c")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--device", device, "device to open: soft, verbs:<ibdev> (see `conveyor devices`)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const bool crc = crc_s == "on";
  try {
    return role == "target" ? run_target(device, address, crc)
                            : run_initiator(device, address, crc);
  } catch (const failure& e) {
    std::fprintf(stderr, "conveyor-demo %s: FAILED: %s\n", role.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "conveyor-demo %s: FAILED: %s\n", role.c_str(), e.what());
    return 1;
  }
}
