// conveyor::kv::rdma_server — acceptor thread, per-connection RPC resources on
// the loop thread (rdma_server.hpp).
#include "rdma_server.hpp"

#include <pthread.h>
#include <sys/epoll.h>

#include <array>
#include <charconv>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "server_loop.hpp"
#include "store.hpp"
#include "store_layout.hpp"

namespace conveyor::kv {

namespace L = layout;

bool parse_rpc_request(std::string_view m, std::vector<std::string_view>& argv,
                       std::size_t max_args) {
  argv.clear();
  std::size_t pos = 0;
  auto number = [&](char lead, std::size_t& out) {
    if (pos >= m.size() || m[pos] != lead) return false;
    ++pos;
    const auto end = m.find("\r\n", pos);
    if (end == std::string_view::npos || end == pos || end - pos > 12) return false;
    auto [p, ec] = std::from_chars(m.data() + pos, m.data() + end, out);
    if (ec != std::errc{} || p != m.data() + end) return false;
    pos = end + 2;
    return true;
  };
  std::size_t n = 0;
  if (!number('*', n) || n == 0 || n > max_args) return false;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t len = 0;
    if (!number('$', len) || len > m.size() - pos || m.size() - pos - len < 2) return false;
    argv.emplace_back(m.data() + pos, len);
    pos += len;
    if (m[pos] != '\r' || m[pos + 1] != '\n') return false;
    pos += 2;
  }
  return pos == m.size();
}

namespace {

struct connection {
  std::uint64_t id = 0;
  completion_queue cq;
  queue_pair qp;
  memory_region recv_mr, send_mr;
  std::vector<std::uint32_t> free_send;  // reply buffers not in flight
  session sess;
  bool closing = false;
  std::uint64_t reply_bytes = 0;  // SEND payloads posted (the RPC replies)
  // Replies waiting for replication (at most rpc_slots: a client sends a
  // request only for a reply it has had).
  struct held_reply {
    std::string bytes;
    std::uint64_t need = 0;
    std::chrono::steady_clock::time_point deadline;
  };
  std::deque<held_reply> held;
};

class rdma_server_impl final : public rdma_server {
 public:
  rdma_server_impl(device& dev, protection_domain& pd, store& st, server_loop& loop, rpc_handler h,
                   rdma_server_options o, listener lis)
      : dev_(dev),
        pd_(pd),
        store_(st),
        loop_(loop),
        handler_(std::move(h)),
        opts_(std::move(o)),
        lis_(std::move(lis)) {
    address_ = lis_.address();
    accepting_.store(!opts_.accept_later);
    acceptor_ = std::thread([this] { accept_loop(); });
    ::pthread_setname_np(acceptor_.native_handle(), "kv-rdma-accept");
  }

  ~rdma_server_impl() override {
    stop_.store(true);
    if (acceptor_.joinable()) acceptor_.join();
    alive_.reset();
    for (auto& [id, c] : conns_)
      if (!c->closing) loop_.remove_fd(c->cq.fd());
    conns_.clear();
  }

  std::string address() const override { return address_; }
  rdma_server_stats stats() const override {
    std::lock_guard lock(stats_mu_);
    return stats_;
  }

 private:
  void start_accepting() override { accepting_.store(true); }

  bool set_requirepass(std::string_view pass) override {
    if (pass.size() > layout::max_password) return false;
    std::lock_guard g(pass_mu_);
    opts_.requirepass = std::string(pass);
    return true;
  }

  void accept_loop() {
    while (!stop_.load()) {
      if (!accepting_.load()) {  // bound, not yet serving (the AOF replays first)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      auto req = lis_.accept(std::chrono::milliseconds(100));
      if (!req) continue;  // timed out (or a failed handshake): look at stop_ again
      auto pass = L::decode_hello(req->private_data());
      if (!pass) {
        count_reject();
        (void)req->reject("conveyor-kv: not a conveyor-kv client hello");
        continue;
      }
      std::string want;
      {
        std::lock_guard g(pass_mu_);
        want = opts_.requirepass;
      }
      if (!want.empty() && !password_equal(want, *pass)) {
        count_reject();
        (void)req->reject(pass->empty() ? "NOAUTH Authentication required."
                                        : "WRONGPASS invalid password");
        continue;
      }
      if (fenced()) {
        count_reject();
        (void)req->reject("CLUSTERDOWN this node's lease in etcd is not confirmed");
        continue;
      }
      if (live_.load() >= opts_.max_connections) {
        count_reject();
        (void)req->reject("conveyor-kv: max number of clients reached");
        continue;
      }
      auto c = make_connection();
      if (!c) {
        count_reject();
        (void)req->reject("conveyor-kv: out of resources: " + c.error().to_string());
        continue;
      }
      auto d = L::decode(store_.describe()).value();
      d.max_message = opts_.max_message;
      d.rpc_slots = opts_.rpc_slots;
      auto info = req->accept((*c)->qp, L::encode(d));
      if (!info) continue;              // the client went away during the handshake: drop it
      (*c)->sess.authenticated = true;  // presented the password (or none needed)
      live_.fetch_add(1);
      {
        std::lock_guard lock(stats_mu_);
        ++stats_.connections_total;
        ++stats_.connections_current;
      }
      auto* raw = c->release();
      loop_.post([this, raw, alive = std::weak_ptr<bool>(alive_)] {
        std::unique_ptr<connection> owned(raw);
        if (alive.lock()) adopt(std::move(owned));
      });
    }
  }

  void count_reject() {
    std::lock_guard lock(stats_mu_);
    ++stats_.rejected;
  }

  result<std::unique_ptr<connection>> make_connection() {
    auto c = std::make_unique<connection>();
    c->id = next_id_.fetch_add(1) + 1;
    c->sess.id = c->id;
    // A reply must fit one message: commands stop building it there, and the
    // ones with side effects (GETDEL, GETSET, SET ... GET) check before acting.
    c->sess.max_reply = opts_.max_message;
    const std::uint32_t slots = opts_.rpc_slots;
    auto cq = dev_.create_cq({.depth = 2 * slots + 8});
    if (!cq) return std::unexpected(cq.error());
    c->cq = std::move(*cq);
    qp_init_attr qa{.send_cq = &c->cq, .recv_cq = &c->cq};
    qa.cap.max_send_wr = slots;
    qa.cap.max_recv_wr = slots;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    // READs a client may have in flight: 2 per GET lane (its bucket groups),
    // 16 lanes, so an MGET of 16 remembered keys is one post (the device's
    // limit where lower; soft's is 128).
    const auto dev_ird = dev_.attr().max_qp_rd_atom;
    qa.max_dest_rd_atomic = std::min<std::uint32_t>(32, dev_ird ? dev_ird : 16);
    auto qp = pd_.create_qp(qa);
    if (!qp) return std::unexpected(qp.error());
    c->qp = std::move(*qp);
    const std::size_t bytes = std::size_t{slots} * opts_.max_message;
    auto r = pd_.allocate_memory(bytes, access::local_write);
    if (!r) return std::unexpected(r.error());
    c->recv_mr = std::move(*r);
    auto s = pd_.allocate_memory(bytes, access::local_write);
    if (!s) return std::unexpected(s.error());
    c->send_mr = std::move(*s);
    for (std::uint32_t i = 0; i < slots; ++i) {
      if (auto st = c->qp.post_recv(
              c->recv_mr.slice(std::size_t{i} * opts_.max_message, opts_.max_message), i);
          st != errc::ok)
        return make_error(st, "kv rdma: post_recv");
      c->free_send.push_back(i);
    }
    return c;
  }

  void adopt(std::unique_ptr<connection> c) {
    auto* raw = c.get();
    const int fd = raw->cq.fd();
    conns_[raw->id] = std::move(c);
    raw->cq.arm();
    loop_.add_fd(fd, EPOLLIN, [this, id = raw->id](unsigned) { on_ready(id); });
    // Accepted just before the fence fell, adopted after: closed at once.
    if (fenced()) return fence_close(raw->id, *raw);
    on_ready(raw->id);
  }

  void on_ready(std::uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    connection& c = *it->second;
    std::array<work_completion, 16> wcs;
    // Drain, then arm: a completion that lands after the last poll finds the CQ
    // armed (or arm() sees it queued) and makes the fd readable again. No poll
    // after arm(): an empty poll resets the fd, which would lose that wake-up.
    for (;;) {
      auto n = c.cq.poll(wcs);
      if (!n) {
        close(c);
        break;
      }
      if (*n == 0) break;
      for (std::size_t i = 0; i < *n && !c.closing; ++i) handle(c, wcs[i]);
      if (c.closing) break;
    }
    if (!c.closing) c.cq.arm();
    if (c.closing) {
      loop_.remove_fd(c.cq.fd());
      loop_.post([this, id, alive = std::weak_ptr<bool>(alive_)] {
        if (alive.lock()) drop(id);
      });
    }
  }

  void handle(connection& c, const work_completion& wc) {
    if (wc.status != wc_status::success) {
      close(c);  // flushed (the client went away) or failed
      return;
    }
    if (wc.opcode == wc_opcode::send) {
      c.free_send.push_back(static_cast<std::uint32_t>(wc.wr_id));
      return;
    }
    if (wc.opcode != wc_opcode::recv || wc.wr_id >= opts_.rpc_slots) {
      close(c);
      return;
    }
    // A long script served this request from inside another's handler
    // (server_loop::serve_ready_now): the outer request's buffers are in use.
    std::string nested_request, nested_reply;
    std::vector<std::string_view> nested_argv;
    const bool nested = in_handler_;
    std::string& request = nested ? nested_request : request_;
    std::string& reply = nested ? nested_reply : reply_;
    std::vector<std::string_view>& argv = nested ? nested_argv : argv_;
    const auto slot = static_cast<std::uint32_t>(wc.wr_id);
    const std::size_t len = std::min<std::size_t>(wc.byte_len, opts_.max_message);
    // Copy once out of the receive buffer; the copy is what gets validated and used.
    request.assign(
        reinterpret_cast<const char*>(c.recv_mr.data()) + std::size_t{slot} * opts_.max_message,
        len);
    reply.clear();
    if (!parse_rpc_request(request, argv, 1u << 16)) {
      reply = "-ERR Protocol error: an RDMA request is one RESP array of bulk strings\r\n";
      std::lock_guard lock(stats_mu_);
      ++stats_.rpc_errors;
    } else {
      try {
        in_handler_ = true;
        handler_(c.sess, argv, reply);
        in_handler_ = nested;
      } catch (const std::bad_alloc&) {  // this request fails; the server goes on
        in_handler_ = nested;
        reply.clear();
        reply = "-OOM out of memory while running the command\r\n";
      }
      std::lock_guard lock(stats_mu_);
      ++stats_.rpcs;
    }
    // The handler bounds its reply by max_reply; this is the last guard.
    if (reply.size() > opts_.max_message) reply = "-ERR reply exceeds the RDMA message limit\r\n";
    // The receive goes back first: the client sends its next request only after this reply.
    if (c.qp.post_recv(c.recv_mr.slice(std::size_t{slot} * opts_.max_message, opts_.max_message),
                       slot) != errc::ok) {
      close(c);
      return;
    }
    // Synchronous replication: the reply waits until the writes before it
    // are on every in-sync replica (and any reply held before it goes first).
    if (sync_ != nullptr && (sync_->waiting() || !c.held.empty())) {
      if (c.held.size() >= opts_.rpc_slots) {  // only a client that breaks the credit rule
        close(c);
        return;
      }
      c.held.push_back(
          {reply, sync_->offset,
           std::chrono::steady_clock::now() + std::chrono::milliseconds(sync_->timeout_ms)});
      return release(c);
    }
    send_reply(c, reply);
  }

  void send_reply(connection& c, std::string_view reply) {
    if (c.free_send.empty()) {  // only a client that breaks the credit rule gets here
      close(c);
      return;
    }
    const auto out = c.free_send.back();
    c.free_send.pop_back();
    std::memcpy(c.send_mr.data() + std::size_t{out} * opts_.max_message, reply.data(),
                reply.size());
    if (c.qp.post_send_msg(c.send_mr.slice(std::size_t{out} * opts_.max_message, reply.size()),
                           out) != errc::ok)
      close(c);
    else
      c.reply_bytes += reply.size();
  }

  // Sends the held replies whose writes are replicated, in order; one past
  // its deadline is answered -NOREPLICAS instead (the write may or may not
  // be applied).
  void release(connection& c) {
    const auto now = std::chrono::steady_clock::now();
    while (!c.held.empty() && !c.closing) {
      auto& h = c.held.front();
      if (sync_ != nullptr && h.need > sync_->acked) {
        if (h.deadline > now) break;
        h.bytes = "-NOREPLICAS Not enough good replicas to write: no acknowledgement within " +
                  std::to_string(sync_->timeout_ms) +
                  " ms (the write may or may not be applied)\r\n";
      }
      send_reply(c, h.bytes);
      c.held.pop_front();
    }
  }

  void set_sync(sync_point* sp) override { sync_ = sp; }

  void set_fence(std::chrono::steady_clock::time_point until) override {
    fence_until_.store(until.time_since_epoch().count());
  }

  void close_all() override {
    for (auto& [id, c] : conns_) fence_close(id, *c);
  }

  bool fenced() const {
    return std::chrono::steady_clock::now().time_since_epoch().count() >= fence_until_.load();
  }

  void fence_close(std::uint64_t id, connection& c) {
    if (c.closing) return;
    close(c);
    c.held.clear();
    loop_.remove_fd(c.cq.fd());
    // drop() disconnects the QP (next iteration): one-sided READs fail from then on.
    loop_.post([this, id, alive = std::weak_ptr<bool>(alive_)] {
      if (alive.lock()) drop(id);
    });
  }

  void replicated() override {
    for (auto& [id, c] : conns_)
      if (!c->closing && !c->held.empty()) release(*c);
  }

  // What the device served to the clients' READs (qp_counters): the QPs that
  // are gone are summed into closed_ when they go. A QP's tx_bytes holds its
  // SEND payloads (the RPC replies) too; those are taken out.
  rdma_served served() const override {
    rdma_served r = closed_;
    for (auto& [id, c] : conns_) add(r, *c);
    return r;
  }

  static void add(rdma_served& r, const connection& c) {
    const auto k = c.qp.counters();
    r.reads_served += k.reads_served;
    r.read_bytes += k.tx_bytes > c.reply_bytes ? k.tx_bytes - c.reply_bytes : 0;
  }

  void close(connection& c) { c.closing = true; }

  void drop(std::uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    add(closed_, *it->second);
    it->second->qp.disconnect();
    conns_.erase(it);
    live_.fetch_sub(1);
    std::lock_guard lock(stats_mu_);
    --stats_.connections_current;
  }

  device& dev_;
  protection_domain& pd_;
  store& store_;
  server_loop& loop_;
  rpc_handler handler_;
  rdma_server_options opts_;
  listener lis_;
  std::string address_;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> accepting_{true};
  std::atomic<std::chrono::steady_clock::rep> fence_until_{
      std::chrono::steady_clock::time_point::max().time_since_epoch().count()};
  rdma_served closed_;  // served() of the connections gone
  std::atomic<std::uint32_t> live_{0};
  std::atomic<std::uint64_t> next_id_{0};
  std::map<std::uint64_t, std::unique_ptr<connection>> conns_;  // loop thread only
  // Work posted to the loop checks this first: the server may be gone by then.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::string request_, reply_;
  std::vector<std::string_view> argv_;
  bool in_handler_ =
      false;  // handler_ is running (requests served inside it use their own buffers)
  mutable std::mutex stats_mu_;
  std::mutex pass_mu_;  // opts_.requirepass: CONFIG SET (loop thread) and the acceptor
  rdma_server_stats stats_;
  sync_point* sync_ = nullptr;  // loop thread
};

}  // namespace

result<std::unique_ptr<rdma_server>> rdma_server::start(device& dev, protection_domain& pd,
                                                        store& st, server_loop& loop,
                                                        rpc_handler handler,
                                                        const rdma_server_options& opts) {
  if (opts.rpc_slots == 0 || opts.rpc_slots > 256 || opts.max_message < 64 ||
      opts.max_message > (64u << 20))
    return make_error(errc::invalid_argument,
                      "kv rdma: rpc_slots 1..256, max_message 64 B..64 MiB");
  if (opts.requirepass.size() > layout::max_password)
    return make_error(errc::invalid_argument,
                      "kv rdma: requirepass longer than a client hello carries (" +
                          std::to_string(layout::max_password) + " bytes)");
  auto lis = opts.address.empty() ? listener::bind(dev) : listener::bind(dev, opts.address);
  if (!lis) return std::unexpected(lis.error());
  return std::unique_ptr<rdma_server>(
      new rdma_server_impl(dev, pd, st, loop, std::move(handler), opts, std::move(*lis)));
}

}  // namespace conveyor::kv
