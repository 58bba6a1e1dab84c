// The server side of `conveyor perf`: accepts a client's control and data
// connections, then serves its phases. One-sided tests need nothing from the
// server's threads (the device's engine serves them); the server only waits
// for the end of the phase. SEND and WRITE_WITH_IMM need receives: the server
// reposts them and tells the client its credit (receives posted, cumulative)
// by RDMA WRITE. Latency tests are echoed.
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <stop_token>
#include <thread>
#include <unordered_map>

#include <unistd.h>
#include <csignal>

#include "perf.hpp"
#include "perf_report.hpp"
#include "perf_session.hpp"
#include "perf_signals.hpp"

namespace conveyor::tool {

namespace {

using clk = std::chrono::steady_clock;

// How long a client that arrives during a run waits for that run to end
// before it is told "server busy": long enough for a loaded machine to read
// the last client's goodbye, well inside a client's handshake timeout (5 s).
constexpr auto run_end_grace = std::chrono::milliseconds(1000);

// The end of a run, as the turn-away thread sees it, and the request it
// caught as the run ended (if any).
struct run_end {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::optional<connect_request> next;

  void finish() {
    {
      std::lock_guard lk(m);
      done = true;
    }
    cv.notify_all();
  }
  // True once the run has ended, waiting up to `grace` for it.
  bool wait(std::chrono::milliseconds grace) {
    std::unique_lock lk(m);
    return cv.wait_for(lk, grace, [this] { return done; });
  }
};

class session {
 public:
  session(perf_endpoint& ep, const perf_hello& h) : ep_(ep), hello_(h) {
    posted_.assign(h.qps, 0);
    consumed_.assign(h.qps, 0);
    credit_written_.assign(h.qps, 0);
    recv_seq_.assign(h.qps, 0);
    phase_recvs_.assign(h.qps, 0);
    for (std::uint32_t i = 0; i < ep_.qps().size(); ++i) index_of_[ep_.qps()[i].qp_num()] = i;
  }
  // Serves phases until the client says goodbye.
  void serve();

 private:
  void phase(const ctl_msg& begin);
  std::uint64_t verify_end(const ctl_msg& begin, const ctl_msg& end);
  void top_up_recvs();
  void write_credit(std::uint32_t q, bool wait);
  // One receive completion: verify, repost, maybe credit or echo.
  void on_recv(const work_completion& wc, const ctl_msg& begin);
  void echo(std::uint64_t seq, const ctl_msg& begin);
  void reap_send();
  std::byte* slot(std::uint32_t q, std::uint64_t n) {
    return ep_.data_mr().data() + ep_.layout().offset(q, n);
  }
  std::byte* spare() { return ep_.data_mr().data() + ep_.layout().spare(); }
  std::uint32_t qp_index(std::uint32_t qp_num) const {
    const auto it = index_of_.find(qp_num);
    if (it == index_of_.end()) fail("completion for an unknown QP " + std::to_string(qp_num));
    return it->second;
  }
  // Grows while the client makes progress: payload received and requests
  // served (atomics move no payload bytes). Zero on verbs, which keeps no
  // per-QP counters.
  std::uint64_t activity() const {
    std::uint64_t n = 0;
    for (const auto& qp : ep_.qps()) {
      const auto c = qp.counters();
      n += c.rx_bytes + c.reads_served + c.writes_placed + c.atomics_served;
    }
    return n;
  }

  perf_endpoint& ep_;
  perf_hello hello_;
  std::vector<std::uint64_t> posted_;          // receives posted per QP (cumulative): the credit
  std::vector<std::uint64_t> consumed_;        // receives completed per QP (cumulative)
  std::vector<std::uint64_t> credit_written_;  // last credit written to the client
  std::vector<std::uint64_t> recv_seq_;        // wr_id of the next receive per QP
  std::vector<std::uint64_t> phase_recvs_;     // receives completed per QP in this phase
  std::unordered_map<std::uint32_t, std::uint32_t> index_of_;  // data QP number -> index
  std::uint64_t verify_errors_ = 0;
  std::uint64_t credit_signal_ = 0;
  std::uint64_t echo_seq_ = 0;
};

void session::reap_send() {
  std::array<work_completion, 32> wcs;
  auto n = ep_.send_cq().poll(wcs);
  if (!n) fail("poll: " + std::string(to_string(n.error())));
  for (std::size_t i = 0; i < *n; ++i)
    if (wcs[i].status != wc_status::success)
      fail(std::string(to_string(wcs[i].opcode)) + " to the client failed: " +
           std::string(to_string(wcs[i].status)) + " (" + ep_.describe() + ")");
}

void session::top_up_recvs() {
  const auto& l = ep_.layout();
  for (std::uint32_t q = 0; q < hello_.qps; ++q) {
    while (posted_[q] - consumed_[q] < hello_.rx_depth) {
      const sge s = ep_.data_mr().slice(l.offset(q, recv_seq_[q]), l.slot_size);
      check(ep_.qps()[q].post_recv(s, recv_seq_[q]),
            "post receive on data QP " + std::to_string(q));
      ++recv_seq_[q];
      ++posted_[q];
    }
  }
}

void session::write_credit(std::uint32_t q, bool wait) {
  std::byte* word = ep_.ctl_mr().data() + ctl_layout::credit_off + 8 * q;
  std::memcpy(word, &posted_[q], 8);
  const sge s = ep_.ctl_mr().slice(ctl_layout::credit_off + 8 * q, 8);
  const bool signaled = wait || ++credit_signal_ % 32 == 0;
  // Inline where the QP allows it; otherwise the NIC reads the word later, and
  // a newer credit written there meanwhile is as good (credits are cumulative).
  const send_flags inl = ep_.inline_size() >= 8 ? send_flags::inline_data : send_flags::none;
  send_wr w{.wr_id = 0,
            .opcode = wr_opcode::rdma_write,
            .flags = inl | (signaled ? send_flags::signaled : send_flags::none),
            .sg_list = std::span(&s, 1),
            .remote_addr = hello_.ctl.addr + ctl_layout::credit_off + 8 * q,
            .rkey = hello_.ctl.rkey};
  status st = ep_.qps()[q].post_send(w);
  while (st == errc::again) {
    reap_send();
    st = ep_.qps()[q].post_send(w);
  }
  check(st, "post credit WRITE");
  credit_written_[q] = posted_[q];
  if (wait) {
    std::array<work_completion, 1> wc;
    const auto deadline = clk::now() + std::chrono::duration<double>(ep_.opts().timeout);
    while (true) {
      auto n = ep_.send_cq().wait(wc, std::chrono::milliseconds(20));
      if (n && *n == 1) {
        if (wc[0].status != wc_status::success)
          fail("credit WRITE failed: " + std::string(to_string(wc[0].status)));
        return;
      }
      if (clk::now() > deadline) fail("credit WRITE did not complete (" + ep_.describe() + ")");
    }
  }
}

void session::echo(std::uint64_t seq, const ctl_msg& b) {
  const sge s = ep_.data_mr().slice(ep_.layout().spare(), b.size);
  const bool inl = b.size <= ep_.inline_size();
  const bool signaled = ++echo_seq_ % 64 == 0;
  send_wr w{.wr_id = seq,
            .flags = (signaled ? send_flags::signaled : send_flags::none) |
                     (inl ? send_flags::inline_data : send_flags::none),
            .sg_list = std::span(&s, 1)};
  if (b.test == perf_test::send) {
    w.opcode = wr_opcode::send;
  } else {
    w.opcode = wr_opcode::rdma_write_with_imm;
    w.remote_addr = hello_.data.addr + ep_.layout().offset(0, 0);
    w.rkey = hello_.data.rkey;
    w.imm_data = static_cast<std::uint32_t>(seq);
  }
  check(ep_.qps()[0].post_send(w), "post echo");
}

void session::on_recv(const work_completion& wc, const ctl_msg& b) {
  if (wc.status != wc_status::success)
    fail("receive failed: " + std::string(to_string(wc.status)) + " (" + ep_.describe() + ")");
  const std::uint32_t q = qp_index(wc.qp_num);
  const std::uint64_t k = phase_recvs_[q]++;  // the client's k-th request of the phase on q
  ++consumed_[q];
  if (b.verify) {
    if (b.test == perf_test::send) {
      const std::uint64_t slot_of_sender = b.mode == perf_mode::lat ? 0 : k % ep_.layout().slots;
      if (wc.byte_len != b.size ||
          !check_pattern({slot(q, wc.wr_id), b.size}, b.seed, slot_of_sender))
        ++verify_errors_;
    } else {
      // WRITE_WITH_IMM: the data landed in the slot the immediate value names.
      const std::uint64_t n = b.mode == perf_mode::lat ? 0 : wc.imm_data;
      const std::uint64_t slot_of_sender = b.mode == perf_mode::lat ? 0 : n % ep_.layout().slots;
      if (!wc.with_imm || !check_pattern({slot(q, n), b.size}, b.seed, slot_of_sender))
        ++verify_errors_;
    }
  }
  top_up_recvs();
  if (b.mode == perf_mode::lat) {
    echo(b.test == perf_test::write_imm ? wc.imm_data : k + 1, b);
  } else if (posted_[q] - credit_written_[q] >= std::max<std::uint32_t>(1, hello_.rx_depth / 4)) {
    write_credit(q, false);
  }
}

std::uint64_t session::verify_end(const ctl_msg& b, const ctl_msg& e) {
  const std::uint64_t count = e.count;
  const auto& l = ep_.layout();
  std::uint64_t errors = 0;
  if (!b.verify) return 0;
  if (b.test == perf_test::write && b.mode != perf_mode::lat) {
    const std::uint64_t per_qp = e.min_per_qp;
    for (std::uint32_t q = 0; q < hello_.qps; ++q)
      for (std::uint64_t j = 0; j < std::min<std::uint64_t>(l.slots, per_qp); ++j)
        if (!check_pattern({slot(q, j), b.size}, b.seed, j)) ++errors;
  }
  if (b.test == perf_test::fetch_add || b.test == perf_test::compare_swap) {
    std::uint64_t sum = 0;
    for (std::uint32_t q = 0; q < hello_.qps; ++q) {
      std::uint64_t v;
      std::memcpy(&v, slot(q, 0), 8);
      sum += v;
    }
    if (sum != count) ++errors;
  }
  return errors;
}

void session::phase(const ctl_msg& b) {
  const auto& l = ep_.layout();
  if (b.size > l.slot_size)
    fail("phase size " + std::to_string(b.size) + " exceeds the size announced at connect");
  verify_errors_ = 0;
  std::fill(phase_recvs_.begin(), phase_recvs_.end(), 0);
  // Prepare the memory the client will touch.
  if (is_atomic(b.test))
    for (std::uint32_t q = 0; q < hello_.qps; ++q) std::memset(slot(q, 0), 0, 8);
  if (b.test == perf_test::read && b.verify)
    for (std::uint32_t q = 0; q < hello_.qps; ++q)
      for (std::uint32_t j = 0; j < l.slots; ++j) fill_pattern({slot(q, j), b.size}, b.seed, j);
  if (b.mode == perf_mode::lat) {
    if (b.test == perf_test::write) std::memset(slot(0, 0), 0, b.size);
    fill_pattern({spare(), b.size}, b.seed, 1);  // what the echoes carry
  }
  const bool receives = consumes_receive(b.test);
  if (receives) {
    top_up_recvs();
    if (b.mode != perf_mode::lat)
      for (std::uint32_t q = 0; q < hello_.qps; ++q) write_credit(q, true);
  }
  const auto c0 = cpu_times::now();
  const placement here = placement::here(ep_.opts());
  ep_.send_ctl({.kind = ctl_kind::ready, .host = here.host, .cpu = here.cpu});

  // Serve until the client ends the phase. A phase with no traffic for the
  // timeout (beyond its announced duration) means the client is stuck.
  const auto limit =
      std::chrono::duration<double>(ep_.opts().timeout) + std::chrono::milliseconds(b.count);
  auto last_progress = clk::now();
  std::uint64_t last_rx = activity();
  std::optional<ctl_msg> end;
  std::array<work_completion, 32> wcs;
  std::uint64_t expect = 1;  // write latency: the next value the client writes
  std::uint64_t spins = 0;
  latency_spin spin(ep_.manual(), here.shares_cpu_with({b.host, b.cpu}));
  while (!end) {
    bool moved = false;
    if (b.mode == perf_mode::lat && b.test == perf_test::write) {
      std::byte* landing = slot(0, 0);
      auto arrived = [&] { return load_remote_written(landing + b.size - 8) == expect; };
      // Polling the send CQ is what places the client's WRITE under manual
      // progress: look again before relaxing, or every round trip paid a
      // yield (on a shared core, a whole turn of the client) before the echo.
      const bool early = arrived();
      if (!early) reap_send();
      if (early || arrived()) {
        if (b.verify && !check_pattern({landing, b.size - 8}, b.seed, 0)) ++verify_errors_;
        std::byte* src = spare();
        std::memcpy(src + b.size - 8, &expect, 8);
        const sge s = ep_.data_mr().slice(l.spare(), b.size);
        const bool inl = b.size <= ep_.inline_size();
        send_wr w{.wr_id = expect,
                  .opcode = wr_opcode::rdma_write,
                  .flags = (expect % 64 == 0 ? send_flags::signaled : send_flags::none) |
                           (inl ? send_flags::inline_data : send_flags::none),
                  .sg_list = std::span(&s, 1),
                  .remote_addr = hello_.data.addr + l.offset(0, 0),
                  .rkey = hello_.data.rkey};
        check(ep_.qps()[0].post_send(w), "post WRITE back");
        ++expect;
        moved = true;
        reap_send();
      }
    } else if (receives) {
      auto n = b.mode == perf_mode::lat ? ep_.recv_cq().poll(wcs)
                                        : ep_.recv_cq().wait(wcs, std::chrono::milliseconds(1));
      if (!n && n.error() != errc::timed_out) fail("poll: " + std::string(to_string(n.error())));
      const std::size_t got = n ? *n : 0;
      for (std::size_t i = 0; i < got; ++i) on_recv(wcs[i], b);
      moved = got != 0;
      reap_send();
    } else if (ep_.manual() && b.mode == perf_mode::lat) {
      // One-sided round trips with manual progress: nothing moves here unless
      // this thread polls, so it polls (as the servers of ucx_perftest and
      // fi_rma_bw do) instead of sleeping until the socket wakes it (a wake-up
      // per READ: 22 us round trips instead of 13).
      end = ep_.try_recv_ctl();
    } else {
      // One-sided: the engine serves the client; wait for the end message.
      end = ep_.wait_ctl(std::chrono::milliseconds(200));
    }
    if (!end && (moved || ++spins % 256 == 0)) end = ep_.try_recv_ctl();
    if (moved) {
      spin.reset();
    } else if (b.mode == perf_mode::lat) {
      spin.relax();  // the client waits for this echo: give the core away only after a while
    } else if (!ep_.manual()) {
      std::this_thread::yield();  // 2 cores: let the engine threads run
    }
    if (moved) {
      last_progress = clk::now();
    } else if (spins % 4096 == 0 || (b.mode != perf_mode::lat && receives)) {
      const std::uint64_t rx = activity();
      if (rx != last_rx) {
        last_rx = rx;
        last_progress = clk::now();
      } else if (clk::now() - last_progress > limit) {
        fail("the client stopped in the middle of a phase (" + ep_.describe() + ")");
      }
    }
  }
  if (end->kind != ctl_kind::end)
    fail("unexpected control message during a phase (protocol error)");
  // The end message can overtake the last receive completions (another QP):
  // take every one of this phase before answering, so none is left for the next.
  if (receives) {
    const auto deadline = clk::now() + std::chrono::duration<double>(ep_.opts().timeout);
    while (std::accumulate(phase_recvs_.begin(), phase_recvs_.end(), std::uint64_t{0}) <
           end->count) {
      auto n = ep_.recv_cq().wait(wcs, std::chrono::milliseconds(10));
      if (!n && n.error() != errc::timed_out) fail("poll: " + std::string(to_string(n.error())));
      for (std::size_t i = 0; n && i < *n; ++i) on_recv(wcs[i], b);
      if (clk::now() > deadline)
        fail("the client reported " + std::to_string(end->count) + " requests but only " +
             std::to_string(
                 std::accumulate(phase_recvs_.begin(), phase_recvs_.end(), std::uint64_t{0})) +
             " arrived (" + ep_.describe() + ")");
    }
  }
  // Retire unsignaled sends (echoes, credits) before the next phase.
  const auto c = cpu_times::now() - c0;
  const std::uint64_t errors = verify_errors_ + verify_end(b, *end);
  ctl_msg r{.kind = ctl_kind::result,
            .test = b.test,
            .mode = b.mode,
            .size = b.size,
            .count = std::accumulate(phase_recvs_.begin(), phase_recvs_.end(), std::uint64_t{0}),
            .user_us = static_cast<std::uint64_t>(c.user * 1e6),
            .sys_us = static_cast<std::uint64_t>(c.sys * 1e6),
            .errors = errors};
  ep_.send_ctl(r);
}

void session::serve() {
  // Between phases the client is one control message away (its next phase or
  // its goodbye). One that stays silent holds the server, every other client
  // hearing "server busy": after --timeout without a word it is dropped and
  // the server goes on (a --persistent one to its next client).
  const auto idle = std::chrono::duration<double>(ep_.opts().timeout);
  while (true) {
    const auto deadline = clk::now() + idle;
    std::optional<ctl_msg> next;
    while (!(next = ep_.wait_ctl(std::chrono::milliseconds(20))))
      if (clk::now() >= deadline) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", ep_.opts().timeout);
        fail(std::string("the client sent nothing for --timeout ") + secs + " s between phases (" +
             ep_.describe() + "); dropped");
      }
    const ctl_msg m = *next;
    if (m.kind == ctl_kind::bye) return;
    if (m.kind != ctl_kind::begin) fail("unexpected control message (protocol error)");
    phase(m);
  }
}

// Why the server will not serve `h` (empty: it will). A client's hello fixes
// how much memory the server allocates for it: that is bounded by
// --max-memory, as the message size is by --max-size.
std::string refusal(const perf_hello& h, const perf_options& o) {
  if (h.index != 0) return "expected the control connection first";
  if (h.max_size > o.max_size)
    return "message size " + std::to_string(h.max_size) + " exceeds this server's --max-size " +
           std::to_string(o.max_size);
  if (h.qps == 0 || h.qps > perf_max_qps)
    return "QP count " + std::to_string(h.qps) + " out of range (1.." +
           std::to_string(perf_max_qps) + ")";
  if (h.slots > perf_max_slots)
    return "slot count " + std::to_string(h.slots) + " out of range (1.." +
           std::to_string(perf_max_slots) + ")";
  const std::uint64_t need = data_layout::make(h.max_size, h.tx_depth, h.qps, h.slots).bytes();
  if (need > o.max_memory)
    return "the run needs " + format_size(need) + " of server memory (" + std::to_string(h.qps) +
           " QPs x depth x message size), over this server's --max-memory " +
           format_size(o.max_memory);
  return {};
}

// The data connections of one client carry its control hello's regions: that
// is what tells them from another client's.
bool same_client(const perf_hello& a, const perf_hello& b) {
  return a.qps == b.qps && a.data.addr == b.data.addr && a.data.rkey == b.data.rkey &&
         a.ctl.addr == b.ctl.addr && a.ctl.rkey == b.ctl.rkey;
}

}  // namespace

// One client at a time. A connection that is not a perf client, a hello the
// server refuses, or a client that does not open all its data connections
// within --timeout is turned away and the server keeps waiting (a
// non-persistent server exits only after serving a client: 0 if the run went
// through, 1 if it failed, or 1 when --accept-timeout passes first). While a
// client's data connections are awaited, any other client is refused with
// "server busy" and the one being set up is not disturbed; during a run too,
// except that a request arriving as the run ends is served next.
int run_perf_server(const perf_options& o) {
  try {
    apply_cpu_pinning(o);
    device dev = open_perf_device(o);
    auto lis = listener::bind(dev, o.address);
    if (!lis) fail(lis.error().to_string());
    // Ctrl-C / SIGTERM: a shm socket path must not outlive the server (it
    // would refuse the next one's bind). Set before "listening" is printed.
    const bool path = dev.attr().transport_type == transport::shm && !o.address.starts_with('@');
    on_interrupt([path, address = o.address](int sig) {
      if (path) ::unlink(address.c_str());
      std::fprintf(stderr, "conveyor perf server: interrupted by %s%s\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM",
                   path ? ("; removed " + address).c_str() : "");
    });
    std::fprintf(stderr, "conveyor perf server: listening on %s (provider %s, device %s)\n",
                 lis->address().c_str(), dev.attr().provider.c_str(), dev.attr().name.c_str());
    const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout * 1000));
    // Without --accept-timeout the server waits for ever, in slices.
    const auto slice = std::chrono::milliseconds(std::int64_t{3600} * 1000);
    const bool bounded = o.accept_timeout > 0;
    const auto give_up =
        clk::now() +
        std::chrono::milliseconds(static_cast<std::int64_t>(bounded ? o.accept_timeout * 1000 : 0));
    // A client whose request reached the run's turn-away thread as the run
    // ended: it is served next, before the listener is asked again.
    std::optional<connect_request> next_client;
    while (true) {
      const auto wait =
          bounded ? std::chrono::duration_cast<std::chrono::milliseconds>(give_up - clk::now())
                  : slice;
      if (bounded && wait.count() <= 0)
        fail("no client connected within " + std::to_string(o.accept_timeout) + " s");
      result<connect_request> req = next_client
                                        ? result<connect_request>(std::move(*next_client))
                                        : lis->accept(std::max(wait, std::chrono::milliseconds(1)));
      next_client.reset();
      if (!req) {
        if (req.error().code != errc::timed_out)
          std::fprintf(stderr, "conveyor perf server: %s\n", req.error().to_string().c_str());
        continue;
      }
      std::string why;
      auto hello = perf_hello::decode(req->private_data(), why);
      if (hello) why = refusal(*hello, o);
      if (!hello || !why.empty()) {
        std::fprintf(stderr, "conveyor perf server: refusing %s: %s\n", req->peer_address().c_str(),
                     why.c_str());
        (void)req->reject(why);
        continue;
      }
      bool served = false;
      try {
        perf_endpoint ep(
            dev.share(), o,
            data_layout::make(hello->max_size, hello->tx_depth, hello->qps, hello->slots));
        ep.create_qps(hello->qps, hello->tx_depth, hello->rx_depth);
        ep.post_ctl_recvs();
        const auto welcome = perf_welcome{ep.data_mr().remote(), ep.ctl_mr().remote()}.encode();
        const std::string client = req->peer_address();
        check(req->accept(ep.ctl_qp(), welcome), "accept control connection of " + client);
        // Its data connections, in order, within --timeout in all; anyone else is told to wait.
        const auto until = clk::now() + timeout;
        std::uint16_t next = 1;
        while (next <= hello->qps) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now());
          if (left.count() <= 0) break;
          auto dreq = lis->accept(left);
          if (!dreq) continue;
          std::string w;
          auto h = perf_hello::decode(dreq->private_data(), w);
          if (!h || !same_client(*h, *hello)) {
            const std::string busy = "server busy: setting up the run of client " + client +
                                     "; try again when it is done";
            std::fprintf(stderr, "conveyor perf server: refusing %s: %s\n",
                         dreq->peer_address().c_str(), (h ? busy : w).c_str());
            (void)dreq->reject(h ? busy : w);
            continue;
          }
          if (h->index != next) {
            (void)dreq->reject("expected data connection " + std::to_string(next));
            fail("client " + client + " sent connections out of order");
          }
          check(dreq->accept(ep.qps()[next - 1], welcome),
                "accept data connection " + std::to_string(next));
          ++next;
        }
        if (next <= hello->qps) {
          std::fprintf(stderr,
                       "conveyor perf server: client %s opened %u of its %u data connections "
                       "within --timeout %g s; "
                       "dropped, waiting for the next client\n",
                       client.c_str(), static_cast<unsigned>(next - 1),
                       static_cast<unsigned>(hello->qps), o.timeout);
          continue;
        }
        std::fprintf(stderr, "conveyor perf server: client %s connected (%u data QPs)\n",
                     client.c_str(), static_cast<unsigned>(hello->qps));
        served = true;
        {
          // During the run, another client hears "server busy" at once
          // instead of waiting out its handshake timeout. A script starts the
          // next client the moment the last one exits, so its request can
          // arrive before the server has read the goodbye or while this thread
          // still waits in accept: a request is held up to run_end_grace for
          // the run to end, and is then served rather than refused.
          run_end gate;
          std::jthread turn_away([&lis, &client, &gate](std::stop_token stop) {
            while (!stop.stop_requested()) {
              auto other = lis->accept(std::chrono::milliseconds(100));
              if (!other) continue;
              if (gate.wait(run_end_grace)) {
                gate.next = std::move(*other);
                return;
              }
              const std::string busy = "server busy: running the test of client " + client +
                                       "; try again when it is done";
              std::fprintf(stderr, "conveyor perf server: refusing %s: %s\n",
                           other->peer_address().c_str(), busy.c_str());
              (void)other->reject(busy);
            }
          });
          {
            session s(ep, *hello);
            s.serve();
            gate.finish();  // the goodbye is read: a waiting request is next, not busy
          }
          turn_away.request_stop();
          turn_away.join();
          next_client = std::move(gate.next);
        }
        std::fprintf(stderr, "conveyor perf server: client %s done\n", client.c_str());
      } catch (const perf_failure& e) {
        if (!o.persistent && served) throw;
        std::fprintf(
            stderr, "conveyor perf server: %s%s\n", e.what(),
            served ? "" : " (the client was dropped before its run; waiting for the next)");
        if (!served) continue;
      }
      if (!o.persistent) return 0;
    }
  } catch (const perf_failure& e) {
    std::fprintf(stderr, "conveyor perf server: %s\n", e.what());
    return 1;
  }
}

}  // namespace conveyor::tool
