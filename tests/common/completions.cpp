#include "common/completions.hpp"

#include <array>
#include <iostream>
#include <sstream>

#include "common/env.hpp"

namespace cvt {

using conveyor::errc;
using conveyor::work_completion;

std::string describe(const work_completion& wc) {
  std::ostringstream os;
  os << "{wr_id=" << wc.wr_id << " status=" << conveyor::to_string(wc.status)
     << " opcode=" << conveyor::to_string(wc.opcode) << " byte_len=" << wc.byte_len;
  if (wc.with_imm) os << " imm=0x" << std::hex << wc.imm_data << std::dec;
  if (wc.with_inv) os << " inv_rkey=0x" << std::hex << wc.invalidated_rkey << std::dec;
  os << " qp=" << wc.qp_num;
  if (wc.vendor_err != 0) os << " vendor_err=0x" << std::hex << wc.vendor_err << std::dec;
  os << '}';
  return os.str();
}

std::string describe(std::span<const work_completion> wcs) {
  std::ostringstream os;
  os << '[';
  std::size_t shown = 0;
  for (const auto& wc : wcs) {
    if (shown == 16) {
      os << " ... (" << wcs.size() - shown << " more)";
      break;
    }
    if (shown != 0) os << ", ";
    os << describe(wc);
    ++shown;
  }
  os << ']';
  return os.str();
}

cq_reader::cq_reader(conveyor::completion_queue* cq, std::string name)
    : cq_(cq), name_(std::move(name)) {}

cq_reader::~cq_reader() {
  stop_pump();
}

void cq_reader::start_pump(std::chrono::milliseconds slice) {
  if (pump_.joinable()) return;
  stop_.store(false, std::memory_order_release);
  pump_ = std::thread([this, slice] {
    std::array<work_completion, 64> buf;
    while (!stop_.load(std::memory_order_acquire)) {
      auto r = cq_->wait(buf, slice);
      if (r) {
        push(std::span<const work_completion>(buf.data(), *r));
      } else if (r.error() != errc::timed_out) {
        record(r.error());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  });
}

void cq_reader::stop_pump() {
  if (!pump_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  pump_.join();
}

void cq_reader::poll_once() {
  if (pumped()) return;
  std::array<work_completion, 64> buf;
  for (int rounds = 0; rounds < 64; ++rounds) {
    auto r = cq_->poll(buf);
    if (!r) {
      record(r.error());
      return;
    }
    if (*r == 0) return;
    push(std::span<const work_completion>(buf.data(), *r));
  }
}

void cq_reader::wait_some(std::chrono::nanoseconds slice) {
  if (pumped()) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, slice, [&] { return !q_.empty() || err_.has_value(); });
    return;
  }
  std::array<work_completion, 64> buf;
  auto r = cq_->wait(buf, slice);
  if (r) {
    push(std::span<const work_completion>(buf.data(), *r));
  } else if (r.error() != errc::timed_out) {
    record(r.error());
    // Never spin on a persistent error.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::size_t cq_reader::buffered() const {
  std::lock_guard lk(mu_);
  return q_.size();
}

std::vector<work_completion> cq_reader::take(std::size_t max) {
  std::lock_guard lk(mu_);
  std::vector<work_completion> out;
  while (!q_.empty() && out.size() < max) {
    out.push_back(q_.front());
    q_.pop_front();
  }
  return out;
}

std::optional<errc> cq_reader::sticky_error() const {
  std::lock_guard lk(mu_);
  return err_;
}

void cq_reader::push(std::span<const work_completion> wcs) {
  if (wcs.empty()) return;
  {
    std::lock_guard lk(mu_);
    q_.insert(q_.end(), wcs.begin(), wcs.end());
  }
  cv_.notify_all();
}

void cq_reader::record(errc e) {
  {
    std::lock_guard lk(mu_);
    if (!err_) err_ = e;
  }
  cv_.notify_all();
}

std::string wait_for(cq_reader& target, std::size_t n, std::chrono::nanoseconds timeout,
                     std::vector<work_completion>& out, std::span<cq_reader* const> drive) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + timeout;
  const std::size_t before = out.size();
  std::size_t got = 0;
  for (;;) {
    auto v = target.take(n - got);
    got += v.size();
    out.insert(out.end(), v.begin(), v.end());
    if (got >= n) return {};
    std::span<const work_completion> seen(out.data() + before, got);
    if (auto e = target.sticky_error()) {
      return target.name() + ": poll/wait failed with errc::" + name(*e) + " after " +
             std::to_string(got) + " of " + std::to_string(n) + " completions: " + describe(seen);
    }
    auto now = clock::now();
    if (now >= deadline) {
      auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
      return target.name() + ": timed out after " + std::to_string(waited) + " ms waiting for " +
             std::to_string(n) + " completions; got " + std::to_string(got) + ": " + describe(seen);
    }
    for (auto* d : drive) {
      if (d != nullptr && d != &target) d->poll_once();
    }
    auto slice = std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(2));
    target.wait_some(slice);
  }
}

std::string drop_siw_repeated_flushes(std::vector<work_completion>& wcs, cq_reader& reader,
                                      std::chrono::nanoseconds timeout) {
  for (std::size_t i = 1; i < wcs.size(); ++i) {
    if (wcs[i].wr_id != wcs[i - 1].wr_id || wcs[i].status != conveyor::wc_status::wr_flush_err)
      continue;
    std::cout << "[   INFO   ] the device completed request " << wcs[i].wr_id
              << " twice (Linux siw's flush race); the second, " << describe(wcs[i])
              << ", is ignored\n";
    wcs.erase(wcs.begin() + static_cast<std::ptrdiff_t>(i));
    if (auto err = wait_for(reader, 1, timeout, wcs); !err.empty())
      return "after dropping a repeated flush: " + err;
    --i;
  }
  return {};
}

std::string all_success(std::span<const work_completion> wcs) {
  for (const auto& wc : wcs) {
    if (wc.status != conveyor::wc_status::success) {
      return "not every completion succeeded: " + describe(wcs);
    }
  }
  return {};
}

std::string check_wc(const work_completion& wc, conveyor::wc_status status,
                     conveyor::wc_opcode opcode, std::uint64_t wr_id) {
  std::string err;
  if (wc.status != status) err += " status " + name(wc.status) + " != " + name(status) + ";";
  // Verbs leaves the opcode of an error completion undefined: check it on success only.
  if (status == conveyor::wc_status::success && wc.opcode != opcode) {
    err += " opcode " + name(wc.opcode) + " != " + name(opcode) + ";";
  }
  if (wc.wr_id != wr_id)
    err += " wr_id " + std::to_string(wc.wr_id) + " != " + std::to_string(wr_id) + ";";
  if (err.empty()) return {};
  return "unexpected completion" + err + " " + describe(wc);
}

}  // namespace cvt
