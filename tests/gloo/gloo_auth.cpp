// gloo_auth.cpp — conveyor-gloo's pair handshake against a local impostor.
//
//   conveyor-gloo-auth-test --case impostor  --device shm
//   conveyor-gloo-auth-test --case wrong_key --device shm|soft
//   conveyor-gloo-auth-test --case other_uid --device shm     (root; else exit 77)
//   conveyor-gloo-auth-test --case flood     --device shm
//
// Two ranks in two processes (rendezvous through a FileStore in a fresh
// folder) all_reduce {10,20,30,40} and {1,2,3,4}. Before rank 1 starts, an
// impostor in the test process connects to rank 0's listener claiming to be
// rank 1, so that its requests wait in the listener's queue ahead of the real
// rank's:
//   impostor:  it knows what any local process knows: the listener's name
//              from /proc/net/unix and every byte of that name. It sends the
//              earlier protocol's request (the name's hex tail as the cookie)
//              and a current hello keyed with the name's bytes.
//   wrong_key: it knows everything a rank publishes except the key: it reads
//              rank 0's address from the store and sends a correct hello over
//              the real nonce, keyed with random bytes (and one with the
//              right key claiming rank 2).
//   other_uid: a process of another user (uid 65534) with a perfect hello
//              (the key read from the store): shm refuses another uid too.
//   flood:     24 wrong-key hellos at once, more than a pair's listener
//              queues (16): the rest must be refused "listener busy" at once
//              (the queue is bounded), the queued ones for their key (8 log
//              lines, then a count), and the real rank then connects.
// Passes when every impostor request is refused ("authentication failed"),
// the real rank 1 then connects, and both ranks get {11,22,33,44}.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <conveyor/conveyor.hpp>

#include "auth.hpp"
#include "conveyor_gloo/transport.hpp"
#include "wire.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

int run_rank(int rank, const std::string& dir, const std::string& device) {
  auto dev = conveyor_gloo::CreateDevice({.hostname = "127.0.0.1", .device = device});
  gloo::rendezvous::FileStore store(dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, 2);
  ctx->setTimeout(15s);
  ctx->connectFullMesh(store, dev);
  std::vector<float> v =
      rank == 0 ? std::vector<float>{10, 20, 30, 40} : std::vector<float>{1, 2, 3, 4};
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v.data(), v.size());
  o.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  o.setTag(3);
  gloo::allreduce(o);
  if (v != std::vector<float>{11, 22, 33, 44}) {
    std::fprintf(stderr, "rank %d: FAILED all_reduce gave %g %g %g %g, want 11 22 33 44\n", rank,
                 v[0], v[1], v[2], v[3]);
    return 1;
  }
  std::fprintf(stderr, "rank %d: all_reduce gave the real data\n", rank);
  return 0;
}

// Forked before the test process starts any thread (a child of a
// multi-threaded process may not start threads under TSan); with `gate`, the
// rank waits for a byte on it before it joins.
pid_t spawn_rank(int rank, const std::string& dir, const std::string& device, int gate = -1) {
  pid_t p = ::fork();
  if (p == 0) {
    if (gate >= 0) {
      char go = 0;
      if (::read(gate, &go, 1) != 1) ::_exit(1);  // the test process went away
      ::close(gate);
    }
    int rc = 1;
    try {
      rc = run_rank(rank, dir, device);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: FAILED exception: %s\n", rank, e.what());
    }
    std::fflush(stderr);
    ::_exit(rc);
  }
  return p;
}

// The socket inodes a process holds (/proc/<pid>/fd -> "socket:[N]").
std::set<std::string> socket_inodes(pid_t pid) {
  std::set<std::string> out;
  std::string d = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* dir = ::opendir(d.c_str())) {
    while (auto* e = ::readdir(dir)) {
      char buf[64] = {};
      auto n = ::readlink((d + "/" + e->d_name).c_str(), buf, sizeof buf - 1);
      std::string s(buf, n > 0 ? std::size_t(n) : 0);
      if (s.rfind("socket:[", 0) == 0) out.insert(s.substr(8, s.size() - 9));
    }
    ::closedir(dir);
  }
  return out;
}

// The @cvgloo-... abstract listener of process `pid`, as any local process
// sees it in /proc/net/unix (the pid only picks out this test's rank 0 among
// other jobs on the host).
std::optional<std::string> find_listener(pid_t pid) {
  auto mine = socket_inodes(pid);
  std::ifstream f("/proc/net/unix");
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    in >> num >> refs >> proto >> flags >> type >> st >> inode >> path;
    if (path.rfind("@cvgloo-", 0) == 0 && mine.count(inode)) return path;
  }
  return std::nullopt;
}

// Rank 0's pair address, as the store holds it (found by its magic).
std::optional<conveyor_gloo::wire::address> read_address(const std::string& dir) {
  namespace wire = conveyor_gloo::wire;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (std::size_t i = 0; i + wire::addr_size <= bytes.size(); ++i) {
      if (wire::get32(reinterpret_cast<const std::byte*>(bytes.data() + i)) != wire::addr_magic)
        continue;
      auto a = wire::decode_address(
          std::vector<char>(bytes.begin() + long(i), bytes.begin() + long(i + wire::addr_size)));
      if (a && a->rank == 0) return a;
    }
  }
  return std::nullopt;
}

// One impostor connection: its own device, QP and request; returns what
// conveyor::connect said ("accepted" when it got in).
std::string attempt(const std::string& device, const std::string& target,
                    const std::vector<std::byte>& request) {
  auto dev = conveyor::device::open(device);
  if (!dev) return "open: " + dev.error().to_string();
  auto pd = dev->alloc_pd();
  auto cq = dev->create_cq({.depth = 64});
  if (!pd || !cq) return "cannot set up a QP";
  conveyor::qp_init_attr qa;
  qa.send_cq = &*cq;
  qa.recv_cq = &*cq;
  auto qp = pd->create_qp(qa);
  if (!qp) return "create_qp: " + qp.error().to_string();
  auto info = conveyor::connect(*qp, target, {.private_data = request, .timeout = 20000ms});
  if (!info) return info.error().to_string();
  qp->disconnect();
  return "accepted";
}

// An impostor's connection attempt: on a thread of this process, or (as_nobody)
// in a child process running as uid/gid 65534, forked while this process has
// no other thread.
struct impostor {
  std::string target, what, outcome;
  std::vector<std::byte> request;
  bool as_nobody = false;
  std::thread thread;
  pid_t child = -1;
  int from_child = -1;

  void start(const std::string& device) {
    if (!as_nobody) {
      thread = std::thread([this, device] { outcome = attempt(device, target, request); });
      return;
    }
    int fds[2];
    if (::pipe(fds) != 0) return void(outcome = "pipe failed");
    child = ::fork();
    if (child == 0) {
      ::close(fds[0]);
      std::string out = ::setgid(65534) == 0 && ::setuid(65534) == 0
                            ? attempt(device, target, request)
                            : std::string("setuid(65534) failed");
      (void)!::write(fds[1], out.data(), out.size());
      ::_exit(0);
    }
    ::close(fds[1]);
    from_child = fds[0];
  }

  void finish() {
    if (thread.joinable()) thread.join();
    if (from_child >= 0) {
      char buf[256];
      ssize_t n;
      while ((n = ::read(from_child, buf, sizeof buf)) > 0) outcome.append(buf, std::size_t(n));
      ::close(from_child);
      ::waitpid(child, nullptr, 0);
    }
  }
};

std::string hex_tail(const std::string& name) {
  return name.substr(name.rfind('-') + 1);
}

}  // namespace

int main(int argc, char** argv) {
  namespace wire = conveyor_gloo::wire;
  std::string which, device = "shm";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--case")
      which = argv[i + 1];
    else if (a == "--device")
      device = argv[i + 1];
  }
  if ((which != "impostor" && which != "wrong_key" && which != "other_uid" && which != "flood") ||
      (which != "wrong_key" && device != "shm")) {
    std::fprintf(stderr,
                 "usage: %s --case impostor|other_uid --device shm | --case wrong_key --device "
                 "shm|soft\n",
                 argv[0]);
    return 2;
  }
  if (which == "other_uid" && ::geteuid() != 0) {
    std::printf("SKIPPED: other_uid runs its impostor as uid 65534, which needs root\n");
    return 77;
  }
  char tmpl[] = "/tmp/conveyor-gloo-auth-XXXXXX";
  if (!::mkdtemp(tmpl)) return 2;
  std::string dir = tmpl;
  int failed = 0;
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "FAILED %s\n", msg.c_str());
    ++failed;
  };

  int gate[2];
  if (::pipe(gate) != 0) return 2;
  pid_t r0 = spawn_rank(0, dir, device);
  pid_t r1 = spawn_rank(1, dir, device, gate[0]);
  ::close(gate[0]);
  std::vector<impostor> imps(which == "other_uid" ? 1 : which == "flood" ? 24 : 2);
  auto deadline = clock_type::now() + 10s;
  if (which == "impostor") {
    std::optional<std::string> name;
    while (!(name = find_listener(r0)) && clock_type::now() < deadline)
      std::this_thread::sleep_for(10ms);
    if (!name) {
      fail("rank 0's @cvgloo- listener never showed in /proc/net/unix");
    } else {
      std::fprintf(stderr, "impostor: found %s in /proc/net/unix\n", name->c_str());
      std::string tail = hex_tail(*name);
      // The earlier protocol: {magic "CVGL", rank 1, the name's hex as the cookie}.
      std::vector<std::byte> legacy(16);
      wire::put32(legacy.data(), 0x4356474c);
      wire::put32(legacy.data() + 4, 1);
      wire::put64(legacy.data() + 8, std::strtoull(tail.c_str(), nullptr, 16));
      // The current hello, keyed with every byte the name holds.
      wire::hello h;
      h.from_rank = 1;
      h.to_rank = 0;
      std::uint8_t key[wire::key_size] = {}, nonce_a[wire::nonce_size] = {};
      std::memcpy(key, name->data(), std::min(name->size(), sizeof key));
      auto m = conveyor_gloo::auth::compute(key, conveyor_gloo::auth::role::hello, 1, 0, nonce_a,
                                            h.nonce);
      std::memcpy(h.mac, m.data(), m.size());
      imps[0].target = *name;
      imps[0].what = "cookie from the name";
      imps[0].request = legacy;
      imps[1].target = *name;
      imps[1].what = "hello keyed with the name";
      imps[1].request = wire::encode(h);
    }
  } else {
    std::optional<wire::address> a;
    while (!(a = read_address(dir)) && clock_type::now() < deadline)
      std::this_thread::sleep_for(10ms);
    if (!a) {
      fail("rank 0's address never showed in the store");
    } else {
      std::string target = device == "shm" ? a->shm : a->soft;
      for (int i = 0; i < int(imps.size()); ++i) {
        // Everything rank 0 published but the key; the second also claims a rank that is not its
        // peer.
        wire::hello h;
        h.to_rank = 0;
        conveyor_gloo::auth::random_bytes(h.nonce, sizeof h.nonce);
        std::uint8_t key[wire::key_size];
        conveyor_gloo::auth::random_bytes(key, sizeof key);
        if (i == 1 && which == "wrong_key") {  // the right key, the wrong rank
          h.from_rank = 2;
          std::memcpy(key, a->key, sizeof key);
        } else {
          h.from_rank = 1;
        }
        if (which == "other_uid") {  // a perfect hello, from another user
          h.from_rank = 1;
          std::memcpy(key, a->key, sizeof key);
        }
        auto m = conveyor_gloo::auth::compute(key, conveyor_gloo::auth::role::hello, h.from_rank, 0,
                                              a->nonce, h.nonce);
        std::memcpy(h.mac, m.data(), m.size());
        imps[i].target = target;
        imps[i].what = which == "other_uid" ? "right key, uid 65534"
                       : which == "flood"   ? "flood " + std::to_string(i) + ", wrong key"
                       : i == 0             ? "hello with a wrong key"
                                            : "hello claiming rank 2";
        imps[i].as_nobody = which == "other_uid";
        imps[i].request = wire::encode(h);
      }
    }
  }
  bool started = !imps[0].request.empty();
  if (started) {
    for (auto& im : imps) im.start(device);
    // Let the requests reach rank 0's listener queue before the real rank
    // joins (rank 0 accepts nothing until rank 1's address is in the store);
    // the outcomes below show whether they did.
    std::this_thread::sleep_for(1s);
  }
  char go = 'g';
  if (::write(gate[1], &go, 1) != 1) fail("cannot start rank 1");
  ::close(gate[1]);
  int busy = 0;
  for (auto& im : imps) {
    if (im.request.empty()) continue;
    im.finish();
    std::fprintf(stderr, "impostor (%s): %s\n", im.what.c_str(), im.outcome.c_str());
    if (which == "flood" && im.outcome.find("listener busy") != std::string::npos)
      ++busy;
    else if (im.outcome == "accepted")
      fail("rank 0 accepted the impostor (" + im.what + ") as rank 1");
    else if (im.outcome.find("conveyor-gloo: authentication failed") == std::string::npos)
      fail("the impostor (" + im.what + ") was not refused by rank 0's check (it did not get " +
           "in first?): " + im.outcome);
  }
  if (which == "flood" && started && busy == 0)
    fail("the flood never filled rank 0's listener queue (no 'listener busy')");
  pid_t kids[2] = {r0, r1};
  auto end = clock_type::now() + 60s;
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    while (::waitpid(kids[r], &status, WNOHANG) == 0) {
      if (clock_type::now() > end) {
        ::kill(kids[r], SIGKILL);
        ::waitpid(kids[r], &status, 0);
        fail("rank " + std::to_string(r) + " hung");
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      fail("rank " + std::to_string(r) + " failed (status " + std::to_string(status) + ")");
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf("%s: %s on %s\n", failed ? "FAILED" : "passed", which.c_str(), device.c_str());
  return failed ? 1 : 0;
}
