// conveyor-demo's target (demo.cpp): registers the region and the atomic slot,
// accepts one initiator, checks and answers each message, and checks every
// byte on "done".
#include <conveyor/conveyor.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "demo_common.hpp"

namespace demo {

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
    if (!c.iwarp && !c.shm) {
      // No engine of ours served them (the counters of soft's and shm's
      // transports are absent): the NIC did, and it keeps no per-QP counters.
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

}  // namespace demo
