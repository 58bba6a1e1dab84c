// The primary's side of replication (primary.hpp).
#include "repl/primary.hpp"

#include <pthread.h>
#include <sys/epoll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "aof.hpp"
#include "repl/wire.hpp"
#include "resp.hpp"
#include "server_loop.hpp"
#include "store.hpp"

namespace conveyor::kv::repl {

namespace {

using clock = std::chrono::steady_clock;

struct link {
  std::uint64_t id = 0;
  std::string node_id, shard_id, peer, password;
  completion_queue cq;
  queue_pair qp;
  memory_region recv_mr, send_mr;
  std::vector<std::uint32_t> free_send;
  std::uint32_t credits = replica_slots;  // the replica's receive buffers we may fill
  std::uint32_t to_return = 0;            // our buffers posted again, not yet told
  bool adopted = false, closing = false;
  // Catch-up: the snapshot's records, taken at snap_offset, then the stream.
  std::string snap;
  std::size_t snap_pos = 0;
  std::uint64_t snap_offset = 0;
  bool begin_sent = false, end_sent = false;
  std::uint64_t sent = 0;  // stream bytes sent up to this offset (once end_sent)
  std::uint64_t ack = 0;   // the replica's applied offset
  bool caught_up = false;  // acked its snapshot: its acks count
  bool ping_due = false;   // the heartbeat: a ping, which the replica answers with an ack
  clock::time_point last_ack = clock::now(), last_ping = clock::now();
  std::uint64_t position() const { return end_sent ? sent : snap_offset; }
};

}  // namespace

struct primary::impl {
  device& dev;
  protection_domain& pd;
  server_loop& loop;
  executor& exec;
  primary_options opts;
  listener lis;
  std::string address;
  std::thread acceptor;
  std::atomic<bool> stop{false};
  std::atomic<std::uint32_t> live{0};
  std::atomic<std::uint64_t> next_id{0};
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  std::map<std::uint64_t, std::unique_ptr<link>> links;  // loop thread only
  sync_point sync;
  std::string backlog;  // the stream from backlog_start to sync.offset
  std::uint64_t backlog_start = 0;
  std::string shard_id;
  std::vector<std::string> replicas, in_sync;
  std::vector<std::string> map_isr, joined;  // in_sync: the map's isr and these
  std::set<std::string, std::less<>> join_asked;
  // The shrink. marks: (offset, when the stream had reached it), taken at
  // most every mark_every and from the 100 ms timer, above acked only: a
  // replica whose ack is below a mark older than isr_lag has left bytes
  // unacknowledged for at least that long (a mark is taken after its bytes
  // were written, so the lag is never overestimated). unlinked: a map isr
  // member -> since when it has had no caught-up link. leave_asked: the
  // members asked out of the map's isr (until the map no longer has them).
  std::chrono::milliseconds isr_lag{2500}, mark_every{10};
  std::deque<std::pair<std::uint64_t, clock::time_point>> marks;
  std::map<std::string, clock::time_point, std::less<>> unlinked;
  std::set<std::string, std::less<>> leave_asked;
  static constexpr std::size_t max_marks = 1024;
  std::map<std::string, std::string, std::less<>> resp;  // replica id -> its RESP address
  std::vector<server_loop::callback_id> callbacks;
  std::string scratch;
  // One-sided readers' acked_version (store.hpp): the store's version after
  // each record, by the stream offset after it, while replies wait for an
  // in-sync set; at most max_versions, the newest entries merged past that
  // (a later version at a later offset: readers wait longer, never less).
  std::deque<std::pair<std::uint64_t, std::uint64_t>> versions;
  static constexpr std::size_t max_versions = 4096;
  bool follows = true;

  impl(device& d, protection_domain& p, server_loop& l, executor& e, primary_options o, listener li)
      : dev(d), pd(p), loop(l), exec(e), opts(std::move(o)), lis(std::move(li)) {
    address = lis.address();
    sync.timeout_ms = opts.ack_timeout_ms;
    isr_lag = std::chrono::milliseconds(
        std::max<std::int64_t>(1, opts.isr_lag_ms > 0 ? opts.isr_lag_ms : opts.ack_timeout_ms / 2));
    // 1024 marks span at least 8 bounds.
    mark_every = std::max(std::chrono::milliseconds(1), isr_lag / 128);
    sync.in_sync = [this] { return in_sync.size(); };
  }

  static bool contains(const std::vector<std::string>& v, std::string_view id) {
    return std::find(v.begin(), v.end(), id) != v.end();
  }

  void say(const std::string& line) const {
    if (opts.log) opts.log(line);
  }

  // ---- accepting (the acceptor thread) ----------------------------------------

  void accept_loop() {
    while (!stop.load()) {
      auto req = lis.accept(std::chrono::milliseconds(100));
      if (!req) continue;
      std::string why;
      auto h = decode_hello(req->private_data(), why);
      if (!h) {
        (void)req->reject("conveyor-kv replication: " + why);
        continue;
      }
      if (live.load() >= opts.max_links) {
        (void)req->reject("conveyor-kv replication: too many replica links");
        continue;
      }
      auto l = make_link(*h, req->peer_address());
      if (!l) {
        (void)req->reject("conveyor-kv replication: out of resources: " + l.error().to_string());
        continue;
      }
      if (!req->accept((*l)->qp)) continue;  // the replica went away meanwhile
      live.fetch_add(1);
      auto* raw = l->release();
      loop.post([this, raw, a = std::weak_ptr<bool>(alive)] {
        std::unique_ptr<link> owned(raw);
        if (a.lock()) adopt(std::move(owned));
      });
    }
  }

  result<std::unique_ptr<link>> make_link(const hello& h, std::string peer) {
    auto l = std::make_unique<link>();
    l->id = next_id.fetch_add(1) + 1;
    l->node_id = h.node_id;
    l->shard_id = h.shard_id;
    l->password = h.password;
    l->peer = std::move(peer);
    auto cq = dev.create_cq({.depth = replica_slots + primary_slots + 8});
    if (!cq) return std::unexpected(cq.error());
    l->cq = std::move(*cq);
    qp_init_attr qa{.send_cq = &l->cq, .recv_cq = &l->cq};
    qa.cap.max_send_wr = replica_slots;
    qa.cap.max_recv_wr = primary_slots;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    auto qp = pd.create_qp(qa);
    if (!qp) return std::unexpected(qp.error());
    l->qp = std::move(*qp);
    auto r = pd.allocate_memory(std::size_t{primary_slots} * ack_message, access::local_write);
    if (!r) return std::unexpected(r.error());
    l->recv_mr = std::move(*r);
    for (std::uint32_t i = 0; i < primary_slots; ++i)
      if (auto st = l->qp.post_recv(l->recv_mr.slice(std::size_t{i} * ack_message, ack_message), i);
          st != errc::ok)
        return make_error(st, "kv replication: post_recv");
    return l;
  }

  // ---- links (loop thread) -----------------------------------------------------

  bool is_replica(const std::string& node) const {
    return std::find(replicas.begin(), replicas.end(), node) != replicas.end();
  }

  void adopt(std::unique_ptr<link> l) {
    link& k = *l;
    const auto id = k.id;
    links[id] = std::move(l);
    k.adopted = true;
    loop.add_fd(k.cq.fd(), EPOLLIN, [this, id](unsigned) { on_ready(id); });
    k.cq.arm();
    // The cluster's password (requirepass, shared by its nodes), in constant time.
    const auto& want = exec.config().requirepass;
    const bool pass_ok = want.empty() || password_equal(want, k.password);
    std::string().swap(k.password);
    if (!pass_ok) {
      say("replication: refused a link from " + k.peer + " (node " + k.node_id.substr(0, 8) +
          "): wrong password (replicas present the cluster's requirepass)");
      return close(k);
    }
    if (exec.fenced()) {  // it may have been replaced: no replica follows it
      say("replication: refused a link from " + k.peer + " (node " + k.node_id.substr(0, 8) +
          "): this node is fenced");
      return close(k);
    }
    if (k.shard_id != shard_id || !is_replica(k.node_id)) {
      say("replication: refused a link from " + k.peer + ": node " + k.node_id.substr(0, 8) +
          " is not a replica of this node's shard");
      return close(k);
    }
    // Only now, for a replica of this shard, the send buffers (4 MiB).
    auto sm = pd.allocate_memory(std::size_t{replica_slots} * max_message, access::local_write);
    if (!sm) {
      say("replication: no send buffers for replica " + k.node_id.substr(0, 8) + ": " +
          sm.error().to_string());
      return close(k);
    }
    k.send_mr = std::move(*sm);
    for (std::uint32_t i = 0; i < replica_slots; ++i) k.free_send.push_back(i);
    // A restarted replica: its old link goes.
    for (auto& [oid, o] : links)
      if (oid != id && o->node_id == k.node_id) close(*o);
    k.snap_offset = sync.offset;
    try {
      snapshot_records(exec.data(), [&](std::string& chunk) {
        k.snap += chunk;
        return true;
      });
    } catch (const std::bad_alloc&) {
      say("replication: no memory for a snapshot for replica " + k.node_id.substr(0, 8));
      return close(k);
    }
    say("replication: replica " + k.node_id.substr(0, 8) + " at " + k.peer + " connected; " +
        std::to_string(k.snap.size()) + " snapshot bytes at offset " +
        std::to_string(k.snap_offset));
    pump(k);
    reap();
  }

  void on_ready(std::uint64_t id) {
    auto it = links.find(id);
    if (it == links.end()) return;
    link& k = *it->second;
    std::array<work_completion, 16> wcs;
    for (;;) {
      auto n = k.cq.poll(wcs);
      if (!n) {
        close(k);
        break;
      }
      if (*n == 0) break;
      for (std::size_t i = 0; i < *n && !k.closing; ++i) handle(k, wcs[i]);
      if (k.closing) break;
    }
    if (!k.closing) {
      k.cq.arm();
      pump(k);
    }
    reap();
  }

  void handle(link& k, const work_completion& wc) {
    if (wc.status != wc_status::success) {
      say("replication: link to replica " + k.node_id.substr(0, 8) + " failed (" +
          std::string(to_string(wc.status)) + ")");
      return close(k);
    }
    if (wc.opcode == wc_opcode::send) {
      k.free_send.push_back(static_cast<std::uint32_t>(wc.wr_id));
      return;
    }
    if (wc.opcode != wc_opcode::recv || wc.wr_id >= primary_slots) return close(k);
    const auto slot = static_cast<std::uint32_t>(wc.wr_id);
    // One copy out of the receive buffer; only the copy is read.
    std::array<std::byte, ack_message> msg;
    const std::size_t len = std::min<std::size_t>(wc.byte_len, ack_message);
    std::memcpy(msg.data(), k.recv_mr.data() + std::size_t{slot} * ack_message, len);
    if (k.qp.post_recv(k.recv_mr.slice(std::size_t{slot} * ack_message, ack_message), slot) !=
        errc::ok)
      return close(k);
    ++k.to_return;
    std::string why;
    auto h = decode(std::span<const std::byte>(msg.data(), len), reader::primary, why);
    const std::uint64_t limit = k.end_sent ? k.sent : k.ack;
    if (h && (h->offset < k.ack || h->offset > limit))
      why = "acknowledged offset " + std::to_string(h->offset) + " outside " +
            std::to_string(k.ack) + ".." + std::to_string(limit);
    else if (h && k.credits + h->credits > replica_slots)
      why = "returned more credits than it was sent messages";
    if (!why.empty()) {
      say("replication: replica " + k.node_id.substr(0, 8) + " at " + k.peer +
          " broke the protocol: " + why + "; link closed");
      return close(k);
    }
    k.credits += h->credits;
    k.ack = h->offset;
    k.last_ack = clock::now();
    if (k.end_sent && k.ack >= k.snap_offset && !k.caught_up) {
      k.caught_up = true;
      say("replication: replica " + k.node_id.substr(0, 8) + " caught up at offset " +
          std::to_string(k.ack));
      if (!contains(in_sync, k.node_id) && is_replica(k.node_id)) {
        joined.push_back(k.node_id);
        in_sync.push_back(k.node_id);
        sync_follows();
      }
    }
    advance();
    ask_join(k);
  }

  // A joined replica that holds every acknowledged write: ask for the map.
  void ask_join(const link& k) {
    if (k.caught_up && !k.closing && contains(joined, k.node_id) && k.ack >= sync.acked &&
        !join_asked.contains(k.node_id)) {
      join_asked.insert(k.node_id);
      say("replication: replica " + k.node_id.substr(0, 8) +
          " holds every acknowledged write: asking for it to join the in-sync set");
      if (opts.on_join) opts.on_join(k.node_id);
    }
  }

  // ---- the shrink (loop thread) -------------------------------------------------

  void mark(clock::time_point now) {
    if (sync.offset <= sync.acked) return;
    if (!marks.empty() &&
        (marks.back().first >= sync.offset || now - marks.back().second < mark_every))
      return;
    marks.emplace_back(sync.offset, now);
    // Dropping the oldest makes a lag look shorter, never longer.
    if (marks.size() > max_marks) marks.pop_front();
  }

  // Each member of the map's isr that has not acknowledged within isr_lag:
  // its caught-up links closed (a stopped or slow replica must not count as
  // caught up when it rejoins: it starts over from a snapshot) and asked out
  // of the map's isr. Replies wait for it until the map without it arrives. A fenced
  // node asks nothing (it may have been replaced). Members that joined here
  // and are not in the map yet are asked out once the map has them (their
  // addition is on its way, and a replica must never be dropped here while
  // a map naming it in the isr may be written).
  void check_isr(clock::time_point now) {
    mark(now);
    for (const auto& r : map_isr) {
      bool linked = false;
      std::uint64_t best = 0;
      for (const auto& [id, k] : links)
        if (k->node_id == r && k->caught_up && !k->closing) {
          linked = true;
          best = std::max(best, k->ack);
        }
      std::optional<clock::time_point> since;
      if (!linked) {
        since = unlinked.try_emplace(r, now).first->second;
      } else {
        unlinked.erase(r);
        auto m =
            std::find_if(marks.begin(), marks.end(), [&](const auto& x) { return x.first > best; });
        if (m != marks.end()) since = m->second;
      }
      if (!since || now - *since < isr_lag || leave_asked.contains(r) || exec.fenced() ||
          !opts.on_leave)
        continue;
      leave_asked.insert(r);
      say("replication: replica " + r.substr(0, 8) +
          (linked ? " acknowledged " + std::to_string(best) + " of " + std::to_string(sync.offset) +
                        " bytes"
                  : " has no link") +
          " for " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(now - *since).count()) +
          " ms (bound " + std::to_string(isr_lag.count()) +
          " ms): asking for it to leave the in-sync set; replies wait for it until the map says "
          "so");
      // Its caught-up links go (one still in its snapshot stays: it joins by
      // the usual path when its snapshot is applied).
      for (auto& [id, k] : links)
        if (k->node_id == r && k->caught_up) close(*k);
      opts.on_leave(r);
    }
  }

  // Sends what the link may: the snapshot, then the stream, one message per
  // credit but the last (kept for a ping that returns the replica's credits).
  void pump(link& k) {
    while (!k.closing && !k.free_send.empty()) {
      header h;
      std::string_view payload;
      if (!k.begin_sent) {
        h.type = msg_type::snap_begin;
        h.offset = k.snap_offset;
      } else if (k.snap_pos < k.snap.size()) {
        h.type = msg_type::snap_data;
        payload = std::string_view(k.snap).substr(k.snap_pos, max_payload);
      } else if (!k.end_sent) {
        h.type = msg_type::snap_end;
        h.offset = k.snap_offset;
      } else if (k.sent < sync.offset) {
        h.type = msg_type::stream;
        h.offset = k.sent;
        const std::size_t from = static_cast<std::size_t>(k.sent - backlog_start);
        payload = std::string_view(backlog).substr(from, max_payload);
      } else if ((k.to_return >= primary_slots / 2 || k.ping_due) && k.credits >= 1) {
        h.type = msg_type::ping;
        k.ping_due = false;
        k.last_ping = clock::now();
      } else {
        break;
      }
      if (h.type != msg_type::ping && k.credits < 2) break;
      h.credits = std::exchange(k.to_return, 0);
      h.len = static_cast<std::uint32_t>(payload.size());
      const auto slot = k.free_send.back();
      std::byte* p = k.send_mr.data() + std::size_t{slot} * max_message;
      encode(h, std::span<std::byte, header_bytes>(p, header_bytes));
      if (!payload.empty()) std::memcpy(p + header_bytes, payload.data(), payload.size());
      if (k.qp.post_send_msg(
              k.send_mr.slice(std::size_t{slot} * max_message, header_bytes + payload.size()),
              slot) != errc::ok)
        return close(k);
      k.free_send.pop_back();
      --k.credits;
      switch (h.type) {
        case msg_type::snap_begin:
          k.begin_sent = true;
          break;
        case msg_type::snap_data:
          k.snap_pos += payload.size();
          break;
        case msg_type::snap_end:
          k.end_sent = true;
          k.sent = k.snap_offset;
          std::string().swap(k.snap);
          break;
        case msg_type::stream:
          k.sent += payload.size();
          break;
        default:
          break;
      }
    }
  }

  void close(link& k) {
    if (k.closing) return;
    k.closing = true;
    loop.post([this, id = k.id, a = std::weak_ptr<bool>(alive)] {
      if (a.lock()) drop(id);
    });
  }

  void drop(std::uint64_t id) {
    auto it = links.find(id);
    if (it == links.end()) return;
    if (it->second->adopted) loop.remove_fd(it->second->cq.fd());
    it->second->qp.disconnect();
    links.erase(it);
    live.fetch_sub(1);
    reap();
  }

  // The acknowledged offset: the least over the in-sync replicas' caught-up
  // links (none: nothing more is acknowledged); never goes back.
  void advance() {
    std::uint64_t least = sync.offset;
    for (const auto& r : in_sync) {
      std::uint64_t best = 0;
      for (const auto& [id, k] : links)
        if (k->node_id == r && k->caught_up && !k->closing) best = std::max(best, k->ack);
      least = std::min(least, best);
    }
    if (least > sync.acked) {
      sync.acked = least;
      while (!marks.empty() && marks.front().first <= sync.acked) marks.pop_front();
      publish_acked();
      if (sync.on_advance) sync.on_advance();
    }
  }

  // The store's acked_version follows its changes while no replica is in
  // sync; otherwise it moves as the acknowledged offset passes records.
  void sync_follows() {
    const bool f = in_sync.empty();
    if (f == follows) return;
    follows = f;
    versions.clear();
    exec.data().set_acked_follows(f);
  }
  void note_record() {
    if (follows) return;
    const auto v = exec.data().current_version();
    if (versions.size() >= max_versions)
      versions.back() = {sync.offset, v};
    else
      versions.emplace_back(sync.offset, v);
  }
  void publish_acked() {
    if (follows) return;
    std::uint64_t v = 0;
    while (!versions.empty() && versions.front().first <= sync.acked) {
      v = versions.front().second;
      versions.pop_front();
    }
    // Nothing unacknowledged: every change so far (those no record carries,
    // such as a lazy expiry, too) is as final as it gets.
    if (sync.acked >= sync.offset) v = exec.data().current_version();
    if (v) exec.data().set_acked_version(v);
  }

  // The lag bound and the backlog's trim.
  void reap() {
    std::uint64_t keep = sync.offset;
    for (auto& [id, k] : links) {
      if (k->closing) continue;
      if (sync.offset - k->position() > opts.max_lag) {
        say("replication: replica " + k->node_id.substr(0, 8) + " is " +
            std::to_string(sync.offset - k->position()) + " bytes behind (more than " +
            std::to_string(opts.max_lag) + "); link closed, it starts over from a snapshot");
        close(*k);
        continue;
      }
      keep = std::min(keep, k->position());
    }
    if (keep > backlog_start && (keep - backlog_start >= (1u << 20) || keep == sync.offset)) {
      backlog.erase(0, static_cast<std::size_t>(keep - backlog_start));
      backlog_start = keep;
    }
  }

  void before_wait() {
    for (auto& [id, k] : links)
      if (!k->closing) pump(*k);
    reap();
    if (in_sync.empty()) advance();
  }
};

primary::primary(std::unique_ptr<impl> p) : p_(std::move(p)) {}

primary::~primary() {
  p_->stop.store(true);
  if (p_->acceptor.joinable()) p_->acceptor.join();
  p_->alive.reset();
  for (auto id : p_->callbacks) p_->loop.cancel(id);
  for (auto& [id, k] : p_->links)
    if (k->adopted) p_->loop.remove_fd(k->cq.fd());
  p_->links.clear();
}

result<std::unique_ptr<primary>> primary::start(device& dev, protection_domain& pd,
                                                server_loop& loop, executor& exec,
                                                primary_options opts) {
  auto lis = opts.address.empty() ? listener::bind(dev) : listener::bind(dev, opts.address);
  if (!lis) return std::unexpected(lis.error());
  auto p = std::make_unique<impl>(dev, pd, loop, exec, std::move(opts), std::move(*lis));
  auto* raw = p.get();
  std::unique_ptr<primary> out(new primary(std::move(p)));
  raw->callbacks.push_back(loop.before_wait([raw] { raw->before_wait(); }));
  // Replies waiting past their bound are answered by the front end's timer;
  // this one wakes it even when no ack comes.
  // A heartbeat each second: the replica's answer keeps INFO's lag (seconds
  // since its last ack) meaningful while no write flows.
  raw->callbacks.push_back(loop.every(std::chrono::milliseconds(100), [raw] {
    if (raw->sync.waiting() && raw->sync.on_advance) raw->sync.on_advance();
    const auto now = clock::now();
    for (auto& [id, k] : raw->links)
      if (!k->closing && k->end_sent && now - k->last_ping >= std::chrono::seconds(1)) {
        k->ping_due = true;
        raw->pump(*k);
      }
    raw->check_isr(now);
    raw->reap();  // the links check_isr closed
  }));
  raw->acceptor = std::thread([raw] { raw->accept_loop(); });
  ::pthread_setname_np(raw->acceptor.native_handle(), "kv-repl-accept");
  return out;
}

void primary::append(std::span<const std::string_view> argv) {
  const auto before = p_->backlog.size();
  encode_command(p_->backlog, argv);
  p_->sync.offset += p_->backlog.size() - before;
  p_->note_record();
  // With no link to send to, nothing needs the bytes.
  if (p_->links.empty()) {
    p_->backlog_start = p_->sync.offset;
    p_->backlog.clear();
  }
  if (p_->in_sync.empty()) p_->sync.acked = p_->sync.offset;
  p_->mark(clock::now());
}

sync_point& primary::sync() noexcept {
  return p_->sync;
}

std::string primary::address() const {
  return p_->address;
}

bool primary::caught_up_fully(std::string_view node_id) const {
  for (const auto& [id, k] : p_->links)
    if (k->node_id == node_id && k->caught_up && !k->closing && k->ack >= p_->sync.offset)
      return true;
  return false;
}

void primary::set_shard(std::string shard_id, std::vector<std::string> replicas,
                        std::vector<std::string> in_sync,
                        std::map<std::string, std::string, std::less<>> resp) {
  p_->resp = std::move(resp);
  if (shard_id != p_->shard_id) {  // a new role: nothing joined under the old one counts
    p_->joined.clear();
    p_->join_asked.clear();
  }
  p_->shard_id = std::move(shard_id);
  p_->replicas = std::move(replicas);
  p_->map_isr = std::move(in_sync);
  // Those that joined here stay in sync (replies wait for them) while they
  // are replicas and the map does not yet say so.
  std::vector<std::string> still;
  for (auto& id : p_->joined)
    if (p_->is_replica(id) && !impl::contains(p_->map_isr, id)) still.push_back(std::move(id));
  p_->joined = std::move(still);
  for (auto it = p_->join_asked.begin(); it != p_->join_asked.end();)
    it = impl::contains(p_->joined, *it) ? std::next(it) : p_->join_asked.erase(it);
  p_->in_sync = p_->map_isr;
  p_->in_sync.insert(p_->in_sync.end(), p_->joined.begin(), p_->joined.end());
  // The shrink's state follows the map: a member no longer in it may be asked
  // out again once it is back.
  std::erase_if(p_->unlinked, [&](const auto& u) { return !impl::contains(p_->map_isr, u.first); });
  std::erase_if(p_->leave_asked, [&](const auto& r) { return !impl::contains(p_->map_isr, r); });
  for (auto& [id, k] : p_->links)
    if (k->shard_id != p_->shard_id || !p_->is_replica(k->node_id)) p_->close(*k);
  // A replica whose link caught up while the map still had it in the isr (it
  // reconnected after it was asked out) and that the map no longer has:
  // it joins here again, as at the end of a snapshot.
  for (auto& [id, k] : p_->links)
    if (k->caught_up && !k->closing && !impl::contains(p_->in_sync, k->node_id)) {
      p_->joined.push_back(k->node_id);
      p_->in_sync.push_back(k->node_id);
    }
  p_->sync_follows();
  p_->advance();
  for (auto& [id, k] : p_->links) p_->ask_join(*k);
}

void primary::info(std::string& t, const std::string& replid) const {
  auto line = [&](std::string_view k, const std::string& v) {
    t += k;
    t += ':';
    t += v;
    t += "\r\n";
  };
  line("role", "master");
  std::size_t n = 0;
  std::string slaves;
  const auto now = clock::now();
  for (const auto& [id, k] : p_->links) {
    if (k->closing) continue;
    // Redis gives the replica's listening address: its RESP address from the map.
    const auto r = p_->resp.find(k->node_id);
    const std::string& addr = r != p_->resp.end() ? r->second : k->peer;
    const auto colon = addr.rfind(':');
    const std::string host = addr.substr(0, colon), port = addr.substr(colon + 1);
    const auto lag = std::chrono::duration_cast<std::chrono::seconds>(now - k->last_ack).count();
    slaves += "slave" + std::to_string(n++) + ":ip=" + host + ",port=" + port +
              ",state=" + (k->caught_up ? "online" : "wait_bgsave") +
              ",offset=" + std::to_string(k->ack) + ",lag=" + std::to_string(lag) +
              ",node=" + k->node_id + ",sync_lag_bytes=" +
              std::to_string(p_->sync.offset - std::min(p_->sync.offset, k->ack)) + "\r\n";
  }
  line("connected_slaves", std::to_string(n));
  t += slaves;
  line("master_replid", replid);
  line("master_repl_offset", std::to_string(p_->sync.offset));
  line("repl_acked_offset", std::to_string(p_->sync.acked));
  line("repl_in_sync_replicas", std::to_string(p_->in_sync.size()));
  line("repl_address", p_->address);
  line("repl_backlog_active", p_->links.empty() ? "0" : "1");
  line("repl_backlog_size", std::to_string(p_->opts.max_lag));
  line("repl_backlog_first_byte_offset", std::to_string(p_->backlog_start));
  line("repl_backlog_histlen", std::to_string(p_->backlog.size()));
}

}  // namespace conveyor::kv::repl
