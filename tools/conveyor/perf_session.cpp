// Handshake, control messages and endpoint of `conveyor perf`.
#include "perf_session.hpp"

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <new>

namespace conveyor::tool {

void fail(const std::string& what) {
  throw perf_failure(what);
}

void check(status s, std::string_view what) {
  if (s != errc::ok) fail(std::string(what) + ": " + std::string(to_string(s)));
}

namespace {

constexpr std::array<std::byte, 4> magic{std::byte{'C'}, std::byte{'V'}, std::byte{'P'},
                                         std::byte{'F'}};

// Little-endian field writer/reader over a byte vector / span.
struct writer {
  std::vector<std::byte> out;
  void u(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
  }
  void raw(std::span<const std::byte> b) { out.insert(out.end(), b.begin(), b.end()); }
};
struct reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  bool ok = true;
  std::uint64_t u(int bytes) {
    if (at + static_cast<std::size_t>(bytes) > in.size()) {
      ok = false;
      return 0;
    }
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= std::to_integer<std::uint64_t>(in[at + static_cast<std::size_t>(i)]) << (8 * i);
    at += static_cast<std::size_t>(bytes);
    return v;
  }
  std::optional<remote_region> region() {
    if (at + remote_region::encoded_size > in.size()) {
      ok = false;
      return std::nullopt;
    }
    auto r = remote_region::decode(in.subspan(at, remote_region::encoded_size));
    at += remote_region::encoded_size;
    if (!r) {
      ok = false;
      return std::nullopt;
    }
    return *r;
  }
};

}  // namespace

std::vector<std::byte> perf_hello::encode() const {
  writer w;
  w.raw(magic);
  w.u(version, 2);
  w.u(qps, 2);
  w.u(index, 2);
  w.u(tx_depth, 4);
  w.u(rx_depth, 4);
  w.u(slots, 4);
  w.u(max_size, 8);
  // Regions as address and rkey only (the server knows their lengths from the
  // layout): the whole hello must fit the 55 bytes a connect may carry on
  // InfiniBand and RoCE.
  w.u(data.addr, 8);
  w.u(data.rkey, 4);
  w.u(ctl.addr, 8);
  w.u(ctl.rkey, 4);
  return w.out;
}

std::optional<perf_hello> perf_hello::decode(std::span<const std::byte> b, std::string& why) {
  if (b.size() < 6 || !std::equal(magic.begin(), magic.end(), b.begin())) {
    why = "the peer is not a conveyor perf client (no CVPF hello in its private data)";
    return std::nullopt;
  }
  reader r{b.subspan(4)};
  perf_hello h;
  h.version = static_cast<std::uint16_t>(r.u(2));
  if (h.version != perf_protocol_version) {
    why = "conveyor perf protocol version mismatch: the client speaks version " +
          std::to_string(h.version) + ", this server version " +
          std::to_string(perf_protocol_version) + "; run the same release on both sides";
    return std::nullopt;
  }
  h.qps = static_cast<std::uint16_t>(r.u(2));
  h.index = static_cast<std::uint16_t>(r.u(2));
  h.tx_depth = static_cast<std::uint32_t>(r.u(4));
  h.rx_depth = static_cast<std::uint32_t>(r.u(4));
  h.slots = static_cast<std::uint32_t>(r.u(4));
  h.max_size = r.u(8);
  h.data.addr = r.u(8);
  h.data.rkey = static_cast<std::uint32_t>(r.u(4));
  h.ctl.addr = r.u(8);
  h.ctl.rkey = static_cast<std::uint32_t>(r.u(4));
  if (!r.ok) {
    why = "malformed conveyor perf hello";
    return std::nullopt;
  }
  h.data.length =
      h.qps == 0 ? 0 : data_layout::make(h.max_size, h.tx_depth, h.qps, h.slots).bytes();
  h.ctl.length = ctl_layout::bytes;
  return h;
}

std::vector<std::byte> perf_welcome::encode() const {
  writer w;
  w.raw(magic);
  w.u(perf_protocol_version, 2);
  w.raw(data.encode());
  w.raw(ctl.encode());
  return w.out;
}

std::optional<perf_welcome> perf_welcome::decode(std::span<const std::byte> b) {
  if (b.size() < 6 || !std::equal(magic.begin(), magic.end(), b.begin())) return std::nullopt;
  reader r{b.subspan(4)};
  if (r.u(2) != perf_protocol_version) return std::nullopt;
  auto d = r.region();
  auto c = r.region();
  if (!r.ok || !d || !c) return std::nullopt;
  return perf_welcome{*d, *c};
}

void ctl_msg::encode(std::span<std::byte, wire_size> out) const noexcept {
  writer w;
  w.out.reserve(wire_size);
  w.raw(magic);
  w.u(static_cast<std::uint32_t>(kind), 4);
  w.u(static_cast<std::uint8_t>(test), 1);
  w.u(static_cast<std::uint8_t>(mode), 1);
  w.u(verify ? 1 : 0, 1);
  w.u(0, 1);
  w.u(size, 8);
  w.u(count, 8);
  w.u(seed, 8);
  w.u(user_us, 8);
  w.u(sys_us, 8);
  w.u(errors, 8);
  w.u(min_per_qp, 8);
  w.u(host, 8);
  w.u(cpu, 4);
  std::fill(out.begin(), out.end(), std::byte{0});
  std::copy_n(w.out.begin(), std::min(w.out.size(), wire_size), out.begin());
}

ctl_msg ctl_msg::decode(std::span<const std::byte, wire_size> in) noexcept {
  reader r{in.subspan(4)};
  ctl_msg m;
  m.kind = static_cast<ctl_kind>(r.u(4));
  m.test = static_cast<perf_test>(r.u(1));
  m.mode = static_cast<perf_mode>(r.u(1));
  m.verify = r.u(1) != 0;
  r.u(1);
  m.size = r.u(8);
  m.count = r.u(8);
  m.seed = r.u(8);
  m.user_us = r.u(8);
  m.sys_us = r.u(8);
  m.errors = r.u(8);
  m.min_per_qp = r.u(8);
  m.host = r.u(8);
  m.cpu = static_cast<std::uint32_t>(r.u(4));
  if (!std::equal(magic.begin(), magic.end(), in.begin())) m.kind = static_cast<ctl_kind>(0);
  return m;
}

namespace {
std::uint8_t pattern_byte(std::uint64_t seed, std::uint64_t slot, std::size_t i) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + slot * 0xBF58476D1CE4E5B9ull + i;
  x ^= x >> 29;
  return static_cast<std::uint8_t>(x * 0x94D049BB133111EBull >> 56);
}
}  // namespace

void fill_pattern(std::span<std::byte> out, std::uint64_t seed, std::uint64_t slot) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::byte{pattern_byte(seed, slot, i)};
}

// Receive buffers are shared by several posted receives and a peer may be
// placing the next message (same bytes) while this one is checked: the engine
// stands for a NIC writing by DMA, which ThreadSanitizer cannot know.
__attribute__((no_sanitize("thread"))) bool check_pattern(std::span<const std::byte> in,
                                                          std::uint64_t seed, std::uint64_t slot) {
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i] != std::byte{pattern_byte(seed, slot, i)}) return false;
  return true;
}

data_layout data_layout::make(std::uint64_t max_size, std::uint32_t depth, std::uint32_t qps,
                              std::uint32_t slots) {
  data_layout l;
  l.slot_size = std::max<std::uint64_t>(64, (max_size + 63) / 64 * 64);
  // Enough slots for every outstanding request, within 64 MiB per QP (requests
  // beyond that reuse slots, which a NIC does not mind).
  const std::uint64_t cap = std::max<std::uint64_t>(1, (64ull << 20) / l.slot_size);
  l.slots = slots != 0 ? slots
                       : static_cast<std::uint32_t>(
                             std::max<std::uint64_t>(2, std::min<std::uint64_t>(depth, cap)));
  l.qps = qps;
  return l;
}

aligned_buffer::aligned_buffer(std::size_t n)
    : ptr(static_cast<std::byte*>(::operator new (n, std::align_val_t{4096}))), size(n) {
  std::memset(ptr, 0, n);
}
aligned_buffer::~aligned_buffer() {
  ::operator delete (ptr, std::align_val_t{4096});
}

__attribute__((no_sanitize("thread"))) std::uint64_t load_remote_written(
    const std::byte* p) noexcept {
  const std::uint64_t v = *reinterpret_cast<const volatile std::uint64_t*>(p);
  std::atomic_thread_fence(std::memory_order_acquire);
  return v;
}

std::string device_to_open(const perf_options& o) {
  if (!o.device.empty()) return o.device;
  return o.provider;
}

device_options device_options_for(const perf_options& o) {
  device_options d;
  d.progress = o.progress;
  d.software.request_crc = o.crc;
  d.handshake_timeout_ms = static_cast<std::uint32_t>(o.timeout * 1000);
  return d;
}

void apply_cpu_pinning(const perf_options& o) {
  if (o.cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(o.cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0)
    fail("--cpu " + std::to_string(o.cpu) + ": " + std::strerror(errno));
}

void raise_fd_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur >= r.rlim_max) return;
  r.rlim_cur = r.rlim_max;
  (void)::setrlimit(RLIMIT_NOFILE, &r);  // best effort: a QP that finds no descriptor says so
}

placement placement::here(const perf_options& o) {
  // The boot id does not change while the process runs: read it once.
  static const std::uint64_t host = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    if (!std::getline(in, id) || id.empty()) return std::uint64_t{0};
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (unsigned char ch : id) h = (h ^ ch) * 0x100000001b3ull;
    return h != 0 ? h : 1;
  }();
  placement p;
  p.host = host;
  if (o.cpu >= 0) p.cpu = static_cast<std::uint32_t>(o.cpu) + 1;
  return p;
}

cpu_times cpu_times::now() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return {tv(ru.ru_utime), tv(ru.ru_stime)};
}

device open_perf_device(const perf_options& o) {
  const std::string name = device_to_open(o);
  auto d = device::open(name, device_options_for(o));
  if (!d) {
    std::string hint;
    if (d.error().code == errc::not_found)
      hint = " (`conveyor devices` lists what this machine has)";
    fail("open device " + name + ": " + d.error().to_string() + hint);
  }
  return std::move(*d);
}

perf_endpoint::perf_endpoint(device dev, const perf_options& o, const data_layout& layout)
    : opts_(o), layout_(layout), dev_(std::move(dev)) {
  const std::string name(dev_.name());
  pd_ = check(dev_.alloc_pd(), "alloc_pd on " + name);
  const std::uint32_t depth = std::min<std::uint32_t>(dev_.attr().max_cqe, 65536);
  scq_ = check(dev_.create_cq({.depth = depth}), "create send CQ on " + name);
  rcq_ = check(dev_.create_cq({.depth = depth}), "create receive CQ on " + name);
  ccq_ = check(dev_.create_cq({.depth = 64}), "create control CQ on " + name);
  ctl_buf_ = std::make_unique<aligned_buffer>(ctl_layout::bytes);
  constexpr auto all =
      access::local_write | access::remote_write | access::remote_read | access::remote_atomic;
  // The data region is the provider's own memory: on shm a peer maps it and
  // serves its one-sided operations itself (direct mapping; CONVEYOR_SHM_DIRECT=off
  // keeps them in this side's engine).
  data_mr_ = check(pd_.allocate_memory(layout_.bytes(), all),
                   "allocate " + format_size(layout_.bytes()) + " on " + name);
  ctl_mr_ = check(pd_.register_memory(ctl_buf_->span(), all), "register control region on " + name);
}

void perf_endpoint::create_qps(std::uint32_t n, std::uint32_t tx_depth, std::uint32_t rx_depth) {
  const auto& a = dev_.attr();
  // Device attributes may not know inline limits (verbs: per QP, 0 here):
  // ask for --inline then and use what each QP was granted.
  const std::uint32_t inline_cap =
      a.max_inline_data > 0 ? std::min<std::uint32_t>(opts_.inline_size, a.max_inline_data)
                            : opts_.inline_size;
  const std::uint32_t ord = std::min<std::uint32_t>(a.max_qp_rd_atom, 128);
  ctl_qp_ = check(pd_.create_qp({.send_cq = &ccq_,
                                 .recv_cq = &ccq_,
                                 .cap = {.max_send_wr = 16,
                                         .max_recv_wr = ctl_layout::recv_slots,
                                         .max_send_sge = 1,
                                         .max_recv_sge = 1,
                                         .max_inline_data = 64},
                                 .max_rd_atomic = 1,
                                 .max_dest_rd_atomic = 1}),
                  "create control QP");
  for (std::uint32_t i = 0; i < n; ++i) {
    qps_.push_back(check(pd_.create_qp({.send_cq = &scq_,
                                        .recv_cq = &rcq_,
                                        .cap = {.max_send_wr = std::min(a.max_qp_wr, tx_depth + 16),
                                                .max_recv_wr = std::min(a.max_qp_wr, rx_depth + 16),
                                                .max_send_sge = 1,
                                                .max_recv_sge = 1,
                                                .max_inline_data = inline_cap},
                                        .max_rd_atomic = ord,
                                        .max_dest_rd_atomic = ord}),
                         "create data QP " + std::to_string(i)));
  }
  inline_size_ = opts_.inline_size;
  for (const auto& q : qps_) inline_size_ = std::min(inline_size_, q.caps().max_inline_data);
}

void perf_endpoint::post_ctl_recvs() {
  for (std::size_t i = 0; i < ctl_layout::recv_slots; ++i)
    check(ctl_qp_.post_recv(
              ctl_mr_.slice(ctl_layout::recv_off + i * ctl_msg::wire_size, ctl_msg::wire_size), i),
          "post control receive");
}

void perf_endpoint::send_ctl(const ctl_msg& m) {
  auto buf = ctl_mr_.data() + ctl_layout::send_off;
  m.encode(std::span<std::byte, ctl_msg::wire_size>(buf, ctl_msg::wire_size));
  const sge s = ctl_mr_.slice(ctl_layout::send_off, ctl_msg::wire_size);
  check(ctl_qp_.post_send({.wr_id = 1u << 20,
                           .opcode = wr_opcode::send,
                           .flags = send_flags::signaled,
                           .sg_list = std::span(&s, 1)}),
        "post control message");
  // The send buffer is reused by the next message: wait until this one is out.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(opts_.timeout);
  while (true) {
    auto wc = ccq_.wait_one(std::chrono::milliseconds(50));
    if (wc) {
      if (wc->status != wc_status::success)
        fail("control message to the peer failed: " + std::string(to_string(wc->status)) + " (" +
             describe() + ")");
      if (wc->opcode == wc_opcode::send) return;
      pending_.push_back(*wc);
      continue;
    }
    if (wc.error() != errc::timed_out) fail("control CQ: " + std::string(to_string(wc.error())));
    if (std::chrono::steady_clock::now() > deadline)
      fail("the peer did not take a control message within the timeout (" + describe() + ")");
  }
}

std::optional<ctl_msg> perf_endpoint::take_ctl(const work_completion& wc) {
  if (wc.status != wc_status::success)
    fail("control connection failed: " + std::string(to_string(wc.status)) + " (" + describe() +
         ")");
  if (wc.opcode != wc_opcode::recv) return std::nullopt;
  const std::size_t slot = wc.wr_id % ctl_layout::recv_slots;
  const std::size_t off = ctl_layout::recv_off + slot * ctl_msg::wire_size;
  auto m = ctl_msg::decode(
      std::span<const std::byte, ctl_msg::wire_size>(ctl_mr_.data() + off, ctl_msg::wire_size));
  // Once the peer has gone (after its goodbye) the repost fails; the message stands.
  (void)ctl_qp_.post_recv(ctl_mr_.slice(off, ctl_msg::wire_size), slot);
  if (wc.byte_len != ctl_msg::wire_size || static_cast<std::uint32_t>(m.kind) == 0)
    fail("malformed control message from the peer (" + std::to_string(wc.byte_len) + " bytes)");
  return m;
}

std::optional<ctl_msg> perf_endpoint::try_recv_ctl() {
  while (!pending_.empty()) {
    auto wc = pending_.front();
    pending_.erase(pending_.begin());
    if (auto m = take_ctl(wc)) return m;
  }
  std::array<work_completion, 4> wcs;
  auto n = ccq_.poll(wcs);
  if (!n) fail("control CQ: " + std::string(to_string(n.error())));
  std::optional<ctl_msg> out;
  for (std::size_t i = 0; i < *n; ++i) {
    if (out) {
      pending_.push_back(wcs[i]);
      continue;
    }
    out = take_ctl(wcs[i]);
  }
  return out;
}

std::optional<ctl_msg> perf_endpoint::wait_ctl(std::chrono::milliseconds slice) {
  if (auto m = try_recv_ctl()) return m;
  auto wc = ccq_.wait_one(slice);
  if (wc) {
    pending_.push_back(*wc);
    return try_recv_ctl();
  }
  if (wc.error() != errc::timed_out) fail("control CQ: " + std::string(to_string(wc.error())));
  return std::nullopt;
}

ctl_msg perf_endpoint::recv_ctl(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto m = wait_ctl(std::chrono::milliseconds(20))) return *m;
    if (std::chrono::steady_clock::now() > deadline)
      fail("no control message from the peer within " + std::to_string(timeout.count() / 1000) +
           " s (" + describe() + ")");
  }
}

std::string perf_endpoint::describe() const {
  std::string s;
  auto one = [&](const char* what, const queue_pair& qp) {
    if (!qp) return;
    auto c = qp.counters();
    if (!s.empty()) s += "; ";
    s += std::string(what) + " QP " + std::to_string(qp.qp_num()) + " " +
         std::string(to_string(qp.state())) + ", tx/rx bytes " + std::to_string(c.tx_bytes) + "/" +
         std::to_string(c.rx_bytes);
  };
  one("control", ctl_qp_);
  if (!qps_.empty()) one("data", qps_.front());
  return s;
}

}  // namespace conveyor::tool
