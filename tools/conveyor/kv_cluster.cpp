// conveyor kv cluster — create, status, up, failover, add-node and del-node (kv_cluster.hpp).
//
//   conveyor kv cluster up --shards 3                    # etcd + 3 nodes on 7001..7003
//   conveyor kv cluster create --etcd 127.0.0.1:2379 --shards 3
//   conveyor kv cluster status --etcd 127.0.0.1:2379 [--json]
//   conveyor kv cluster failover --etcd 127.0.0.1:2379 --shard 127.0.0.1:7001 [--to <id>]
//   conveyor kv cluster add-node --etcd 127.0.0.1:2379 --node 127.0.0.1:7004 [--shard
//   S|--new-shard] conveyor kv cluster del-node --etcd 127.0.0.1:2379 --node 127.0.0.1:7004
//
// `up` is Redis's create-cluster script for conveyor-kv: it starts a local
// etcd (/usr/bin/etcd, a data directory of its own, free loopback ports) when
// --etcd is not given, starts one `kv serve --cluster` per shard (this very
// executable, /proc/self/exe), creates the shard map and waits for SIGINT or
// SIGTERM; then it stops the nodes and etcd (SIGTERM, SIGKILL after 5 s). The
// children also get SIGTERM from the kernel if `up` dies first
// (PR_SET_PDEATHSIG), so none is left behind.
#include "kv_cluster.hpp"

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "conveyor_kv/cluster.hpp"

namespace conveyor::tool {

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

std::vector<std::string> split_endpoints(const std::string& s) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < s.size();) {
    auto j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) v.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

kv::cluster_admin_options admin(const kv_cluster_options& o) {
  kv::cluster_admin_options a;
  a.etcd = split_endpoints(o.etcd);
  a.name = o.name;
  return a;
}

int run_status(const kv_cluster_options& o) {
  auto s = kv::read_cluster_state(admin(o));
  if (!s) {
    std::fprintf(stderr, "conveyor kv cluster status: %s\n", s.error().to_string().c_str());
    return 1;
  }
  std::printf("%s\n", o.json ? kv::to_json(*s).c_str() : kv::to_table(*s).c_str());
  return 0;
}

result<kv::cluster_state> create(const kv_cluster_options& o, const char* who) {
  kv::cluster_create_options c;
  c.shards = o.shards;
  c.replicas = o.replicas;
  c.wait = std::chrono::seconds(o.wait_s);
  c.progress = [who](const std::string& line) {
    std::fprintf(stderr, "conveyor kv cluster %s: %s\n", who, line.c_str());
  };
  return kv::create_cluster(admin(o), c);
}

int run_create(const kv_cluster_options& o) {
  auto s = create(o, "create");
  if (!s) {
    std::fprintf(stderr, "conveyor kv cluster create: %s\n", s.error().to_string().c_str());
    return s.error().code == errc::invalid_argument ? 2 : 1;
  }
  std::printf("%s", kv::to_table(*s).c_str());
  return 0;
}

// Prints the state after a change of the map, or the error (exit 2 when the
// command was refused, 1 otherwise).
int report(const char* what, const result<kv::cluster_state>& s) {
  if (!s) {
    std::fprintf(stderr, "conveyor kv cluster %s: %s\n", what, s.error().to_string().c_str());
    return s.error().code == errc::invalid_argument ? 2 : 1;
  }
  std::printf("%s", kv::to_table(*s).c_str());
  return 0;
}

int run_failover(const kv_cluster_options& o) {
  kv::cluster_failover_options f;
  f.shard = o.shard;
  f.to = o.to;
  f.wait = std::chrono::seconds(o.failover_wait_s);
  return report("failover", kv::failover_cluster(admin(o), f));
}

int run_add_node(const kv_cluster_options& o) {
  kv::cluster_add_node_options a;
  a.node = o.node;
  a.shard = o.shard;
  a.new_shard = o.new_shard;
  a.wait = std::chrono::seconds(o.add_wait_s);
  return report("add-node", kv::add_node_cluster(admin(o), a));
}

int run_del_node(const kv_cluster_options& o) {
  return report("del-node", kv::del_node_cluster(admin(o), {.node = o.node}));
}

// ---- up ------------------------------------------------------------------------

// Whether the file at `path` holds `needle` (a log line; reads at most 1 MiB).
bool file_contains(const std::string& path, const std::string& needle) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return false;
  std::string text(1u << 20, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  return text.find(needle) != std::string::npos;
}

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string how_it_ended(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// The last line of a child's log (what it said before it ended), at most 300 bytes.
std::string last_line(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "(no log)";
  std::string last, line;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      if (!line.empty()) last = line;
      line.clear();
    }
  }
  std::fclose(f);
  if (!line.empty()) last = line;
  return last.substr(0, 300);
}

// A child that gets SIGTERM when `up` dies, its output in `log`.
pid_t spawn(const std::string& exe, const std::vector<std::string>& args, const std::string& log) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);  // `up` blocks SIGINT/SIGTERM; children must not
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  const int null = ::open("/dev/null", O_RDONLY);
  if (null >= 0) ::dup2(null, 0);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(exe.c_str(), argv.data());
  ::_exit(127);
}

struct child {
  std::string what;  // "etcd", "node 7001"
  pid_t pid = -1;
  std::string log;
};

// SIGTERM to all, then SIGKILL to what is left after 5 s; reaps every one.
void stop_all(std::vector<child>& kids) {
  for (auto& k : kids)
    if (k.pid > 0) ::kill(k.pid, SIGTERM);
  const auto until = steady::now() + 5s;
  for (;;) {
    bool left = false;
    for (auto& k : kids)
      if (k.pid > 0) {
        if (::waitpid(k.pid, nullptr, WNOHANG) == k.pid)
          k.pid = -1;
        else
          left = true;
      }
    if (!left) return;
    if (steady::now() >= until) break;
    std::this_thread::sleep_for(20ms);
  }
  for (auto& k : kids)
    if (k.pid > 0) {
      std::fprintf(stderr, "conveyor kv cluster up: %s did not stop in 5 s: SIGKILL\n",
                   k.what.c_str());
      ::kill(k.pid, SIGKILL);
      ::waitpid(k.pid, nullptr, 0);
      k.pid = -1;
    }
}

int run_up(kv_cluster_options o) {
  // The primaries take the first ports, their replicas the next ones
  // (create_cluster assigns by address order).
  const std::size_t count = o.shards * (1 + o.replicas);
  if (o.shards < 1 || o.shards > 64 || o.replicas > 4 || o.port + count - 1 > 65535) {
    std::fprintf(stderr,
                 "conveyor kv cluster up: --shards 1..64, --replicas 0..4, nodes on ports from "
                 "--port up to 65535\n");
    return 2;
  }
  // Signals are read, not handled: blocked before any child exists.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  bool own_dir = false;
  if (o.dir.empty()) {
    char tmpl[] = "/tmp/conveyor-kv-cluster-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      std::fprintf(stderr, "conveyor kv cluster up: mkdtemp failed\n");
      return 1;
    }
    o.dir = tmpl;
    own_dir = true;
  }
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  std::vector<child> kids;
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "conveyor kv cluster up: %s\n", why.c_str());
    stop_all(kids);
    for (const auto& k : kids)
      std::fprintf(stderr, "  %s's log: %s\n", k.what.c_str(), k.log.c_str());
    return 1;
  };
  if (o.etcd.empty()) {
    // The ports are free when chosen, not when etcd binds them: another
    // process (another cluster's etcd) may take one meanwhile, and etcd then
    // exits while that process answers on the port. So the etcd is trusted
    // only once its own log says it serves on the chosen port; one that exits
    // first is started again on other ports (at most 5 tries).
    bool up = false;
    for (int attempt = 0; attempt < 5 && !up; ++attempt) {
      const int client = o.etcd_port ? int(o.etcd_port) : free_loopback_port();
      const int peer = free_loopback_port();
      if (client <= 0 || peer <= 0 || client == peer)
        return fail("no free loopback ports for etcd");
      const std::string curl = "http://127.0.0.1:" + std::to_string(client);
      const std::string purl = "http://127.0.0.1:" + std::to_string(peer);
      child e{"etcd", -1, o.dir + "/etcd.log"};
      std::filesystem::remove_all(o.dir + "/etcd", ec);
      e.pid = spawn("/usr/bin/etcd",
                    {"/usr/bin/etcd", "--name", "kv", "--data-dir", o.dir + "/etcd",
                     "--listen-client-urls", curl, "--advertise-client-urls", curl,
                     "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                     "--initial-cluster", "kv=" + purl, "--log-outputs", "stderr"},
                    e.log);
      if (e.pid < 0) return fail("fork failed");
      kids.assign(1, e);
      o.etcd = "127.0.0.1:" + std::to_string(client);
      const std::string serving =
          "serving insecure client requests on 127.0.0.1:" + std::to_string(client);
      const auto until = steady::now() + 15s;
      for (;;) {
        if (file_contains(e.log, serving) && kv::read_cluster_state(admin(o))) {
          up = true;
          break;
        }
        if (::waitpid(kids[0].pid, nullptr, WNOHANG) == kids[0].pid) {
          kids[0].pid = -1;
          if (!file_contains(e.log, "address already in use"))
            return fail("etcd exited at start (is /usr/bin/etcd installed? Debian's etcd-server)");
          if (o.etcd_port)
            return fail("etcd could not listen on 127.0.0.1:" + std::to_string(o.etcd_port) +
                        " (address already in use)");
          break;  // a port was taken meanwhile: other ports
        }
        if (steady::now() >= until) return fail("etcd did not answer within 15 s");
        std::this_thread::sleep_for(100ms);
      }
    }
    if (!up) return fail("etcd could not bind free loopback ports in 5 tries");
    std::fprintf(stderr, "conveyor kv cluster up: etcd on %s (data in %s/etcd)\n", o.etcd.c_str(),
                 o.dir.c_str());
  }
  const std::string self = "/proc/self/exe";
  char exe[4096];
  const ssize_t n = ::readlink(self.c_str(), exe, sizeof exe - 1);
  if (n <= 0) return fail("cannot read /proc/self/exe");
  exe[n] = '\0';
  for (std::size_t i = 0; i < count; ++i) {
    const std::string port = std::to_string(o.port + i);
    const std::string dir = o.dir + "/node-" + port;
    std::filesystem::create_directories(dir, ec);
    child k{"node " + port, -1, dir + "/serve.log"};
    k.pid = spawn(exe,
                  // An RDMA front end on any free port, for one-sided GETs: its
                  // address is in the node's registration (cluster status) and
                  // INFO conveyor.
                  {exe, "kv", "serve", "--port", port, "--dir", dir, "--cluster", o.etcd,
                   "--cluster-name", o.name, "--rdma-listen", "127.0.0.1:0"},
                  k.log);
    if (k.pid < 0) return fail("fork failed");
    kids.push_back(k);
  }
  // Created in one-second waits, so that a node that ends at start (a port
  // in use) is reported now rather than after the whole wait.
  const auto deadline = steady::now() + std::chrono::seconds(o.wait_s);
  std::string last_progress;
  result<kv::cluster_state> made = make_error(errc::timed_out, "not created");
  for (;;) {
    kv::cluster_create_options c;
    c.shards = o.shards;
    c.replicas = o.replicas;
    c.wait = 1s;
    c.progress = [&last_progress](const std::string& line) {
      if (line != last_progress) std::fprintf(stderr, "conveyor kv cluster up: %s\n", line.c_str());
      last_progress = line;
    };
    made = kv::create_cluster(admin(o), c);
    if (made || made.error().code != errc::timed_out) break;
    for (auto& k : kids) {
      int status = 0;
      if (k.pid > 0 && ::waitpid(k.pid, &status, WNOHANG) == k.pid) {
        k.pid = -1;
        return fail(k.what + " exited at start (" + how_it_ended(status) +
                    "): " + last_line(k.log));
      }
    }
    if (steady::now() >= deadline) break;
  }
  if (!made) return fail(made.error().to_string());
  std::printf("%s\n", kv::to_table(*made).c_str());
  std::printf(
      "cluster %s is up: %zu shard(s) x %zu replica(s) on ports %u-%zu, etcd %s, files in %s\n",
      o.name.c_str(), o.shards, o.replicas, o.port, o.port + count - 1, o.etcd.c_str(),
      o.dir.c_str());
  std::printf("connect:  redis-cli -c -p %u\n", o.port);
  std::printf("status:   conveyor kv cluster status --etcd %s --name %s\n", o.etcd.c_str(),
              o.name.c_str());
  std::printf("stop:     Ctrl-C (stops the nodes%s)\n", kids[0].what == "etcd" ? " and etcd" : "");
  std::fflush(stdout);
  for (;;) {
    timespec t{0, 500 * 1000 * 1000};
    const int sig = ::sigtimedwait(&mask, nullptr, &t);
    if (sig == SIGINT || sig == SIGTERM) break;
    bool any = false;
    for (auto& k : kids) {
      int status = 0;
      if (k.pid > 0 && ::waitpid(k.pid, &status, WNOHANG) == k.pid) {
        k.pid = -1;
        std::fprintf(stderr, "conveyor kv cluster up: %s exited (%s; log %s)\n", k.what.c_str(),
                     how_it_ended(status).c_str(), k.log.c_str());
      }
      any = any || k.pid > 0;
    }
    if (!any) break;
  }
  std::fprintf(stderr, "conveyor kv cluster up: stopping\n");
  stop_all(kids);
  if (own_dir) std::filesystem::remove_all(o.dir, ec);
  return 0;
}

}  // namespace

kv_cluster_commands add_kv_cluster_commands(CLI::App& kv, kv_cluster_options& o) {
  auto* cl = kv.add_subcommand("cluster",
                               "a conveyor-kv cluster coordinated by etcd (docs/KV-CLUSTER.md)");
  cl->require_subcommand(1);
  kv_cluster_commands c;
  c.create = cl->add_subcommand(
      "create", "write the shard map: wait for --shards registered nodes, split the slots");
  c.status = cl->add_subcommand("status", "the shard map and the registered nodes");
  c.up = cl->add_subcommand(
      "up",
      "a whole local cluster in one command: etcd (unless --etcd) and --shards x (1 + "
      "--replicas) nodes");
  c.failover = cl->add_subcommand(
      "failover",
      "promote an in-sync replica of a shard by hand: its primary fences itself, waits for the "
      "replica to hold every write, then hands over (nothing lost, nothing stale served)");
  c.add_node = cl->add_subcommand(
      "add-node",
      "add a registered node to the map: a replica of a shard (it catches up, then joins the "
      "in-sync set) or, with --new-shard, the primary of a new shard with no slots");
  c.del_node = cl->add_subcommand(
      "del-node",
      "remove a node from the map: a replica leaves its shard; a primary only with its shard, "
      "which must own no slot and have no replica");
  for (auto* sub : {c.create, c.status, c.up, c.failover, c.add_node, c.del_node}) {
    auto* e = sub->add_option("--etcd", o.etcd, "etcd endpoints, host:port[,host:port...]");
    if (sub != c.up) e->required();
    sub->add_option("--name", o.name, "the cluster's name in etcd")->capture_default_str();
  }
  for (auto* sub : {c.create, c.up}) {
    sub->add_option("--shards", o.shards, "number of shards (one primary each)")
        ->capture_default_str();
    sub->add_option("--replicas", o.replicas,
                    "replicas per shard (synchronous: a write is acknowledged once every in-sync "
                    "replica applied it)")
        ->capture_default_str();
    sub->add_option("--wait-s", o.wait_s, "seconds to wait for the nodes to register")
        ->capture_default_str();
  }
  c.status->add_flag("--json", o.json, "JSON output");
  c.failover->add_option("--shard", o.shard,
                         "the shard: its id (or 4+ leading characters), or its primary's id or "
                         "RESP address (default: the only shard)");
  c.failover->add_option("--to", o.to,
                         "the node to promote: its id or 4+ leading characters (default: the "
                         "first registered in-sync replica)");
  c.failover
      ->add_option("--wait-s", o.failover_wait_s,
                   "seconds to wait for the map that names the new primary")
      ->capture_default_str();
  for (auto* sub : {c.add_node, c.del_node})
    sub->add_option("--node", o.node, "the node: its id (or 4+ leading characters) or RESP address")
        ->required();
  auto* shard_opt = c.add_node->add_option(
      "--shard", o.shard,
      "the shard it joins as a replica: its id (or 4+ leading characters), or its primary's id or "
      "RESP address (default: the shard with the fewest replicas)");
  c.add_node->add_flag("--new-shard", o.new_shard, "the primary of a new shard that owns no slot")
      ->excludes(shard_opt);
  c.add_node
      ->add_option("--wait-s", o.add_wait_s,
                   "seconds to wait for the replica to enter the in-sync set (0: do not wait)")
      ->capture_default_str();
  c.up->add_option("--port", o.port, "the first node's RESP port (then +1 for each)")
      ->capture_default_str();
  c.up->add_option("--etcd-port", o.etcd_port,
                   "the local etcd's client port (default: a free one; not with --etcd)")
      ->check(CLI::Range(1, 65535))
      ->excludes(c.up->get_option("--etcd"));
  c.up->add_option("--dir", o.dir,
                   "where the nodes and etcd keep their files (default: a temporary directory, "
                   "removed at exit)");
  return c;
}

int run_kv_cluster(const kv_cluster_commands& c, const kv_cluster_options& o) {
  if (c.create && *c.create) return run_create(o);
  if (c.status && *c.status) return run_status(o);
  if (c.up && *c.up) return run_up(o);
  if (c.failover && *c.failover) return run_failover(o);
  if (c.add_node && *c.add_node) return run_add_node(o);
  if (c.del_node && *c.del_node) return run_del_node(o);
  return -1;
}

}  // namespace conveyor::tool
