// A replica's side of replication (replica.hpp).
#include "repl/replica.hpp"

#include <pthread.h>
#include <sys/epoll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "cluster/routing.hpp"
#include "repl/wire.hpp"
#include "server_loop.hpp"
#include "store.hpp"

namespace conveyor::kv::repl {

namespace {

using clock = std::chrono::steady_clock;

struct conn {
  completion_queue cq;
  queue_pair qp;
  memory_region recv_mr, send_mr;
  std::vector<std::uint32_t> free_send;
  std::uint32_t credits = primary_slots;  // the primary's buffers we may fill
  std::uint32_t to_return = 0;            // ours posted again, not yet told
  bool closing = false;
};

bool is(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x | 0x20) == (y | 0x20);
         });
}

enum class phase { wait_snapshot, snapshot, streaming };

}  // namespace

struct replica::impl {
  device& dev;
  protection_domain& pd;
  server_loop& loop;
  executor& exec;
  replica_options opts;
  std::thread connector;
  std::mutex mu;
  std::condition_variable cv;
  bool want_connect = true, stopping = false;  // under mu
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  // Loop thread only from here on.
  std::unique_ptr<conn> link;
  phase ph = phase::wait_snapshot;
  request_parser parser;
  std::uint64_t snap_offset = 0, stream_base = 0, fed = 0, applied = 0, ack_sent = 0;
  bool in_block = false, data_seen = false;
  // The keyspace is a whole copy of the stream up to `applied`: from a
  // snapshot's end until the next snapshot begins (emptying it).
  bool whole = false;
  std::vector<std::vector<std::string>> block;
  std::size_t block_bytes = 0;
  std::string msg;
  std::vector<std::string_view> argv;
  std::uint64_t syncs = 0;
  clock::time_point last_io = clock::now(), down_since = clock::now();
  std::string last_error;
  server_loop::callback_id timer = 0;

  impl(device& d, protection_domain& p, server_loop& l, executor& e, replica_options o)
      : dev(d), pd(p), loop(l), exec(e), opts(std::move(o)), parser(opts.limits) {}

  void say(const std::string& line) const {
    if (opts.log) opts.log(line);
  }

  // ---- connecting (the connector thread) --------------------------------------

  void connect_loop() {
    std::string last_failure;
    auto last_try = clock::now() - std::chrono::seconds(1);
    for (;;) {
      {
        std::unique_lock lk(mu);
        cv.wait_for(lk, std::chrono::milliseconds(500), [&] { return stopping || want_connect; });
        if (stopping) return;
        if (!want_connect) continue;
        // At most one attempt each 500 ms, also after a link that failed at
        // once (a record the store refuses would otherwise resync in a loop).
        cv.wait_until(lk, last_try + std::chrono::milliseconds(500), [&] { return stopping; });
        if (stopping) return;
      }
      last_try = clock::now();
      std::string why;
      auto c = make_conn();
      if (c) {
        const auto h = encode_hello({opts.node_id, opts.shard_id, opts.password});
        auto info = conveyor::connect((*c)->qp, opts.primary,
                                      {.private_data = h, .timeout = opts.connect_timeout});
        if (info && opts.before_link && !opts.before_link()) {
          c->reset();  // disconnects: the primary serves the next attempt
          why = "etcd was not told that this replica resynchronises";
          // The link's last report again: the keyspace is as it was.
          loop.post([this, a = std::weak_ptr<bool>(alive)] {
            if (a.lock() && !link && opts.on_link) opts.on_link(false, applied, whole);
          });
        } else if (info) {
          {
            std::lock_guard lk(mu);
            want_connect = false;
          }
          last_failure.clear();
          auto* raw = c->release();
          loop.post([this, raw, a = std::weak_ptr<bool>(alive)] {
            std::unique_ptr<conn> owned(raw);
            if (a.lock()) adopt(std::move(owned));
          });
          continue;
        } else {
          why = info.error().to_string();
        }
      } else {
        why = c.error().to_string();
      }
      if (why != last_failure)
        say("replication: connecting to primary " + opts.primary + ": " + why);
      last_failure = why;
    }
  }

  result<std::unique_ptr<conn>> make_conn() {
    auto c = std::make_unique<conn>();
    auto cq = dev.create_cq({.depth = replica_slots + primary_slots + 8});
    if (!cq) return std::unexpected(cq.error());
    c->cq = std::move(*cq);
    qp_init_attr qa{.send_cq = &c->cq, .recv_cq = &c->cq};
    qa.cap.max_send_wr = primary_slots;
    qa.cap.max_recv_wr = replica_slots;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    auto qp = pd.create_qp(qa);
    if (!qp) return std::unexpected(qp.error());
    c->qp = std::move(*qp);
    auto r = pd.allocate_memory(std::size_t{replica_slots} * max_message, access::local_write);
    if (!r) return std::unexpected(r.error());
    c->recv_mr = std::move(*r);
    auto s = pd.allocate_memory(std::size_t{primary_slots} * ack_message, access::local_write);
    if (!s) return std::unexpected(s.error());
    c->send_mr = std::move(*s);
    for (std::uint32_t i = 0; i < replica_slots; ++i)
      if (auto st = c->qp.post_recv(c->recv_mr.slice(std::size_t{i} * max_message, max_message), i);
          st != errc::ok)
        return make_error(st, "kv replication: post_recv");
    for (std::uint32_t i = 0; i < primary_slots; ++i) c->free_send.push_back(i);
    return c;
  }

  // ---- the link (loop thread) ------------------------------------------------------

  void adopt(std::unique_ptr<conn> c) {
    link = std::move(c);
    ph = phase::wait_snapshot;
    parser = request_parser(opts.limits);
    in_block = false;
    block.clear();
    block_bytes = 0;
    ack_sent = 0;
    last_io = clock::now();
    loop.add_fd(link->cq.fd(), EPOLLIN, [this](unsigned) { on_ready(); });
    link->cq.arm();
    say("replication: connected to primary " + opts.primary + ", waiting for its snapshot");
    if (opts.on_link) opts.on_link(true, 0, false);
    on_ready();
  }

  void on_ready() {
    if (!link || link->closing) return;
    conn& c = *link;
    std::array<work_completion, 16> wcs;
    data_seen = false;
    for (;;) {
      auto n = c.cq.poll(wcs);
      if (!n) return fail("polling the link's completion queue failed");
      if (*n == 0) break;
      for (std::size_t i = 0; i < *n && !c.closing; ++i) handle(c, wcs[i]);
      if (c.closing) return;
    }
    c.cq.arm();
    maybe_ack(c);
  }

  void fail(const std::string& why) {
    if (!link || link->closing) return;
    link->closing = true;
    last_error = why;
    down_since = clock::now();
    say("replication: link to primary " + opts.primary + " closed: " + why);
    if (opts.on_link) opts.on_link(false, applied, whole);
    loop.post([this, a = std::weak_ptr<bool>(alive)] {
      if (!a.lock() || !link) return;
      loop.remove_fd(link->cq.fd());
      link->qp.disconnect();
      link.reset();
      std::lock_guard lk(mu);
      want_connect = true;
      cv.notify_all();
    });
  }

  void handle(conn& c, const work_completion& wc) {
    if (wc.status != wc_status::success)
      return fail("the link failed (" + std::string(to_string(wc.status)) + ")");
    if (wc.opcode == wc_opcode::send) {
      c.free_send.push_back(static_cast<std::uint32_t>(wc.wr_id));
      return;
    }
    if (wc.opcode != wc_opcode::recv || wc.wr_id >= replica_slots)
      return fail("an unexpected completion");
    const auto slot = static_cast<std::uint32_t>(wc.wr_id);
    // One copy out of the receive buffer; only the copy is checked and used.
    const std::size_t len = std::min<std::size_t>(wc.byte_len, max_message);
    msg.assign(reinterpret_cast<const char*>(c.recv_mr.data()) + std::size_t{slot} * max_message,
               len);
    if (c.qp.post_recv(c.recv_mr.slice(std::size_t{slot} * max_message, max_message), slot) !=
        errc::ok)
      return fail("posting a receive failed");
    ++c.to_return;
    last_io = clock::now();
    std::string why;
    auto h = decode(std::as_bytes(std::span(msg.data(), msg.size())), reader::replica, why);
    if (!h) return fail("the primary broke the protocol: " + why);
    if (c.credits + h->credits > primary_slots)
      return fail("the primary returned more credits than it was sent messages");
    c.credits += h->credits;
    const std::string_view payload = std::string_view(msg).substr(header_bytes);
    data_seen = true;  // every message is answered (a ping too: the heartbeat)
    switch (h->type) {
      case msg_type::snap_begin: {
        if (ph != phase::wait_snapshot) return fail("a second snap_begin");
        whole = false;
        const std::string_view flush[] = {"FLUSHALL"};
        if (!exec.apply_replicated(flush, why)) return fail("emptying the keyspace: " + why);
        ph = phase::snapshot;
        snap_offset = h->offset;
        return;
      }
      case msg_type::snap_data:
        if (ph != phase::snapshot) return fail("snapshot data outside a snapshot");
        parser.feed(payload);
        return drain();
      case msg_type::snap_end:
        if (ph != phase::snapshot || h->offset != snap_offset)
          return fail("snap_end at offset " + std::to_string(h->offset) + " for a snapshot at " +
                      std::to_string(snap_offset));
        if (parser.buffered() != 0 || in_block) return fail("the snapshot ends inside a record");
        ph = phase::streaming;
        parser = request_parser(opts.limits);
        stream_base = applied = snap_offset;
        whole = true;
        if (opts.on_link) opts.on_link(true, applied, true);
        fed = 0;
        ++syncs;
        say("replication: snapshot applied (" + std::to_string(exec.data().size()) +
            " keys), streaming from offset " + std::to_string(snap_offset));
        return;
      case msg_type::stream:
        if (ph != phase::streaming) return fail("stream data before the snapshot ended");
        if (h->offset != stream_base + fed)
          return fail("stream bytes at offset " + std::to_string(h->offset) + ", expected " +
                      std::to_string(stream_base + fed));
        parser.feed(payload);
        fed += payload.size();
        return drain();
      case msg_type::ping:
      case msg_type::ack:
        return;
    }
  }

  // Applies every complete record; a MULTI ... EXEC block when its EXEC is in.
  void drain() {
    std::string why;
    for (;;) {
      const auto st = parser.next(argv);
      if (st == parse_status::need_more) return;
      if (st == parse_status::error) return fail("a record does not parse: " + parser.error());
      if (argv.empty()) return fail("an empty record");
      if (is(argv[0], "MULTI")) {
        if (in_block) return fail("MULTI inside a MULTI block");
        in_block = true;
        continue;
      }
      if (is(argv[0], "EXEC")) {
        if (!in_block) return fail("EXEC without MULTI");
        std::vector<std::string_view> v;
        for (const auto& rec : block) {
          v.assign(rec.begin(), rec.end());
          if (!exec.apply_replicated(v, why)) return fail("applying a record: " + why);
        }
        block.clear();
        block_bytes = 0;
        in_block = false;
      } else if (in_block) {
        std::size_t bytes = 64;
        for (auto a : argv) bytes += a.size() + 16;
        if (block_bytes + bytes > opts.max_block_bytes)
          return fail("a MULTI block over " + std::to_string(opts.max_block_bytes) + " bytes");
        block_bytes += bytes;
        block.emplace_back(argv.begin(), argv.end());
        continue;
      } else if (!exec.apply_replicated(argv, why)) {
        return fail("applying a record: " + why);
      }
      if (ph == phase::streaming) applied = stream_base + parser.consumed();
    }
  }

  void maybe_ack(conn& c) {
    const bool more = ph == phase::streaming && applied > ack_sent;
    const bool credits = c.to_return > 0 && data_seen;
    if (!(more || credits) || c.credits == 0 || c.free_send.empty()) return;
    header h;
    h.type = msg_type::ack;
    h.credits = std::exchange(c.to_return, 0);
    h.offset = ph == phase::streaming ? applied : 0;
    const auto slot = c.free_send.back();
    std::byte* p = c.send_mr.data() + std::size_t{slot} * ack_message;
    encode(h, std::span<std::byte, header_bytes>(p, header_bytes));
    if (c.qp.post_send_msg(c.send_mr.slice(std::size_t{slot} * ack_message, header_bytes), slot) !=
        errc::ok)
      return fail("posting an ack failed");
    c.free_send.pop_back();
    --c.credits;
    ack_sent = h.offset;
  }
};

replica::replica(std::unique_ptr<impl> p) : p_(std::move(p)) {}

replica::~replica() {
  {
    std::lock_guard lk(p_->mu);
    p_->stopping = true;
    p_->cv.notify_all();
  }
  if (p_->connector.joinable()) p_->connector.join();
  p_->loop.cancel(p_->timer);
  p_->alive.reset();
  if (p_->link) p_->loop.remove_fd(p_->link->cq.fd());
  p_->link.reset();
}

result<std::unique_ptr<replica>> replica::start(device& dev, protection_domain& pd,
                                                server_loop& loop, executor& exec,
                                                replica_options opts) {
  if (!cluster::valid_id(opts.node_id) || !cluster::valid_id(opts.shard_id))
    return make_error(errc::invalid_argument, "kv replication: node and shard ids are 40 hex");
  auto p = std::make_unique<impl>(dev, pd, loop, exec, std::move(opts));
  auto* raw = p.get();
  std::unique_ptr<replica> out(new replica(std::move(p)));
  raw->timer = loop.every(std::chrono::milliseconds(250), [raw] {
    if (raw->link && !raw->link->closing && clock::now() - raw->last_io > raw->opts.silence_timeout)
      raw->fail("nothing from the primary for " +
                std::to_string(raw->opts.silence_timeout.count()) + " ms");
  });
  raw->connector = std::thread([raw] { raw->connect_loop(); });
  ::pthread_setname_np(raw->connector.native_handle(), "kv-repl-connect");
  return out;
}

const replica_options& replica::options() const noexcept {
  return p_->opts;
}

void replica::info(std::string& t) const {
  auto line = [&](std::string_view k, const std::string& v) {
    t += k;
    t += ':';
    t += v;
    t += "\r\n";
  };
  const auto& p = *p_;
  const bool up = p.link && !p.link->closing && p.ph == phase::streaming;
  const auto [host, port] = cluster::split_address(p.opts.primary_resp);
  const auto now = clock::now();
  line("role", "slave");
  line("master_host", std::string(host));
  line("master_port", std::to_string(port));
  line("master_link_status", up ? "up" : "down");
  line("master_last_io_seconds_ago",
       p.link ? std::to_string(
                    std::chrono::duration_cast<std::chrono::seconds>(now - p.last_io).count())
              : "-1");
  line("master_sync_in_progress", p.link && p.ph != phase::streaming ? "1" : "0");
  line("slave_read_repl_offset", std::to_string(p.stream_base + p.fed));
  line("slave_repl_offset", std::to_string(p.applied));
  if (!up)
    line("master_link_down_since_seconds",
         std::to_string(
             std::chrono::duration_cast<std::chrono::seconds>(now - p.down_since).count()));
  line("slave_priority", "100");
  line("slave_read_only", "1");
  line("replica_announced", "1");
  line("connected_slaves", "0");
  line("master_repl_offset", std::to_string(p.applied));
  line("repl_full_syncs", std::to_string(p.syncs));
  line("repl_primary_address", p.opts.primary);
  if (!p.last_error.empty()) line("repl_last_error", p.last_error);
}

}  // namespace conveyor::kv::repl
