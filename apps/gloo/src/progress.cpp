// progress.cpp — a context's progress thread: it waits on the completion
// queue its pairs share and hands each completion (sends done, receives
// arrived, errors) to its pair; every message from a peer is decoded once
// into a validated header and acted on (docs/GLOO.md, "Data path").
#include <pthread.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "log.hpp"
#include "pair.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

// One queue for every pair of the provider: room for each pair's send and
// receive queues (a pair reserves its share, so the queue cannot overflow),
// one pair's more for the flushes of a QP a retried handshake replaced (they
// are drained and dropped), and a margin.
poller& Context::poller_for(Device::provider& prov) {
  for (auto& p : pollers_) {
    if (p.prov == &prov && !p.dead && p.room >= per_pair_cqes) {
      p.room -= per_pair_cqes;
      return p;
    }
  }
  std::uint64_t want = std::uint64_t(std::max(size - 1, 1) + 1) * per_pair_cqes + 64;
  std::uint64_t max = prov.dev.attr().max_cqe ? prov.dev.attr().max_cqe : want;
  auto depth = std::uint32_t(std::max<std::uint64_t>(std::min(want, max), per_pair_cqes + 64));
  auto cq = prov.dev.create_cq({.depth = depth});
  if (!cq) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: create_cq: ", cq.error().to_string());
  auto& p = pollers_.emplace_back();
  p.prov = &prov;
  p.cq = std::move(*cq);
  std::uint32_t usable = depth >= 2 * per_pair_cqes + 64 ? depth - 64 - per_pair_cqes : 0;
  // The first pair takes it even where max_cqe leaves only its own share.
  p.room = usable >= per_pair_cqes ? usable - per_pair_cqes : 0;
  p.thread = std::thread([this, &p] { poll_loop(p); });
  if (auto n = npollers_.load(std::memory_order_relaxed); n < max_helped) {
    helped_[n] = &p;
    npollers_.store(n + 1, std::memory_order_release);
  }
  return p;
}

// The thread sleeps in cq.wait (which spins briefly first, and in manual
// progress drives the device's engine), wakes for a batch of completions,
// hands them out under the context's lock and posts what they made possible.
// While threads waiting for an unbound buffer's operation poll the queue
// themselves (help_poll), it leaves the queue to them: one thread less to
// schedule per message (docs/GLOO.md, "Waiting").
void Context::poll_loop(poller& p) {
  ::pthread_setname_np(::pthread_self(), "cvgloo-progress");
  std::array<conveyor::work_completion, 32> wcs;
  std::unique_lock q(p.q_mu);
  while (!p.stop.load(std::memory_order_acquire)) {
    if (p.spinners.load(std::memory_order_acquire) > 0 &&
        p.sleepers.load(std::memory_order_acquire) == 0) {
      q.unlock();
      park(p);
      q.lock();
      continue;
    }
    auto n = p.cq.wait(wcs, 50ms);
    if (!n) {
      if (n.error() == conveyor::errc::timed_out) continue;
      std::lock_guard g(mu_);
      p.dead = true;
      for (auto& [qpn, e] : p.by_qp)
        e.first->fail("completion queue: " + std::string(conveyor::to_string(n.error())));
      return;
    }
    deliver(p, std::span(wcs.data(), *n));
  }
}

// Until no waiter has polled for a lease (the wait spin), one goes to sleep
// (then nobody else polls) or the context stops. A waiter that leaves with
// its completion does not wake this thread (that would be a wake-up per
// operation): behind spinning waiters it looks again every park_check, so
// the queue comes back at most that long after the last one left.
void Context::park(poller& p) {
  constexpr auto park_check = 1ms;
  const auto lease = device_->wait_spin();
  std::unique_lock l(p.park_mu);
  while (!p.stop.load(std::memory_order_acquire) && p.sleepers.load() == 0) {
    if (p.spinners.load() > 0) {
      p.park_cv.wait_for(l, park_check);
      continue;
    }
    auto until = p.last_spin + lease;
    if (clock_type::now() >= until) return;
    p.park_cv.wait_until(l, until);
  }
}

// A completion of a QP the map does not know, or of an older QP of the pair
// (another serial), belongs to a closed or replaced connection: dropped.
void Context::deliver(poller& p, std::span<const conveyor::work_completion> wcs) {
  std::array<Pair*, 32> touched;
  std::lock_guard g(mu_);
  std::size_t nt = 0;
  for (const auto& wc : wcs) {
    auto it = p.by_qp.find(wc.qp_num);
    if (it == p.by_qp.end() || it->second.second != wr_serial(wc.wr_id)) continue;
    Pair* pr = it->second.first;
    pr->on_completion(wc);
    if (nt < touched.size() &&
        std::find(touched.begin(), touched.begin() + nt, pr) == touched.begin() + nt)
      touched[nt++] = pr;
  }
  for (std::size_t i = 0; i < nt; ++i) touched[i]->pump();
}

std::size_t Context::begin_wait() {
  std::size_t n = std::min(npollers_.load(std::memory_order_acquire), max_helped);
  for (std::size_t i = 0; i < n; ++i) {
    std::lock_guard g(helped_[i]->park_mu);
    helped_[i]->spinners.fetch_add(1);
  }
  return n;
}

// Only where nobody else takes completions (the progress thread holds q_mu
// also while asleep in cq.wait): the batch is handed out before q_mu is let
// go, so the queue's order is the protocol's. An error (overflow) is left to
// the progress thread, which gets it from its own wait.
bool Context::help_poll(std::size_t n) {
  std::array<conveyor::work_completion, 32> wcs;
  bool got = false;
  for (std::size_t i = 0; i < n; ++i) {
    poller& p = *helped_[i];
    std::unique_lock q(p.q_mu, std::try_to_lock);
    if (!q) continue;
    auto r = p.cq.poll(wcs);
    if (!r || *r == 0) continue;
    deliver(p, std::span(wcs.data(), *r));
    got = true;
  }
  return got;
}

void Context::end_spin(std::size_t n, bool sleeping) {
  auto now = clock_type::now();
  for (std::size_t i = 0; i < n; ++i) {
    poller& p = *helped_[i];
    std::lock_guard g(p.park_mu);
    p.spinners.fetch_sub(1);
    if (sleeping) {
      p.sleepers.fetch_add(1);
      p.park_cv.notify_all();  // nobody polls now: the progress thread takes over
    } else {
      p.last_spin = now;
    }
  }
}

void Context::end_sleep(std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::lock_guard g(helped_[i]->park_mu);
    helped_[i]->sleepers.fetch_sub(1);
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
