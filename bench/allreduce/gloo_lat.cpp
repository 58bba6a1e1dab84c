// gloo_lat.cpp — where a small all_reduce's time goes below torch: the same
// Gloo ring allreduce torch's ProcessGroupGloo runs (gloo::allreduce, float
// sum), called from C++ with no Python and no torch, over Gloo's TCP transport
// and conveyor-gloo (shm, soft), and a 4 KiB ping-pong of unbound buffers.
//
//   conveyor-gloo-lat [--ranks 2] [--size 4096] [--iters 2000]
//                     [--devices tcp,shm,soft] [--rounds 3]
//
// Ranks are forked processes (Gloo's FileStore in a fresh folder). Per device
// and round, one line per measurement:
//   <device> <ranks> <bytes> <what> <median_us> <p10_us> <p90_us>
// what: "allreduce" (gloo::allreduce called by the rank's main thread),
// "allreduce-handoff" (the same, run by a second thread that the main thread
// wakes through a condition variable and waits for on another, as torch's
// work queue and future do), and, for rank 0 <-> rank 1 only, "pingpong"
// (half a round trip: send, waitSend, recv, waitRecv against recv, waitRecv,
// send, waitSend). Each allreduce iteration is timed after a barrier and is
// the slowest rank's time; the median is over the iterations.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <conveyor_gloo/transport.hpp>

#include "../../tests/gloo/fork_ranks.hpp"

namespace {

using clk = std::chrono::steady_clock;
using ctx_ptr = std::shared_ptr<gloo::rendezvous::Context>;

double us(clk::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

void allreduce(const ctx_ptr& ctx, std::vector<float>& v) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v.data(), v.size());
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  o.setTag(1);
  gloo::allreduce(o);
}

void barrier(const ctx_ptr& ctx) {
  gloo::BarrierOptions o(ctx);
  o.setTag(2);
  gloo::barrier(o);
}

// Every rank's times, in rank order (gloo::allgather over the context).
std::vector<double> gather(const ctx_ptr& ctx, const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * std::size_t(ctx->size));
  gloo::AllgatherOptions o(ctx);
  o.setInput(const_cast<double*>(mine.data()), mine.size());
  o.setOutput(all.data(), all.size());
  o.setTag(3);
  gloo::allgather(o);
  return all;
}

void report(const std::string& dev, int ranks, std::size_t bytes, const char* what,
            std::vector<double> t) {
  std::sort(t.begin(), t.end());
  auto at = [&](double q) { return t[std::min(t.size() - 1, std::size_t(q * double(t.size())))]; };
  std::printf("%s %d %zu %s %.1f %.1f %.1f\n", dev.c_str(), ranks, bytes, what, at(0.5), at(0.1),
              at(0.9));
  std::fflush(stdout);
}

// Slowest rank per iteration.
std::vector<double> slowest(const ctx_ptr& ctx, const std::vector<double>& mine) {
  auto all = gather(ctx, mine);
  std::vector<double> worst(mine.size(), 0);
  for (int r = 0; r < ctx->size; ++r)
    for (std::size_t i = 0; i < mine.size(); ++i)
      worst[i] = std::max(worst[i], all[std::size_t(r) * mine.size() + i]);
  return worst;
}

// torch's shape: the caller hands the collective to a worker thread (work
// queue) and waits for it (the future), one wake-up each way.
class handoff_worker {
 public:
  explicit handoff_worker(std::function<void()> fn) : fn_(std::move(fn)), t_([this] { run(); }) {}
  ~handoff_worker() {
    {
      std::lock_guard g(m_);
      quit_ = true;
    }
    cv_.notify_all();
    t_.join();
  }
  void call() {
    std::unique_lock l(m_);
    ++asked_;
    cv_.notify_all();
    done_cv_.wait(l, [&] { return done_ == asked_; });
  }

 private:
  void run() {
    std::unique_lock l(m_);
    for (;;) {
      cv_.wait(l, [&] { return quit_ || done_ < asked_; });
      if (quit_) return;
      l.unlock();
      fn_();
      l.lock();
      ++done_;
      done_cv_.notify_all();
    }
  }
  std::function<void()> fn_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  long asked_ = 0, done_ = 0;
  bool quit_ = false;
  std::thread t_;
};

int run_rank(int rank, int ranks, const std::string& dir, const std::string& device,
             std::size_t bytes, int iters) {
  auto dev = device == "tcp"
                 ? gloo::transport::tcp::CreateDevice("127.0.0.1")
                 : conveyor_gloo::CreateDevice({.hostname = "127.0.0.1", .device = device});
  gloo::rendezvous::FileStore store(dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
  ctx->setTimeout(std::chrono::seconds(30));
  ctx->connectFullMesh(store, dev);

  std::vector<float> v(bytes / sizeof(float), float(rank + 1));
  allreduce(ctx, v);
  if (v[0] != float(ranks * (ranks + 1) / 2)) {
    std::fprintf(stderr, "rank %d: wrong sum %g\n", rank, double(v[0]));
    return 1;
  }
  for (int i = 0; i < 20; ++i) allreduce(ctx, v);

  std::vector<double> t(std::size_t(iters), 0);
  for (int i = 0; i < iters; ++i) {
    barrier(ctx);
    auto t0 = clk::now();
    allreduce(ctx, v);
    t[std::size_t(i)] = us(clk::now() - t0);
  }
  auto w = slowest(ctx, t);
  if (rank == 0) report(device, ranks, bytes, "allreduce", w);

  {
    handoff_worker hw([&] { allreduce(ctx, v); });
    for (int i = 0; i < 20; ++i) hw.call();
    for (int i = 0; i < iters; ++i) {
      barrier(ctx);
      auto t0 = clk::now();
      hw.call();
      t[std::size_t(i)] = us(clk::now() - t0);
    }
  }
  w = slowest(ctx, t);
  if (rank == 0) report(device, ranks, bytes, "allreduce-handoff", w);

  // Ping-pong between ranks 0 and 1 (the others wait at the barrier).
  barrier(ctx);
  if (rank <= 1) {
    std::vector<char> sb(bytes, 1), rb(bytes, 0);
    auto sbuf = ctx->createUnboundBuffer(sb.data(), bytes);
    auto rbuf = ctx->createUnboundBuffer(rb.data(), bytes);
    int peer = 1 - rank;
    auto one = [&] {
      if (rank == 0) {
        sbuf->send(peer, 9);
        rbuf->recv(peer, 10);
        sbuf->waitSend();
        rbuf->waitRecv();
      } else {
        rbuf->recv(peer, 9);
        rbuf->waitRecv();
        sbuf->send(peer, 10);
        sbuf->waitSend();
      }
    };
    for (int i = 0; i < 50; ++i) one();
    for (int i = 0; i < iters; ++i) {
      auto t0 = clk::now();
      one();
      t[std::size_t(i)] = us(clk::now() - t0) / 2;
    }
    if (rank == 0) report(device, ranks, bytes, "pingpong", t);
  }
  barrier(ctx);
  return 0;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) out.push_back(x);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, iters = 2000, rounds = 3;
  std::size_t bytes = 4096;
  std::string devices = "tcp,shm,soft";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks")
      ranks = std::atoi(next().c_str());
    else if (a == "--size")
      bytes = std::size_t(std::atoll(next().c_str()));
    else if (a == "--iters")
      iters = std::atoi(next().c_str());
    else if (a == "--devices")
      devices = next();
    else if (a == "--rounds")
      rounds = std::atoi(next().c_str());
    else {
      std::fprintf(stderr,
                   "usage: conveyor-gloo-lat [--ranks N] [--size BYTES] [--iters N] "
                   "[--devices tcp,shm,soft] [--rounds N]\n");
      return 2;
    }
  }
  if (ranks < 2 || bytes < sizeof(float) || iters < 1) {
    std::fprintf(stderr, "conveyor-gloo-lat: need --ranks >= 2, --size >= 4, --iters >= 1\n");
    return 2;
  }
  int failed = 0;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& device : split(devices)) {
      std::string dir = conveyor_gloo_test::make_rank_dir("gloo-lat");
      if (dir.empty()) {
        std::perror("mkdtemp");
        return 1;
      }
      std::fflush(stdout);
      auto kids = conveyor_gloo_test::fork_ranks(
          ranks, [&](int r) { return run_rank(r, ranks, dir, device, bytes, iters); });
      for (pid_t k : kids) {
        int st = 0;
        ::waitpid(k, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
      }
      std::filesystem::remove_all(dir);
    }
  }
  return failed;
}
