// Writes the seed corpora under tests/fuzz/corpus/{fpdu,mpa,shm_peer,gloo_wire}/
// from the wire encoders: one valid example of every FPDU kind and MPA frame
// kind, plus a few coalesced streams; for conveyor-gloo, a header of every
// message type, a pair address, a hello and a reply (each behind the target's
// selector byte). The checked-in seeds were made with it:
//   fuzz_make_seeds tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "providers/soft/wire/wire.hpp"
#include "wire.hpp"  // apps/gloo/src

namespace {

using namespace conveyor::wire;

std::vector<std::byte> text(std::string_view s) {
  std::vector<std::byte> out;
  for (char c : s) out.push_back(std::byte(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::byte> counting(std::size_t n) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = std::byte(i);
  return out;
}

std::vector<std::byte> cat(std::initializer_list<std::vector<std::byte>> parts) {
  std::vector<std::byte> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

bool save(const std::filesystem::path& dir, const std::string& name,
          const std::vector<std::byte>& b) {
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return static_cast<bool>(f);
}

// fuzz_shm_peer's programs (its reader's format): one action byte, the
// action's fields little-endian, then the engine rounds to run.
struct shm_program {
  std::vector<std::byte> b;
  template <class T>
  shm_program& put(T v) {
    for (std::size_t i = 0; i < sizeof v; ++i)
      b.push_back(std::byte(static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i))));
    return *this;
  }
  // A request: op (msg_op value), flags, payload length, region index and
  // offset of raddr, key index, total, slot offset, payload bytes.
  shm_program& request(std::uint8_t op, std::uint8_t flags, std::uint16_t len, std::uint8_t area,
                       std::int32_t off, std::uint8_t key, std::uint32_t total,
                       std::uint16_t slot_off = 0, std::uint64_t cmp = 0, std::size_t payload = 0) {
    put<std::uint8_t>(op - 1).put(flags).put<std::uint8_t>(0).put(len).put(area).put(off);
    put(key).put(total).put(slot_off).put<std::uint8_t>(0).put<std::uint8_t>(0);
    put(cmp).put<std::uint64_t>(0).put<std::uint8_t>(static_cast<std::uint8_t>(payload));
    for (std::size_t i = 0; i < payload; ++i) put<std::uint8_t>(static_cast<std::uint8_t>(i));
    return *this;
  }
  shm_program& step(std::uint8_t action) { return put(action); }
  shm_program& rounds(std::uint8_t n = 3) { return put(n); }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  const auto fpdu = root / "fpdu";
  const auto mpa = root / "mpa";
  std::filesystem::create_directories(fpdu);
  std::filesystem::create_directories(mpa);
  bool ok = true;

  // ---- FPDUs
  read_request rr{0x11223344u, 0x7F0000001000ull, 4096, 0x00000201u, 0x7F0000002000ull};
  read_request read_rtr{};
  read_rtr.src_stag = 1;
  terminate_msg term_llp;
  term_llp.layer = term_layer::llp;
  term_llp.ecode = term::llp_crc;
  const auto bad_write = encode_tagged(rdmap_op::write, true, 0x42, 0, counting(5), false);
  terminate_msg term_ddp;
  term_ddp.layer = term_layer::ddp;
  term_ddp.etype = term::ddp_tagged;
  term_ddp.ecode = term::ddp_t_inv_stag;
  term_ddp.has_segment_length = true;
  term_ddp.ddp_segment_length = 19;
  term_ddp.ddp_header.assign(bad_write.begin() + 2, bad_write.begin() + 16);
  const auto rr_fpdu = encode_read_request(rr, 1, false);
  terminate_msg term_rdmap;
  term_rdmap.layer = term_layer::rdmap;
  term_rdmap.etype = term::rdmap_remote_prot;
  term_rdmap.ecode = term::rdmap_access;
  term_rdmap.ddp_segment_length = 46;
  term_rdmap.ddp_header.assign(rr_fpdu.begin() + 2, rr_fpdu.begin() + 20);
  term_rdmap.rdmap_header.assign(rr_fpdu.begin() + 20, rr_fpdu.begin() + 48);
  atomic_request fadd;
  fadd.request_id = 7;
  fadd.stag = 0x301;
  fadd.to = 0x7F0000003000ull;
  fadd.add_swap = 1;
  atomic_request cswap = fadd;
  cswap.kind = atomic_kind::cmp_swap;
  cswap.compare = 5;

  const auto write_rtr = encode_tagged(rdmap_op::write, true, 1, 0, {}, true);
  const auto send = encode_untagged(rdmap_op::send, true, qn::send, 1, 0, 0, text("hello"), true);
  const auto write =
      encode_tagged(rdmap_op::write, true, 0x101, 0x7F0000001000ull, counting(33), false);
  ok &= save(fpdu, "write_rtr_crc", write_rtr);
  ok &= save(fpdu, "write_payload_nocrc", write);
  ok &= save(fpdu, "write_first_segment_crc",
             encode_tagged(rdmap_op::write, false, 0x101, 0x1000, counting(64), true));
  ok &= save(fpdu, "read_response_crc",
             encode_tagged(rdmap_op::read_response, true, 0x11223344u, 0x7F0000001000ull,
                           counting(20), true));
  ok &= save(fpdu, "send_crc", send);
  ok &= save(fpdu, "send_inv_nocrc",
             encode_untagged(rdmap_op::send_inv, true, qn::send, 2, 0, 0x201u, counting(7), false));
  ok &= save(fpdu, "send_se_middle_crc",
             encode_untagged(rdmap_op::send_se, false, qn::send, 3, 1024, 0, counting(9), true));
  ok &= save(fpdu, "send_se_inv_empty",
             encode_untagged(rdmap_op::send_se_inv, true, qn::send, 4, 0, 0x301u, {}, true));
  ok &= save(fpdu, "read_request_crc", encode_read_request(rr, 1, true));
  ok &= save(fpdu, "read_rtr_nocrc", encode_read_request(read_rtr, 1, false));
  ok &= save(fpdu, "terminate_llp_crc", encode_terminate(term_llp, true));
  ok &= save(fpdu, "terminate_ddp_tagged", encode_terminate(term_ddp, false));
  ok &= save(fpdu, "terminate_rdmap_read", encode_terminate(term_rdmap, true));
  ok &= save(fpdu, "immediate", encode_immediate(0x0102030405060708ull, false, 5, true));
  ok &= save(fpdu, "immediate_se", encode_immediate(42, true, 6, false));
  ok &= save(fpdu, "atomic_fetch_add", encode_atomic_request(fadd, 1, true));
  ok &= save(fpdu, "atomic_cmp_swap", encode_atomic_request(cswap, 2, false));
  ok &= save(fpdu, "atomic_response", encode_atomic_response({7, 99}, 1, true));
  ok &= save(fpdu, "stream_rtr_send_write", cat({write_rtr, send, write}));
  ok &= save(fpdu, "stream_split_tail",
             cat({send, std::vector<std::byte>(write.begin(), write.begin() + 11)}));

  // ---- MPA frames
  mpa_frame req;
  req.revision = 2;
  req.v2 = mpa_v2_words{128, 128, true, false, true, true};
  req.private_data = text("conveyor");
  mpa_frame rep = req;
  rep.reply = true;
  rep.v2 = mpa_v2_words{128, 128, true, false, true, false};
  rep.private_data.clear();
  mpa_frame req_crc = req;
  req_crc.flags = mpa_flag::crc | mpa_flag::ext_offer;
  mpa_frame req_large = req_crc;  // a Conveyor request: CRC, RFC 7306, large FPDUs
  req_large.flags |= mpa_flag::large_fpdus;
  mpa_frame rep_large = rep;  // a Conveyor reply accepting both
  rep_large.flags = mpa_flag::crc | mpa_flag::ext_ack | mpa_flag::large_fpdus;
  mpa_frame v1_req;
  v1_req.revision = 1;
  v1_req.private_data = text("rev one");
  mpa_frame v1_rep = v1_req;
  v1_rep.reply = true;
  v1_rep.flags = mpa_flag::crc;
  mpa_frame reject;
  reject.reply = true;
  reject.flags = mpa_flag::reject;
  reject.private_data = text("no");
  mpa_frame big;
  big.v2 = mpa_v2_words{16, 16, false, false, false, false};
  big.private_data = counting(252);
  ok &= save(mpa, "req_v2_p2p", encode_mpa(req));
  ok &= save(mpa, "rep_v2_write_rtr", encode_mpa(rep));
  ok &= save(mpa, "req_v2_crc_ext", encode_mpa(req_crc));
  ok &= save(mpa, "req_v2_crc_ext_large", encode_mpa(req_large));
  ok &= save(mpa, "rep_v2_ext_ack_large", encode_mpa(rep_large));
  ok &= save(mpa, "req_v1", encode_mpa(v1_req));
  ok &= save(mpa, "rep_v1_crc", encode_mpa(v1_rep));
  ok &= save(mpa, "rep_reject", encode_mpa(reject));
  ok &= save(mpa, "req_v2_max_pd", encode_mpa(big));
  ok &= save(mpa, "req_then_fpdu", cat({encode_mpa(req), write_rtr}));

  // ---- fuzz_shm_peer: A is area 0 (3 MiB), B 1 (read-only), C 2 (other PD),
  // D 3 (local only), R 4 (receives); ops: 1 send, 3 write, 6 read, 7 atomic, 10 map_req.
  const auto shm_dir = root / "shm_peer";
  std::filesystem::create_directories(shm_dir);
  constexpr std::uint32_t big_a = 3u << 20;
  auto consume = [](shm_program& p) { p.step(4).put<std::uint8_t>(199).rounds(); };
  shm_program read_a, full, send_r, write_a, atomic_a, two, read_b, map;
  read_a.step(0).request(6, 3, 0, 0, 0, 0, 65536).rounds();
  consume(read_a);
  full.step(0).request(6, 3, 0, 0, 0, 0, big_a).rounds();
  full.step(3).request(6, 3, 0, 0, static_cast<std::int32_t>(big_a - 16), 0, 16).rounds();
  for (int i = 0; i < 4; ++i) consume(full);
  send_r.step(0).request(1, 3, 100, 4, 0, 0, 100, 0, 0, 100).rounds();
  write_a.step(0).request(3, 3, 64, 0, 128, 0, 64, 0, 0, 64).rounds();
  atomic_a.step(0).request(7, 3 | 32, 0, 0, 8, 0, 8, 0, 5).rounds();
  two.step(2).put<std::uint8_t>(1).request(1, 1, 8128, 4, 0, 0, 9000, 0, 0, 64);
  two.request(1, 2, 872, 4, 0, 0, 9000, 8128, 0, 64).rounds();
  read_b.step(0).request(6, 3, 0, 1, 0, 1, 65536).rounds();
  read_b.step(3).request(6, 3, 0, 1, 65520, 1, 16).rounds();
  consume(read_b);
  map.step(0).request(10, 3, 0, 0, 0, 0, 0).rounds();
  ok &= save(shm_dir, "read_a", read_a.b);
  ok &= save(shm_dir, "read_a_full_ring_rewrite", full.b);
  ok &= save(shm_dir, "send", send_r.b);
  ok &= save(shm_dir, "write_a", write_a.b);
  ok &= save(shm_dir, "atomic_a", atomic_a.b);
  ok &= save(shm_dir, "send_two_slots", two.b);
  ok &= save(shm_dir, "read_b_then_rewrite", read_b.b);
  ok &= save(shm_dir, "map_req", map.b);
  // ---- fuzz_gloo_wire: selector byte (0 header, 1 address, 2 hello, 3 reply), then the bytes.
  {
    namespace gw = conveyor_gloo::wire;
    const auto gdir = root / "gloo_wire";
    std::filesystem::create_directories(gdir);
    auto sel = [](std::uint8_t s, const std::vector<std::byte>& b) {
      return cat({{std::byte(s)}, b});
    };
    for (int t = 1; t <= 10; ++t) {
      gw::header h;
      h.type = gw::msg_type(t);
      h.flags = t == 3 || t == 4 ? gw::flag_notify : 0;
      h.credits = 3;
      h.slot = 0x100000007ull;
      h.token = 42;
      h.nbytes = t == 3 ? 16 : 1u << 20;
      h.addr = t == 2 || t == 6 ? 0x7f0000001000ull : 0;
      h.rkey = t == 2 || t == 6 ? 0x1234u : 0;
      std::vector<std::byte> b(gw::header_size);
      gw::encode(h, b.data());
      if (t == 3) b = cat({b, counting(16)});
      ok &= save(gdir, "header_" + std::to_string(t), sel(0, b));
    }
    gw::address a;
    a.rank = 3;
    for (std::size_t i = 0; i < gw::key_size; ++i) a.key[i] = std::uint8_t(i + 1);
    for (std::size_t i = 0; i < gw::nonce_size; ++i) a.nonce[i] = std::uint8_t(0xa0 + i);
    a.host_id[0] = 0x5a;
    a.forced = "";
    a.soft = "10.1.2.3:40123";
    a.shm = "@cvgloo-0123456789abcdef";
    auto ab = gw::encode(a);
    std::vector<std::byte> abytes(ab.size());
    std::memcpy(abytes.data(), ab.data(), ab.size());
    ok &= save(gdir, "address", sel(1, abytes));
    a.forced = "verbs";
    a.soft = "";
    a.shm = "";
    a.verbs = "255.255.255.255:65535";
    ab = gw::encode(a);
    std::memcpy(abytes.data(), ab.data(), ab.size());
    ok &= save(gdir, "address_verbs", sel(1, abytes));
    gw::hello hello;
    hello.from_rank = 1;
    hello.to_rank = 0;
    for (std::size_t i = 0; i < gw::nonce_size; ++i) hello.nonce[i] = std::uint8_t(i);
    for (std::size_t i = 0; i < gw::mac_size; ++i) hello.mac[i] = std::uint8_t(0xc0 + i);
    ok &= save(gdir, "hello", sel(2, gw::encode(hello)));
    gw::hello_reply reply;
    reply.rank = 0;
    for (std::size_t i = 0; i < gw::mac_size; ++i) reply.mac[i] = std::uint8_t(0x40 + i);
    ok &= save(gdir, "reply", sel(3, gw::encode(reply)));
  }
  if (!ok) {
    std::fprintf(stderr, "failed to write seeds under %s\n", argv[1]);
    return 1;
  }
  return 0;
}
