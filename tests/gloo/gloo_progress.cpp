// gloo_progress.cpp — conveyor-gloo's progress: how many threads a rank runs,
// and pairs closed in any order while traffic is outstanding. One process per
// rank, rendezvous through Gloo's FileStore in a fresh temporary folder.
//
//   conveyor-gloo-progress-test --case threads --ranks 5 --device shm
//   conveyor-gloo-progress-test --case close_order --ranks 4 --device soft
//
// threads: with 4 pairs connected and traffic on all of them, a rank runs one
// thread named cvgloo-progress (one per provider in use; the run forces one),
// and connecting the pairs started at most 2 other threads (what the device
// runs for its listeners: 1 in release, 2 under TSan), not one per pair. Before, every pair had its
// own progress thread (3 per rank at 4 ranks).
//
// close_order: every rank has, with every peer, a receive nobody answers (an
// RTR parked at the peer, its memory registered), a send nobody receives (a
// parked NOTIFY), and large sends and receives under way; then each rank
// closes its pairs in its own order (ascending, descending, alternating, none:
// the context's destructor does it) without waiting. Every wait on an
// operation of a closed pair must raise (never hang, never crash), and the
// buffers and the context must then be destroyed cleanly. Three rounds, each
// with a fresh context.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>

#include "conveyor_gloo/transport.hpp"
#include "fork_ranks.hpp"

namespace {

using namespace std::chrono_literals;

int g_rank = 0, g_size = 0;

int fail(const std::string& what) {
  std::fprintf(stderr, "rank %d: FAILED %s\n", g_rank, what.c_str());
  return 1;
}

// The process's threads by name (/proc/self/task/*/comm).
std::map<std::string, int> threads_by_name() {
  std::map<std::string, int> m;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "comm");
    std::string name;
    std::getline(f, name);
    ++m[name];
  }
  return m;
}

int total(const std::map<std::string, int>& m) {
  int n = 0;
  for (auto& [k, v] : m) n += v;
  return n;
}

std::string show(const std::map<std::string, int>& m) {
  std::string s;
  for (auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k + " x" + std::to_string(v);
  return s;
}

std::shared_ptr<gloo::rendezvous::Context> connect(const std::string& dir,
                                                   std::shared_ptr<gloo::transport::Device> dev,
                                                   const std::string& prefix) {
  gloo::rendezvous::FileStore files(dir);
  gloo::rendezvous::PrefixStore store(prefix, files);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(g_rank, g_size);
  ctx->setTimeout(5000ms);
  ctx->connectFullMesh(store, dev);
  return ctx;
}

void allreduce(const std::shared_ptr<gloo::rendezvous::Context>& ctx, std::vector<float>& v) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v.data(), v.size());
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::allreduce(o);
}

int run_threads(const std::string& dir, const std::string& device) {
  auto dev = conveyor_gloo::CreateDevice({.hostname = "127.0.0.1", .device = device});
  auto before = threads_by_name();
  auto ctx = connect(dir, dev, "threads");
  std::vector<float> v(1 << 16, float(g_rank + 1));
  for (int i = 0; i < 3; ++i) allreduce(ctx, v);
  float want = 0;
  for (int r = 0; r < g_size; ++r) want += float(r + 1);
  // Three sums of the sum: want * size^2 after the first, ... (exact in float).
  want *= float(g_size) * float(g_size);
  if (v[0] != want || v.back() != want) return fail("wrong sum " + std::to_string(v[0]));
  auto after = threads_by_name();
  int progress = after.count("cvgloo-progress") ? after["cvgloo-progress"] : 0;
  std::fprintf(stderr, "rank %d: %d pairs; threads before the context: %s; after: %s\n", g_rank,
               g_size - 1, show(before).c_str(), show(after).c_str());
  if (progress != 1)
    return fail(std::to_string(progress) + " progress threads for " + std::to_string(g_size - 1) +
                " pairs (expected 1)");
  // Connecting started the progress thread and, on the lower ranks, what the
  // device runs for its listeners and handshakes: never a thread per pair
  // (with one per pair, 4 pairs added 4 besides the listener's).
  int others = total(after) - total(before) - progress;
  if (others > 2)
    return fail(std::to_string(others) + " threads other than the progress thread started for " +
                std::to_string(g_size - 1) +
                " pairs (at most 2: the device's listener and handshake threads)");
  return 0;
}

// Waits for an operation that may never complete: true if it raised or
// completed, false if it neither did within the bound (a hang).
template <class Wait>
bool ends(Wait&& wait) {
  auto start = std::chrono::steady_clock::now();
  try {
    wait();
  } catch (const gloo::IoException&) {
  } catch (const gloo::EnforceNotMet&) {
  }
  return std::chrono::steady_clock::now() - start < 9s;
}

// Posts an operation; a peer that already closed the pair makes it raise.
template <class Post>
void post(Post&& p) {
  try {
    p();
  } catch (const gloo::IoException&) {
  }
}

int run_close_order(const std::string& dir, const std::string& device) {
  auto dev = conveyor_gloo::CreateDevice({.hostname = "127.0.0.1", .device = device});
  constexpr std::size_t large = 1 << 18;  // floats: 1 MiB, beyond the eager size
  gloo::rendezvous::FileStore files(dir);
  for (int round = 0; round < 3; ++round) {
    auto ctx = connect(dir, dev, "round" + std::to_string(round));
    std::vector<int> peers;
    for (int r = 0; r < g_size; ++r)
      if (r != g_rank) peers.push_back(r);
    std::vector<std::vector<float>> mem(4 * peers.size(), std::vector<float>(large, 1.0f));
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> unanswered_recv, unanswered_send,
        bulk_send, bulk_recv;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      int p = peers[i];
      auto mk = [&](std::size_t k) {
        return ctx->createUnboundBuffer(mem[4 * i + k].data(), large * sizeof(float));
      };
      unanswered_recv.push_back(mk(0));
      unanswered_send.push_back(mk(1));
      bulk_send.push_back(mk(2));
      bulk_recv.push_back(mk(3));
      post([&] { unanswered_recv.back()->recv(p, 100 + g_rank); });  // the peer never sends
      post([&] { unanswered_send.back()->send(p, 200 + g_rank); });  // the peer never receives
      post([&] { bulk_send.back()->send(p, 300); });
      post([&] { bulk_recv.back()->recv(p, 300); });
    }
    // Every rank has posted before any closes.
    std::string key = "posted/" + std::to_string(round) + "/";
    files.set(key + std::to_string(g_rank), {'1'});
    std::vector<std::string> keys;
    for (int r = 0; r < g_size; ++r) keys.push_back(key + std::to_string(r));
    files.wait(keys, 10000ms);
    // Some of the bulk traffic completes, some is still under way, when the
    // ranks start closing; each rank closes in its own order.
    if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(g_rank * round));
    std::vector<int> order = peers;
    switch ((g_rank + round) % 4) {
      case 0:
        break;
      case 1:
        std::reverse(order.begin(), order.end());
        break;
      case 2:
        std::rotate(order.begin(), order.begin() + 1, order.end());
        break;
      case 3:
        order.clear();  // the context's destructor closes them
        break;
    }
    for (int p : order) ctx->getPair(p)->close();
    for (std::size_t i = 0; i < peers.size(); ++i) {
      bool closed = std::find(order.begin(), order.end(), peers[i]) != order.end();
      if (closed && !ends([&] { unanswered_recv[i]->waitRecv(1000ms); }))
        return fail("waiting for a receive of a closed pair hung");
      if (!ends([&] { bulk_send[i]->waitSend(1000ms); }))
        return fail("waiting for a bulk send hung");
      if (!ends([&] { bulk_recv[i]->waitRecv(1000ms); }))
        return fail("waiting for a bulk receive hung");
    }
    // A closed pair refuses new operations at once.
    for (int p : order) {
      bool raised = false;
      try {
        bulk_send[0]->send(p, 400);
      } catch (const gloo::IoException&) {
        raised = true;
      }
      if (!raised) return fail("a send on a closed pair did not raise");
    }
    // Buffers first (their cancellations meet closed pairs), then the context.
    unanswered_recv.clear();
    unanswered_send.clear();
    bulk_send.clear();
    bulk_recv.clear();
    ctx.reset();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kase, device = "shm";
  int ranks = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--case")
      kase = argv[i + 1];
    else if (a == "--device")
      device = argv[i + 1];
    else if (a == "--ranks")
      ranks = std::atoi(argv[i + 1]);
  }
  if (kase != "threads" && kase != "close_order") {
    std::fprintf(stderr, "usage: %s --case threads|close_order --ranks N --device soft|shm\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = conveyor_gloo_test::make_rank_dir("conveyor-gloo-progress");
  if (dir.empty()) return 2;
  g_size = ranks;
  const auto kids = conveyor_gloo_test::fork_ranks(ranks, [&](int r) {
    g_rank = r;
    return kase == "threads" ? run_threads(dir, device) : run_close_order(dir, device);
  });
  int failed = 0;
  auto deadline = std::chrono::steady_clock::now() + 100s;
  for (int r = 0; r < ranks; ++r) {
    int status = 0;
    while (::waitpid(kids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rank %d hung: killed\n", r);
        ::kill(kids[r], SIGKILL);
        ::waitpid(kids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      std::fprintf(stderr, "rank %d failed (status %d)\n", r, status);
      ++failed;
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf("%s: %s, %d ranks on %s\n", failed ? "FAILED" : "passed", kase.c_str(), ranks,
              device.c_str());
  return failed ? 1 : 0;
}
