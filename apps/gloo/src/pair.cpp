// pair.cpp — a pair's data path: starting sends and receives of unbound
// buffers (RTR, NOTIFY, DATA, WRITE + DONE), posting queued messages within
// credits and the send queue, failing the pair.
#include "pair.hpp"

#include <algorithm>
#include <cstring>

#include "buffer.hpp"
#include "log.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

// Closing a pair (Gloo's close(), its destructor, the context's): it leaves
// the shared queue's map under the context's lock first, so the progress
// thread never touches it again, and posts nothing more (stop_); then the
// connection is closed and what was outstanding fails, as before. Idempotent.
void Pair::shutdown() {
  {
    std::lock_guard g(ctx_.mu_);
    if (stop_) return;
    stop_ = true;
    leave_poller();
  }
  if (qp_) qp_.disconnect();
  std::lock_guard g(ctx_.mu_);
  if (connected_ && !failed_) fail("connection to " + peer_name_ + " closed locally");
}

Pair::~Pair() {
  shutdown();
  // Its flushes land in the shared queue and are dropped there (the QP left
  // the poller's map); then its room in the queue is free for another pair.
  qp_ = {};
  if (poller_) {
    std::lock_guard g(ctx_.mu_);
    Context::release(*poller_);
  }
}

void Pair::leave_poller() {
  if (!poller_) return;
  auto it = poller_->by_qp.find(qpn_);
  if (it != poller_->by_qp.end() && it->second.first == this) poller_->by_qp.erase(it);
  qpn_ = 0;
}

void Pair::on_completion(const conveyor::work_completion& wc) {
  if (connected_) return handle(wc);
  if (early_.size() >= std::size_t(sq_depth) + recv_depth)
    return fail("more completions before the connection than work requests posted");
  early_.push_back(wc);
}

void Pair::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  error_ = "Connection closed by peer [" + peer_name_ + "]: " + why;
  // At info only: a peer that ends its job first closes its pairs the same way
  // a dead one does, so at warn this line would follow every normal exit.
  // Not for this side's own shutdown (stop_ is set first).
  if (!stop_) log_line(log_level::info, "rank " + std::to_string(ctx_.rank) + ": " + error_);
  for (auto& [tok, op] : recv_ops_) op->st->fail(error_);
  for (auto& [slot, q] : pending_sends_)
    for (auto& op : q) op->st->fail(error_);
  for (auto& it : out_)
    if (it.op) it.op->st->fail(error_);
  for (auto& s : staging_)
    if (s.op) s.op->st->fail(error_);
  recv_ops_.clear();
  pending_sends_.clear();
  remote_rtrs_.clear();
  out_.clear();
  ctx_.fail_any(peer_, error_);
  ctx_.bound_cv_.notify_all();
  if (qp_) (void)qp_.modify(conveyor::qp_state::error);
}

void Pair::start_send(const std::shared_ptr<send_op>& op) {
  auto it = remote_rtrs_.find(op->slot);
  if (it != remote_rtrs_.end() && !it->second.empty()) {
    rtr_info r = it->second.front();
    it->second.pop_front();
    --parked_;
    if (it->second.empty()) remote_rtrs_.erase(it);
    transmit(op, r, wire::flag_notify);
    return;
  }
  pending_sends_[op->slot].push_back(op);
  out_item o;
  o.h.type = wire::msg_type::notify;
  o.h.slot = op->slot;
  enqueue(std::move(o));
}

void Pair::start_recv(const std::shared_ptr<recv_op>& op) {
  std::uint64_t token = ctx_.next_token_++;
  out_item o;
  o.h.type = wire::msg_type::rtr;
  o.h.slot = op->slot;
  o.h.token = token;
  o.h.nbytes = op->nbytes;
  if (op->nbytes > eager_max) {
    auto mr =
        prov_->pd.register_memory(std::span(op->ptr, op->nbytes),
                                  conveyor::access::local_write | conveyor::access::remote_write);
    if (!mr) {
      op->st->fail("conveyor-gloo: register: " + mr.error().to_string());
      return;
    }
    op->mr = std::move(*mr);
    o.h.addr = op->mr.addr();
    o.h.rkey = op->mr.rkey();
  }
  recv_ops_[token] = op;
  enqueue(std::move(o));
}

void Pair::transmit(const std::shared_ptr<send_op>& op, const rtr_info& r, std::uint8_t flags) {
  if (r.nbytes != op->nbytes) {
    std::string msg = "message size mismatch on slot " + std::to_string(op->slot) + ": sending " +
                      std::to_string(op->nbytes) + " bytes to " + peer_name_ + ", which expects " +
                      std::to_string(r.nbytes);
    op->st->fail(msg);
    fail(msg);
    return;
  }
  out_item o;
  o.h.slot = op->slot;
  o.h.token = r.token;
  o.h.nbytes = op->nbytes;
  o.h.flags = flags;
  o.op = op;
  if (op->nbytes <= eager_max) {
    o.h.type = wire::msg_type::data;
    o.payload = op->ptr;
    o.payload_len = op->nbytes;
  } else {
    auto mr = prov_->pd.register_memory(std::span(const_cast<std::byte*>(op->ptr), op->nbytes),
                                        conveyor::access::local_write);
    if (!mr) {
      op->st->fail("conveyor-gloo: register: " + mr.error().to_string());
      return;
    }
    op->mr = std::move(*mr);
    o.h.type = wire::msg_type::done;
    o.write_lkey = op->mr.lkey();
    o.write_src = op->mr.addr();
    o.write_len = op->nbytes;
    o.write_dst = r.addr;
    o.write_rkey = r.rkey;
  }
  enqueue(std::move(o));
}

bool Pair::post_item(out_item& it) {
  std::uint32_t chunks =
      it.write_len == 0 ? 0 : std::uint32_t((it.write_len + max_write_ - 1) / max_write_);
  bool credit_only = it.h.type == wire::msg_type::credit;
  if (free_staging_.empty() || credits_ < (credit_only ? 1u : 2u) ||
      sq_used_ + chunks + 1 > sq_depth)
    return false;
  for (std::uint32_t c = 0; c < chunks; ++c) {
    std::size_t off = std::size_t(c) * max_write_;
    std::size_t len = std::min<std::size_t>(max_write_, it.write_len - off);
    conveyor::sge s{it.write_src + off, std::uint32_t(len), it.write_lkey};
    conveyor::send_wr w;
    w.wr_id = make_wr(wr_kind::write, serial_, 0);
    w.opcode = conveyor::wr_opcode::rdma_write;
    w.sg_list = std::span(&s, 1);
    w.remote_addr = it.write_dst + off;
    w.rkey = it.write_rkey;
    auto st = qp_.post_send(w);
    if (st != conveyor::errc::ok) {
      fail("post WRITE: " + std::string(conveyor::to_string(st)));
      return false;
    }
    ++sq_used_;
  }
  std::uint32_t idx = free_staging_.back();
  free_staging_.pop_back();
  std::byte* buf = send_mem_.data() + std::size_t(idx) * staging_size;
  it.h.credits = to_return_;
  to_return_ = 0;
  wire::encode(it.h, buf);
  trace("->", ctx_.rank, peer_, it.h);
  if (it.payload_len) std::memcpy(buf + wire::header_size, it.payload, it.payload_len);
  staging_[idx] = {std::move(it.op), std::move(it.bsend)};
  auto st = qp_.post_send_msg(
      send_mem_.slice(std::size_t(idx) * staging_size, wire::header_size + it.payload_len),
      make_wr(wr_kind::send, serial_, idx));
  if (st != conveyor::errc::ok) {
    fail("post SEND: " + std::string(conveyor::to_string(st)));
    return false;
  }
  ++sq_used_;
  --credits_;
  return true;
}

void Pair::pump() {
  if (failed_ || !connected_ || stop_) return;
  while (!out_.empty()) {
    if (!post_item(out_.front())) return;
    out_.pop_front();
  }
  if (to_return_ >= recv_depth / 2) {
    out_item c;
    c.h.type = wire::msg_type::credit;
    (void)post_item(c);
  }
}

std::unique_ptr<::gloo::transport::Buffer> Pair::createSendBuffer(int slot, void* ptr,
                                                                  size_t size) {
  GLOO_ENFORCE(prov_ != nullptr, "conveyor-gloo: pair not connected");
  return make_send_buffer(ctx_, *this, slot, ptr, size);
}

std::unique_ptr<::gloo::transport::Buffer> Pair::createRecvBuffer(int slot, void* ptr,
                                                                  size_t size) {
  GLOO_ENFORCE(prov_ != nullptr, "conveyor-gloo: pair not connected");
  return make_recv_buffer(ctx_, *this, slot, ptr, size);
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
