// gloo_algorithms.cpp — Gloo's own algorithms over conveyor-gloo, one process
// per rank, rendezvous through Gloo's FileStore in a fresh temporary folder.
//
//   conveyor-gloo-test --ranks 3 --device shm [--large] [--fault kill|absent]
//   conveyor-gloo-test --ranks 2 --device verbs:rxe0 --host 10.11.0.1   (tests/vm)
//
// Every rank fills its inputs from its rank and the element index, runs the
// algorithm and compares with the result computed locally from the same
// formula; any mismatch or exception fails the rank and the run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/scatter.h>
#include <gloo/types.h>

#include <gloo/transport/tcp/device.h>

#include "conveyor_gloo/transport.hpp"
#include "fork_ranks.hpp"

namespace {

using namespace std::chrono_literals;
using gloo::float16;

int g_rank = 0, g_size = 0;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "rank %d: FAILED %s\n", g_rank, what.c_str());
  }
}

// Small integers, exact in float16 even after summing over 4 ranks.
float value(int rank, std::size_t i) {
  return float((rank + 1) * int(i % 7 + 1));
}

template <class T>
T to(float v) {
  if constexpr (std::is_same_v<T, float16>)
    return gloo::cpu_float2half_rn(v);
  else
    return T(v);
}
template <class T>
float from(T v) {
  if constexpr (std::is_same_v<T, float16>)
    return gloo::cpu_half2float(v);
  else
    return float(v);
}

template <class T>
std::vector<T> input(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = to<T>(value(rank, i));
  return v;
}

float sum_all(std::size_t i) {
  float s = 0;
  for (int r = 0; r < g_size; ++r) s += value(r, i);
  return s;
}

template <class T>
bool all_sum(const std::vector<T>& v, std::size_t n, std::size_t from_i = 0) {
  for (std::size_t i = 0; i < n; ++i)
    if (from<T>(v[i]) != sum_all(from_i + i)) {
      std::fprintf(stderr, "rank %d: element %zu of %zu is %g, expected %g\n", g_rank, i, n,
                   double(from<T>(v[i])), double(sum_all(from_i + i)));
      return false;
    }
  return true;
}

template <class T>
const char* tname() {
  return std::is_same_v<T, float16> ? "f16" : "f32";
}

using ctx_ptr = std::shared_ptr<gloo::rendezvous::Context>;

template <class T>
void allreduce_new(const ctx_ptr& ctx, std::size_t n, gloo::AllreduceOptions::Algorithm algo,
                   const char* name) {
  auto v = input<T>(g_rank, n);
  gloo::AllreduceOptions o(ctx);
  o.setAlgorithm(algo);
  o.setOutput(v.data(), n);
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
  o.setTag(7);
  gloo::allreduce(o);
  check(all_sum(v, n),
        std::string("allreduce ") + name + " " + tname<T>() + " n=" + std::to_string(n));
}

template <class Algo, class T>
void allreduce_old(const ctx_ptr& ctx, std::size_t n, const char* name) {
  auto v = input<T>(g_rank, n);
  std::vector<T*> ptrs{v.data()};
  Algo a(ctx, ptrs, int(n));
  a.run();
  check(all_sum(v, n), std::string(name) + " " + tname<T>() + " n=" + std::to_string(n));
}

void broadcast_cases(const ctx_ptr& ctx, std::size_t n) {
  for (int root = 0; root < g_size; ++root) {
    auto v = g_rank == root ? input<float>(root, n) : std::vector<float>(n, -1.f);
    gloo::BroadcastOptions o(ctx);
    o.setOutput(v.data(), n);
    o.setRoot(root);
    gloo::broadcast(o);
    check(v == input<float>(root, n),
          "broadcast root " + std::to_string(root) + " n=" + std::to_string(n));
  }
  auto v = g_rank == 1 ? input<float>(1, n) : std::vector<float>(n, -1.f);
  std::vector<float*> ptrs{v.data()};
  gloo::BroadcastOneToAll<float> b(ctx, ptrs, n, 1);
  b.run();
  check(v == input<float>(1, n), "BroadcastOneToAll n=" + std::to_string(n));
}

void allgather_cases(const ctx_ptr& ctx, std::size_t n) {
  auto in = input<float>(g_rank, n);
  std::vector<float> out(n * g_size, -1.f);
  gloo::AllgatherOptions o(ctx);
  o.setInput(in.data(), n);
  o.setOutput(out.data(), out.size());
  gloo::allgather(o);
  std::vector<float> want;
  for (int r = 0; r < g_size; ++r) {
    auto x = input<float>(r, n);
    want.insert(want.end(), x.begin(), x.end());
  }
  check(out == want, "allgather n=" + std::to_string(n));
  std::vector<float> out2(n * g_size, -1.f);
  std::vector<const float*> ins{in.data()};
  gloo::AllgatherRing<float> ar(ctx, ins, out2.data(), int(n));
  ar.run();
  check(out2 == want, "AllgatherRing n=" + std::to_string(n));
}

void reduce_scatter_case(const ctx_ptr& ctx, std::size_t per_rank) {
  std::size_t n = per_rank * g_size;
  auto v = input<float>(g_rank, n);
  std::vector<int> counts(g_size, int(per_rank));
  std::vector<float*> ptrs{v.data()};
  gloo::ReduceScatterHalvingDoubling<float> rs(ctx, ptrs, int(n), counts);
  rs.run();
  std::vector<float> mine(v.begin(), v.begin() + per_rank);
  check(all_sum(mine, per_rank, per_rank * g_rank),
        "ReduceScatterHalvingDoubling n=" + std::to_string(n));
}

void alltoall_case(const ctx_ptr& ctx, std::size_t per_rank) {
  std::vector<float> in(per_rank * g_size), out(per_rank * g_size, -1.f);
  for (int r = 0; r < g_size; ++r)
    for (std::size_t i = 0; i < per_rank; ++i)
      in[r * per_rank + i] = float(g_rank * 1000 + r * 100 + int(i % 50));
  gloo::AlltoallOptions o(ctx);
  o.setInput(in.data(), in.size());
  o.setOutput(out.data(), out.size());
  gloo::alltoall(o);
  bool ok = true;
  for (int r = 0; r < g_size; ++r)
    for (std::size_t i = 0; i < per_rank; ++i)
      ok &= out[r * per_rank + i] == float(r * 1000 + g_rank * 100 + int(i % 50));
  check(ok, "alltoall per_rank=" + std::to_string(per_rank));
}

void reduce_gather_scatter(const ctx_ptr& ctx, std::size_t n) {
  auto v = input<float>(g_rank, n);
  std::vector<float> out(n, -1.f);
  gloo::ReduceOptions o(ctx);
  o.setInput(v.data(), n);
  o.setOutput(out.data(), n);
  o.setRoot(0);
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::reduce(o);
  if (g_rank == 0) check(all_sum(out, n), "reduce n=" + std::to_string(n));

  std::vector<float> g(n * g_size, -1.f);
  gloo::GatherOptions go(ctx);
  go.setInput(v.data(), n);
  if (g_rank == 0) go.setOutput(g.data(), g.size());
  go.setRoot(0);
  gloo::gather(go);
  if (g_rank == 0) {
    bool ok = true;
    for (int r = 0; r < g_size; ++r)
      ok &= std::vector<float>(g.begin() + r * n, g.begin() + (r + 1) * n) == input<float>(r, n);
    check(ok, "gather n=" + std::to_string(n));
  }

  std::vector<std::vector<float>> parts;
  std::vector<float*> ptrs;
  for (int r = 0; r < g_size; ++r) parts.push_back(input<float>(r, n));
  for (auto& p : parts) ptrs.push_back(p.data());
  std::vector<float> s(n, -1.f);
  gloo::ScatterOptions so(ctx);
  if (g_rank == 0) so.setInputs(ptrs, n);
  so.setOutput(s.data(), n);
  so.setRoot(0);
  gloo::scatter(so);
  check(s == input<float>(g_rank, n), "scatter n=" + std::to_string(n));
}

void barrier_cases(const ctx_ptr& ctx) {
  gloo::BarrierOptions o(ctx);
  gloo::barrier(o);
  gloo::BarrierAllToAll b(ctx);
  b.run();
}

// Rank 0 receives one message from each other rank with recv-from-any on one
// slot; the source of each completion says who it was, and the payload agrees.
void recv_from_any(const ctx_ptr& ctx, std::size_t n) {
  const std::uint64_t slot = 0x5150;
  if (g_rank == 0) {
    std::vector<float> buf(n + 1);
    auto ub = ctx->createUnboundBuffer(buf.data(), buf.size() * sizeof(float));
    std::vector<int> srcs;
    for (int r = 1; r < g_size; ++r) srcs.push_back(r);
    std::set<int> seen;
    for (int k = 1; k < g_size; ++k) {
      ub->recv(srcs, slot);
      int src = -1;
      ub->waitRecv(&src);
      bool ok = src >= 1 && src < g_size && !seen.contains(src) && buf[0] == float(src);
      for (std::size_t i = 0; i < n && ok; ++i) ok = buf[i + 1] == value(src, i);
      check(ok, "recv-from-any n=" + std::to_string(n) + " from " + std::to_string(src));
      seen.insert(src);
      srcs.erase(std::remove(srcs.begin(), srcs.end(), src), srcs.end());
    }
  } else {
    std::vector<float> buf(n + 1);
    buf[0] = float(g_rank);
    for (std::size_t i = 0; i < n; ++i) buf[i + 1] = value(g_rank, i);
    auto ub = ctx->createUnboundBuffer(buf.data(), buf.size() * sizeof(float));
    ub->send(0, slot);
    int dst = -1;
    ub->waitSend(&dst);
    check(dst == 0, "send reports its destination");
  }
  // Ordering: several messages on one slot between two ranks arrive in order,
  // and an abort returns false without a completion.
  if (g_rank < 2) {
    const std::uint64_t s2 = 0x5151;
    std::vector<int> v(4);
    auto ub = ctx->createUnboundBuffer(v.data(), v.size() * sizeof(int));
    if (g_rank == 1) {
      for (int k = 0; k < 3; ++k) {
        for (auto& x : v) x = k;
        ub->send(0, s2);
        ub->waitSend();
      }
    } else {
      bool ok = true;
      for (int k = 0; k < 3; ++k) {
        ub->recv(1, s2);
        ub->waitRecv();
        for (int x : v) ok &= x == k;
      }
      check(ok, "messages on one slot arrive in order");
      std::thread t([&] {
        std::this_thread::sleep_for(20ms);
        ub->abortWaitRecv();
      });
      check(!ub->waitRecv(5000ms), "abortWaitRecv makes waitRecv return false");
      t.join();
    }
  }
}

// A receive destroyed before its data came (what a rank's collective does
// when it unwinds): its RTR is withdrawn, so a later send on the slot goes to
// the next receive posted there, and a WRITE already under way into it is let
// finish, so the pair stays usable. Before, the stale RTR swallowed the next
// message (eager: dropped; large: a WRITE into a deregistered region, which
// broke the pair), and a destroyed buffer deregistered under a peer's WRITE.
void cancelled_receives(const ctx_ptr& ctx, std::size_t n) {
  if (g_rank > 1) return;
  const std::uint64_t slot = 0x5200 + n % 251, sync = 0x5300 + n % 251;
  int token = 0;
  auto tk = ctx->createUnboundBuffer(&token, sizeof token);
  std::vector<float> buf(n);
  if (g_rank == 0) {
    {
      auto gone = ctx->createUnboundBuffer(buf.data(), n * sizeof(float));
      gone->recv(1, slot);
    }                   // destroyed unanswered
    tk->send(1, sync);  // rank 1 sends only after this
    tk->waitSend();
    auto ub = ctx->createUnboundBuffer(buf.data(), n * sizeof(float));
    ub->recv(1, slot);
    ub->waitRecv(5000ms);
    bool ok = true;
    for (std::size_t i = 0; i < n && ok; ++i) ok = buf[i] == value(1, i);
    check(ok, "a send after a destroyed receive reaches the next receive, n=" + std::to_string(n));
    // Rank 1's send waits for a receive: this one's RTR is answered at once
    // and the buffer is destroyed while the data is being placed.
    tk->recv(1, sync);
    tk->waitRecv(5000ms);
    auto busy = ctx->createUnboundBuffer(buf.data(), n * sizeof(float));
    busy->recv(1, slot);
    busy.reset();
  } else {
    for (std::size_t i = 0; i < n; ++i) buf[i] = value(1, i);
    auto ub = ctx->createUnboundBuffer(buf.data(), n * sizeof(float));
    tk->recv(0, sync);
    tk->waitRecv(5000ms);
    ub->send(0, slot);
    ub->waitSend(5000ms);
    ub->send(0, slot);
    tk->send(0, sync);
    tk->waitSend(5000ms);
    ub->waitSend(5000ms);  // placed, then dropped by the destroyed receive
  }
  // The pair still works both ways.
  token = g_rank + 10;
  if (g_rank == 0) {
    tk->send(1, sync + 1);
    tk->waitSend(5000ms);
    tk->recv(1, sync + 2);
    tk->waitRecv(5000ms);
    check(token == 11, "the pair works after the cancellations, n=" + std::to_string(n));
  } else {
    tk->recv(0, sync + 1);
    tk->waitRecv(5000ms);
    check(token == 10, "the pair works after the cancellations, n=" + std::to_string(n));
    token = 11;
    tk->send(0, sync + 2);
    tk->waitSend(5000ms);
  }
}

std::string g_host = "127.0.0.1";  // --host: the address the ranks listen on

ctx_ptr connect(const std::string& dir, const std::string& device,
                std::chrono::milliseconds timeout) {
  // "tcp": Gloo's own TCP transport, the reference behaviour.
  auto dev = device == "tcp" ? gloo::transport::tcp::CreateDevice(g_host.c_str())
                             : conveyor_gloo::CreateDevice({.hostname = g_host, .device = device});
  gloo::rendezvous::FileStore store(dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(g_rank, g_size);
  ctx->setTimeout(timeout);
  ctx->connectFullMesh(store, dev);
  return ctx;
}

int run_rank(const std::string& dir, const std::string& device, bool large) {
  auto ctx = connect(dir, device, 30s);
  std::vector<std::size_t> sizes{0, 1, 7, 1000, 16381, 70000, 300007};
  for (auto n : sizes) {
    allreduce_new<float>(ctx, n, gloo::AllreduceOptions::Algorithm::RING, "ring");
    allreduce_new<float>(ctx, n, gloo::AllreduceOptions::Algorithm::BCUBE, "bcube");
    allreduce_new<float16>(ctx, n, gloo::AllreduceOptions::Algorithm::RING, "ring");
    if (n == 0) continue;  // the bound-buffer algorithms need elements
    allreduce_old<gloo::AllreduceRing<float>, float>(ctx, n, "AllreduceRing");
    allreduce_old<gloo::AllreduceRingChunked<float>, float>(ctx, n, "AllreduceRingChunked");
    allreduce_old<gloo::AllreduceHalvingDoubling<float>, float>(ctx, n, "AllreduceHalvingDoubling");
    // The bound-buffer BCube needs a size that is a power of the context's
    // base (2): with 3 ranks it gives wrong sums over Gloo's TCP transport too.
    if ((g_size & (g_size - 1)) == 0)
      allreduce_old<gloo::AllreduceBcube<float>, float>(ctx, n, "AllreduceBcube");
    allreduce_old<gloo::AllreduceHalvingDoubling<float16>, float16>(ctx, n,
                                                                    "AllreduceHalvingDoubling");
    broadcast_cases(ctx, n);
    allgather_cases(ctx, n);
    reduce_scatter_case(ctx, n);
    alltoall_case(ctx, n);
    reduce_gather_scatter(ctx, n);
    barrier_cases(ctx);
  }
  recv_from_any(ctx, 1);
  recv_from_any(ctx, 100000);
  cancelled_receives(ctx, 1);
  cancelled_receives(ctx, 1 << 20);  // 4 MiB: RDMA WRITE
  if (large) {                       // one 64 MiB allreduce
    allreduce_new<float>(ctx, (64u << 20) / sizeof(float), gloo::AllreduceOptions::Algorithm::RING,
                         "ring");
  }
  barrier_cases(ctx);
  return g_failures == 0 ? 0 : 1;
}

// Faults: the last rank dies mid-allreduce (kill), stops there (hang: SIGSTOP)
// or never joins (absent); the others must fail with Gloo's exception within
// the timeout, naming the rank (kill, hang) or the missing key (absent).
int run_fault(const std::string& dir, const std::string& device, const std::string& fault) {
  const auto timeout = 4000ms;
  const bool victim = g_rank == g_size - 1;
  if (fault == "absent" && victim) return 0;
  auto start = std::chrono::steady_clock::now();
  // The context outlives the try block: destroying it closes this rank's
  // connections, and a survivor that closed them before the others raised
  // would make them fail naming it instead of the victim (seen under ASan).
  ctx_ptr ctx;
  try {
    ctx = connect(dir, device, timeout);
    std::vector<float> v(1 << 18);
    for (int it = 0;; ++it) {
      if (victim && it == 3) ::raise(fault == "hang" ? SIGSTOP : SIGKILL);
      start = std::chrono::steady_clock::now();
      gloo::AllreduceOptions o(ctx);
      o.setOutput(v.data(), v.size());
      o.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(o);
      if (it > 1000) break;
    }
    std::fprintf(stderr, "rank %d: FAILED no exception after the %s rank\n", g_rank, fault.c_str());
    return 1;
  } catch (const gloo::IoException& e) {
    auto took = std::chrono::steady_clock::now() - start;
    // A survivor that exits at once closes its connections, and another
    // survivor still waiting would then fail naming it instead of the victim:
    // each keeps its context and waits (bounded) until every survivor has raised.
    {
      std::FILE* f = std::fopen((dir + "/raised." + std::to_string(g_rank)).c_str(), "w");
      if (f) std::fclose(f);
      auto until = std::chrono::steady_clock::now() + 10s;
      for (int r = 0; r < g_size - 1 && std::chrono::steady_clock::now() < until;) {
        if (std::filesystem::exists(dir + "/raised." + std::to_string(r)))
          ++r;
        else
          std::this_thread::sleep_for(5ms);
      }
    }
    std::string what = e.what();
    std::fprintf(stderr, "rank %d: raised after %lld ms: %s\n", g_rank,
                 (long long)std::chrono::duration_cast<std::chrono::milliseconds>(took).count(),
                 e.what());
    if (took > timeout + 3000ms) {
      std::fprintf(stderr, "rank %d: FAILED took longer than the timeout\n", g_rank);
      return 1;
    }
    if (fault != "absent" && what.find("rank " + std::to_string(g_size - 1)) == std::string::npos &&
        what.find("Timed out") == std::string::npos) {
      std::fprintf(stderr, "rank %d: FAILED the message names neither the rank nor a timeout\n",
                   g_rank);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: FAILED unexpected exception: %s\n", g_rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2;
  std::string device = "soft", fault;
  bool large = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc)
      ranks = std::atoi(argv[++i]);
    else if (a == "--device" && i + 1 < argc)
      device = argv[++i];
    else if (a == "--fault" && i + 1 < argc)
      fault = argv[++i];
    else if (a == "--large")
      large = true;
    else if (a == "--host" && i + 1 < argc)
      g_host = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s --ranks N --device soft|shm|verbs[:dev] [--host IP] [--large] "
                   "[--fault kill|hang|absent]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string dir = conveyor_gloo_test::make_rank_dir("conveyor-gloo");
  if (dir.empty()) return 2;
  g_size = ranks;
  const auto kids = conveyor_gloo_test::fork_ranks(ranks, [&](int r) {
    g_rank = r;
    return fault.empty() ? run_rank(dir, device, large) : run_fault(dir, device, fault);
  });
  int failed = 0;
  auto deadline = std::chrono::steady_clock::now() + 240s;
  std::vector<bool> done(ranks, false);
  int left = ranks;
  while (left > 0) {
    if (fault == "hang" && left == 1 && !done[ranks - 1]) ::kill(kids[ranks - 1], SIGKILL);
    for (int r = 0; r < ranks; ++r) {
      if (done[r]) continue;
      int status = 0;
      pid_t w = ::waitpid(kids[r], &status, WNOHANG);
      if (w != kids[r]) continue;
      done[r] = true;
      --left;
      bool killed_victim = (fault == "kill" || fault == "hang") && r == ranks - 1 &&
                           WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
      if (!killed_victim && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        std::fprintf(stderr, "rank %d failed (status %d)\n", r, status);
        ++failed;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "timed out: killing the ranks left\n");
      for (int r = 0; r < ranks; ++r)
        if (!done[r]) ::kill(kids[r], SIGKILL), ::waitpid(kids[r], nullptr, 0);
      ++failed;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf("%s: %d ranks on %s%s%s\n", failed ? "FAILED" : "passed", ranks, device.c_str(),
              fault.empty() ? "" : ", fault ", fault.c_str());
  return failed ? 1 : 0;
}
