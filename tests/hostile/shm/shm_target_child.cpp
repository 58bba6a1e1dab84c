#include "shm_target_child.hpp"

#include <sys/mman.h>

#include <cstring>
#include <sstream>

namespace cvt_shm_hostile {
namespace {

// Layout of the child's one buffer: guard | region | guard | recv | guard.
struct target_layout {
  std::byte* base = nullptr;
  std::byte* region() const { return base + guard_len; }
  std::byte* recv() const { return region() + region_len + guard_len; }
  static std::size_t total() { return 3 * guard_len + region_len + recv_len; }
};

void report(int fd, const std::string& line) {
  const std::string l = line + "\n";
  [[maybe_unused]] auto r = ::write(fd, l.data(), l.size());
}

std::string guards_text(const target_layout& t) {
  const std::byte* g[3] = {t.base, t.region() + region_len, t.recv() + recv_len};
  for (int k = 0; k < 3; ++k)
    for (std::size_t i = 0; i < guard_len; ++i)
      if (g[k][i] != guard_byte)
        return "canary bad guard " + std::to_string(k) + " +" + std::to_string(i);
  return "canary ok";
}

}  // namespace

int serve(int rep, const std::string& addr, int conns) {
  ::alarm(60);
  auto dev = conveyor::device::open("shm:hostile-" + std::to_string(::getpid()), {});
  if (!dev) return 10;
  auto pd = dev->alloc_pd();
  if (!pd) return 11;
  auto cq = dev->create_cq({.depth = 256});
  if (!cq) return 12;
  void* mem = ::mmap(nullptr, target_layout::total(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 13;
  target_layout t{static_cast<std::byte*>(mem)};
  std::memset(t.base, static_cast<int>(guard_byte), target_layout::total());
  for (std::size_t i = 0; i < region_len; ++i) t.region()[i] = region_byte(i);
  std::memset(t.recv(), 0, recv_len);
  auto mr = pd->register_memory(
      std::span(t.region(), region_len),
      access::local_write | access::remote_read | access::remote_write | access::remote_atomic);
  if (!mr) return 14;
  auto rmr = pd->register_memory(std::span(t.recv(), recv_len), access::local_write);
  if (!rmr) return 15;
  auto lis = conveyor::listener::bind(*dev, addr);
  if (!lis) return 16;
  report(rep, "ready " + std::to_string(mr->addr()) + " " + std::to_string(mr->rkey()));
  for (int c = 0; c < conns; ++c) {
    auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
    if (!qp) return 17;
    if (qp->post_recv(rmr->as_sge(), 100 + c) != errc::ok) return 18;
    auto req = lis->accept(10s);
    if (!req) {
      report(rep, "accept-failed " + req.error().to_string());
      report(rep, guards_text(t));
      continue;
    }
    auto info = req->accept(*qp, {});
    if (!info) {
      report(rep, "accept-failed " + info.error().to_string());
      report(rep, guards_text(t));
      continue;
    }
    report(rep, "connected");
    const auto end = clk::now() + 20s;
    bool err = false;
    auto settle = clk::time_point::max();
    while (clk::now() < end && clk::now() < settle) {
      auto wc = cq->wait_one(20ms);
      if (wc) {
        report(rep, "wc " + std::to_string(wc->wr_id) + " " +
                        std::to_string(static_cast<int>(wc->status)) + " " +
                        std::to_string(wc->byte_len));
        continue;
      }
      if (!err && qp->state() == qp_state::error) {
        err = true;
        settle = clk::now() + 200ms;  // the flushed completions
      }
    }
    report(rep, std::string("state ") + (err ? "error" : "rts"));
    report(rep, guards_text(t));
  }
  report(rep, "done");
  return 0;
}

std::optional<ready_info> parse_ready(const std::optional<std::string>& l) {
  if (!l || l->rfind("ready ", 0) != 0) return std::nullopt;
  std::istringstream in(l->substr(6));
  ready_info r;
  in >> r.addr >> r.rkey;
  return r;
}

bool contains(const std::vector<std::string>& lines, const std::string& s) {
  for (const auto& l : lines)
    if (l == s) return true;
  return false;
}
std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "; ";
  return s;
}

}  // namespace cvt_shm_hostile
