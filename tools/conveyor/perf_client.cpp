// The client side of `conveyor perf`: connects, runs every size through the
// server's phases, prints the table or the JSON.
//
// Loops: bandwidth/rate keep --tx-depth requests outstanding per QP (READs and
// atomics also within the negotiated ORD), posted --batch at a time with the
// last of each batch signaled; SEND and WRITE_WITH_IMM also wait for receive
// credits the server writes into the client's control region. Latency loops
// are ping-pongs timed per iteration: WRITE (each side watches the last 8 bytes
// of its landing slot, ib_write_lat style), SEND and WRITE_WITH_IMM (echoed by
// the server), READ and atomics (one request, wait for its completion).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include "perf.hpp"
#include "perf_clock.hpp"
#include "perf_report.hpp"
#include "perf_session.hpp"
#include "perf_signals.hpp"

namespace conveyor::tool {

namespace {

using clk = std::chrono::steady_clock;

double secs(clk::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Progress lines on stderr for runs that last more than a couple of seconds.
class progress_line {
 public:
  explicit progress_line(bool quiet) : quiet_(quiet), tty_(::isatty(2) != 0), start_(clk::now()) {}
  void update(const std::string& what, double fraction) {
    if (quiet_) return;
    const auto now = clk::now();
    if (now - start_ < std::chrono::seconds(2) || now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    shown_ = true;
    std::fprintf(stderr, "%sconveyor perf: %s %3.0f%%%s", tty_ ? "\r" : "", what.c_str(),
                 100.0 * std::clamp(fraction, 0.0, 1.0), tty_ ? "   " : "\n");
    std::fflush(stderr);
  }
  void done() {
    if (shown_ && tty_) std::fprintf(stderr, "\n");
    shown_ = false;
  }

 private:
  bool quiet_, tty_;
  clk::time_point start_, last_{};
  bool shown_ = false;
};

// Bounded busy loops: no progress for the timeout fails with what was waited for.
class stall_guard {
 public:
  stall_guard(double timeout, perf_endpoint& ep)
      : limit_(std::chrono::duration<double>(timeout)), ep_(ep) {}
  // No clock read here: it sits inside every timed round trip. The next
  // check() that reads the clock starts the stall window from then.
  void progress() { moved_ = true; }
  void check(const char* waiting_for) {
    if (++spins_ % 1024 != 0) return;
    const auto now = clk::now();
    if (moved_) {
      moved_ = false;
      last_ = now;
      return;
    }
    if (now - last_ > limit_)
      fail(std::string("no progress for ") + std::to_string(static_cast<int>(limit_.count())) +
           " s while waiting for " + waiting_for + " (" + ep_.describe() + ")");
  }

 private:
  std::chrono::duration<double> limit_;
  perf_endpoint& ep_;
  clk::time_point last_ = clk::now();
  bool moved_ = false;
  std::uint64_t spins_ = 0;
};

class client {
 public:
  explicit client(const perf_options& o)
      : o_(o),
        layout_(data_layout::make(*std::max_element(o.sizes.begin(), o.sizes.end()),
                                  std::max(o.tx_depth, o.batch), o.qps, o.slots)),
        ep_(open_perf_device(o), o, layout_),
        progress_(o.quiet) {}

  int run();

 private:
  void connect_all();
  void check_supported();
  perf_result run_size(std::uint64_t size, std::uint64_t seed, std::size_t index);
  void bw_loop(perf_result& r, std::uint64_t seed, const std::string& label);
  void lat_loop(perf_result& r, std::uint64_t seed, const std::string& label);
  // Polls the send CQ once, or with `block` waits up to bw_block for a
  // completion (the CQ spins, then sleeps and hands progress to the engine
  // thread); returns completions, failing on an error status.
  std::size_t reap_send(std::span<work_completion> wcs, bool block = false);
  void relax() const {
    if (!ep_.manual()) std::this_thread::yield();
  }
  // A bandwidth loop that saw no progress for bw_spin blocks on its CQ instead
  // of yielding again: on a CPU it shares with the target, a poller that only
  // yields can keep the target's engine off the CPU for hundreds of
  // milliseconds (each process in its own session, hence its own scheduling
  // group: the yield does not reach the group).
  static constexpr std::chrono::microseconds bw_spin{50};
  static constexpr std::chrono::milliseconds bw_block{1};
  remote_region peer_slot(std::uint32_t qp, std::uint64_t n, std::uint64_t len) const {
    return {peer_.data.addr + layout_.offset(qp, n), len, peer_.data.rkey};
  }
  std::byte* local_slot(std::uint32_t qp, std::uint64_t n) {
    return ep_.data_mr().data() + layout_.offset(qp, n);
  }
  std::uint32_t effective_depth() const;

  perf_options o_;
  data_layout layout_;
  perf_endpoint ep_;
  perf_welcome peer_;
  perf_settings settings_;
  progress_line progress_;
  std::vector<std::uint64_t> sent_total_;  // receive-consuming requests per QP, whole session
  std::uint32_t client_recvs_ = 0;         // receives posted on data QP 0 for echoes
  std::uint64_t client_recv_seq_ = 0;
  std::uint64_t min_per_qp_ = 0;   // of the last bandwidth loop
  bool peer_on_this_cpu_ = false;  // the server said it is pinned to our CPU
};

std::size_t client::reap_send(std::span<work_completion> wcs, bool block) {
  auto n = block ? ep_.send_cq().wait(wcs, bw_block) : ep_.send_cq().poll(wcs);
  if (!n && block && n.error() == errc::timed_out) return 0;
  if (!n) fail("poll: " + std::string(to_string(n.error())));
  for (std::size_t i = 0; i < *n; ++i)
    if (wcs[i].status != wc_status::success)
      fail(std::string(to_string(wcs[i].opcode)) +
           " failed: " + std::string(to_string(wcs[i].status)) + " (" + ep_.describe() + ")");
  return *n;
}

std::uint32_t client::effective_depth() const {
  std::uint32_t d = o_.tx_depth;
  if (o_.test == perf_test::read || is_atomic(o_.test))
    d = std::min(d, std::max<std::uint32_t>(1, settings_.ord));
  return d;
}

void client::connect_all() {
  ep_.create_qps(o_.qps, o_.tx_depth, o_.rx_depth);
  o_.inline_size = ep_.inline_size();  // what the device granted (the report shows it)
  ep_.post_ctl_recvs();
  sent_total_.assign(o_.qps, 0);
  perf_hello h;
  h.qps = static_cast<std::uint16_t>(o_.qps);
  h.tx_depth = std::max(o_.tx_depth, o_.batch);
  h.rx_depth = o_.rx_depth;
  h.slots = o_.slots;
  h.max_size = *std::max_element(o_.sizes.begin(), o_.sizes.end());
  h.data = ep_.data_mr().remote();
  h.ctl = ep_.ctl_mr().remote();
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o_.timeout * 1000));
  auto connect_one = [&](queue_pair& qp, std::uint16_t index) {
    h.index = index;
    const auto pd = h.encode();
    auto info = connect(qp, o_.address, {.private_data = pd, .timeout = timeout});
    if (!info) {
      const auto& e = info.error();
      std::string hint;
      if (e.code == errc::connection_refused)
        hint = "; nothing is listening there: start `conveyor perf --server` on that host first";
      else if (e.code == errc::timed_out)
        hint = "; check the address and that the server is reachable";
      else if (e.code == errc::address_error)
        hint = "; addresses look like 192.0.2.1:18515";
      fail("connect to " + o_.address + ": " + e.to_string() + hint);
    }
    auto w = perf_welcome::decode(info->private_data);
    if (!w)
      fail("the peer at " + o_.address + " is not a conveyor perf server of protocol version " +
           std::to_string(perf_protocol_version));
    peer_ = *w;
    return *info;
  };
  auto ctl_info = connect_one(ep_.ctl_qp(), 0);
  (void)ctl_info;
  connection_info first{};
  for (std::uint32_t i = 0; i < o_.qps; ++i) {
    auto info = connect_one(ep_.qps()[i], static_cast<std::uint16_t>(i + 1));
    if (i == 0) first = info;
  }
  const auto& a = ep_.dev().attr();
  settings_.provider = a.provider;
  settings_.device = a.name;
  settings_.transport = std::string(to_string(a.transport_type));
  settings_.progress = o_.progress == progress_mode::manual ? "manual" : "thread";
  const auto& c = first.attr;
  settings_.local_address = c.local_address;
  settings_.peer_address = c.peer_address;
  settings_.ird = c.ird;
  settings_.ord = c.ord;
  settings_.extensions = c.extensions;
  settings_.iwarp = c.iwarp;
  settings_.shm = c.shm;
  settings_.verbs = c.verbs;
  settings_.opts = o_;
  settings_.slots = o_.mode == perf_mode::lat ? 1 : layout_.slots;
}

void client::check_supported() {
  const bool needs_ext = is_atomic(o_.test) || o_.test == perf_test::write_imm;
  if (needs_ext && !settings_.extensions) {
    const char* what = is_atomic(o_.test) ? "atomics" : "immediate data";
    fail(std::string(to_string(o_.test)) + " is not supported on this connection: " + what +
         " need both ends to support them (provider " + settings_.provider + ", device " +
         settings_.device + ")");
  }
}

void client::bw_loop(perf_result& r, std::uint64_t seed, const std::string& label) {
  const std::uint32_t nq = o_.qps;
  const std::uint32_t depth = effective_depth();
  const std::uint32_t batch = std::min(o_.batch, depth);
  const std::uint64_t size = r.size;
  const bool inl =
      size <= ep_.inline_size() && (o_.test == perf_test::write || o_.test == perf_test::send ||
                                    o_.test == perf_test::write_imm);
  const bool credits = consumes_receive(o_.test);
  std::vector<std::uint64_t> posted(nq, 0), completed(nq, 0);
  std::vector<sge> sges(batch);
  std::vector<send_wr> wrs(batch);
  std::array<work_completion, 64> wcs;
  std::uint64_t posted_total = 0, completed_total = 0;
  const auto duration = std::chrono::duration<double>(o_.duration);
  stall_guard stall(o_.timeout, ep_);
  const std::byte* credit_words = ep_.ctl_mr().data() + ctl_layout::credit_off;
  auto t0 = clk::now();
  auto t_last = t0;
  auto idle_since = t0;
  bool stop = false;
  std::uint32_t next_q = 0;
  // --warmup: that many requests first, all completed before the clock starts
  // (a first touch of each slot, and mappings made on first access, stay out).
  const std::uint64_t warm = o_.warmup;
  bool timing = warm == 0;

  while (true) {
    // One clock read a turn (about 25 ns on a VM: a fifth of a turn at 8 B).
    const auto now = clk::now();
    if (!timing && completed_total == warm && posted_total == warm) {
      timing = true;
      t0 = t_last = idle_since = now;
    }
    if (timing && !stop) {
      stop = o_.iters != 0 ? posted_total - warm >= o_.iters : now - t0 >= duration;
      progress_.update(label, o_.iters != 0 ? static_cast<double>(completed_total - warm) /
                                                  static_cast<double>(o_.iters)
                                            : secs(now - t0) / o_.duration);
    }
    if (stop && completed_total == posted_total) break;
    bool moved = false;
    for (std::uint32_t k = 0; k < nq && !stop; ++k) {
      const std::uint32_t q = (next_q + k) % nq;
      std::uint64_t room = depth - (posted[q] - completed[q]);
      if (room < batch) continue;
      std::uint64_t n = batch;
      if (!timing)
        n = std::min<std::uint64_t>(n, warm - posted_total);
      else if (o_.iters != 0)
        n = std::min<std::uint64_t>(n, o_.iters - (posted_total - warm));
      if (credits) {
        const std::uint64_t credit = load_remote_written(credit_words + 8 * q);
        const std::uint64_t avail = credit > sent_total_[q] ? credit - sent_total_[q] : 0;
        n = std::min(n, avail);
      }
      if (n == 0) continue;
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint64_t seq = posted[q] + i;
        const std::uint64_t off = layout_.offset(q, seq);
        sges[i] = ep_.data_mr().slice(off, size);
        auto& w = wrs[i];
        w = send_wr{};
        w.sg_list = std::span(&sges[i], 1);
        const bool last = i + 1 == n;
        w.flags = last ? send_flags::signaled : send_flags::none;
        if (inl) w.flags = w.flags | send_flags::inline_data;
        w.wr_id = (static_cast<std::uint64_t>(q) << 40) | (seq + 1);
        const auto remote = peer_slot(q, seq, size);
        switch (o_.test) {
          case perf_test::write:
            w.opcode = wr_opcode::rdma_write;
            break;
          case perf_test::read:
            w.opcode = wr_opcode::rdma_read;
            break;
          case perf_test::send:
            w.opcode = wr_opcode::send;
            break;
          case perf_test::write_imm:
            w.opcode = wr_opcode::rdma_write_with_imm;
            w.imm_data = static_cast<std::uint32_t>(seq);
            break;
          case perf_test::fetch_add:
            w.opcode = wr_opcode::atomic_fetch_and_add;
            w.compare_add = 1;
            break;
          case perf_test::compare_swap:
            w.opcode = wr_opcode::atomic_cmp_and_swp;
            w.compare_add = seq;
            w.swap = seq + 1;
            break;
        }
        if (is_atomic(o_.test)) {
          w.remote_addr = peer_.data.addr + layout_.offset(q, 0);
          sges[i].length = 8;
        } else {
          w.remote_addr = remote.addr;
        }
        w.rkey = peer_.data.rkey;
      }
      std::size_t bad = 0;
      const status s = ep_.qps()[q].post_send(std::span(wrs.data(), n), &bad);
      if (s == errc::again) continue;
      if (s != errc::ok) check(s, "post on data QP " + std::to_string(q));
      posted[q] += n;
      posted_total += n;
      if (credits) sent_total_[q] += n;
      moved = true;
    }
    next_q = (next_q + 1) % nq;
    // Block only while a completion is due (not while waiting for receive
    // credits, which arrive as remote writes that wake no one).
    const bool block =
        !moved && !ep_.manual() && completed_total < posted_total && now - idle_since >= bw_spin;
    const std::size_t got = reap_send(wcs, block);
    for (std::size_t i = 0; i < got; ++i) {
      const std::uint32_t q = static_cast<std::uint32_t>(wcs[i].wr_id >> 40);
      const std::uint64_t upto = wcs[i].wr_id & ((1ull << 40) - 1);
      if (r.verified) {
        for (std::uint64_t seq = completed[q]; seq < upto; ++seq) {
          if (o_.test == perf_test::read) {
            if (!check_pattern({local_slot(q, seq), size}, seed, seq % layout_.slots))
              ++r.verify_errors;
          } else if (o_.test == perf_test::compare_swap) {
            std::uint64_t v;
            std::memcpy(&v, local_slot(q, seq), 8);
            if (v != seq) ++r.verify_errors;
          }
        }
      }
      completed_total += upto - completed[q];
      completed[q] = upto;
    }
    if (got != 0 || moved) {
      stall.progress();
      idle_since = now;
      // When the last completion came: after a blocking wait, now; otherwise
      // this turn's start is within one non-blocking turn of it.
      if (got != 0) t_last = block ? clk::now() : now;
    } else {
      stall.check(credits ? "completions or receive credits from the server" : "completions");
      if (!block) relax();
    }
  }
  progress_.done();
  r.iterations = completed_total - warm;
  r.seconds = secs(t_last - t0);
  min_per_qp_ = *std::min_element(completed.begin(), completed.end());
}

void client::lat_loop(perf_result& r, std::uint64_t seed, const std::string& label) {
  const std::uint64_t size = r.size;
  const std::uint64_t total = o_.iters != 0 ? o_.iters + o_.warmup : 0;
  const auto duration = std::chrono::duration<double>(o_.duration);
  std::vector<std::uint32_t> samples;
  samples.reserve(o_.iters != 0 ? o_.iters : 1u << 20);
  std::array<work_completion, 16> wcs;
  queue_pair& qp = ep_.qps()[0];
  std::vector<std::uint64_t> done_on(o_.qps, 0);  // one-sided round trips per QP
  std::byte* landing = local_slot(0, 0);
  std::byte* src = ep_.data_mr().data() + layout_.spare();
  const bool inl = size <= ep_.inline_size();
  const sge src_sge = ep_.data_mr().slice(layout_.spare(), size);
  // Receives take a whole slot: one posted in an earlier, smaller phase must
  // still hold this phase's echoes.
  const sge land_sge = ep_.data_mr().slice(layout_.offset(0, 0), layout_.slot_size);
  stall_guard stall(o_.timeout, ep_);
  // Receives for the server's echoes (SEND / WRITE_WITH_IMM).
  auto top_up_recvs = [&] {
    while (client_recvs_ < 16) {
      check(qp.post_recv(land_sge, client_recv_seq_++), "post receive");
      ++client_recvs_;
    }
  };
  // WRITE ping-pong polls the landing slot, so it starts cleared. Echo tests
  // look at it only after the receive completed, and a slot under posted
  // receives belongs to the provider: leave it alone (a memset here raced
  // with the engine placing an echo, which TSan caught on shm).
  if (consumes_receive(o_.test))
    top_up_recvs();
  else
    std::memset(landing, 0, size);
  if (r.verified) fill_pattern({src, size}, seed, 0);

  latency_spin spin(ep_.manual(), peer_on_this_cpu_);
  tick_clock::ns_per_tick();  // starts the counter's rate measurement
  auto wait_send = [&](const char* what) {
    while (true) {
      if (reap_send(wcs) != 0) return;
      spin.relax();
      stall.check(what);
    }
  };
  auto wait_recv = [&](std::uint64_t i) {
    while (true) {
      auto n = ep_.recv_cq().poll(std::span(wcs.data(), 1));
      if (!n) fail("poll: " + std::string(to_string(n.error())));
      if (*n == 1) {
        const auto& wc = wcs[0];
        if (wc.status != wc_status::success)
          fail("receive failed: " + std::string(to_string(wc.status)) + " (" + ep_.describe() +
               ")");
        --client_recvs_;
        if (o_.test == perf_test::write_imm &&
            (!wc.with_imm || wc.imm_data != static_cast<std::uint32_t>(i)))
          fail("echo carried the wrong immediate value");
        return;
      }
      if (reap_send(wcs) == 0) spin.relax();
      stall.check("the server's echo");
    }
  };

  const auto t_start = clk::now();
  for (std::uint64_t i = 1;; ++i) {
    if (total != 0 ? i > total : (i > o_.warmup && clk::now() - t_start >= duration)) break;
    if ((i & 255) == 0)
      progress_.update(label, total != 0 ? static_cast<double>(i) / static_cast<double>(total)
                                         : secs(clk::now() - t_start) / o_.duration);
    const bool signaled = i % 64 == 0;
    spin.reset();
    const std::uint64_t t0 = tick_clock::now();
    switch (o_.test) {
      case perf_test::write: {
        std::memcpy(src + size - 8, &i, 8);
        send_wr w{.wr_id = i,
                  .opcode = wr_opcode::rdma_write,
                  .flags = (signaled ? send_flags::signaled : send_flags::none) |
                           (inl ? send_flags::inline_data : send_flags::none),
                  .sg_list = std::span(&src_sge, 1),
                  .remote_addr = peer_slot(0, 0, size).addr,
                  .rkey = peer_.data.rkey};
        check(qp.post_send(w), "post WRITE");
        // Under manual progress the poll places the echo: look again before
        // relaxing (a yield per round trip otherwise).
        while (load_remote_written(landing + size - 8) != i) {
          if (reap_send(wcs) == 0 && load_remote_written(landing + size - 8) != i) spin.relax();
          stall.check("the server's WRITE back");
        }
        if (r.verified && !check_pattern({landing, size - 8}, seed, 1)) ++r.verify_errors;
        break;
      }
      case perf_test::read:
      case perf_test::fetch_add:
      case perf_test::compare_swap: {
        // One-sided: each round trip takes the next QP (--qps), into that
        // QP's first slot on both sides.
        const std::uint32_t q = static_cast<std::uint32_t>((i - 1) % o_.qps);
        const std::uint64_t before = done_on[q]++;  // this QP's atomic word holds it
        const sge s = ep_.data_mr().slice(layout_.offset(q, 0), is_atomic(o_.test) ? 8 : size);
        send_wr w{.wr_id = i,
                  .sg_list = std::span(&s, 1),
                  .remote_addr = peer_slot(q, 0, size).addr,
                  .rkey = peer_.data.rkey};
        w.opcode = o_.test == perf_test::read        ? wr_opcode::rdma_read
                   : o_.test == perf_test::fetch_add ? wr_opcode::atomic_fetch_and_add
                                                     : wr_opcode::atomic_cmp_and_swp;
        w.compare_add = o_.test == perf_test::fetch_add ? 1 : before;
        w.swap = before + 1;
        if (const status st = ep_.qps()[q].post_send(w); st != errc::ok)
          check(st, "post request on data QP " + std::to_string(q));
        wait_send("the response");
        if (r.verified) {
          const std::byte* got = local_slot(q, 0);
          if (o_.test == perf_test::read) {
            if (!check_pattern({got, size}, seed, 0)) ++r.verify_errors;
          } else {
            std::uint64_t v;
            std::memcpy(&v, got, 8);
            if (v != before) ++r.verify_errors;
          }
        }
        break;
      }
      case perf_test::send:
      case perf_test::write_imm: {
        send_wr w{.wr_id = i,
                  .flags = (signaled ? send_flags::signaled : send_flags::none) |
                           (inl ? send_flags::inline_data : send_flags::none),
                  .sg_list = std::span(&src_sge, 1)};
        if (o_.test == perf_test::send) {
          w.opcode = wr_opcode::send;
        } else {
          w.opcode = wr_opcode::rdma_write_with_imm;
          w.remote_addr = peer_slot(0, 0, size).addr;
          w.rkey = peer_.data.rkey;
          w.imm_data = static_cast<std::uint32_t>(i);
        }
        check(qp.post_send(w), "post request");
        wait_recv(i);
        if (r.verified && !check_pattern({landing, size}, seed, 1)) ++r.verify_errors;
        top_up_recvs();
        break;
      }
    }
    const std::uint64_t t1 = tick_clock::now();
    stall.progress();
    if (i > o_.warmup)
      samples.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(t1 - t0, 0xFFFFFFFF)));
  }
  // Ticks to nanoseconds, at the counter's rate measured over the run.
  const double ns_per_tick = tick_clock::ns_per_tick();
  for (auto& t : samples)
    t = static_cast<std::uint32_t>(std::min(std::round(t * ns_per_tick), double(0xFFFFFFFF)));
  // Retire what is still unsignaled in the send queue: one signaled zero-length
  // WRITE completes after everything before it.
  {
    const sge none = ep_.data_mr().slice(0, 0);
    send_wr w{.wr_id = 0,
              .opcode = wr_opcode::rdma_write,
              .flags = send_flags::signaled,
              .sg_list = std::span(&none, 1),
              .remote_addr = peer_.data.addr,
              .rkey = peer_.data.rkey};
    check(qp.post_send(w), "post final WRITE");
    wait_send("the final completion");
  }
  progress_.done();
  r.iterations = samples.size();
  r.seconds = secs(clk::now() - t_start);
  r.lat = latency_stats::from_ns(samples);
  if (r.lat->mean > 0) r.mops = 1.0 / r.lat->mean;
  r.mb_per_s = r.seconds > 0
                   ? static_cast<double>(size) * static_cast<double>(r.iterations) / r.seconds / 1e6
                   : 0;
}

perf_result client::run_size(std::uint64_t size, std::uint64_t seed, std::size_t index) {
  perf_result r;
  r.test = o_.test;
  r.mode = o_.mode;
  r.size = size;
  r.verified = o_.verify;
  // What this side sends carries the pattern of its slot.
  if (o_.verify &&
      (o_.test == perf_test::write || o_.test == perf_test::send ||
       o_.test == perf_test::write_imm) &&
      o_.mode != perf_mode::lat) {
    for (std::uint32_t q = 0; q < o_.qps; ++q)
      for (std::uint32_t j = 0; j < layout_.slots; ++j)
        fill_pattern({local_slot(q, j), size}, seed, j);
  }
  ctl_msg b{.kind = ctl_kind::begin,
            .test = o_.test,
            .mode = o_.mode,
            .verify = o_.verify,
            .size = size,
            .count = static_cast<std::uint64_t>(o_.duration * 1000),
            .seed = seed};
  const placement here = placement::here(o_);
  b.host = here.host;
  b.cpu = here.cpu;
  ep_.send_ctl(b);
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o_.timeout * 1000));
  auto ready = ep_.recv_ctl(timeout);
  if (ready.kind != ctl_kind::ready) fail("the server did not start the phase (protocol error)");
  peer_on_this_cpu_ = here.shares_cpu_with({ready.host, ready.cpu});

  const std::string label = std::string(to_string(o_.test)) + " " +
                            std::string(to_string(o_.mode)) + " " + format_size(size) + " (" +
                            std::to_string(index + 1) + "/" + std::to_string(o_.sizes.size()) + ")";
  const auto c0 = cpu_times::now();
  if (o_.mode == perf_mode::lat)
    lat_loop(r, seed, label);
  else
    bw_loop(r, seed, label);
  const auto c = cpu_times::now() - c0;
  r.user_s = c.user;
  r.sys_s = c.sys;
  if (o_.mode != perf_mode::lat && r.seconds > 0) {
    r.mb_per_s = static_cast<double>(size) * static_cast<double>(r.iterations) / r.seconds / 1e6;
    r.mops = static_cast<double>(r.iterations) / r.seconds / 1e6;
  }
  ctl_msg e{.kind = ctl_kind::end,
            .test = o_.test,
            .mode = o_.mode,
            .verify = o_.verify,
            .size = size,
            .count = r.iterations + o_.warmup,
            .seed = seed,
            .min_per_qp = o_.mode == perf_mode::lat ? r.iterations : min_per_qp_};
  ep_.send_ctl(e);
  auto res = ep_.recv_ctl(timeout + std::chrono::seconds(30));  // the server may be verifying
  if (res.kind != ctl_kind::result)
    fail("the server did not report the phase's result (protocol error)");
  r.peer_user_s = static_cast<double>(res.user_us) / 1e6;
  r.peer_sys_s = static_cast<double>(res.sys_us) / 1e6;
  r.verify_errors += res.errors;
  return r;
}

int client::run() {
  connect_all();
  check_supported();
  if (!o_.json) {
    print_settings(stdout, settings_);
    print_table_header(stdout, settings_);
  }
  std::vector<perf_result> results;
  // Ctrl-C / SIGTERM: what was measured so far (the table's rows are printed
  // already; JSON gets the finished sizes and "interrupted"), then exit 128+sig.
  std::mutex results_mu;
  struct forget_action {
    ~forget_action() { on_interrupt({}); }
  } forget;  // before `results` goes away, also when a run fails
  on_interrupt([&](int sig) {
    const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    std::lock_guard lk(results_mu);
    if (o_.json) {
      auto j = to_json(settings_, results);
      j["interrupted"] = name;
      std::cout << j.dump(2) << std::endl;
    }
    std::fprintf(stderr, "conveyor perf: interrupted by %s after %zu of %zu sizes%s\n", name,
                 results.size(), o_.sizes.size(),
                 results.empty() ? ""
                 : o_.json       ? " (their results above)"
                                 : " (the rows above are complete)");
  });
  bool verify_failed = false;
  for (std::size_t i = 0; i < o_.sizes.size(); ++i) {
    const std::uint64_t seed = 0x5eedull * (i + 1) + o_.sizes[i];
    auto r = run_size(o_.sizes[i], seed, i);
    std::lock_guard lk(results_mu);
    results.push_back(r);
    if (results.back().verify_errors != 0) verify_failed = true;
    if (!o_.json) print_table_row(stdout, settings_, results.back());
  }
  ep_.send_ctl({.kind = ctl_kind::bye});
  if (o_.json) std::cout << to_json(settings_, results).dump(2) << std::endl;
  if (verify_failed) {
    std::fprintf(stderr, "conveyor perf: data verification FAILED (see verify_errors)\n");
    return 1;
  }
  return 0;
}

}  // namespace

int run_perf_client(const perf_options& o) {
  try {
    apply_cpu_pinning(o);
    client c(o);
    return c.run();
  } catch (const perf_failure& e) {
    std::fprintf(stderr, "conveyor perf: %s\n", e.what());
    return 1;
  }
}

int run_perf(perf_options o) {
  std::string why;
  const std::string address = resolve_address(o, o.address, why);
  if (address.empty()) {
    std::fprintf(stderr, "conveyor perf%s: %s\n", o.server ? " server" : "", why.c_str());
    return 1;
  }
  o.address = address;
  take_interrupts();
  raise_fd_limit();
  return o.server ? run_perf_server(o) : run_perf_client(o);
}

}  // namespace conveyor::tool
