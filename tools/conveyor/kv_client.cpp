// conveyor kv get|set|del|bench — the conveyor::kv client on the command line.
//
//   conveyor kv set greeting hello --address 127.0.0.1:7380
//   conveyor kv get greeting --provider shm --address @kv
//   conveyor kv bench --keys 100000 --value-size 64 --get-ratio 0.95 --zipf 0.99 --depth 16
#include "kv_client.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "conveyor_kv/client.hpp"

namespace conveyor::tool {

kv_client_commands add_kv_client_commands(CLI::App& kv, kv_client_options& o) {
  kv_client_commands c;
  auto common = [&](CLI::App* a) {
    a->add_option("-a,--address", o.address, "the server's RDMA address (kv serve --rdma-listen)");
    a->add_option("-p,--provider", o.provider, "device: soft, shm, verbs");
    a->add_option("--password", o.password, "the server's requirepass");
  };
  c.get = kv.add_subcommand("get", "GET a key by one-sided RDMA READs");
  c.get->add_option("key", o.key)->required();
  common(c.get);
  c.set = kv.add_subcommand("set", "SET a key (an RPC)");
  c.set->add_option("key", o.key)->required();
  c.set->add_option("value", o.value)->required();
  common(c.set);
  c.del = kv.add_subcommand("del", "DEL a key (an RPC)");
  c.del->add_option("key", o.key)->required();
  common(c.del);
  c.bench =
      kv.add_subcommand("bench", "GET/SET mix against a server: ops/s and latency percentiles");
  common(c.bench);
  c.bench->add_option("--keys", o.keys, "key space");
  c.bench->add_option("--value-size", o.value_size, "bytes per value");
  c.bench->add_option("--get-ratio", o.get_ratio, "fraction of operations that are GETs")
      ->check(CLI::Range(0.0, 1.0));
  c.bench->add_option("--zipf", o.zipf, "Zipf exponent of key popularity (0: uniform)")
      ->check(CLI::Range(0.0, 5.0));
  c.bench
      ->add_option("--depth", o.depth, "GETs in flight: each GET step is an MGET of this many keys")
      ->check(CLI::Range(1, 128));
  c.bench->add_option("--seconds", o.seconds, "measured time");
  c.bench->add_option("--load", o.load, "SET every key before measuring (true/false)");
  c.bench->add_flag("--json", o.json, "JSON output (schema conveyor-kv-bench/1)");
  return c;
}

namespace {

std::unique_ptr<kv::client> open(const kv_client_options& o, int& rc) {
  kv::client_options co;
  co.password = o.password;
  co.depth = std::max<std::uint32_t>(o.depth, 1);
  auto c = kv::client::connect(o.provider, o.address, co);
  if (!c) {
    std::fprintf(stderr, "conveyor kv: %s\n", c.error().to_string().c_str());
    rc = 1;
    return nullptr;
  }
  return std::move(*c);
}

// Key popularity: uniform, or Zipf(s) by the inverse of the cumulative weights.
class key_picker {
 public:
  key_picker(std::uint64_t n, double s) : n_(n), uniform_(0, n - 1) {
    if (s <= 0) return;
    cdf_.resize(n);
    double sum = 0;
    for (std::uint64_t i = 0; i < n; ++i) cdf_[i] = sum += 1.0 / std::pow(double(i + 1), s);
    for (auto& v : cdf_) v /= sum;
  }
  template <class R>
  std::uint64_t operator()(R& rng) {
    if (cdf_.empty()) return uniform_(rng);
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
    // scatter the popular ranks over the key space, as a hash would
    const std::uint64_t rank = std::min<std::uint64_t>(it - cdf_.begin(), n_ - 1);
    return (rank * 0x9e3779b97f4a7c15ull) % n_;
  }

 private:
  std::uint64_t n_;
  std::uniform_int_distribution<std::uint64_t> uniform_;
  std::vector<double> cdf_;
};

double pct(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(std::min<double>(v.size() - 1, p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

int bench(kv::client& c, const kv_client_options& o) {
  using clk = std::chrono::steady_clock;
  const std::string value(o.value_size, 'v');
  auto name = [](std::uint64_t i) { return "key:" + std::to_string(i); };
  if (o.load) {
    const auto t0 = clk::now();
    for (std::uint64_t i = 0; i < o.keys; ++i)
      if (auto r = c.set(name(i), value); !r) {
        std::fprintf(stderr, "conveyor kv bench: load: %s\n", r.error().to_string().c_str());
        return 1;
      }
    if (!o.json)
      std::printf("loaded %llu keys of %u B in %.1f s\n", static_cast<unsigned long long>(o.keys),
                  o.value_size, std::chrono::duration<double>(clk::now() - t0).count());
  }
  key_picker pick(o.keys, o.zipf);
  std::mt19937_64 rng(42);
  std::bernoulli_distribution is_get(o.get_ratio);
  std::vector<double> get_us, set_us;  // per GET step (an MGET of depth keys), per SET
  std::uint64_t gets = 0, sets = 0, misses = 0;
  std::vector<std::string> names(o.depth);
  std::vector<std::string_view> views(o.depth);
  const auto start = clk::now();
  const auto end =
      start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(o.seconds));
  while (clk::now() < end) {
    if (is_get(rng)) {
      for (std::uint32_t i = 0; i < o.depth; ++i) views[i] = names[i] = name(pick(rng));
      const auto t = clk::now();
      if (o.depth == 1) {
        auto r = c.get(views[0]);
        if (!r)
          return std::fprintf(stderr, "conveyor kv bench: %s\n", r.error().to_string().c_str()), 1;
        misses += !*r;
      } else {
        auto r = c.mget(views);
        if (!r)
          return std::fprintf(stderr, "conveyor kv bench: %s\n", r.error().to_string().c_str()), 1;
        for (auto& v : *r) misses += !v;
      }
      get_us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t).count());
      gets += o.depth;
    } else {
      const auto k = name(pick(rng));
      const auto t = clk::now();
      if (auto r = c.set(k, value); !r)
        return std::fprintf(stderr, "conveyor kv bench: %s\n", r.error().to_string().c_str()), 1;
      set_us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t).count());
      ++sets;
    }
  }
  const double secs = std::chrono::duration<double>(clk::now() - start).count();
  const auto st = c.stats();
  nlohmann::json j = {
      {"schema", "conveyor-kv-bench/1"},
      {"provider", o.provider},
      {"keys", o.keys},
      {"value_size", o.value_size},
      {"get_ratio", o.get_ratio},
      {"zipf", o.zipf},
      {"depth", o.depth},
      {"seconds", secs},
      {"ops_per_s", double(gets + sets) / secs},
      {"gets_per_s", double(gets) / secs},
      {"sets", sets},
      {"misses", misses},
      {"retries", st.retries},
      {"get_us",
       {{"p50", pct(get_us, 0.5)}, {"p99", pct(get_us, 0.99)}, {"p999", pct(get_us, 0.999)}}},
      {"set_us",
       {{"p50", pct(set_us, 0.5)}, {"p99", pct(set_us, 0.99)}, {"p999", pct(set_us, 0.999)}}}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "%s %llu keys %u B get %.2f zipf %.2f depth %u: %.0f ops/s (%.0f GET/s), misses %llu, "
        "retries %llu\n",
        o.provider.c_str(), static_cast<unsigned long long>(o.keys), o.value_size, o.get_ratio,
        o.zipf, o.depth, double(gets + sets) / secs, double(gets) / secs,
        static_cast<unsigned long long>(misses), static_cast<unsigned long long>(st.retries));
    std::printf("  GET%s us: p50 %.1f p99 %.1f p999 %.1f\n", o.depth > 1 ? " batch" : "",
                j["get_us"]["p50"].get<double>(), j["get_us"]["p99"].get<double>(),
                j["get_us"]["p999"].get<double>());
    if (sets)
      std::printf("  SET us: p50 %.1f p99 %.1f p999 %.1f\n", j["set_us"]["p50"].get<double>(),
                  j["set_us"]["p99"].get<double>(), j["set_us"]["p999"].get<double>());
  }
  return 0;
}

}  // namespace

int run_kv_client(const kv_client_commands& cmds, const kv_client_options& o) {
  if (!*cmds.get && !*cmds.set && !*cmds.del && !*cmds.bench) return -1;
  int rc = 0;
  auto c = open(o, rc);
  if (!c) return rc;
  if (*cmds.get) {
    auto r = c->get(o.key);
    if (!r) return std::fprintf(stderr, "conveyor kv get: %s\n", r.error().to_string().c_str()), 1;
    if (!*r) {
      std::printf("(nil)\n");
      return 0;
    }
    std::fwrite((*r)->data(), 1, (*r)->size(), stdout);
    std::printf("\n");
    return 0;
  }
  if (*cmds.set) {
    auto r = c->set(o.key, o.value);
    if (!r) return std::fprintf(stderr, "conveyor kv set: %s\n", r.error().to_string().c_str()), 1;
    std::printf("OK\n");
    return 0;
  }
  if (*cmds.del) {
    auto r = c->del(o.key);
    if (!r) return std::fprintf(stderr, "conveyor kv del: %s\n", r.error().to_string().c_str()), 1;
    std::printf("(integer) %d\n", *r ? 1 : 0);
    return 0;
  }
  return bench(*c, o);
}

}  // namespace conveyor::tool
