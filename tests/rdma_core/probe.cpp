// conveyor-rdma-core-probe: what a program that links libconveyor.so sees of
// the providers. It moves data over soft and shm (a loopback READ, verified)
// and tries to open verbs. Without rdma-core (tests/rdma_core/absent.sh runs it
// so) soft and shm must work and verbs must fail with errc::unsupported and a
// sentence saying what to install; with rdma-core, verbs opens or names why not
// (no device here). Prints one line per step; exits 0 only when soft and shm
// moved their bytes and verbs, if it failed, failed with a stated reason.
#include <conveyor/conveyor.hpp>

#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace cvy = conveyor;
using namespace std::chrono_literals;

namespace {

// One process, two endpoints: the target publishes 64 KiB, the initiator READs
// it back and checks every byte. Returns an empty string on success.
std::string loopback_read(const std::string& provider, const std::string& address) {
  auto dev = cvy::device::open(provider);
  if (!dev) return "open: " + dev.error().to_string();
  auto pd = dev->alloc_pd().value();
  auto cq = dev->create_cq({.depth = 16}).value();
  std::vector<std::byte> shelf(64 << 10);
  for (std::size_t i = 0; i < shelf.size(); ++i) shelf[i] = static_cast<std::byte>(i * 7 + 1);
  auto shelf_mr =
      pd.register_memory(std::span(shelf), cvy::access::local_write | cvy::access::remote_read)
          .value();
  auto lis = cvy::listener::bind(*dev, address);
  if (!lis) return "listen on " + address + ": " + lis.error().to_string();
  auto target_qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
  std::string target_error;
  std::jthread target([&] {
    auto req = lis->accept(10s);
    if (!req) {
      target_error = "accept: " + req.error().to_string();
      return;
    }
    if (auto ok = req->accept(target_qp, shelf_mr.remote().encode()); !ok)
      target_error = "accept: " + ok.error().to_string();
  });
  std::vector<std::byte> local(shelf.size());
  auto local_mr = pd.register_memory(std::span(local), cvy::access::local_write).value();
  auto qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
  auto conn = cvy::connect(qp, lis->address(), {.timeout = 10s});
  target.join();
  if (!conn) return "connect: " + conn.error().to_string() + " " + target_error;
  if (!target_error.empty()) return target_error;
  auto peer = cvy::remote_region::decode(conn->private_data).value();
  if (qp.post_read(local_mr.as_sge(), peer.slice(0, local.size()), 1) != cvy::errc::ok)
    return "post_read refused";
  auto wc = cq.wait_one(10s);
  if (!wc) return "wait: " + std::string(cvy::to_string(wc.error()));
  if (wc->status != cvy::wc_status::success)
    return "READ completed with " + std::string(cvy::to_string(wc->status));
  if (local != shelf) return "READ brought different bytes";
  return {};
}

}  // namespace

int main() {
  bool ok = true;
  const std::string shm_name = "@rdma-core-probe-" + std::to_string(::getpid());
  for (const auto& [provider, address] :
       {std::pair<std::string, std::string>{"soft", "127.0.0.1:0"}, {"shm", shm_name}}) {
    const std::string e = loopback_read(provider, address);
    std::printf("%s: %s\n", provider.c_str(), e.empty() ? "READ 65536 bytes verified" : e.c_str());
    ok = ok && e.empty();
  }
  for (const char* name : {"verbs", "verbs:mlx5_0"}) {
    auto dev = cvy::device::open(name);
    if (dev) {
      std::printf("%s: opened %s\n", name, dev->attr().name.c_str());
      continue;
    }
    std::printf("%s: %s: %s\n", name, std::string(cvy::to_string(dev.error().code)).c_str(),
                dev.error().context.c_str());
    ok = ok && !dev.error().context.empty();
  }
  return ok ? 0 : 1;
}
