// context.cpp — unbound buffers' operations across a context's pairs: a recv
// (directed or from any rank) matched to the peers' send notifications, and
// the cancellation of a destroyed buffer's operations.
#include "context.hpp"

#include <algorithm>

#include <gloo/common/error.h>

#include "device.hpp"
#include "pair.hpp"
#include "unbound_buffer.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {
namespace {

// How long destroying a buffer waits for a peer to withdraw its RTRs or for a
// send from it to finish (Context::cancel); capped by the context's timeout.
constexpr std::chrono::milliseconds cancel_wait_max{1000};

}  // namespace

// The pairs leave the shared queues first (shutdown), then the progress
// threads stop; the pairs' QPs go before the queues they completed on.
Context::~Context() {
  for (auto& p : pairs_)
    if (p) static_cast<Pair*>(p.get())->shutdown();
  for (auto& p : pollers_) {
    p.stop.store(true, std::memory_order_release);
    std::lock_guard g(p.park_mu);
    p.park_cv.notify_all();
  }
  for (auto& p : pollers_)
    if (p.thread.joinable()) p.thread.join();
  pairs_.clear();
}

std::unique_ptr<::gloo::transport::Pair>& Context::createPair(int r) {
  GLOO_ENFORCE(r >= 0 && r < size && r != rank, "conveyor-gloo: bad peer rank ", r);
  pairs_[r] = std::make_unique<Pair>(*this, r);
  return pairs_[r];
}

std::unique_ptr<::gloo::transport::UnboundBuffer> Context::createUnboundBuffer(void* ptr,
                                                                               size_t size) {
  return make_unbound_buffer(shared_from_this(), ptr, size);
}

Pair& Context::pair(int r) {
  GLOO_ENFORCE(r >= 0 && r < size && r != rank, "conveyor-gloo: rank ", r, " out of range");
  auto& p = pairs_[r];
  GLOO_ENFORCE(p != nullptr, "conveyor-gloo: no pair for rank ", r);
  return static_cast<Pair&>(*p);
}

void Context::send(const std::shared_ptr<buf_state>& st, int dst, std::uint64_t slot,
                   const std::byte* ptr, std::size_t n) {
  auto op = std::make_shared<send_op>();
  op->st = st;
  op->ptr = ptr;
  op->nbytes = n;
  op->slot = slot;
  std::lock_guard g(mu_);
  auto& p = pair(dst);
  p.check_usable();
  p.start_send(op);
}

void Context::recv(const std::shared_ptr<buf_state>& st, std::vector<int> srcs, std::uint64_t slot,
                   std::byte* ptr, std::size_t n) {
  // A recv-from-any list may name this rank (torch's recv without a source
  // lists every rank): there is no pair to self, so it can never match.
  if (srcs.size() > 1) std::erase(srcs, rank);
  GLOO_ENFORCE(!srcs.empty(), "conveyor-gloo: recv from no other rank");
  std::lock_guard g(mu_);
  for (int r : srcs) pair(r).check_usable();
  int chosen = -1;
  if (srcs.size() == 1) {
    chosen = srcs[0];
    auto& q = available_[slot];
    auto it = std::find(q.begin(), q.end(), chosen);
    if (it != q.end()) {
      q.erase(it);
      --pair(chosen).parked_;
    } else {
      ++debt_[{slot, chosen}];
    }
    if (q.empty()) available_.erase(slot);
  } else {
    auto qi = available_.find(slot);
    if (qi != available_.end()) {
      for (auto it = qi->second.begin(); it != qi->second.end(); ++it) {
        if (std::find(srcs.begin(), srcs.end(), *it) != srcs.end()) {
          chosen = *it;
          qi->second.erase(it);
          --pair(chosen).parked_;
          break;
        }
      }
      if (qi->second.empty()) available_.erase(qi);
    }
    if (chosen < 0) {
      pending_any_.push_back({st, std::move(srcs), slot, ptr, n});
      return;
    }
  }
  auto op = std::make_shared<recv_op>();
  op->st = st;
  op->ptr = ptr;
  op->nbytes = n;
  op->slot = slot;
  pair(chosen).start_recv(op);
}

void Context::on_notify(Pair& p, std::uint64_t slot) {
  auto d = debt_.find({slot, p.peer()});
  if (d != debt_.end()) {
    if (--d->second == 0) debt_.erase(d);
    return;
  }
  for (auto it = pending_any_.begin(); it != pending_any_.end(); ++it) {
    if (it->slot != slot ||
        std::find(it->ranks.begin(), it->ranks.end(), p.peer()) == it->ranks.end())
      continue;
    auto op = std::make_shared<recv_op>();
    op->st = it->st;
    op->ptr = it->ptr;
    op->nbytes = it->n;
    op->slot = slot;
    pending_any_.erase(it);
    p.start_recv(op);
    return;
  }
  if (++p.parked_ > max_peer_entries) {
    p.fail("rank " + std::to_string(p.peer()) + " sent too many unmatched send notifications");
    return;
  }
  available_[slot].push_back(p.peer());
}

void Context::fail_any(int r, const std::string& msg) {
  for (auto it = pending_any_.begin(); it != pending_any_.end();) {
    if (std::find(it->ranks.begin(), it->ranks.end(), r) != it->ranks.end()) {
      it->st->fail(msg);
      it = pending_any_.erase(it);
    } else {
      ++it;
    }
  }
}

// A buffer being destroyed (the caller frees its memory next). A large
// receive's memory is registered for the peer to WRITE into: deregistering it
// while the peer writes would fail that WRITE with a remote access error and
// break a healthy pair, so that the peer's collective would name this rank
// instead of the one that really failed. The RTR is withdrawn instead: the
// peer answers with a cancel_ack if it had not used it, or its data is already
// on the way and ends with the usual `done`. Likewise a large send still being
// written from the buffer is let finish. Both are awaited for at most
// cancel_wait_max; a peer that answers nothing in that time is marked
// unresponsive and its regions are deregistered at once, then and from then on.
void Context::cancel(const std::shared_ptr<buf_state>& st) {
  std::unique_lock l(mu_);
  pending_any_.remove_if([&](const any_recv& a) { return a.st == st; });
  auto each_pair = [&](auto&& fn) {
    for (auto& up : pairs_)
      if (up) fn(*static_cast<Pair*>(up.get()));
  };
  each_pair([&](Pair& p) {
    for (auto& [slot, q] : p.pending_sends_)
      std::erase_if(q, [&](const std::shared_ptr<send_op>& o) { return o->st == st; });
    // Not posted yet: this buffer's sends, and the RTRs of its receives. A
    // send that had taken one of the peer's RTRs gives it back unused, so
    // the peer's withdrawal of it finds it and is answered.
    std::erase_if(p.out_, [&](const out_item& o) {
      if (o.op && o.op->st == st) {
        if (o.h.type == wire::msg_type::data || o.h.type == wire::msg_type::done) {
          p.remote_rtrs_[o.h.slot].push_front({o.h.token, o.h.nbytes, o.write_dst, o.write_rkey});
          ++p.parked_;
        }
        return true;
      }
      if (o.h.type != wire::msg_type::rtr) return false;
      auto it = p.recv_ops_.find(o.h.token);
      if (it == p.recv_ops_.end() || it->second->st != st) return false;
      p.recv_ops_.erase(it);
      return true;
    });
    std::vector<std::pair<std::uint64_t, std::uint64_t>> withdraw;  // token, slot
    for (auto& [tok, op] : p.recv_ops_) {
      if (op->st != st || op->cancelled) continue;
      op->cancelled = true;
      if (p.failed_ || p.unresponsive_)
        drop(op->mr);
      else
        withdraw.emplace_back(tok, op->slot);
    }
    for (auto [tok, slot] : withdraw) {
      out_item o;
      o.h.type = wire::msg_type::rtr_cancel;
      o.h.slot = slot;
      o.h.token = tok;
      p.enqueue(std::move(o));
    }
  });
  auto busy = [&](Pair& p) {
    if (p.failed_ || p.unresponsive_) return false;
    for (auto& [tok, op] : p.recv_ops_)
      if (op->st == st && op->mr) return true;
    return p.sending_from(st);
  };
  auto deadline =
      clock_type::now() + std::min<std::chrono::milliseconds>(getTimeout(), cancel_wait_max);
  each_pair([&](Pair& p) {
    if (!bound_cv_.wait_until(l, deadline, [&] { return !busy(p); })) p.unresponsive_ = true;
  });
  each_pair([&](Pair& p) {
    for (auto& [tok, op] : p.recv_ops_)
      if (op->st == st) drop(op->mr);  // kept, cancelled: a late done or ack is recognised
    p.drop_sends_from(st);
  });
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
