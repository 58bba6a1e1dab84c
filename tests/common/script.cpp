#include "common/script.hpp"

#include "common/caps.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "common/buffer.hpp"
#include "common/completions.hpp"
#include "common/env.hpp"
#include "common/pattern.hpp"

namespace cvt {

using conveyor::access;
using conveyor::errc;
using conveyor::wc_opcode;
using conveyor::wc_status;
using conveyor::work_completion;

namespace {

std::string get(const child_args& a, const std::string& k, const std::string& def = {}) {
  auto it = a.find(k);
  return it == a.end() ? def : it->second;
}
std::uint64_t get_u64(const child_args& a, const std::string& k, std::uint64_t def) {
  auto it = a.find(k);
  return it == a.end() ? def : std::strtoull(it->second.c_str(), nullptr, 0);
}

void log_line(const std::string& who, const std::string& msg) {
  std::fprintf(stderr, "[%s %d] %s\n", who.c_str(), static_cast<int>(::getpid()), msg.c_str());
  std::fflush(stderr);
}

void report(const std::string& line) {
  std::string l = line + "\n";
  const char* p = l.data();
  std::size_t left = l.size();
  while (left > 0) {
    ssize_t n = ::write(3, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

std::uint64_t load_u64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// One CQ of a child process, waited on directly (manual mode: this drives the engine).
std::string wait_one(cq_reader& r, std::chrono::milliseconds timeout, work_completion& wc) {
  std::vector<work_completion> v;
  if (auto e = wait_for(r, 1, timeout, v); !e.empty()) return e;
  wc = v[0];
  return {};
}

std::string expect_wc(cq_reader& r, std::chrono::milliseconds timeout, wc_opcode op,
                      std::uint64_t id, work_completion* out = nullptr) {
  work_completion wc;
  if (auto e = wait_one(r, timeout, wc); !e.empty()) return e;
  if (auto e = check_wc(wc, wc_status::success, op, id); !e.empty()) return e;
  if (out != nullptr) *out = wc;
  return {};
}

}  // namespace

std::vector<std::string> two_party_script::to_args() const {
  return {"--provider=" + provider,
          "--progress=" + std::string(progress_name(progress)),
          "--crc=" + std::string(crc ? "1" : "0"),
          "--region=" + std::to_string(region_size),
          "--region-seed=" + std::to_string(region_seed),
          "--write-len=" + std::to_string(write_len),
          "--write-seed=" + std::to_string(write_seed),
          "--msg-len=" + std::to_string(msg_len),
          "--msg-seed=" + std::to_string(msg_seed),
          "--max-mss=" + std::to_string(max_mss),
          "--expect-data-path=" + expect_data_path,
          "--target-uid=" + std::to_string(target_uid)};
}

two_party_script two_party_script::from_args(const child_args& a) {
  two_party_script s;
  s.provider = get(a, "provider", s.provider);
  parse_progress(get(a, "progress", "thread"), s.progress);
  s.crc = get(a, "crc", "1") == "1";
  s.region_size = get_u64(a, "region", s.region_size);
  s.region_seed = get_u64(a, "region-seed", s.region_seed);
  s.write_len = get_u64(a, "write-len", s.write_len);
  s.write_seed = get_u64(a, "write-seed", s.write_seed);
  s.msg_len = get_u64(a, "msg-len", s.msg_len);
  s.msg_seed = get_u64(a, "msg-seed", s.msg_seed);
  s.max_mss = static_cast<std::uint32_t>(get_u64(a, "max-mss", 0));
  s.expect_data_path = get(a, "expect-data-path");
  s.target_uid = static_cast<std::uint32_t>(get_u64(a, "target-uid", 0));
  return s;
}

std::string enter_netns(const std::string& name) {
  std::string path = "/var/run/netns/" + name;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "open " + path + ": " + std::strerror(errno);
  int r = ::setns(fd, CLONE_NEWNET);
  int e = errno;
  ::close(fd);
  if (r != 0) return "setns " + path + ": " + std::strerror(e);
  return {};
}

std::string run_two_party_initiator(const two_party_script& s, const std::string& address,
                                    const std::string& netns) {
  if (!netns.empty()) {
    if (auto e = enter_netns(netns); !e.empty()) return e;
  }
  const auto small = scaled(std::chrono::milliseconds(10000));
  const auto big = scaled(std::chrono::milliseconds(30000));
  auto dev =
      conveyor::device::open(device_name(s.provider, "init"), make_options(s.progress, s.crc));
  if (!dev) return "device::open: " + dev.error().to_string();
  auto pd = dev->alloc_pd();
  if (!pd) return "alloc_pd: " + pd.error().to_string();
  auto cq = dev->create_cq({.depth = 256});
  if (!cq) return "create_cq: " + cq.error().to_string();
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
  if (!qp) return "create_qp: " + qp.error().to_string();
  cq_reader reader(&*cq, "initiator CQ");

  auto src = make_region(*pd, s.region_size, access::local_write, s.write_seed);
  if (!src) return "register src: " + src.error().to_string();
  auto sink = make_region(*pd, s.region_size, access::local_write, 0xdead);
  if (!sink) return "register sink: " + sink.error().to_string();
  auto result = make_region(*pd, 64, access::local_write, 0xbeef);
  if (!result) return "register result: " + result.error().to_string();
  auto msg = make_region(*pd, s.msg_len, access::local_write, s.msg_seed);
  if (!msg) return "register msg: " + msg.error().to_string();

  const auto hello = as_bytes("cvt two-party initiator");
  auto info = conveyor::connect(*qp, address, {.private_data = hello, .timeout = small});
  if (!info) return "connect to " + address + ": " + info.error().to_string();
  if (info->private_data.size() < 2 * conveyor::remote_region::encoded_size) {
    return "target private data too short: " + std::to_string(info->private_data.size()) + " bytes";
  }
  std::span<const std::byte> pdata(info->private_data);
  auto data_r = conveyor::remote_region::decode(pdata.first(conveyor::remote_region::encoded_size));
  auto atom_r = conveyor::remote_region::decode(
      pdata.subspan(conveyor::remote_region::encoded_size, conveyor::remote_region::encoded_size));
  if (!data_r || !atom_r) return "cannot decode the target's remote regions";
  if (data_r->length != s.region_size)
    return "data region length " + std::to_string(data_r->length);

  auto conn = qp->connection();
  if (!conn) return "qp.connection(): " + conn.error().to_string();
  // The transport's own facts. shm has no wire to checksum: it never
  // negotiates CRC; on verbs CRC is the kernel's or the NIC's business and not
  // reported, and the MTU is the packet size.
  const auto& da = dev->attr();
  if (int{conn->iwarp.has_value()} + int{conn->shm.has_value()} + int{conn->verbs.has_value()} != 1)
    return "not exactly one transport part in the connection's attributes";
  if (has_mpa(*conn) != runs_mpa(da))
    return std::string("MPA part ") + (has_mpa(*conn) ? "present" : "missing") + " on " + da.name;
  if (conn->shm.has_value() == has_wire(da))
    return std::string("shm part ") + (conn->shm ? "present" : "missing") + " on " + da.name;
  std::string sizes;
  if (conn->shm) {
    if (conn->shm->slot_payload == 0) return "connection slot_payload is 0";
    sizes = " slot_payload=" + std::to_string(conn->shm->slot_payload);
  }
  if (conn->verbs) {
    if (conn->verbs->port_mtu == 0) return "connection port_mtu is 0";
    sizes = " path_mtu=" + std::to_string(conn->verbs->path_mtu) +
            " port_mtu=" + std::to_string(conn->verbs->port_mtu);
  }
  if (conn->iwarp) {
    const auto& iw = *conn->iwarp;
    if (iw.mss == 0) return "connection mss is 0";
    // Large FPDUs (both sides soft with software.large_fpdus, the default):
    // 64 KiB whatever the MSS; otherwise an FPDU fits in one TCP segment.
    if (iw.large_fpdus ? iw.max_fpdu != 65536 : (iw.max_fpdu == 0 || iw.max_fpdu > iw.mss)) {
      return "max_fpdu " + std::to_string(iw.max_fpdu) +
             (iw.large_fpdus ? std::string(" with large FPDUs, not 65536")
                             : " not in (0, mss " + std::to_string(iw.mss) + "]");
    }
    if (conveyor_peer(s.provider) && !iw.large_fpdus)
      return "soft<->soft connection without large FPDUs";
    if (iw.crc != s.crc) return std::string("crc negotiated ") + (iw.crc ? "on" : "off");
    sizes = " mss=" + std::to_string(iw.mss) + " max_fpdu=" + std::to_string(iw.max_fpdu) +
            (iw.large_fpdus ? " (large)" : "");
  }
  if (s.max_mss != 0 && (!conn->iwarp || conn->iwarp->mss > s.max_mss)) {
    return "mss " + (conn->iwarp ? std::to_string(conn->iwarp->mss) : std::string("unknown")) +
           " exceeds " + std::to_string(s.max_mss) + " on this link";
  }
  if (!s.expect_data_path.empty()) {
    const std::string path = conn->shm ? conn->shm->data_path : "";
    if (path != s.expect_data_path)
      return "data path \"" + path + "\", expected \"" + s.expect_data_path + "\"";
  }
  if (conveyor_peer(s.provider) && !conn->extensions) {
    return "Conveyor<->Conveyor connection without RFC 7306 extensions";
  }
  log_line("initiator", "connected " + conn->local_address + " -> " + conn->peer_address + sizes +
                            " ird=" + std::to_string(conn->ird) +
                            " ord=" + std::to_string(conn->ord));

  // WRITE the prefix.
  if (auto st = qp->post_write(src->sge(0, s.write_len), data_r->slice(0, s.write_len), 1);
      st != errc::ok) {
    return "post_write: " + name(st);
  }
  if (auto e = expect_wc(reader, big, wc_opcode::rdma_write, 1); !e.empty()) return "WRITE: " + e;
  // READ everything back (RDMA ordering: the READ sees the WRITE before it).
  if (auto st = qp->post_read(sink->sge(0, s.region_size), data_r->slice(0, s.region_size), 2);
      st != errc::ok) {
    return "post_read: " + name(st);
  }
  work_completion rwc;
  if (auto e = expect_wc(reader, big, wc_opcode::rdma_read, 2, &rwc); !e.empty())
    return "READ: " + e;
  if (rwc.byte_len != s.region_size) return "READ byte_len " + std::to_string(rwc.byte_len);
  if (auto e = check_pattern(sink->bytes().first(s.write_len), s.write_seed, 0); !e.empty()) {
    return "READ after WRITE, written part: " + e;
  }
  if (auto e = check_pattern(sink->bytes().subspan(s.write_len), s.region_seed, s.write_len);
      !e.empty()) {
    return "READ after WRITE, untouched part: " + e;
  }
  if (conn->extensions) {
    auto slot0 = atom_r->slice(0, 8), slot1 = atom_r->slice(8, 8);
    if (auto st = qp->post_cmp_swap(result->sge(0, 8), slot0, s.cas_initial, s.cas_swap, 3);
        st != errc::ok) {
      return "post_cmp_swap: " + name(st);
    }
    if (auto e = expect_wc(reader, small, wc_opcode::comp_swap, 3); !e.empty()) return "CAS: " + e;
    if (load_u64(result->data()) != s.cas_initial) return "CAS returned the wrong original value";
    // A failing compare returns the current value and changes nothing.
    if (auto st = qp->post_cmp_swap(result->sge(8, 8), slot0, s.cas_initial, 0, 4);
        st != errc::ok) {
      return "post_cmp_swap: " + name(st);
    }
    if (auto e = expect_wc(reader, small, wc_opcode::comp_swap, 4); !e.empty())
      return "CAS (miss): " + e;
    if (load_u64(result->data() + 8) != s.cas_swap)
      return "failed CAS returned the wrong current value";
    if (auto st = qp->post_fetch_add(result->sge(16, 8), slot1, s.faa_add, 5); st != errc::ok) {
      return "post_fetch_add: " + name(st);
    }
    if (auto e = expect_wc(reader, small, wc_opcode::fetch_add, 5); !e.empty()) return "FAA: " + e;
    if (load_u64(result->data() + 16) != s.faa_initial)
      return "FAA returned the wrong original value";
  }
  if (allocate_regions() && conn->shm && conn->shm->direct_mapping) {
    // The target's data region came from allocate_memory: READ it again until
    // this process serves the READ through its own mapping of the target's
    // memfd (the first request asked for it), then check the bytes it saw.
    bool mapped = false;
    for (int i = 0; i < 200 && !mapped; ++i) {
      if (auto st = qp->post_read(sink->sge(0, s.region_size), data_r->slice(0, s.region_size), 7);
          st != errc::ok)
        return "post_read (direct): " + name(st);
      if (auto e = expect_wc(reader, big, wc_opcode::rdma_read, 7); !e.empty())
        return "READ (direct): " + e;
      const auto c = qp->counters();
      mapped = c.shm && c.shm->direct_ops > 0;
      if (!mapped) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!mapped) return "the target's allocated region was never mapped";
    if (auto e = check_pattern(sink->bytes().first(s.write_len), s.write_seed, 0); !e.empty())
      return "direct READ, written part: " + e;
    if (auto e = check_pattern(sink->bytes().subspan(s.write_len), s.region_seed, s.write_len);
        !e.empty())
      return "direct READ, untouched part: " + e;
    log_line("initiator", "direct READ through the mapping of the target's region verified");
  }
  if (auto st = qp->post_send_msg(msg->sge(0, s.msg_len), 6); st != errc::ok)
    return "post_send: " + name(st);
  if (auto e = expect_wc(reader, big, wc_opcode::send, 6); !e.empty()) return "SEND: " + e;
  log_line("initiator", "script done");
  return {};
}

int run_two_party_target(const child_args& a) {
  const auto s = two_party_script::from_args(a);
  const std::string mode = get(a, "mode", "verify");
  const std::string who = "target";
  const unsigned lifetime = static_cast<unsigned>(get_u64(a, "lifetime", 120));
  ::alarm(lifetime);  // never outlive a test
  auto fail = [&](const std::string& m, int code = 1) {
    log_line(who, "FAILED: " + m);
    return code;
  };
  if (auto ns = get(a, "netns"); !ns.empty()) {
    if (auto e = enter_netns(ns); !e.empty()) return fail(e, 2);
  }
  if (s.target_uid != 0) {  // become another user (drops every capability)
    if (::setgroups(0, nullptr) != 0 || ::setgid(s.target_uid) != 0 || ::setuid(s.target_uid) != 0)
      return fail(std::string("switching to uid ") + std::to_string(s.target_uid) + ": " +
                      std::strerror(errno),
                  2);
  }
  auto dev =
      conveyor::device::open(device_name(s.provider, "child-tgt"), make_options(s.progress, s.crc));
  if (!dev) return fail("device::open: " + dev.error().to_string(), 2);
  auto pd = dev->alloc_pd();
  if (!pd) return fail("alloc_pd: " + pd.error().to_string(), 2);
  auto cq = dev->create_cq({.depth = 256});
  if (!cq) return fail("create_cq: " + cq.error().to_string(), 2);
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
  if (!qp) return fail("create_qp: " + qp.error().to_string(), 2);
  cq_reader reader(&*cq, "target CQ");

  auto data = make_region(*pd, s.region_size, all_rights, s.region_seed);
  if (!data) return fail("register data: " + data.error().to_string(), 2);
  // Atomic slots, written before registration.
  aligned_buffer abuf(64);
  std::memcpy(abuf.data(), &two_party_script::cas_initial, 8);
  std::memcpy(abuf.data() + 8, &two_party_script::faa_initial, 8);
  auto amr = pd->register_memory(abuf.bytes(), all_rights);
  if (!amr) return fail("register atomics: " + amr.error().to_string(), 2);
  auto msg = make_region(*pd, s.msg_len + 64, access::local_write, 0xdead);
  if (!msg) return fail("register msg: " + msg.error().to_string(), 2);
  if (auto st = qp->post_recv(msg->sge(0, s.msg_len + 64), 77); st != errc::ok) {
    return fail("post_recv: " + name(st), 2);
  }

  const std::string bind_addr = get(a, "addr");
  auto lis = bind_addr.empty() ? conveyor::listener::bind(*dev)
                               : conveyor::listener::bind(*dev, bind_addr);
  if (!lis) return fail("listener::bind: " + lis.error().to_string(), 2);
  // "port N address A": soft's A is "ip:port", shm's an abstract Unix name.
  report("port " + std::to_string(lis->port()) + " address " + lis->address());
  auto req = lis->accept(scaled(std::chrono::milliseconds(60000)));
  if (!req) return fail("listener.accept: " + req.error().to_string(), 3);
  std::vector<std::byte> published = data->remote().encode();
  auto ar = amr->remote().encode();
  published.insert(published.end(), ar.begin(), ar.end());
  auto info = req->accept(*qp, published);
  if (!info) return fail("connect_request.accept: " + info.error().to_string(), 3);
  report("connected");
  const bool ext = info->attr.extensions;

  if (mode == "serve") {
    // Serve one-sided operations; only manual progress needs this thread to poll.
    for (;;) {
      if (s.progress == conveyor::progress_mode::manual) {
        reader.wait_some(std::chrono::milliseconds(20));
        (void)reader.take(1000);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (qp->state() == conveyor::qp_state::error) {
        log_line(who, "connection ended");
        return 0;
      }
    }
  }

  work_completion wc;
  if (auto e = wait_one(reader, scaled(std::chrono::milliseconds(100000)), wc); !e.empty()) {
    return fail("waiting for the final SEND: " + e, 3);
  }
  if (auto e = check_wc(wc, wc_status::success, wc_opcode::recv, 77); !e.empty()) return fail(e, 4);
  if (wc.byte_len != s.msg_len)
    return fail("final SEND byte_len " + std::to_string(wc.byte_len), 4);
  if (auto e = check_pattern(msg->bytes().first(s.msg_len), s.msg_seed); !e.empty())
    return fail("message: " + e, 5);
  if (auto e = check_pattern(data->bytes().first(s.write_len), s.write_seed); !e.empty()) {
    return fail("written part: " + e, 5);
  }
  if (auto e = check_pattern(data->bytes().subspan(s.write_len), s.region_seed, s.write_len);
      !e.empty()) {
    return fail("untouched part: " + e, 5);
  }
  if (ext) {
    if (load_u64(abuf.data()) != two_party_script::cas_swap) return fail("CAS slot not swapped", 5);
    if (load_u64(abuf.data() + 8) != two_party_script::faa_initial + two_party_script::faa_add) {
      return fail("FAA slot has the wrong value", 5);
    }
  }
  log_line(who, "verified everything");
  return 0;
}

int run_two_party_initiator_child(const child_args& a) {
  ::alarm(static_cast<unsigned>(get_u64(a, "lifetime", 240)));
  const auto s = two_party_script::from_args(a);
  auto err = run_two_party_initiator(s, get(a, "connect"), get(a, "netns"));
  if (!err.empty()) {
    log_line("initiator", "FAILED: " + err);
    return 1;
  }
  return 0;
}

int child_main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s --conveyor-child <role> [--key=value ...]\n", argv[0]);
    return 2;
  }
  std::string role = argv[2];
  child_args a;
  for (int i = 3; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) continue;
    auto eq = s.find('=');
    if (eq == std::string::npos) {
      a[s.substr(2)] = "1";
    } else {
      a[s.substr(2, eq - 2)] = s.substr(eq + 1);
    }
  }
  if (role == "target") return run_two_party_target(a);
  if (role == "initiator") return run_two_party_initiator_child(a);
  std::fprintf(stderr, "unknown child role %s\n", role.c_str());
  return 2;
}

}  // namespace cvt
