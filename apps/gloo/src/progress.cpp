// progress.cpp — a pair's progress thread: completions (sends done, receives
// arrived, errors) and every message from the peer, decoded once into a
// validated header and acted on (docs/GLOO.md, "Data path").
#include <algorithm>
#include <array>
#include <cstring>

#include "log.hpp"
#include "pair.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

void Pair::progress_loop() {
  std::array<conveyor::work_completion, 32> wcs;
  while (!stop_) {
    auto n = cq_.wait(wcs, 50ms);
    if (!n) {
      if (n.error() == conveyor::errc::timed_out) continue;
      std::lock_guard g(ctx_.mu_);
      fail("completion queue of the pair with " + peer_name_ + ": " +
           std::string(conveyor::to_string(n.error())));
      return;
    }
    std::lock_guard g(ctx_.mu_);
    for (std::size_t i = 0; i < *n; ++i) handle(wcs[i]);
    pump();
  }
}

void Pair::handle(const conveyor::work_completion& wc) {
  if (failed_) return;
  auto kind = wr_kind(wc.wr_id >> 56);
  auto idx = std::uint32_t(wc.wr_id & 0xffffffu);
  if (wc.status != conveyor::wc_status::success) {
    fail(std::string(conveyor::to_string(wc.status)));
    return;
  }
  switch (kind) {
    case wr_kind::write:
      --sq_used_;
      return;
    case wr_kind::send: {
      --sq_used_;
      if (idx >= staging_.size()) return;
      auto meta = std::move(staging_[idx]);
      staging_[idx] = {};
      free_staging_.push_back(idx);
      if (meta.op) {
        bool large = bool(meta.op->mr);
        drop(meta.op->mr);
        meta.op->st->send_done(peer_);
        if (large) ctx_.bound_cv_.notify_all();  // a cancellation may wait for it
      }
      if (meta.bsend) {
        --meta.bsend->pending;
        ctx_.bound_cv_.notify_all();
      }
      return;
    }
    case wr_kind::recv:
      if (idx >= recv_depth || wc.opcode != conveyor::wc_opcode::recv) {
        fail("unexpected receive completion");
        return;
      }
      handle_message(idx, wc.byte_len);
      if (failed_) return;
      if (qp_.post_recv(recv_mem_.slice(std::size_t(idx) * staging_size, staging_size), wc.wr_id) !=
          conveyor::errc::ok) {
        fail("repost receive");
        return;
      }
      ++to_return_;
      return;
  }
  fail("unknown completion");
}

void Pair::handle_message(std::uint32_t idx, std::uint32_t len) {
  const std::byte* buf = recv_mem_.data() + std::size_t(idx) * staging_size;
  auto h = wire::decode(buf, std::min<std::size_t>(len, staging_size));
  auto bad = [&](const std::string& what) { fail("protocol error: " + what); };
  if (!h) return bad("malformed message");
  trace("<-", ctx_.rank, peer_, *h);
  if (h->credits > recv_depth || credits_ + h->credits > recv_depth)
    return bad("credits beyond the receive depth");
  credits_ += h->credits;
  if (h->type != wire::msg_type::data && len != wire::header_size) return bad("trailing bytes");
  switch (h->type) {
    case wire::msg_type::credit:
      return;
    case wire::msg_type::notify:
      ctx_.on_notify(*this, h->slot);
      return;
    case wire::msg_type::rtr: {
      if (h->nbytes > eager_max && h->rkey == 0) return bad("large RTR without a key");
      rtr_info r{h->token, h->nbytes, h->addr, h->rkey};
      auto it = pending_sends_.find(h->slot);
      if (it != pending_sends_.end() && !it->second.empty()) {
        auto op = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) pending_sends_.erase(it);
        transmit(op, r, 0);
        return;
      }
      if (++parked_ > max_peer_entries) return bad("too many unmatched RTRs");
      remote_rtrs_[h->slot].push_back(r);
      return;
    }
    case wire::msg_type::data:
    case wire::msg_type::done: {
      if (h->flags & wire::flag_notify) ctx_.on_notify(*this, h->slot);
      if (failed_) return;
      auto it = recv_ops_.find(h->token);
      if (it == recv_ops_.end()) return bad("data for an unknown receive");
      auto op = it->second;
      if (op->slot != h->slot || op->nbytes != h->nbytes) return bad("data does not match its RTR");
      bool eager = h->type == wire::msg_type::data;
      if (eager != (op->nbytes <= eager_max)) return bad("wrong data path");
      if (eager && len != wire::header_size + h->nbytes) return bad("payload length");
      recv_ops_.erase(it);
      if (op->cancelled) {
        ctx_.bound_cv_.notify_all();  // the cancellation waiting for it
        return;
      }
      if (eager && h->nbytes) std::memcpy(op->ptr, buf + wire::header_size, h->nbytes);
      drop(op->mr);
      op->st->recv_done(peer_);
      return;
    }
    case wire::msg_type::buf_announce: {
      if (h->nbytes > 0 && h->rkey == 0) return bad("announcement without a key");
      if (remote_bufs_.size() >= max_peer_entries && !remote_bufs_.contains(h->slot))
        return bad("too many announced buffers");
      remote_bufs_[h->slot] = {h->addr, h->nbytes, h->rkey};
      ctx_.bound_cv_.notify_all();
      return;
    }
    case wire::msg_type::buf_retract:
      remote_bufs_.erase(h->slot);
      return;
    case wire::msg_type::rtr_cancel: {
      // Not found: it was used, and its data or done is already on the way.
      auto it = remote_rtrs_.find(h->slot);
      if (it == remote_rtrs_.end()) return;
      auto& q = it->second;
      auto r =
          std::find_if(q.begin(), q.end(), [&](const rtr_info& x) { return x.token == h->token; });
      if (r == q.end()) return;
      q.erase(r);
      --parked_;
      if (q.empty()) remote_rtrs_.erase(it);
      out_item o;
      o.h.type = wire::msg_type::cancel_ack;
      o.h.slot = h->slot;
      o.h.token = h->token;
      enqueue(std::move(o));
      return;
    }
    case wire::msg_type::cancel_ack: {
      auto it = recv_ops_.find(h->token);
      if (it == recv_ops_.end() || !it->second->cancelled || it->second->slot != h->slot)
        return bad("acknowledgement of a receive that was not cancelled");
      recv_ops_.erase(it);
      ctx_.bound_cv_.notify_all();
      return;
    }
    case wire::msg_type::buf_done: {
      auto it = bound_recvs_.find(h->slot);
      if (it == bound_recvs_.end()) return;  // the buffer was destroyed meanwhile
      auto& b = *it->second;
      if (h->token > b.size || h->nbytes > b.size - h->token)
        return bad("bound write out of range");
      ++b.completions;
      ctx_.bound_cv_.notify_all();
      return;
    }
  }
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
