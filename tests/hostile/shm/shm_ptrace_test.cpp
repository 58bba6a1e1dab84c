// The shm provider's Yama ptrace declarations against target children
// (shm_target_child.hpp): declared only for the peers that need cross-memory
// attach, scoped to their pids.
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include "providers/shm/engine/shm_qp.hpp"
#include "providers/shm/wire/segment.hpp"
#include "shm_target_child.hpp"

namespace {

using namespace cvt_shm_hostile;

// A client QP connected to a target child, kept open.
struct client_conn {
  conveyor::device dev;
  conveyor::protection_domain pd;
  conveyor::completion_queue cq;
  conveyor::queue_pair qp;
  conveyor::connection_info info;
};
std::unique_ptr<client_conn> open_client(const std::string& addr, bool cma) {
  if (!cma) ::setenv("CONVEYOR_SHM_CMA", "off", 1);
  auto dev = conveyor::device::open("shm:ptrace-" + std::to_string(::getpid()), {});
  ::unsetenv("CONVEYOR_SHM_CMA");
  if (!dev) return nullptr;
  auto c = std::make_unique<client_conn>();
  c->dev = std::move(*dev);
  c->pd = std::move(*c->dev.alloc_pd());
  c->cq = std::move(*c->dev.create_cq({.depth = 16}));
  c->qp = std::move(*c->pd.create_qp({.send_cq = &c->cq, .recv_cq = &c->cq}));
  auto info = conveyor::connect(c->qp, addr, {.timeout = 10s});
  if (!info) return nullptr;
  c->info = std::move(*info);
  return c;
}

int yama_scope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int s = -1;
  return f >> s ? s : -1;
}

// Yama scope 1 binds this process: CAP_SYS_PTRACE (root) bypasses it.
bool yama_binds_us() {
  if (yama_scope() != 1) return false;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("CapEff:", 0) == 0)
      return (std::stoull(line.substr(7), nullptr, 16) & (1ull << 19)) == 0;  // CAP_SYS_PTRACE
  return false;
}

// Can a process that is neither our ancestor nor our declared tracer read our
// memory? (Forks a sibling-like child: it is our descendant, not our ancestor.)
bool stranger_can_read_us() {
  static std::uint64_t word = 0x5157a11e;
  const pid_t me = ::getpid();
  const pid_t c = ::fork();
  if (c == 0) {
    std::uint64_t got = 0;
    iovec l{&got, sizeof got}, r{&word, sizeof word};
    ::_exit(::process_vm_readv(me, &l, 1, &r, 1, 0) == sizeof got && got == word ? 0 : 1);
  }
  int st = 0;
  ::waitpid(c, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// Finding 9, third item: this process declares a tracer only for a peer that
// needs one (cross-memory attach on, the peer reached us), scoped to that
// peer's pid; PR_SET_PTRACER_ANY only while two distinct peers need it (Yama
// keeps one pid per process); nothing once they are gone. Before the change
// every shm connection set PR_SET_PTRACER_ANY, cross-memory attach on or off.
TEST(shm_hostile, ptrace_declaration_is_scoped_to_the_peers_that_need_it) {
  namespace cs = conveyor::shm;
  target_child a(2), b(1);
  ASSERT_TRUE(parse_ready(a.line()));
  ASSERT_TRUE(parse_ready(b.line()));
  EXPECT_EQ(cs::declared_ptracer(), 0);
  {
    auto off = open_client(a.address(), /*cma=*/false);
    ASSERT_TRUE(off);
    EXPECT_EQ(off->info.attr.shm.value().data_path, "staged");
    EXPECT_EQ(cs::declared_ptracer(), 0) << "cross-memory attach off: nothing declared";
    off->qp.disconnect();
  }
  a.until("canary");
  auto ca = open_client(a.address(), true);
  ASSERT_TRUE(ca);
  const bool reached = ca->info.attr.shm.value().data_path == "cma";  // the child read our memory
  // Without Yama or under scope 0/1 a child of the same uid reaches us (with
  // scope 1 only because we declared it).
  if (yama_scope() <= 1) {
    EXPECT_TRUE(reached) << "scope " << yama_scope();
  }
  EXPECT_EQ(cs::declared_ptracer(), reached ? a.pid() : 0);
  if (yama_binds_us()) {
    EXPECT_TRUE(reached) << "the declared peer can attach";
    EXPECT_FALSE(stranger_can_read_us()) << "only the peer was declared";
  } else {
    std::printf(
        "note: Yama ptrace_scope 1 does not bind this process here (scope %d, or CAP_SYS_PTRACE): "
        "the kernel-side half is not observable (tests/vm runs it as an unprivileged user)\n",
        yama_scope());
  }
  auto cb = open_client(b.address(), true);
  ASSERT_TRUE(cb);
  if (reached) {
    EXPECT_EQ(cs::declared_ptracer(), -1) << "two peers: Yama keeps one pid";
  }
  cb->qp.disconnect();
  cb.reset();
  EXPECT_EQ(cs::declared_ptracer(), reached ? a.pid() : 0);
  ca->qp.disconnect();
  ca.reset();
  EXPECT_EQ(cs::declared_ptracer(), 0);
  if (yama_binds_us()) {
    EXPECT_FALSE(stranger_can_read_us()) << "nothing declared once the peers are gone";
  }
  a.until("done");
  b.until("done");
  EXPECT_EQ(a.finish(), "exit 0");
  EXPECT_EQ(b.finish(), "exit 0");
}

}  // namespace
