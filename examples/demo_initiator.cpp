// conveyor-demo's initiator (demo.cpp): runs every verb against the target,
// verifies every byte and prints the table.
#include <conveyor/conveyor.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "demo_common.hpp"

namespace demo {

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
        // Where Conveyor runs MPA (soft) it negotiates RFC 7306 (atomics,
        // immediate data) and CRC with its peer and reports both; a NIC's
        // capabilities are the device's own.
        if (dev.attr().runs_mpa && !info->attr.extensions)
          fail("the connection did not negotiate RFC 7306 extensions (atomics, immediate data)");
        const auto& a = info->attr;
        if (a.iwarp && a.iwarp->crc != crc)  // MPA CRC is negotiated: on if either side asks
          fail(std::string("asked for CRC ") + (crc ? "on" : "off") +
               " but the connection has it " + (a.iwarp->crc ? "on" : "off"));
        atomics_ok = dev.attr().atomics && (!dev.attr().runs_mpa || a.extensions);
        immediate_ok = dev.attr().immediate_data && (!dev.attr().runs_mpa || a.extensions);
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

}  // namespace demo
