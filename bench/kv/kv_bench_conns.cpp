// conveyor-kv-bench's connections (kv_bench.cpp): conveyor-kv over RDMA (its
// public client), RESP and memcached's text protocol over TCP, every reply
// checked against the loaded value.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor_kv/client.hpp"
#include "kv_bench.hpp"

namespace conveyor::kvbench {

namespace {

// The RDMA address and provider these options name.
std::string rdma_address(const bench_options& o) {
  if (!o.address.empty()) return o.address;
  if (o.host.starts_with('@')) return o.host;
  const std::string h = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  return h + ":" + std::to_string(o.port ? o.port : 7380);
}

result<std::unique_ptr<kv::client>> open_kv_client(const bench_options& o) {
  kv::client_options co;
  co.password = o.password;
  // READs in flight: a step's MGET of --depth keys, or the warm-up's MGETs of 16
  // (a depth-1 GET uses one lane either way).
  co.depth = std::max<std::uint32_t>(o.depth, o.warmup > 0 ? 16 : 1);
  co.location_cache = o.location_cache;
  co.device.progress = o.progress == "manual" ? progress_mode::manual : progress_mode::thread;
  return kv::client::connect(rdma_provider(o), rdma_address(o), co);
}

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
  void add_counts(tally& t) const override {
    const auto st = c_->stats();
    t.retries += st.retries;
    for (std::size_t i = 0; i < t.rounds.size(); ++i) t.rounds[i] += st.rounds[i];
    t.one_read += st.one_read;
  }

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
    if (wait > 0) {
      out_ += "*3\r\n$4\r\nWAIT\r\n";
      append_bulk(out_, std::to_string(wait));
      append_bulk(out_, "0");
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
    if (wait > 0) {
      std::string_view line;
      long long n = 0;
      if (!s.read_line(line, err_)) return t.error("WAIT: " + err_), false;
      if (!line.starts_with(':') || !parse_size(line.substr(1), n))
        return t.error("WAIT: " + std::string(line)), false;
      if (n < static_cast<long long>(wait))
        t.error("WAIT " + std::to_string(wait) + ": " + std::to_string(n) + " replicas");
    }
    return true;
  }
  unsigned wait = 0;

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

}  // namespace

std::string rdma_provider(const bench_options& o) {
  return o.provider.empty() ? std::string(kv::provider_for_address(rdma_address(o))) : o.provider;
}

std::unique_ptr<bench_conn> open_socket(const std::string& protocol, const std::string& host,
                                        std::uint16_t port, std::string& err, unsigned wait) {
  if (protocol == "memcached") {
    auto c = std::make_unique<memcached_conn>();
    if (!c->s.connect(host, port, err)) return nullptr;
    return c;
  }
  auto c = std::make_unique<resp_conn>();
  c->wait = wait;
  if (!c->s.connect(host, port, err)) return nullptr;
  return c;
}

std::unique_ptr<bench_conn> open_conn(const bench_options& o, std::string& err) {
  if (o.protocol != "rdma") return open_socket(o.protocol, o.host, socket_port(o), err, o.wait);
  auto c = open_kv_client(o);
  if (!c) {
    err = c.error().to_string();
    return nullptr;
  }
  return std::make_unique<rdma_conn>(std::move(*c));
}

}  // namespace conveyor::kvbench
