// conveyor_vm_interop — one connection per scenario between two Conveyor
// devices in one process (a server thread and a client thread), every
// operation both devices support, bytes verified on both sides. Run inside the
// VM by tests/vm/guest.sh, e.g. the kernel's siw against the user-space soft
// provider in both directions:
//
//   conveyor_vm_interop --server verbs:siw0 --client soft --crc 1 --addr 10.11.0.1
//   conveyor_vm_interop --server soft --client verbs:siw0 --crc 0 --addr 10.11.0.1
//   conveyor_vm_interop --list
//   conveyor_vm_interop --port-events verbs:rxe0 veth0
//   conveyor_vm_interop --port-down verbs:rxe0 veth0 10.11.0.1
//   conveyor_vm_interop --device-removal verbs:rxe0 10.11.0.1
//
// Scenarios: (1) data: WRITE 256 KiB, READ it back (a multi-segment READ
// response), zero-length WRITE/READ/SEND, SEND of several sizes, solicited
// SEND, SEND_WITH_INV, and where both ends have them WRITE/SEND_WITH_IMM and
// atomics; the server checks every received message and its region and
// answers with a SEND carrying its own checksum. (2) a WRITE with a bad rkey
// and (3) a READ out of bounds, each after one valid READ (see run_client): the
// initiator's request fails (or, where the
// initiator is kernel iWARP and WRITEs complete locally, the next request
// flushes) and the target's QP goes to ERROR, flushing its receives: the
// Terminate was understood. Exit status 0 only if everything held.
// --port-events, --port-down and --device-removal: port_checks.cpp;
// --transport and --port-flap: transport.cpp.
#include "vm_common.hpp"

#include <conveyor/conveyor.hpp>

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
namespace cvy = conveyor;
using namespace std::chrono_literals;
using namespace vmcheck;

namespace {
struct config {
  std::string server = "soft", client = "soft", addr = "10.11.0.1";
  bool crc = true;
};

bool same(std::span<const std::byte> b, unsigned seed, std::size_t* bad = nullptr) {
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != pattern(i, seed)) {
      if (bad) *bad = i;
      return false;
    }
  return true;
}
std::uint64_t sum(std::span<const std::byte> b) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto x : b) h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
  return h;
}

cvy::device_options opts(const std::string& dev, bool crc) {
  cvy::device_options o;
  o.software.request_crc = dev.rfind("soft", 0) == 0 ? crc : true;
  return o;
}

struct side {
  cvy::device dev;
  cvy::protection_domain pd;
  cvy::completion_queue cq;
  cvy::queue_pair qp;
  std::vector<std::byte> region, scratch, recvbuf, inv;
  cvy::memory_region mr, smr, rmr, imr;

  bool setup(const std::string& name, bool crc, const char* role) {
    auto d = cvy::device::open(name, opts(name, crc));
    if (!d) {
      std::printf("interop: %s: open %s: %s\n", role, name.c_str(), d.error().to_string().c_str());
      ++failures;
      return false;
    }
    dev = std::move(*d);
    pd = dev.alloc_pd().value();
    cq = dev.create_cq({.depth = 512}).value();
    qp = pd.create_qp({.send_cq = &cq,
                       .recv_cq = &cq,
                       .cap = {.max_send_wr = 64,
                               .max_recv_wr = 64,
                               .max_send_sge = 2,
                               .max_recv_sge = 2,
                               .max_inline_data = 64}})
             .value();
    region.assign(1 << 20, std::byte{0});
    scratch.assign(1 << 20, std::byte{0});
    recvbuf.assign(32 * 4096, std::byte{0});
    inv.assign(4096, std::byte{0});
    const auto all = cvy::access::local_write | cvy::access::remote_write |
                     cvy::access::remote_read |
                     (dev.attr().atomics ? cvy::access::remote_atomic : cvy::access::none);
    mr = pd.register_memory(std::span(region), all).value();
    smr = pd.register_memory(std::span(scratch), cvy::access::local_write).value();
    rmr = pd.register_memory(std::span(recvbuf), cvy::access::local_write).value();
    imr = pd.register_memory(std::span(inv), cvy::access::local_write | cvy::access::remote_write |
                                                 cvy::access::remote_invalidate)
              .value();
    for (std::uint64_t i = 0; i < 32; ++i)
      if (qp.post_recv(rmr.slice(i * 4096, 4096), 1000 + i) != cvy::errc::ok) return false;
    return true;
  }
  std::optional<cvy::work_completion> wait(std::chrono::milliseconds t = 10s) {
    auto r = cq.wait_one(t);
    if (!r) return std::nullopt;
    return *r;
  }
};

// Both ends' capabilities: what may be used between them.
struct caps {
  bool atomics, imm, inv;
};

enum class scenario { data, bad_rkey, read_oob };

void run_server(const config& c, scenario sc, caps k, std::promise<std::string>& addr_out,
                std::atomic<bool>& client_done, std::atomic<bool>& server_done) {
  struct mark {
    std::atomic<bool>& f;
    ~mark() { f = true; }
  } m{server_done};
  side s;
  if (!s.setup(c.server, c.crc, "server")) {
    addr_out.set_value("");
    return;
  }
  fill(std::span(s.region).subspan(512 * 1024), 77);  // the client READs this half
  auto lis = cvy::listener::bind(s.dev, c.addr + ":0");
  if (!lis) {
    std::printf("interop: server: bind: %s\n", lis.error().to_string().c_str());
    ++failures;
    addr_out.set_value("");
    return;
  }
  addr_out.set_value(lis->address());
  auto req = lis->accept(20s);
  if (!req) {
    std::printf("interop: server: accept: %s\n", req.error().to_string().c_str());
    ++failures;
    return;
  }
  std::array<std::byte, 2 * cvy::remote_region::encoded_size> pd{};
  s.mr.remote().encode_to(std::span(pd).first<cvy::remote_region::encoded_size>());
  s.imr.remote().encode_to(
      std::span(pd).subspan<cvy::remote_region::encoded_size, cvy::remote_region::encoded_size>());
  auto info = req->accept(s.qp, pd);
  if (!info) {
    std::printf("interop: server: accept: %s\n", info.error().to_string().c_str());
    ++failures;
    return;
  }
  if (c.server.rfind("soft", 0) == 0) {
    const auto iw = info->attr.iwarp.value_or(cvy::iwarp_connection_attr{});
    CHECK(info->attr.iwarp.has_value(), "server (soft) reports no MPA facts");
    CHECK(iw.crc == c.crc, "server (soft) CRC %d, wanted %d", iw.crc, c.crc);
    // Large FPDUs only between two soft peers: siw's Reply echoes soft's 0x08
    // (siw_proc_mpareq reuses the Request's flags) and its Request never has it.
    const bool peer_soft = c.client.rfind("soft", 0) == 0;
    CHECK(iw.large_fpdus == peer_soft, "server (soft) large FPDUs %d with %s", iw.large_fpdus,
          c.client.c_str());
    CHECK(iw.large_fpdus || iw.max_fpdu <= iw.mss, "server (soft) FPDU %u above the MSS %u",
          iw.max_fpdu, iw.mss);
    std::printf("interop: server soft: crc %s, mpa rev %d, ird %u ord %u, mss %u, fpdu %u%s\n",
                iw.crc ? "on" : "off", iw.mpa_revision, info->attr.ird, info->attr.ord, iw.mss,
                iw.max_fpdu, iw.large_fpdus ? " (large)" : "");
  }
  if (sc != scenario::data) {
    // The peer's violation must end in a Terminate that moves our QP to ERROR:
    // our receives flush.
    auto wc = s.wait(15s);
    CHECK(wc.has_value(), "server: no completion after the peer's %s (QP not moved to ERROR)",
          sc == scenario::bad_rkey ? "bad-rkey WRITE" : "out-of-bounds READ");
    if (wc) {
      CHECK(wc->status != cvy::wc_status::success, "server: expected flushed receives, got %s",
            st(wc->status).c_str());
      std::printf("interop: server: after the violation: %s (vendor_err 0x%x), QP %s\n",
                  st(wc->status).c_str(), wc->vendor_err,
                  std::string(cvy::to_string(s.qp.state())).c_str());
    }
    for (int i = 0; i < 100 && !client_done; ++i) std::this_thread::sleep_for(50ms);
    return;
  }
  // Expected messages, in order: SEND 1000 (seed 1), SEND 0, SEND 4096 solicited
  // (seed 2), SEND_WITH_INV 16 (seed 3), [SEND_WITH_IMM 8, WRITE_WITH_IMM], SEND "done".
  struct expect {
    std::uint32_t len;
    unsigned seed;
    bool inv, imm, wimm;
    std::uint32_t imm_value = 0;
  };
  std::vector<expect> ex = {
      {1000, 1, false, false, false}, {0, 0, false, false, false}, {4096, 2, false, false, false}};
  if (k.inv) ex.push_back({16, 3, true, false, false});
  if (k.imm) {
    ex.push_back({8, 4, false, true, false, 0xC0FFEE04u});
    ex.push_back({64, 0, false, true, true, 0xC0FFEE05u});  // byte_len: the WRITE's length
  }
  ex.push_back({4, 9, false, false, false});  // "done"
  for (std::size_t i = 0; i < ex.size(); ++i) {
    auto wc = s.wait(20s);
    CHECK(wc.has_value(), "server: message %zu did not arrive", i);
    if (!wc) return;
    CHECK(wc->status == cvy::wc_status::success, "server: message %zu: %s (vendor_err 0x%x)", i,
          st(wc->status).c_str(), wc->vendor_err);
    if (wc->status != cvy::wc_status::success) return;
    const auto& e = ex[i];
    CHECK(wc->byte_len == e.len, "server: message %zu: %u bytes, wanted %u", i, wc->byte_len,
          e.len);
    auto idx = wc->wr_id - 1000;
    auto got = std::span(s.recvbuf).subspan(idx * 4096, e.wimm ? 0 : wc->byte_len);
    std::size_t bad = 0;
    if (e.len > 0 && !e.wimm)
      CHECK(same(got, e.seed, &bad), "server: message %zu: byte %zu differs", i, bad);
    CHECK(wc->with_inv == e.inv, "server: message %zu: with_inv %d", i, wc->with_inv);
    if (e.inv)
      CHECK(wc->invalidated_rkey == s.imr.rkey(), "server: invalidated rkey 0x%x, wanted 0x%x",
            wc->invalidated_rkey, s.imr.rkey());
    CHECK(wc->with_imm == e.imm, "server: message %zu: with_imm %d", i, wc->with_imm);
    if (e.imm)
      CHECK(wc->imm_data == e.imm_value, "server: imm 0x%x, wanted 0x%x", wc->imm_data,
            e.imm_value);
    if (e.wimm)
      CHECK(wc->opcode == cvy::wc_opcode::recv_rdma_with_imm, "server: WRITE_WITH_IMM opcode");
  }
  // Region: [0, 256 KiB) written with seed 5 by the client; [256K,+64) by WRITE_WITH_IMM seed 6.
  std::size_t bad = 0;
  CHECK(same(std::span(s.region).first(256 * 1024), 5, &bad),
        "server: WRITE data differs at byte %zu", bad);
  if (k.imm)
    CHECK(same(std::span(s.region).subspan(256 * 1024, 64), 6, &bad),
          "server: WRITE_WITH_IMM data at %zu", bad);
  // Answer with our checksum of the written part: the client compares.
  std::uint64_t h = sum(std::span(s.region).first(256 * 1024));
  std::memcpy(s.scratch.data(), &h, 8);
  CHECK(s.qp.post_send_msg(s.smr.slice(0, 8), 1) == cvy::errc::ok, "server: post reply");
  auto wc = s.wait();
  CHECK(wc && wc->status == cvy::wc_status::success, "server: reply SEND: %s",
        wc ? st(wc->status).c_str() : "timeout");
  server_done = true;
  for (int i = 0; i < 200 && !client_done; ++i) std::this_thread::sleep_for(50ms);
}

void run_client(const config& c, scenario sc, caps k, const std::string& addr,
                std::atomic<bool>& server_done) {
  side s;
  // Keep the connection until the server has seen its last completion: this
  // outlives nothing after it, so it is declared after `s`, whose destructor
  // closes the connection (declared first, it let the client close while soft's
  // reply SEND was still completing, which soft then reported as connection lost).
  struct linger {
    std::atomic<bool>& f;
    ~linger() {
      for (int i = 0; i < 400 && !f; ++i) std::this_thread::sleep_for(25ms);
    }
  } l{server_done};
  if (!s.setup(c.client, c.crc, "client")) return;
  auto info = cvy::connect(s.qp, addr, {.timeout = 20s});
  if (!info) {
    std::printf("interop: client: connect: %s\n", info.error().to_string().c_str());
    ++failures;
    return;
  }
  if (c.client.rfind("soft", 0) == 0) {
    const auto iw = info->attr.iwarp.value_or(cvy::iwarp_connection_attr{});
    CHECK(info->attr.iwarp.has_value(), "client (soft) reports no MPA facts");
    CHECK(iw.crc == c.crc, "client (soft) CRC %d, wanted %d", iw.crc, c.crc);
    // Large FPDUs only between two soft peers: siw's Reply echoes soft's 0x08
    // (siw_proc_mpareq reuses the Request's flags) and its Request never has it.
    const bool peer_soft = c.server.rfind("soft", 0) == 0;
    CHECK(iw.large_fpdus == peer_soft, "client (soft) large FPDUs %d with %s", iw.large_fpdus,
          c.server.c_str());
    CHECK(iw.large_fpdus || iw.max_fpdu <= iw.mss, "client (soft) FPDU %u above the MSS %u",
          iw.max_fpdu, iw.mss);
    std::printf("interop: client soft: crc %s, mpa rev %d, ird %u ord %u, mss %u, fpdu %u%s\n",
                iw.crc ? "on" : "off", iw.mpa_revision, info->attr.ird, info->attr.ord, iw.mss,
                iw.max_fpdu, iw.large_fpdus ? " (large)" : "");
  }
  auto peer = cvy::remote_region::decode(info->private_data).value();
  auto peer_inv = cvy::remote_region::decode(
                      std::span(info->private_data).subspan(cvy::remote_region::encoded_size))
                      .value();
  auto one = [&](const cvy::send_wr& wr, const char* what) {
    auto p = s.qp.post_send(wr);
    CHECK(p == cvy::errc::ok, "client: post %s: %s", what, std::string(cvy::to_string(p)).c_str());
    if (p != cvy::errc::ok) return std::optional<cvy::work_completion>{};
    auto wc = s.wait();
    CHECK(wc.has_value(), "client: %s: no completion", what);
    if (wc)
      CHECK(wc->status == cvy::wc_status::success, "client: %s: %s (vendor_err 0x%x)", what,
            st(wc->status).c_str(), wc->vendor_err);
    if (wc) std::printf("interop: client: %-22s %s\n", what, st(wc->status).c_str());
    return wc;
  };
  if (sc == scenario::bad_rkey || sc == scenario::read_oob) {
    // A valid READ first, so the violation is never among the first frames the
    // target processes. Linux siw (6.1, and every version since its merge) as
    // the MPA responder with an RTR offered (soft offers one) announces the
    // connection only after the first batch of frames it reads after the RTR
    // was processed without error; if the violation is in that batch (the RTR
    // and the violation arrive together, or the RTR came before siw_accept
    // switched to its RTR reader), it drops the connection without ever
    // announcing it and iw_cm's cm_close_handler hits BUG() (state CONN_RECV):
    // the guest kernel dies. Seen once in CI. A completed READ means the
    // target processed the RTR and announced the connection, whatever follows.
    std::array<cvy::sge, 1> g0{s.smr.slice(16384, 8)};
    auto w0 = one({.wr_id = 3,
                   .opcode = cvy::wr_opcode::rdma_read,
                   .sg_list = g0,
                   .remote_addr = peer.addr,
                   .rkey = peer.rkey},
                  "READ before violation");
    if (!w0 || w0->status != cvy::wc_status::success) return;
    std::array<cvy::sge, 1> g{s.smr.slice(0, 4096)};
    std::array<cvy::sge, 1> g2{s.smr.slice(8192, 4096)};
    std::array<cvy::send_wr, 2> wrs{};
    if (sc == scenario::bad_rkey) {
      wrs[0] = {.wr_id = 1,
                .opcode = cvy::wr_opcode::rdma_write,
                .sg_list = g,
                .remote_addr = peer.addr,
                .rkey = peer.rkey ^ 0x5a5a00u};
    } else {
      wrs[0] = {.wr_id = 1,
                .opcode = cvy::wr_opcode::rdma_read,
                .sg_list = g,
                .remote_addr = peer.addr + peer.length - 1024,
                .rkey = peer.rkey};
    }
    wrs[1] = {.wr_id = 2,
              .opcode = cvy::wr_opcode::rdma_read,
              .sg_list = g2,
              .remote_addr = peer.addr,
              .rkey = peer.rkey};
    CHECK(s.qp.post_send(wrs) == cvy::errc::ok, "client: post violation");
    auto a = s.wait(15s);
    auto b = s.wait(15s);
    CHECK(a && b, "client: violation: %s completion missing", a ? "second" : "first");
    if (a && b) {
      std::printf("interop: client: violation -> wr1 %s (vendor_err 0x%x), wr2 %s\n",
                  st(a->status).c_str(), a->vendor_err, st(b->status).c_str());
      const bool first_failed = a->status == cvy::wc_status::rem_access_err ||
                                a->status == cvy::wc_status::rem_op_err ||
                                a->status == cvy::wc_status::rem_inv_req_err;
      // Linux siw handles every received Terminate by moving the QP to ERROR
      // and flushing (siw_proc_terminate): its READ completes flushed, not with
      // a remote access error. guest.sh checks the kernel log that siw parsed
      // the Terminate ("got TERMINATE", no "bogus TERM").
      const bool kernel_iwarp_initiator =
          c.client.rfind("verbs:", 0) == 0 && s.dev.attr().transport_type == cvy::transport::iwarp;
      if (kernel_iwarp_initiator && !first_failed && a->status == cvy::wc_status::wr_flush_err)
        std::printf(
            "interop: client: kernel iWARP flushed the violating request on the peer's "
            "Terminate\n");
      CHECK(first_failed || (sc == scenario::bad_rkey && b->status != cvy::wc_status::success) ||
                (kernel_iwarp_initiator && a->status == cvy::wc_status::wr_flush_err),
            "client: the violation was not reported (wr1 %s, wr2 %s)", st(a->status).c_str(),
            st(b->status).c_str());
      CHECK(b->status != cvy::wc_status::success,
            "client: a request after the violation succeeded on a dead QP");
    }
    return;
  }
  // WRITE 256 KiB (seed 5) then READ it back; READ the server's seed-77 half (multi-segment
  // response).
  fill(std::span(s.scratch).first(256 * 1024), 5);
  std::array<cvy::sge, 1> g{s.smr.slice(0, 256 * 1024)};
  one({.wr_id = 10,
       .opcode = cvy::wr_opcode::rdma_write,
       .sg_list = g,
       .remote_addr = peer.addr,
       .rkey = peer.rkey},
      "WRITE 256 KiB");
  std::array<cvy::sge, 1> rg{s.smr.slice(256 * 1024, 256 * 1024)};
  one({.wr_id = 11,
       .opcode = cvy::wr_opcode::rdma_read,
       .sg_list = rg,
       .remote_addr = peer.addr,
       .rkey = peer.rkey},
      "READ 256 KiB back");
  std::size_t bad = 0;
  CHECK(same(std::span(s.scratch).subspan(256 * 1024, 256 * 1024), 5, &bad),
        "client: READ-back differs at %zu", bad);
  std::array<cvy::sge, 1> rg2{s.smr.slice(512 * 1024, 512 * 1024)};
  one({.wr_id = 12,
       .opcode = cvy::wr_opcode::rdma_read,
       .sg_list = rg2,
       .remote_addr = peer.addr + 512 * 1024,
       .rkey = peer.rkey},
      "READ 512 KiB");
  CHECK(same(std::span(s.scratch).subspan(512 * 1024, 512 * 1024), 77, &bad),
        "client: READ differs at %zu", bad);
  std::array<cvy::sge, 1> z{s.smr.slice(0, 0)};
  one({.wr_id = 13,
       .opcode = cvy::wr_opcode::rdma_write,
       .sg_list = z,
       .remote_addr = peer.addr,
       .rkey = peer.rkey},
      "WRITE 0 bytes");
  one({.wr_id = 14,
       .opcode = cvy::wr_opcode::rdma_read,
       .sg_list = z,
       .remote_addr = peer.addr,
       .rkey = peer.rkey},
      "READ 0 bytes");
  // SENDs (the scratch's first 256 KiB still holds seed 5: use a separate area).
  auto send = [&](std::uint32_t len, unsigned seed, cvy::wr_opcode op, cvy::send_flags extra,
                  std::uint32_t imm_or_inv, const char* what) {
    auto area = std::span(s.scratch).subspan(768 * 1024, len);
    fill(area, seed);
    std::array<cvy::sge, 1> sg{s.smr.slice(768 * 1024, len)};
    cvy::send_wr wr{
        .wr_id = 20, .opcode = op, .flags = cvy::send_flags::signaled | extra, .sg_list = sg};
    if (op == cvy::wr_opcode::send_with_imm) wr.imm_data = imm_or_inv;
    if (op == cvy::wr_opcode::send_with_inv) wr.invalidate_rkey = imm_or_inv;
    one(wr, what);
  };
  send(1000, 1, cvy::wr_opcode::send, cvy::send_flags::none, 0, "SEND 1000");
  send(0, 0, cvy::wr_opcode::send, cvy::send_flags::none, 0, "SEND 0 bytes");
  send(4096, 2, cvy::wr_opcode::send, cvy::send_flags::solicited, 0, "SEND 4096 solicited");
  if (k.inv)
    send(16, 3, cvy::wr_opcode::send_with_inv, cvy::send_flags::inline_data, peer_inv.rkey,
         "SEND_WITH_INV (inline)");
  if (k.imm) {
    send(8, 4, cvy::wr_opcode::send_with_imm, cvy::send_flags::none, 0xC0FFEE00u + 4,
         "SEND_WITH_IMM");
    fill(std::span(s.scratch).subspan(800 * 1024, 64), 6);
    std::array<cvy::sge, 1> wg{s.smr.slice(800 * 1024, 64)};
    one({.wr_id = 21,
         .opcode = cvy::wr_opcode::rdma_write_with_imm,
         .sg_list = wg,
         .remote_addr = peer.addr + 256 * 1024,
         .rkey = peer.rkey,
         .imm_data = 0xC0FFEE00u + 5},
        "WRITE_WITH_IMM");
  }
  if (k.atomics) {
    std::array<cvy::sge, 1> ag{s.smr.slice(900 * 1024, 8)};
    auto r = peer.slice(1016 * 1024, 8);
    // The server's region there holds seed-77 bytes: FETCH_ADD returns them.
    std::uint64_t before = 0;
    for (int i = 7; i >= 0; --i)
      before = (before << 8) | static_cast<std::uint64_t>(pattern(
                                   1016 * 1024 - 512 * 1024 + static_cast<std::size_t>(i), 77));
    CHECK(s.qp.post_fetch_add(ag[0], r, 5, 30) == cvy::errc::ok, "post fetch_add");
    auto wc = s.wait();
    CHECK(wc && wc->status == cvy::wc_status::success, "fetch_add");
    std::uint64_t got = 0;
    std::memcpy(&got, s.scratch.data() + 900 * 1024, 8);
    CHECK(got == before, "fetch_add returned 0x%llx, wanted 0x%llx",
          static_cast<unsigned long long>(got), static_cast<unsigned long long>(before));
    CHECK(s.qp.post_cmp_swap(ag[0], r, before + 5, 42, 31) == cvy::errc::ok, "post cmp_swap");
    wc = s.wait();
    CHECK(wc && wc->status == cvy::wc_status::success, "cmp_swap");
    std::memcpy(&got, s.scratch.data() + 900 * 1024, 8);
    CHECK(got == before + 5, "cmp_swap returned 0x%llx", static_cast<unsigned long long>(got));
    std::printf("interop: client: atomics                 success\n");
  }
  send(4, 9, cvy::wr_opcode::send, cvy::send_flags::none, 0, "SEND done");
  auto wc = s.wait(20s);
  CHECK(wc && wc->status == cvy::wc_status::success && wc->opcode == cvy::wc_opcode::recv &&
            wc->byte_len == 8,
        "client: the server's reply");
  if (wc && wc->status == cvy::wc_status::success) {
    std::uint64_t h = 0;
    std::memcpy(&h, s.recvbuf.data() + (wc->wr_id - 1000) * 4096, 8);
    CHECK(h == sum(std::span(s.scratch).first(256 * 1024)),
          "client: the server's checksum of the WRITE differs");
  }
}

bool run(const config& c, scenario sc, const char* name) {
  const int before = failures;
  auto probe = [](const std::string& n) {
    auto d = cvy::device::open(n);
    struct r {
      bool first, second, inv;
    };
    return d ? r{d->attr().atomics, d->attr().immediate_data, d->attr().send_with_invalidate}
             : r{false, false, false};
  };
  auto a = probe(c.server), b = probe(c.client);
  // soft claims atomics/immediate only with a Conveyor peer (negotiated): with a
  // verbs peer the verbs device's capabilities decide.
  auto pick = [&](bool sa, bool ca) {
    if (c.server.rfind("soft", 0) == 0 && c.client.rfind("soft", 0) != 0) return ca;
    if (c.client.rfind("soft", 0) == 0 && c.server.rfind("soft", 0) != 0) return sa;
    return sa && ca;
  };
  caps k{pick(a.first, b.first), pick(a.second, b.second), a.inv && b.inv};
  std::printf("interop: === %s: server %s, client %s, crc %s, atomics %s, immediate %s\n", name,
              c.server.c_str(), c.client.c_str(), c.crc ? "on" : "off", k.atomics ? "yes" : "no",
              k.imm ? "yes" : "no");
  std::promise<std::string> addr;
  auto fut = addr.get_future();
  std::atomic<bool> done{false}, server_done{false};
  std::thread srv([&] { run_server(c, sc, k, addr, done, server_done); });
  std::string where = fut.wait_for(30s) == std::future_status::ready ? fut.get() : "";
  if (!where.empty()) run_client(c, sc, k, where, server_done);
  done = true;
  srv.join();
  std::printf("interop: %s: %s\n", name, failures == before ? "PASS" : "FAIL");
  return failures == before;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--server")
      c.server = next();
    else if (a == "--client")
      c.client = next();
    else if (a == "--addr")
      c.addr = next();
    else if (a == "--crc")
      c.crc = next() != "0";
    else if (a == "--port-down" && i + 3 < argc) {
      return port_down(argv[i + 1], argv[i + 2], argv[i + 3]);
    } else if (a == "--device-removal" && i + 2 < argc) {
      port_down_once(argv[i + 1], "", argv[i + 2], cut::removal);
      return failures == 0 ? 0 : 1;
    } else if (a == "--port-events" && i + 2 < argc) {
      const std::string d = argv[i + 1], n = argv[i + 2];
      return port_events(d, n);
    } else if (a == "--transport" && i + 2 < argc) {
      return transport_check(argv[i + 1], argv[i + 2]);
    } else if (a == "--port-flap" && i + 3 < argc) {
      return port_flap(argv[i + 1], argv[i + 2], argv[i + 3]);
    } else if (a == "--list") {
      for (const auto& d : cvy::device::list())
        std::printf("%-16s %-6s %-10s %s %s\n", d.name.c_str(), d.provider.c_str(),
                    std::string(cvy::to_string(d.transport_type)).c_str(),
                    d.available ? "available" : "unavailable", d.reason.c_str());
      return 0;
    } else {
      std::fprintf(stderr,
                   "usage: %s --server DEV --client DEV [--crc 0|1] [--addr IP] | --list | "
                   "--port-events DEV NETDEV | --port-down DEV NETDEV IP | --device-removal DEV IP "
                   "| --transport DEV IP | --port-flap DEV NETDEV IP\n",
                   argv[0]);
      return 2;
    }
  }
  run(c, scenario::data, "data");
  run(c, scenario::bad_rkey, "bad-rkey WRITE");
  run(c, scenario::read_oob, "out-of-bounds READ");
  std::printf("interop: %s (%d failure(s))\n", failures == 0 ? "ALL PASS" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
