// conveyor-kv-bench — one load generator for conveyor-kv over RDMA, any RESP
// server (conveyor-kv's RESP port, Redis) and memcached (its text protocol), so
// that bench/kv/matrix compares them with the same client. The server's
// address takes redis-cli's letters, as `conveyor kv get` does: -h host, -p
// port, -a password; an "@name" host or --address is shm's, anything else soft's
// unless --provider says otherwise.
//
//   conveyor-kv-bench --keys 100000 --value-size 64 --get-ratio 0.95 --zipf 0.99 --depth 16
//   conveyor-kv-bench -h @kv --get-ratio 1 --depth 16          # RDMA over shm
//   conveyor-kv-bench --protocol resp -p 6379 --clients 32 --server-pid 1234 --json
//   conveyor-kv-bench --protocol memcached -p 11211 --depth 16
//
// Each of --clients threads has its own connection. A step is either a GET
// step of --depth GETs (an MGET over RDMA; depth GET commands written at once,
// then every reply read, on the sockets) or a SET step (one SET RPC over RDMA;
// depth pipelined SETs on the sockets); steps are drawn so that the fraction of
// operations that are GETs is --get-ratio. Latencies are per step. Every reply
// is checked: a GET of a loaded key must return the loaded value; a miss, a
// wrong value or an error reply is an error, and a run with errors exits 1.
#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "conveyor_kv/client.hpp"

namespace conveyor::kvbench {

namespace {

struct bench_options {
  // the server
  std::string host = "127.0.0.1";  // or "@name" (shm)
  std::uint16_t port = 0;          // 0: 7380 (rdma), 7379 (resp), 11211 (memcached)
  std::string address;             // rdma: "host:port" or "@name", instead of -h/-p
  std::string provider;            // rdma: empty: from the address ("@name": shm; else soft)
  std::string password;
  std::string progress = "thread";  // the client device's progress mode: thread | manual
  // the load
  std::uint64_t keys = 100000;
  std::uint32_t value_size = 64;
  double get_ratio = 0.95;
  double zipf = 0;          // 0: uniform; 0.99: Zipf
  std::uint32_t depth = 1;  // GETs in flight (an MGET batch of this many keys)
  double seconds = 5;
  bool load = true;  // SET every key first
  bool json = false;
  std::string protocol = "rdma";  // rdma | resp | memcached
  std::uint16_t load_port = 0;    // rdma: load over RESP at host:load_port (same store)
  unsigned clients = 1;           // threads, one connection each
  int server_pid = 0;             // read this process's CPU time around the run
};

// The RDMA address and provider these options name.
std::string rdma_address(const bench_options& o) {
  if (!o.address.empty()) return o.address;
  if (o.host.starts_with('@')) return o.host;
  const std::string h = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  return h + ":" + std::to_string(o.port ? o.port : 7380);
}
std::string rdma_provider(const bench_options& o) {
  return o.provider.empty() ? std::string(kv::provider_for_address(rdma_address(o))) : o.provider;
}

result<std::unique_ptr<kv::client>> open_kv_client(const bench_options& o) {
  kv::client_options co;
  co.password = o.password;
  co.depth = std::max<std::uint32_t>(o.depth, 1);
  co.device.progress = o.progress == "manual" ? progress_mode::manual : progress_mode::thread;
  return kv::client::connect(rdma_provider(o), rdma_address(o), co);
}

using clk = std::chrono::steady_clock;

std::string key_name(std::uint64_t i) {
  return "key:" + std::to_string(i);
}

// Key popularity: uniform, or Zipf(s) by inverting the cumulative weights. A
// guide table (the first rank whose weight reaches j/n) makes a draw a couple of
// memory accesses instead of a binary search over n doubles, so the picker does
// not slow the fastest paths (shm GETs take about a microsecond).
class key_picker {
 public:
  key_picker(std::uint64_t n, double s) : n_(n) {
    if (s <= 0) return;
    cdf_.resize(n);
    double sum = 0;
    for (std::uint64_t i = 0; i < n; ++i) cdf_[i] = sum += 1.0 / std::pow(double(i + 1), s);
    for (auto& v : cdf_) v /= sum;
    guide_.resize(n);
    std::uint64_t r = 0;
    for (std::uint64_t j = 0; j < n; ++j) {
      const double u = double(j) / double(n);
      while (r + 1 < n && cdf_[r] < u) ++r;
      guide_[j] = static_cast<std::uint32_t>(r);
    }
  }
  template <class R>
  std::uint64_t operator()(R& rng) const {
    if (cdf_.empty()) return std::uniform_int_distribution<std::uint64_t>(0, n_ - 1)(rng);
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    std::uint64_t rank = guide_[std::min<std::uint64_t>(n_ - 1, std::uint64_t(u * double(n_)))];
    while (rank + 1 < n_ && cdf_[rank] < u) ++rank;
    // scatter the popular ranks over the key space, as a hash would
    return (rank * 0x9e3779b97f4a7c15ull) % n_;
  }

 private:
  std::uint64_t n_;
  std::vector<double> cdf_;
  std::vector<std::uint32_t> guide_;
};

// What one client thread saw.
struct tally {
  std::vector<float> get_us, set_us;  // per step
  std::uint64_t gets = 0, sets = 0, misses = 0, errors = 0, retries = 0;
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
  virtual std::uint64_t retries() const { return 0; }
};

bool check_value(std::string_view got, std::string_view want, std::string_view key, tally& t) {
  if (got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size()) == 0)
    return true;
  t.error("GET " + std::string(key) + ": " + std::to_string(got.size()) +
          " bytes, not the loaded value of " + std::to_string(want.size()));
  return false;
}

void count_miss(std::string_view key, tally& t) {
  ++t.misses;
  t.error("GET " + std::string(key) + ": no such key (every key was loaded)");
}

class rdma_conn final : public bench_conn {
 public:
  explicit rdma_conn(std::unique_ptr<kv::client> c) : c_(std::move(c)) {}
  bool gets(std::span<const std::string> keys, std::string_view value, tally& t) override {
    if (keys.size() == 1) {
      auto r = c_->get(keys[0]);
      if (!r) return t.error("GET: " + r.error().to_string()), false;
      if (!*r)
        count_miss(keys[0], t);
      else
        check_value(**r, value, keys[0], t);
      return true;
    }
    views_.assign(keys.begin(), keys.end());
    auto r = c_->mget(views_);
    if (!r) return t.error("MGET: " + r.error().to_string()), false;
    for (std::size_t i = 0; i < r->size(); ++i) {
      if (!(*r)[i])
        count_miss(keys[i], t);
      else
        check_value(*(*r)[i], value, keys[i], t);
    }
    return true;
  }
  bool sets(std::span<const std::string> keys, std::string_view value, tally& t) override {
    for (const auto& k : keys)
      if (auto r = c_->set(k, value); !r) return t.error("SET: " + r.error().to_string()), false;
    return true;
  }
  std::uint64_t retries() const override { return c_->stats().retries; }

 private:
  std::unique_ptr<kv::client> c_;
  std::vector<std::string_view> views_;
};

// A blocking TCP connection with a read buffer (replies are parsed in place).
class tcp_stream {
 public:
  ~tcp_stream() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool connect(const std::string& host, std::uint16_t port, std::string& err) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int g = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); g != 0) {
      err = host + ": " + ::gai_strerror(g);
      return false;
    }
    for (auto* a = res; a; a = a->ai_next) {
      fd_ = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd_ < 0) continue;
      if (::connect(fd_, a->ai_addr, a->ai_addrlen) == 0) break;
      ::close(fd_);
      fd_ = -1;
    }
    ::freeaddrinfo(res);
    if (fd_ < 0) {
      err = "connect " + host + ":" + std::to_string(port) + ": " + std::strerror(errno);
      return false;
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{.tv_sec = 10, .tv_usec = 0};  // a server that stops answering ends the run
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    buf_.resize(256u << 10);
    return true;
  }
  bool send_all(std::string_view s, std::string& err) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return err = std::string("send: ") + std::strerror(errno), false;
      s.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  // The next line, without its \r\n; valid until the next read.
  bool read_line(std::string_view& line, std::string& err) {
    std::size_t scanned = 0;
    for (;;) {
      const char* b = buf_.data() + rd_;
      if (const void* nl = std::memchr(b + scanned, '\n', wr_ - rd_ - scanned)) {
        const std::size_t len = static_cast<std::size_t>(static_cast<const char*>(nl) - b);
        if (len == 0 || b[len - 1] != '\r') return err = "a reply line without \\r\\n", false;
        line = {b, len - 1};
        rd_ += len + 1;
        return true;
      }
      scanned = wr_ - rd_;
      if (scanned > (1u << 20)) return err = "a reply line over 1 MiB", false;
      if (!fill(scanned + 1, err)) return false;
    }
  }
  // Exactly n bytes; valid until the next read.
  bool read_exact(std::size_t n, std::string_view& out, std::string& err) {
    if (wr_ - rd_ < n && !fill(n, err)) return false;
    out = {buf_.data() + rd_, n};
    rd_ += n;
    return true;
  }

 private:
  // Until at least `need` unread bytes are buffered.
  bool fill(std::size_t need, std::string& err) {
    if (rd_ > 0) {
      std::memmove(buf_.data(), buf_.data() + rd_, wr_ - rd_);
      wr_ -= rd_;
      rd_ = 0;
    }
    if (buf_.size() < need) buf_.resize(std::max(need, buf_.size() * 2));
    while (wr_ < need) {
      const ssize_t n = ::recv(fd_, buf_.data() + wr_, buf_.size() - wr_, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return err = "the server closed the connection", false;
      if (n < 0) return err = std::string("recv: ") + std::strerror(errno), false;
      wr_ += static_cast<std::size_t>(n);
    }
    return true;
  }
  int fd_ = -1;
  std::vector<char> buf_;
  std::size_t rd_ = 0, wr_ = 0;
};

bool parse_size(std::string_view s, long long& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc{} && p == s.data() + s.size();
}

void append_bulk(std::string& out, std::string_view s) {
  out += '$';
  out += std::to_string(s.size());
  out += "\r\n";
  out += s;
  out += "\r\n";
}

// RESP2: GET key -> $len value | $-1 (nil); SET key value -> +OK.
class resp_conn final : public bench_conn {
 public:
  tcp_stream s;
  bool gets(std::span<const std::string> keys, std::string_view value, tally& t) override {
    out_.clear();
    for (const auto& k : keys) {
      out_ += "*2\r\n$3\r\nGET\r\n";
      append_bulk(out_, k);
    }
    if (!s.send_all(out_, err_)) return t.error(err_), false;
    for (const auto& k : keys) {
      std::string_view line, data;
      if (!s.read_line(line, err_)) return t.error("GET: " + err_), false;
      long long n = 0;
      if (line.starts_with('-')) {
        t.error("GET " + k + ": " + std::string(line));
        continue;
      }
      if (!line.starts_with('$') || !parse_size(line.substr(1), n) || n < -1)
        return t.error("GET " + k + ": not a bulk string: " + std::string(line)), false;
      if (n == -1) {
        count_miss(k, t);
        continue;
      }
      if (!s.read_exact(static_cast<std::size_t>(n) + 2, data, err_))
        return t.error("GET: " + err_), false;
      if (!data.ends_with("\r\n")) return t.error("GET " + k + ": bulk without \\r\\n"), false;
      check_value(data.substr(0, data.size() - 2), value, k, t);
    }
    return true;
  }
  bool sets(std::span<const std::string> keys, std::string_view value, tally& t) override {
    out_.clear();
    for (const auto& k : keys) {
      out_ += "*3\r\n$3\r\nSET\r\n";
      append_bulk(out_, k);
      append_bulk(out_, value);
    }
    if (!s.send_all(out_, err_)) return t.error(err_), false;
    for (const auto& k : keys) {
      std::string_view line;
      if (!s.read_line(line, err_)) return t.error("SET: " + err_), false;
      if (line != "+OK") {
        if (!line.starts_with('-')) return t.error("SET " + k + ": " + std::string(line)), false;
        t.error("SET " + k + ": " + std::string(line));
      }
    }
    return true;
  }

 private:
  std::string out_, err_;
};

// memcached's text protocol: get key -> VALUE key flags bytes / data / END, or
// END; set key 0 0 bytes / data -> STORED.
class memcached_conn final : public bench_conn {
 public:
  tcp_stream s;
  bool gets(std::span<const std::string> keys, std::string_view value, tally& t) override {
    out_.clear();
    for (const auto& k : keys) {
      out_ += "get ";
      out_ += k;
      out_ += "\r\n";
    }
    if (!s.send_all(out_, err_)) return t.error(err_), false;
    for (const auto& k : keys) {
      std::string_view line, data;
      if (!s.read_line(line, err_)) return t.error("get: " + err_), false;
      if (line == "END") {
        count_miss(k, t);
        continue;
      }
      // VALUE <key> <flags> <bytes>
      const std::string head = "VALUE " + k + " ";
      long long n = 0;
      const auto sp = line.rfind(' ');
      if (!line.starts_with(head) || sp == std::string_view::npos ||
          !parse_size(line.substr(sp + 1), n) || n < 0)
        return t.error("get " + k + ": " + std::string(line)), false;
      if (!s.read_exact(static_cast<std::size_t>(n) + 2, data, err_))
        return t.error("get: " + err_), false;
      if (!data.ends_with("\r\n")) return t.error("get " + k + ": data without \\r\\n"), false;
      check_value(data.substr(0, data.size() - 2), value, k, t);
      if (!s.read_line(line, err_)) return t.error("get: " + err_), false;
      if (line != "END") return t.error("get " + k + ": " + std::string(line)), false;
    }
    return true;
  }
  bool sets(std::span<const std::string> keys, std::string_view value, tally& t) override {
    out_.clear();
    const std::string tail = " 0 0 " + std::to_string(value.size()) + "\r\n";
    for (const auto& k : keys) {
      out_ += "set ";
      out_ += k;
      out_ += tail;
      out_ += value;
      out_ += "\r\n";
    }
    if (!s.send_all(out_, err_)) return t.error(err_), false;
    for (const auto& k : keys) {
      std::string_view line;
      if (!s.read_line(line, err_)) return t.error("set: " + err_), false;
      if (line != "STORED") {
        if (line.find("ERROR") == std::string_view::npos)
          return t.error("set " + k + ": " + std::string(line)), false;
        t.error("set " + k + ": " + std::string(line));
      }
    }
    return true;
  }

 private:
  std::string out_, err_;
};

std::uint16_t socket_port(const bench_options& o) {
  if (o.port) return o.port;
  return o.protocol == "memcached" ? 11211 : 7379;
}

std::unique_ptr<bench_conn> open_socket(const std::string& protocol, const std::string& host,
                                        std::uint16_t port, std::string& err) {
  if (protocol == "memcached") {
    auto c = std::make_unique<memcached_conn>();
    if (!c->s.connect(host, port, err)) return nullptr;
    return c;
  }
  auto c = std::make_unique<resp_conn>();
  if (!c->s.connect(host, port, err)) return nullptr;
  return c;
}

std::unique_ptr<bench_conn> open_conn(const bench_options& o, std::string& err) {
  if (o.protocol != "rdma") return open_socket(o.protocol, o.host, socket_port(o), err);
  auto c = open_kv_client(o);
  if (!c) {
    err = c.error().to_string();
    return nullptr;
  }
  return std::make_unique<rdma_conn>(std::move(*c));
}

// CPU time of a process from /proc: the whole process, and by thread name.
struct cpu_sample {
  double total_s = 0;
  std::map<std::string, double> by_name;
};

bool read_stat(const std::string& path, std::string& comm, double& secs) {
  std::ifstream f(path);
  std::string s;
  if (!std::getline(f, s)) return false;
  const auto open = s.find('('), close = s.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  comm = s.substr(open + 1, close - open - 1);
  std::istringstream rest(s.substr(close + 2));
  std::vector<std::string> f3;  // fields from the third (state) on
  for (std::string w; rest >> w && f3.size() < 13;) f3.push_back(w);
  if (f3.size() < 13) return false;
  const double tick = double(::sysconf(_SC_CLK_TCK));
  secs = (std::stod(f3[11]) + std::stod(f3[12])) / tick;  // utime, stime
  return true;
}

bool sample_cpu(int pid, cpu_sample& out) {
  const std::string dir = "/proc/" + std::to_string(pid);
  std::string comm;
  if (!read_stat(dir + "/stat", comm, out.total_s)) return false;
  if (DIR* d = ::opendir((dir + "/task").c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      double s = 0;
      if (read_stat(dir + "/task/" + e->d_name + "/stat", comm, s)) out.by_name[comm] += s;
    }
    ::closedir(d);
  }
  return true;
}

float micros(clk::duration d) {
  return std::chrono::duration<float, std::micro>(d).count();
}

double pct(std::vector<float>& v, double p) {
  if (v.empty()) return 0;
  const auto k =
      static_cast<std::size_t>(std::min<double>(double(v.size() - 1), p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// Loads every key with pipelined SETs (RESP or memcached), or one SET RPC at a
// time over RDMA when no RESP port of the same store was given.
int load_keys(const bench_options& o, const std::string& value, double& secs) {
  std::string err;
  std::unique_ptr<bench_conn> c;
  std::size_t batch = std::clamp<std::size_t>((1u << 20) / (value.size() + 64), 1, 128);
  if (o.protocol == "rdma" && o.load_port)
    c = open_socket("resp", o.host.starts_with('@') ? std::string("127.0.0.1") : o.host,
                    o.load_port, err);
  else
    c = open_conn(o, err);
  if (o.protocol == "rdma" && !o.load_port) batch = 1;
  if (!c) return std::fprintf(stderr, "conveyor-kv-bench: load: %s\n", err.c_str()), 1;
  const auto t0 = clk::now();
  tally t;
  std::vector<std::string> keys;
  for (std::uint64_t i = 0; i < o.keys;) {
    keys.clear();
    for (; i < o.keys && keys.size() < batch; ++i) keys.push_back(key_name(i));
    if (!c->sets(keys, value, t) || t.errors)
      return std::fprintf(stderr, "conveyor-kv-bench: load: %s\n", t.first_error.c_str()), 1;
  }
  secs = std::chrono::duration<double>(clk::now() - t0).count();
  return 0;
}

struct shared_run {
  const bench_options* o = nullptr;
  const key_picker* pick = nullptr;
  const std::string* value = nullptr;
  std::latch* ready = nullptr;
  std::latch* go = nullptr;
  clk::time_point end{};
  std::mutex connect_mu;  // connects one at a time (setup only)
};

void client_thread(shared_run& sh, unsigned index, tally& t) {
  const auto& o = *sh.o;
  std::unique_ptr<bench_conn> c;
  {
    std::string err;
    std::lock_guard lk(sh.connect_mu);
    c = open_conn(o, err);
    if (!c) t.error("connect: " + err);
  }
  sh.ready->count_down();
  sh.go->wait();
  if (!c) return;
  std::mt19937_64 rng(42 + index);
  // GET steps carry depth operations; SET steps depth on the sockets, one RPC over
  // RDMA. Draw step kinds so that the fraction of operations that are GETs is get_ratio.
  const double g = o.depth, s = o.protocol == "rdma" ? 1.0 : double(o.depth);
  const double r = o.get_ratio;
  std::bernoulli_distribution get_step(r >= 1 ? 1.0 : r * s / (r * s + (1 - r) * g));
  std::vector<std::string> keys;
  t.get_us.reserve(1u << 16);
  while (clk::now() < sh.end) {
    const bool is_get = get_step(rng);
    keys.resize(is_get ? std::size_t(g) : std::size_t(s));
    for (auto& k : keys) k = key_name(sh.pick->operator()(rng));
    const auto t0 = clk::now();
    const bool ok = is_get ? c->gets(keys, *sh.value, t) : c->sets(keys, *sh.value, t);
    const float us = micros(clk::now() - t0);
    if (!ok) break;
    (is_get ? t.get_us : t.set_us).push_back(us);
    (is_get ? t.gets : t.sets) += keys.size();
  }
  t.retries = c->retries();
}

int run(const bench_options& o) {
  if (o.protocol != "rdma" && o.protocol != "resp" && o.protocol != "memcached") {
    std::fprintf(stderr, "conveyor-kv-bench: --protocol %s: rdma, resp or memcached\n",
                 o.protocol.c_str());
    return 2;
  }
  if (o.keys == 0 || o.clients == 0)
    return std::fprintf(stderr, "conveyor-kv-bench: --keys and --clients must be above 0\n"), 2;
  const std::string value(o.value_size, 'v');
  double load_s = 0;
  if (o.load) {
    if (int rc = load_keys(o, value, load_s)) return rc;
    if (!o.json)
      std::printf("loaded %llu keys of %u B in %.1f s\n", static_cast<unsigned long long>(o.keys),
                  o.value_size, load_s);
  }
  if (o.seconds <= 0 && o.load) {  // load only
    if (o.json)
      std::printf("%s\n", nlohmann::json{{"schema", "conveyor-kv-bench/1"},
                                         {"protocol", o.protocol},
                                         {"keys", o.keys},
                                         {"value_size", o.value_size},
                                         {"load_s", load_s},
                                         {"errors", 0}}
                              .dump()
                              .c_str());
    return 0;
  }
  const key_picker pick(o.keys, o.zipf);
  std::latch ready(o.clients), go(1);
  shared_run sh;
  sh.o = &o;
  sh.pick = &pick;
  sh.value = &value;
  sh.ready = &ready;
  sh.go = &go;
  std::vector<tally> tallies(o.clients);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < o.clients; ++i)
    threads.emplace_back([&sh, &tallies, i] { client_thread(sh, i, tallies[i]); });
  ready.wait();
  cpu_sample cpu0, cpu1;
  const bool have_cpu = o.server_pid > 0 && sample_cpu(o.server_pid, cpu0);
  const auto start = clk::now();
  sh.end =
      start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.seconds));
  go.count_down();
  for (auto& th : threads) th.join();
  const double secs = std::chrono::duration<double>(clk::now() - start).count();
  const bool cpu_ok = have_cpu && sample_cpu(o.server_pid, cpu1);

  tally all;
  for (auto& t : tallies) {
    all.get_us.insert(all.get_us.end(), t.get_us.begin(), t.get_us.end());
    all.set_us.insert(all.set_us.end(), t.set_us.begin(), t.set_us.end());
    all.gets += t.gets;
    all.sets += t.sets;
    all.misses += t.misses;
    all.retries += t.retries;
    if (t.errors && all.errors == 0) all.first_error = t.first_error;
    all.errors += t.errors;
  }
  const double ops = double(all.gets + all.sets);
  nlohmann::json j = {{"schema", "conveyor-kv-bench/1"},
                      {"protocol", o.protocol},
                      {"provider", o.protocol == "rdma" ? rdma_provider(o) : o.protocol},
                      {"clients", o.clients},
                      {"keys", o.keys},
                      {"value_size", o.value_size},
                      {"get_ratio", o.get_ratio},
                      {"zipf", o.zipf},
                      {"depth", o.depth},
                      {"seconds", secs},
                      {"load_s", load_s},
                      {"ops_per_s", ops / secs},
                      {"gets_per_s", double(all.gets) / secs},
                      {"gets", all.gets},
                      {"sets", all.sets},
                      {"misses", all.misses},
                      {"errors", all.errors},
                      {"retries", all.retries},
                      {"get_us",
                       {{"p50", pct(all.get_us, 0.5)},
                        {"p99", pct(all.get_us, 0.99)},
                        {"p999", pct(all.get_us, 0.999)},
                        {"steps", all.get_us.size()}}},
                      {"set_us",
                       {{"p50", pct(all.set_us, 0.5)},
                        {"p99", pct(all.set_us, 0.99)},
                        {"p999", pct(all.set_us, 0.999)},
                        {"steps", all.set_us.size()}}}};
  if (all.errors) j["first_error"] = all.first_error;
  if (cpu_ok) {
    // Threads named *-engine are the software providers' engines (the "NIC");
    // every other thread of the server is the application's.
    nlohmann::json threads_j = nlohmann::json::object();
    double engine = 0;
    for (auto& [name, s1] : cpu1.by_name) {
      const double d = s1 - (cpu0.by_name.contains(name) ? cpu0.by_name[name] : 0.0);
      threads_j[name] = d;
      if (name.ends_with("-engine")) engine += d;
    }
    const double total = cpu1.total_s - cpu0.total_s;
    const double app = std::max(0.0, total - engine);
    const double mgets = double(all.gets) / 1e6;
    j["server_cpu"] = {{"pid", o.server_pid},
                       {"total_s", total},
                       {"app_s", app},
                       {"engine_s", engine},
                       {"threads", threads_j}};
    j["server_cpu_s_per_mget"] = mgets > 0 ? total / mgets : 0.0;
    j["server_app_cpu_s_per_mget"] = mgets > 0 ? app / mgets : 0.0;
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "%s %u client%s %llu keys %u B get %.2f zipf %.2f depth %u: %.0f ops/s (%.0f GET/s), "
        "misses %llu, errors %llu, retries %llu\n",
        j["provider"].get<std::string>().c_str(), o.clients, o.clients == 1 ? "" : "s",
        static_cast<unsigned long long>(o.keys), o.value_size, o.get_ratio, o.zipf, o.depth,
        ops / secs, double(all.gets) / secs, static_cast<unsigned long long>(all.misses),
        static_cast<unsigned long long>(all.errors), static_cast<unsigned long long>(all.retries));
    std::printf("  GET%s us: p50 %.1f p99 %.1f p999 %.1f\n", o.depth > 1 ? " batch" : "",
                j["get_us"]["p50"].get<double>(), j["get_us"]["p99"].get<double>(),
                j["get_us"]["p999"].get<double>());
    if (all.sets)
      std::printf("  SET%s us: p50 %.1f p99 %.1f p999 %.1f\n",
                  o.depth > 1 && o.protocol != "rdma" ? " batch" : "",
                  j["set_us"]["p50"].get<double>(), j["set_us"]["p99"].get<double>(),
                  j["set_us"]["p999"].get<double>());
    if (cpu_ok)
      std::printf(
          "  server CPU %.3f s (application %.3f s, engine %.3f s): %.3f s per million GETs\n",
          j["server_cpu"]["total_s"].get<double>(), j["server_cpu"]["app_s"].get<double>(),
          j["server_cpu"]["engine_s"].get<double>(), j["server_cpu_s_per_mget"].get<double>());
    if (all.errors) std::printf("  first error: %s\n", all.first_error.c_str());
  }
  if (all.errors) {
    std::fprintf(stderr, "conveyor-kv-bench: %llu errors; first: %s\n",
                 static_cast<unsigned long long>(all.errors), all.first_error.c_str());
    return 1;
  }
  if (o.server_pid > 0 && !cpu_ok) {
    std::fprintf(stderr, "conveyor-kv-bench: --server-pid %d: cannot read /proc/%d/stat\n",
                 o.server_pid, o.server_pid);
    return 1;
  }
  return 0;
}

}  // namespace

}  // namespace conveyor::kvbench

int main(int argc, char** argv) {
  using conveyor::kvbench::bench_options;
  bench_options o;
  CLI::App app{
      "conveyor-kv-bench: GET/SET mix against a conveyor-kv (RDMA or RESP), Redis or memcached "
      "server: ops/s and latency percentiles (bench/kv/README.md)",
      "conveyor-kv-bench"};
  // -h is the host, as in redis-cli.
  app.set_help_flag("--help", "print this help and exit");
  app.add_option("-h,--host", o.host,
                 "the server's host, or \"@name\" for an shm server (rdma); default 127.0.0.1");
  app.add_option("-p,--port", o.port,
                 "the server's port: kv serve --rdma-listen's (rdma, 7380), its --port or "
                 "Redis's (resp, 7379), memcached's (11211)");
  app.add_option("--address", o.address,
                 "rdma: the server's address as kv serve --rdma-listen has it (host:port or "
                 "@name), instead of -h/-p");
  app.add_option("--provider", o.provider,
                 "rdma: device (soft, shm, verbs); default: shm for an @name address, else soft");
  app.add_option("-a,--pass,--password", o.password, "the server's requirepass (rdma)");
  app.add_option("--progress", o.progress,
                 "rdma: the client device's progress: thread (an engine thread) or manual (the "
                 "calling thread drives the engine while it waits)")
      ->check(CLI::IsMember({"thread", "manual"}));
  app.add_option("--keys", o.keys, "key space");
  app.add_option("--value-size", o.value_size, "bytes per value");
  app.add_option("--get-ratio", o.get_ratio, "fraction of operations that are GETs")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--zipf", o.zipf, "Zipf exponent of key popularity (0: uniform)")
      ->check(CLI::Range(0.0, 5.0));
  app.add_option("--depth", o.depth, "GETs in flight: each GET step is an MGET of this many keys")
      ->check(CLI::Range(1, 128));
  app.add_option("--seconds", o.seconds, "measured time");
  app.add_option("--load", o.load,
                 "SET every key before measuring (true/false); --seconds 0: load only");
  app.add_flag("--json", o.json, "JSON output (schema conveyor-kv-bench/1)");
  app.add_option("--protocol", o.protocol,
                 "rdma (one-sided GETs), resp (any Redis-protocol server) or memcached (text)")
      ->check(CLI::IsMember({"rdma", "resp", "memcached"}));
  app.add_option("--load-port", o.load_port,
                 "rdma: load over RESP at HOST:PORT (kv serve --port; the same store), "
                 "pipelined, instead of one SET RPC per key");
  app.add_option("--clients", o.clients, "client threads, one connection each")
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--server-pid", o.server_pid,
                 "report this process's CPU time over the measured interval (/proc)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return conveyor::kvbench::run(o);
}
