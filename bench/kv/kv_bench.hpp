// What conveyor-kv-bench's parts share (kv_bench.cpp): the options, the key
// names, one client thread's tally, and a connection of any protocol
// (kv_bench_conns.cpp) that the runner (kv_bench_run.cpp) drives.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::kvbench {

struct bench_options {
  // the server
  std::string host = "127.0.0.1";  // or "@name" (shm)
  std::uint16_t port = 0;          // 0: 7380 (rdma), 7379 (resp), 11211 (memcached)
  std::string address;             // rdma: "host:port" or "@name", instead of -h/-p
  std::string provider;            // rdma: empty: from the address ("@name": shm; else soft)
  std::string password;
  std::string progress = "manual";  // the client device's progress mode: thread | manual
  // the load
  std::uint64_t keys = 100000;
  std::uint32_t value_size = 64;
  double get_ratio = 0.95;
  double zipf = 0;          // 0: uniform; 0.99: Zipf
  std::uint32_t depth = 1;  // GETs in flight (an MGET batch of this many keys)
  double seconds = 5;
  // Seconds of unmeasured GETs per client first (every key once, then random).
  double warmup = 0;
  // rdma: item locations each client remembers (0: off).
  std::size_t location_cache = std::size_t{1} << 20;
  bool load = true;  // SET every key first
  bool json = false;
  std::string protocol = "rdma";  // rdma | resp | memcached
  std::uint16_t load_port = 0;    // rdma: load over RESP at host:load_port (same store)
  unsigned clients = 1;           // threads, one connection each
  int server_pid = 0;             // read this process's CPU time around the run
  // resp: each SET step is followed by WAIT <wait> 0 in the same write (Redis's
  // nearest equivalent to a synchronous replica); a reply below it is an error.
  unsigned wait = 0;
};

using clk = std::chrono::steady_clock;

inline std::string key_name(std::uint64_t i) {
  return "key:" + std::to_string(i);
}

// What one client thread saw.
struct tally {
  std::vector<float> get_us, set_us;  // per step
  std::uint64_t gets = 0, sets = 0, misses = 0, errors = 0, retries = 0;
  // RDMA: GETs by dependent READ rounds (1, 2, 3, 4+), and those answered by
  // one READ of a remembered item (kv::client_stats).
  std::array<std::uint64_t, 4> rounds{};
  std::uint64_t one_read = 0;
  std::string first_error;
  void error(std::string what) {
    if (errors++ == 0) first_error = std::move(what);
  }
};

// One connection of one protocol. gets/sets return false when the connection
// can no longer be used (the reason is in t.first_error).
class bench_conn {
 public:
  virtual ~bench_conn() = default;
  virtual bool gets(std::span<const std::string> keys, std::string_view value, tally& t) = 0;
  virtual bool sets(std::span<const std::string> keys, std::string_view value, tally& t) = 0;
  // Adds what the connection counted itself (RDMA: retries, READ rounds).
  virtual void add_counts(tally&) const {}
};

// The RDMA provider the options name: --provider, else from the address.
std::string rdma_provider(const bench_options& o);
// A RESP or memcached connection to host:port; nullptr with `err` set.
// `wait`: resp only, bench_options::wait.
std::unique_ptr<bench_conn> open_socket(const std::string& protocol, const std::string& host,
                                        std::uint16_t port, std::string& err, unsigned wait = 0);
// The connection --protocol names; nullptr with `err` set.
std::unique_ptr<bench_conn> open_conn(const bench_options& o, std::string& err);

// Loads the keys, runs the clients for --seconds and prints the report: the
// exit status.
int run(const bench_options& o);

}  // namespace conveyor::kvbench
