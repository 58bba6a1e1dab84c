#include "common/netns.hpp"

#include <unistd.h>

#include <chrono>
#include <vector>

#include "common/process.hpp"

namespace cvt {

namespace {
constexpr auto k_cmd_timeout = std::chrono::milliseconds(10000);
}

std::unique_ptr<netns_pair> netns_pair::create(std::string& why, bool& environmental) {
  environmental = true;
  if (::geteuid() != 0) {
    why = "needs root to create network namespaces (euid " + std::to_string(::geteuid()) + ")";
    return nullptr;
  }
  std::string ip = find_program("ip");
  if (ip.empty()) {
    why = "the `ip` program (iproute2) is not installed";
    return nullptr;
  }
  std::unique_ptr<netns_pair> p(new netns_pair());
  p->ip_ = ip;
  const std::string pid = std::to_string(::getpid());
  p->a_ = "cvy-a-" + pid;
  p->b_ = "cvy-b-" + pid;
  const std::string va = "cva" + pid, vb = "cvb" + pid;  // <= 15 chars

  auto run = [&](const std::vector<std::string>& rest) {
    std::vector<std::string> args{ip};
    for (const auto& a : rest) args.push_back(a);
    auto r = run_command(args, k_cmd_timeout);
    if (!r.ok()) {
      std::string cmd;
      for (const auto& s : args) cmd += s + " ";
      why = cmd + "failed: " + r.output;
    }
    return r.ok();
  };
  if (!run({"netns", "add", p->a_})) {
    why = "cannot create network namespaces here: " + why;
    return nullptr;
  }
  p->a_made_ = true;
  environmental = false;  // from here on, a failure is a real one
  if (!run({"netns", "add", p->b_})) return nullptr;
  p->b_made_ = true;
  if (!run({"link", "add", va, "mtu", "1500", "type", "veth", "peer", "name", vb, "mtu", "1500"})) {
    // Some kernels/containers refuse veth: that is the environment too.
    environmental = true;
    why = "cannot create a veth pair here: " + why;
    return nullptr;
  }
  bool ok = run({"link", "set", va, "netns", p->a_}) && run({"link", "set", vb, "netns", p->b_}) &&
            run({"-n", p->a_, "addr", "add", std::string(addr_a) + "/24", "dev", va}) &&
            run({"-n", p->b_, "addr", "add", std::string(addr_b) + "/24", "dev", vb}) &&
            run({"-n", p->a_, "link", "set", va, "mtu", "1500", "up"}) &&
            run({"-n", p->b_, "link", "set", vb, "mtu", "1500", "up"}) &&
            run({"-n", p->a_, "link", "set", "lo", "up"}) &&
            run({"-n", p->b_, "link", "set", "lo", "up"});
  if (!ok) return nullptr;
  return p;
}

netns_pair::~netns_pair() {
  // Deleting a namespace destroys the veth end inside it, and with it the pair.
  if (a_made_) (void)run_command({ip_, "netns", "del", a_}, k_cmd_timeout);
  if (b_made_) (void)run_command({ip_, "netns", "del", b_}, k_cmd_timeout);
}

}  // namespace cvt
