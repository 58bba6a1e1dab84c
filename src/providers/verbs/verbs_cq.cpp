// The verbs provider's completion queues: an ibv_cq with its own completion
// channel; fd() is an epoll set of that channel and an eventfd, so arm() can
// make it readable at once when a completion is already queued.
#include "providers/verbs/verbs_objects.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace conveyor::verbs {

verbs_cq::verbs_cq(std::shared_ptr<verbs_device> dev, ibv_comp_channel* ch, ibv_cq* cq,
                   std::uint32_t depth)
    : dev_(std::move(dev)), ch_(ch), cq_(cq), depth_(depth) {
  // fd(): an epoll set of the completion channel and an eventfd, so that
  // arm() can make it readable at once when a completion is already queued
  // (a completion channel only signals new ones).
  efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event e{};
  e.events = EPOLLIN;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, ch_->fd, &e);
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, efd_, &e);
}

verbs_cq::~verbs_cq() {
  if (epfd_ >= 0) ::close(epfd_);
  if (efd_ >= 0) ::close(efd_);
  if (unacked_ > 0) rdma_core().ibv_ack_cq_events(cq_, unacked_);
  rdma_core().ibv_destroy_cq(cq_);
  rdma_core().ibv_destroy_comp_channel(ch_);
}

std::expected<std::size_t, errc> verbs_cq::poll(std::span<work_completion> out) noexcept {
  if (out.empty()) return std::size_t{0};
  if (has_stash_.load(std::memory_order_acquire)) {
    std::lock_guard lk(stash_mu_);
    if (has_stash_.load(std::memory_order_relaxed)) {
      out[0] = stash_;
      has_stash_.store(false, std::memory_order_release);
      std::uint64_t v = 0;
      [[maybe_unused]] auto r = ::read(efd_, &v, sizeof v);
      auto more = poll_raw(out.subspan(1));
      return more ? 1 + *more : std::expected<std::size_t, errc>(std::size_t{1});
    }
  }
  return poll_raw(out);
}

std::expected<std::size_t, errc> verbs_cq::poll_raw(std::span<work_completion> out) noexcept {
  if (errored_.load(std::memory_order_relaxed)) return std::unexpected(errc::cq_overflow);
  std::size_t total = 0;
  ibv_wc wc[32];
  while (total < out.size()) {
    int want = static_cast<int>(std::min<std::size_t>(32, out.size() - total));
    int n = ibv_poll_cq(cq_, want, wc);
    if (n < 0) {
      if (!errored_.exchange(true)) dev_->cq_failed(this);
      return std::unexpected(errc::cq_overflow);
    }
    for (int i = 0; i < n; ++i) {
      auto& o = out[total + static_cast<std::size_t>(i)];
      const auto& w = wc[i];
      o = work_completion{};
      o.wr_id = w.wr_id;
      o.status = map_status(w.status);
      o.opcode = map_opcode(w.opcode);
      o.byte_len = w.byte_len;
      o.qp_num = w.qp_num;
      o.vendor_err = w.vendor_err;
      if (w.status != IBV_WC_SUCCESS && w.status != IBV_WC_WR_FLUSH_ERR) dev_->qp_failed(w.qp_num);
      if (w.status == IBV_WC_SUCCESS) {
        if (w.wc_flags & IBV_WC_WITH_IMM) {
          o.with_imm = true;
          o.imm_data = ntohl(w.imm_data);
        } else if (w.wc_flags & IBV_WC_WITH_INV) {
          o.with_inv = true;
          o.invalidated_rkey = w.invalidated_rkey;
        }
      }
    }
    total += static_cast<std::size_t>(n);
    if (n < want) break;
  }
  return total;
}

std::expected<std::size_t, errc> verbs_cq::wait(std::span<work_completion> out,
                                                std::chrono::nanoseconds timeout) noexcept {
  const auto start = clock_type::now();
  const auto deadline = start + timeout;
  const auto spin_end = start + std::chrono::microseconds(dev_->options().spin_us);
  for (;;) {
    auto r = poll(out);
    if (!r || *r > 0) return r;
    if (clock_type::now() < spin_end) continue;
    break;
  }
  for (;;) {
    std::unique_lock lk(wait_mu_);
    if (ibv_req_notify_cq(cq_, 0) != 0) return std::unexpected(errc::io_error);
    auto r = poll(out);  // anything that arrived before arming
    if (!r || *r > 0) return r;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0 && clock_type::now() >= deadline) return std::unexpected(errc::timed_out);
    pollfd p{ch_->fd, POLLIN, 0};
    int pr = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left.count() + 1, 1, 100)));
    if (pr > 0) consume_events();
    lk.unlock();
    if (clock_type::now() >= deadline) {
      auto last = poll(out);
      if (!last || *last > 0) return last;
      return std::unexpected(errc::timed_out);
    }
  }
}

void verbs_cq::arm() noexcept {
  std::lock_guard lk(wait_mu_);
  consume_events();
  ibv_req_notify_cq(cq_, 0);
  std::lock_guard sl(stash_mu_);
  if (!has_stash_.load(std::memory_order_relaxed)) {
    auto r = poll_raw(std::span(&stash_, 1));
    if (r && *r == 1) {
      has_stash_.store(true, std::memory_order_release);
      std::uint64_t one = 1;
      [[maybe_unused]] auto w = ::write(efd_, &one, sizeof one);
    }
  }
}

void verbs_cq::consume_events() noexcept {
  ibv_cq* ev_cq = nullptr;
  void* ctx = nullptr;
  while (rdma_core().ibv_get_cq_event(ch_, &ev_cq, &ctx) == 0) {
    if (++unacked_ >= 64) {
      rdma_core().ibv_ack_cq_events(cq_, unacked_);
      unacked_ = 0;
    }
  }
}

}  // namespace conveyor::verbs
