// conveyor-kv-hash-bench: the latency of reading one whole hash (HGETALL), by
// one-sided READs with conveyor-kv's client (soft or shm) or by the RESP
// command against any RESP server (Redis 7, conveyor-kv's RESP port). It
// writes the hash first (--fields fields of --value-size bytes), checks every
// reply has them all, and prints ops/s and the p50/p99 per HGETALL.
//
//   conveyor-kv-hash-bench -h @kv                       # one-sided, shm
//   conveyor-kv-hash-bench -h 127.0.0.1 -p 7380         # one-sided, soft
//   conveyor-kv-hash-bench --resp -p 6379               # HGETALL on Redis
#include <CLI/CLI.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "conveyor_kv/client.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

std::string encode(const std::vector<std::string>& argv) {
  std::string out = "*" + std::to_string(argv.size()) + "\r\n";
  for (auto& a : argv) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return out;
}

// A blocking RESP connection that reads one reply (arrays of bulks, integers, status).
struct resp_conn {
  int fd = -1;
  std::string buf;
  bool open(int port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~resp_conn() {
    if (fd >= 0) ::close(fd);
  }
  bool fill() {
    char tmp[65536];
    auto n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<std::size_t>(n));
    return true;
  }
  bool line(std::string& out) {
    std::size_t e;
    while ((e = buf.find("\r\n")) == std::string::npos)
      if (!fill()) return false;
    out = buf.substr(0, e);
    buf.erase(0, e + 2);
    return true;
  }
  // Elements of the reply (bulks of an array; one element for anything else).
  bool call(const std::vector<std::string>& argv, std::vector<std::string>& out) {
    const auto req = encode(argv);
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
      return false;
    out.clear();
    std::string l;
    if (!line(l) || l.empty()) return false;
    long n = l[0] == '*' ? std::stol(l.substr(1)) : 0;
    if (l[0] == '-') return false;
    if (l[0] != '*') return out.push_back(l), true;
    for (long i = 0; i < n; ++i) {
      if (!line(l) || l.empty() || l[0] != '$') return false;
      const auto len = static_cast<std::size_t>(std::stol(l.substr(1)));
      while (buf.size() < len + 2)
        if (!fill()) return false;
      out.push_back(buf.substr(0, len));
      buf.erase(0, len + 2);
    }
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"HGETALL latency: one-sided READs (conveyor-kv) or RESP (any server)"};
  app.set_help_flag("--help", "print this help and exit");  // -h is the host, as in redis-cli
  std::string host = "127.0.0.1", provider, key = "bench:hash";
  int port = 7380;
  bool resp = false;
  std::size_t fields = 10, value_size = 16, ops = 20000;
  app.add_option("-h,--host", host, "RDMA host or @name (shm)");
  app.add_option("-p,--port", port, "the RDMA port, or with --resp the RESP port");
  app.add_option("--provider", provider, "soft, shm (default: from the address)");
  app.add_flag("--resp", resp, "HGETALL over RESP instead of one-sided READs");
  app.add_option("--fields", fields, "fields in the hash");
  app.add_option("--value-size", value_size, "bytes per value");
  app.add_option("--ops", ops, "HGETALLs to time");
  app.add_option("--key", key, "the hash's key");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> hset{"HSET", key};
  for (std::size_t i = 0; i < fields; ++i) {
    hset.push_back("field" + std::to_string(i));
    hset.push_back(std::string(value_size, static_cast<char>('a' + i % 26)));
  }
  std::vector<double> us;
  us.reserve(ops);
  std::size_t bad = 0;
  const auto begin = clock_type::now();
  if (resp) {
    resp_conn c;
    std::vector<std::string> out;
    if (!c.open(port) || !c.call({"DEL", key}, out) || !c.call(hset, out)) {
      std::fprintf(stderr, "conveyor-kv-hash-bench: RESP server on port %d failed\n", port);
      return 1;
    }
    for (std::size_t i = 0; i < ops; ++i) {
      const auto t0 = clock_type::now();
      const bool ok = c.call({"HGETALL", key}, out);
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
      if (!ok || out.size() != 2 * fields) ++bad;
    }
  } else {
    const std::string address = host.starts_with('@') ? host : host + ":" + std::to_string(port);
    const std::string dev =
        provider.empty() ? std::string(conveyor::kv::provider_for_address(address)) : provider;
    auto c = conveyor::kv::client::connect(dev, address, {});
    if (!c) {
      std::fprintf(stderr, "conveyor-kv-hash-bench: %s\n", c.error().to_string().c_str());
      return 1;
    }
    std::vector<std::string_view> del{"DEL", key}, set(hset.begin(), hset.end());
    if (!(*c)->command(del) || !(*c)->command(set)) return 1;
    for (std::size_t i = 0; i < ops; ++i) {
      const auto t0 = clock_type::now();
      auto r = (*c)->hgetall(key);
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
      if (!r || r->size() != fields) ++bad;
    }
    const auto st = (*c)->stats();
    std::printf("one-sided %llu, by RPC %llu\n", static_cast<unsigned long long>(st.hash_one_sided),
                static_cast<unsigned long long>(st.hash_rpc_reads));
  }
  const double secs = std::chrono::duration<double>(clock_type::now() - begin).count();
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[std::min(us.size() - 1, std::size_t(p * us.size()))]; };
  std::printf(
      "%s HGETALL of %zu fields x %zu B: %zu ops, %.0f ops/s, p50 %.2f us, p99 %.2f us, "
      "bad replies %zu\n",
      resp ? "RESP" : "one-sided", fields, value_size, us.size(), us.size() / secs, pct(0.5),
      pct(0.99), bad);
  return bad == 0 ? 0 : 1;
}
