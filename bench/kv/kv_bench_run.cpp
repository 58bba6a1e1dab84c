// conveyor-kv-bench's runner (kv_bench.cpp): key popularity, the load, the
// client threads, the server's CPU time from /proc, and the report (a table or
// JSON, schema conveyor-kv-bench/1).
#include <dirent.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
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

#include "kv_bench.hpp"

namespace conveyor::kvbench {

namespace {

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
  std::mt19937_64 rng(42 + index);
  // --warmup: GETs before the measured time (and before the server's CPU is
  // sampled), so an RDMA client has remembered where the keys it reads are.
  tally before;
  if (c && o.warmup > 0) {
    const auto until = clk::now() + std::chrono::duration_cast<clk::duration>(
                                        std::chrono::duration<double>(o.warmup));
    tally w;
    // Every key once (MGETs of 16), as an application that has read its keys
    // before, however long that takes (a loaded machine must not measure a cold
    // client as warm); then random GETs for the rest of the time.
    std::vector<std::string> keys;
    for (std::uint64_t i = 0; i < o.keys && w.errors == 0;) {
      keys.clear();
      for (; i < o.keys && keys.size() < 16; ++i) keys.push_back(key_name(i));
      if (!c->gets(keys, *sh.value, w)) break;
    }
    keys.resize(o.depth);
    while (clk::now() < until && w.errors == 0) {
      for (auto& k : keys) k = key_name(sh.pick->operator()(rng));
      if (!c->gets(keys, *sh.value, w)) break;
    }
    if (w.errors) t.error("warm-up: " + w.first_error);
    c->add_counts(before);
  }
  sh.ready->count_down();
  sh.go->wait();
  if (!c || t.errors) return;
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
  c->add_counts(t);
  t.retries -= before.retries;
  t.one_read -= before.one_read;
  for (std::size_t i = 0; i < t.rounds.size(); ++i) t.rounds[i] -= before.rounds[i];
}

}  // namespace

int run(const bench_options& o) {
  if (o.protocol != "rdma" && o.protocol != "resp" && o.protocol != "memcached") {
    std::fprintf(stderr, "conveyor-kv-bench: --protocol %s: rdma, resp or memcached\n",
                 o.protocol.c_str());
    return 2;
  }
  if (o.wait > 0 && o.protocol != "resp")
    return std::fprintf(stderr, "conveyor-kv-bench: --wait is for --protocol resp\n"), 2;
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
    for (std::size_t i = 0; i < all.rounds.size(); ++i) all.rounds[i] += t.rounds[i];
    all.one_read += t.one_read;
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
                      {"wait", o.wait},
                      {"seconds", secs},
                      {"warmup_s", o.warmup},
                      {"load_s", load_s},
                      {"ops_per_s", ops / secs},
                      {"gets_per_s", double(all.gets) / secs},
                      {"gets", all.gets},
                      {"sets", all.sets},
                      {"misses", all.misses},
                      {"errors", all.errors},
                      {"retries", all.retries},
                      {"get_rounds",
                       {{"one", all.rounds[0]},
                        {"two", all.rounds[1]},
                        {"three", all.rounds[2]},
                        {"more", all.rounds[3]}}},
                      {"one_read_gets", all.one_read},
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
    if (o.protocol == "rdma")
      std::printf(
          "  GETs by READ rounds: one %llu (%llu by one READ of a remembered item), two "
          "%llu, three %llu, more %llu\n",
          static_cast<unsigned long long>(all.rounds[0]),
          static_cast<unsigned long long>(all.one_read),
          static_cast<unsigned long long>(all.rounds[1]),
          static_cast<unsigned long long>(all.rounds[2]),
          static_cast<unsigned long long>(all.rounds[3]));
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

}  // namespace conveyor::kvbench
