// etcd_coord: the coord interface over etcd 3.4's v3 JSON gateway (etcd.hpp).
//
// The HTTP around each request: endpoints, bounds, retries, and the
// framing of the two streams (one JSON object per line). What a reply says is
// read by etcd_reply.cpp's parsers, which list the shapes etcd sends.
#include "cluster/etcd.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace conveyor::kv::cluster {

using json = nlohmann::json;

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

namespace {

using etcd_reply::printable;

std::string b64(std::string_view s) {
  return base64_encode(s);
}
std::string i64(std::int64_t v) {
  return std::to_string(v);
}

}  // namespace

// ---------------------------------------------------------------- one exchange

// What the write callback fills and the caller reads after curl_easy_perform.
struct etcd_coord::exchange {
  // Streams (watch, keepalive) deliver one JSON object per line; on_line sees
  // each complete line that is not blank and returns true when it has what it
  // needs, or an error when the line is not what etcd sends.
  std::function<result<bool>(std::string_view)> on_line;
  std::size_t cap = 0;
  CURL* handle = nullptr;
  std::string body;       // a unary reply, or a stream's unfinished line
  bool over_cap = false;  // the peer sent more than cap: transfer aborted
  bool stopped = false;   // on_line had enough: transfer aborted on purpose
  bool as_unary = false;  // a stream answered with an error status: read it whole
  bool checked_status = false;
  bool ran_out = false;                // a stream ran to its time bound (as a long-poll does)
  std::optional<std::string> garbage;  // why a stream line was not what etcd sends

  bool stream() const { return on_line != nullptr && !as_unary; }
};

namespace {

// libcurl's write callback: C code calls it, so nothing may leave it by an exception.
std::size_t on_data(char* data, std::size_t size, std::size_t n, void* user) noexcept {
  auto& x = *static_cast<etcd_coord::exchange*>(user);
  const std::size_t len = size * n;
  if (x.on_line && !x.checked_status) {
    x.checked_status = true;
    long status = 0;
    curl_easy_getinfo(x.handle, CURLINFO_RESPONSE_CODE, &status);
    x.as_unary = status != 200;
  }
  // A unary reply is bounded as a whole, a stream line by line (libcurl hands
  // over at most CURL_MAX_WRITE_SIZE bytes a call, so one chunk stays small).
  if (!x.stream() && x.body.size() + len > x.cap) {
    x.over_cap = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  try {
    x.body.append(data, len);
    if (!x.stream()) return len;
    std::size_t nl;
    while ((nl = x.body.find('\n')) != std::string::npos) {
      std::string_view line(x.body.data(), nl);
      bool done = false;
      if (line.find_first_not_of(" \r\t") != std::string_view::npos) {
        auto r = x.on_line(line);
        if (!r) {
          x.garbage = std::move(r.error().context);
          x.stopped = true;
          return 0;
        }
        done = *r;
      }
      x.body.erase(0, nl + 1);
      if (done) {
        x.stopped = true;
        return 0;
      }
    }
    if (x.body.size() > x.cap) {
      x.over_cap = true;
      return 0;
    }
    return len;
  } catch (const std::exception& e) {
    x.garbage = std::string("a stream line: ") + e.what();
  }
  x.stopped = true;
  return 0;
}

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct endpoint_check {
  bool ok;
  std::string base;  // "scheme://host:port"
};

endpoint_check parse_endpoint(std::string_view e) {
  while (!e.empty() && e.back() == '/') e.remove_suffix(1);
  std::string scheme = "http";
  if (auto p = e.find("://"); p != std::string_view::npos) {
    scheme = std::string(e.substr(0, p));
    e.remove_prefix(p + 3);
    if (scheme != "http" && scheme != "https") return {false, {}};
  }
  auto colon = e.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return {false, {}};
  auto host = e.substr(0, colon), port = e.substr(colon + 1);
  unsigned p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || p == 0 || p > 65535)
    return {false, {}};
  for (char c : host)
    if (c <= 0x20 || c >= 0x7f || c == '/' || c == '@' || c == '?' || c == '#') return {false, {}};
  if (host.front() == '[' ? host.back() != ']' : host.find(':') != std::string_view::npos)
    return {false, {}};
  return {true, scheme + "://" + std::string(e)};
}

}  // namespace

// ---------------------------------------------------------------- etcd_coord

result<std::unique_ptr<etcd_coord>> etcd_coord::open(etcd_options opts) {
  if (opts.endpoints.empty()) return make_error(errc::invalid_argument, "etcd: no endpoints");
  for (auto& e : opts.endpoints) {
    auto c = parse_endpoint(e);
    if (!c.ok)
      return make_error(errc::invalid_argument,
                        "etcd: endpoint '" + printable(e) + "' is not [http[s]://]host:port");
    e = c.base;
  }
  if (opts.request_timeout.count() <= 0 || opts.connect_timeout.count() <= 0 ||
      opts.max_reply_bytes < 1024)
    return make_error(errc::invalid_argument,
                      "etcd: timeouts must be positive, max_reply_bytes >= 1024");
  init_curl_once();
  return std::unique_ptr<etcd_coord>(new etcd_coord(std::move(opts)));
}

etcd_coord::etcd_coord(etcd_options opts) : opts_(std::move(opts)) {}

etcd_coord::~etcd_coord() {
  for (void* h : pool_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* etcd_coord::take_handle() {
  {
    std::lock_guard lock(pool_mu_);
    if (!pool_.empty()) {
      void* h = pool_.back();
      pool_.pop_back();
      curl_easy_reset(static_cast<CURL*>(h));  // options off, connections kept
      return h;
    }
  }
  return curl_easy_init();
}

void etcd_coord::give_handle(void* h) {
  std::lock_guard lock(pool_mu_);
  if (pool_.size() < 8)
    pool_.push_back(h);
  else
    curl_easy_cleanup(static_cast<CURL*>(h));
}

result<std::string> etcd_coord::call(std::string_view method, const std::string& body, retry kind,
                                     exchange& x, std::chrono::milliseconds timeout) {
  const std::size_t n = opts_.endpoints.size();
  const std::size_t first = preferred_.load(std::memory_order_relaxed) % n;
  std::string errors;
  errc last = errc::connection_refused;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t at = (first + i) % n;
    const std::string& base = opts_.endpoints[at];
    const std::string where = "etcd " + base + " /v3/" + std::string(method);
    const std::string url = base + "/v3/" + std::string(method);

    auto* h = static_cast<CURL*>(take_handle());
    if (!h) return make_error(errc::resource_exhausted, where + ": curl_easy_init failed");
    x.handle = h;
    x.body.clear();
    x.over_cap = x.stopped = x.as_unary = x.checked_status = x.ran_out = false;
    x.garbage.reset();
    x.cap = opts_.max_reply_bytes;

    char errbuf[CURL_ERROR_SIZE] = {};
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_PROXY, "");  // never an environment proxy
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(opts_.connect_timeout.count()));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    if (!x.on_line)
      curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE,
                       static_cast<curl_off_t>(opts_.max_reply_bytes));

    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    long sent = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(h, CURLINFO_REQUEST_SIZE, &sent);
    curl_slist_free_all(headers);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);
    x.handle = nullptr;
    give_handle(h);

    // Decide: done, a final error, or worth the next endpoint.
    errc code = errc::ok;
    std::string why;
    bool reached = sent > 0;  // the request left: a write may have been applied
    if (x.stopped && !x.garbage) {
      if (status == 200) {
        preferred_.store(at, std::memory_order_relaxed);
        return base;
      }
      code = errc::protocol_error;
      why = "HTTP " + std::to_string(status);
    } else if (x.garbage) {
      code = errc::protocol_error;
      why = *x.garbage;
    } else if (x.over_cap || rc == CURLE_FILESIZE_EXCEEDED) {
      code = errc::protocol_error;
      why = "reply larger than " + std::to_string(opts_.max_reply_bytes) + " bytes";
    } else if (rc == CURLE_OPERATION_TIMEDOUT && x.on_line && !x.as_unary && status == 200) {
      // A stream that ran to its long-poll bound: the caller's on_line saw
      // whatever came (a watch with no events).
      x.ran_out = true;
      preferred_.store(at, std::memory_order_relaxed);
      return base;
    } else if (rc != CURLE_OK) {
      const bool no_connection = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST;
      code = no_connection                    ? errc::connection_refused
             : rc == CURLE_OPERATION_TIMEDOUT ? errc::timed_out
             : rc == CURLE_WEIRD_SERVER_REPLY || rc == CURLE_UNSUPPORTED_PROTOCOL ||
                     rc == CURLE_BAD_CONTENT_ENCODING
                 ? errc::protocol_error  // not HTTP, or not the HTTP we asked for
                 : errc::connection_reset;
      if (no_connection) reached = false;
      why = errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(rc));
    } else if (status == 200) {
      preferred_.store(at, std::memory_order_relaxed);
      return base;
    } else {
      // etcd's own error ({"error","message","code"}) is final unless it is a
      // server-side failure (5xx); anything else is not etcd.
      if (auto err = etcd_reply::parse_error(x.body)) {
        code = err->code;
        why = "HTTP " + std::to_string(status) + ": " + err->message;
        bool server_side = status >= 500 || code == errc::timed_out;
        if (!server_side) return make_error(code, where + ": " + why);
      } else {
        code = errc::protocol_error;
        why = "HTTP " + std::to_string(status) + " " + printable(x.body);
      }
    }
    last = code;
    if (!errors.empty()) errors += "; ";
    errors += where + ": " + why;
    bool retriable = kind == retry::read || !reached;
    if (!retriable) return make_error(code, errors);
  }
  if (n > 1) errors = "all " + std::to_string(n) + " etcd endpoints failed: " + errors;
  return make_error(last, errors);
}

namespace {

// A parser's result, its error prefixed with where the reply came from.
template <class T>
result<T> from(const std::string& where, result<T> r) {
  if (!r) r.error().context = where + ": " + r.error().context;
  return r;
}

}  // namespace

result<std::string> etcd_coord::unary(std::string_view method, const std::string& body, retry kind,
                                      std::string& reply) {
  exchange x;
  auto ep = call(method, body, kind, x, opts_.request_timeout);
  if (!ep) return std::unexpected(std::move(ep.error()));
  reply = std::move(x.body);
  return "etcd " + *ep + " /v3/" + std::string(method);
}

result<std::optional<key_value>> etcd_coord::get(std::string_view key) {
  json req = {{"key", b64(key)}};
  std::string reply;
  auto where = unary("kv/range", req.dump(), retry::read, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_range_one(reply));
}

result<range_result> etcd_coord::range_prefix(std::string_view prefix, std::int64_t limit) {
  std::string start = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
  json req = {{"key", b64(start)}, {"range_end", b64(prefix_end(prefix))}};
  if (limit > 0) req["limit"] = i64(limit);
  std::string reply;
  auto where = unary("kv/range", req.dump(), retry::read, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_range_prefix(reply, prefix));
}

result<std::int64_t> etcd_coord::put(std::string_view key, std::string_view value,
                                     std::int64_t lease) {
  json req = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) req["lease"] = i64(lease);
  std::string reply;
  auto where = unary("kv/put", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_put(reply));
}

result<cas_result> etcd_coord::put_if(std::string_view key, std::string_view value,
                                      std::int64_t expected_mod_revision, std::int64_t lease) {
  if (expected_mod_revision < 0)
    return make_error(errc::invalid_argument, "etcd put_if: negative mod_revision");
  json put = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) put["lease"] = i64(lease);
  json req = {{"compare", json::array({{{"key", b64(key)},
                                        {"result", "EQUAL"},
                                        {"target", "MOD"},
                                        {"mod_revision", i64(expected_mod_revision)}}})},
              {"success", json::array({{{"request_put", put}}})},
              {"failure", json::array({{{"request_range", {{"key", b64(key)}}}}})}};
  std::string reply;
  auto where = unary("kv/txn", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_txn(reply, key));
}

result<cas_result> etcd_coord::put_if_absent(std::string_view key, std::string_view value,
                                             std::int64_t expected_mod_revision,
                                             const std::vector<std::string>& absent) {
  if (expected_mod_revision < 0)
    return make_error(errc::invalid_argument, "etcd put_if_absent: negative mod_revision");
  if (absent.size() > 64)
    return make_error(errc::invalid_argument, "etcd put_if_absent: too many keys");
  json compare = json::array({{{"key", b64(key)},
                               {"result", "EQUAL"},
                               {"target", "MOD"},
                               {"mod_revision", i64(expected_mod_revision)}}});
  // A key that does not exist has version 0.
  for (const auto& k : absent)
    compare.push_back(
        {{"key", b64(k)}, {"result", "EQUAL"}, {"target", "VERSION"}, {"version", i64(0)}});
  json req = {
      {"compare", std::move(compare)},
      {"success", json::array({{{"request_put", {{"key", b64(key)}, {"value", b64(value)}}}}})},
      {"failure", json::array({{{"request_range", {{"key", b64(key)}}}}})}};
  std::string reply;
  auto where = unary("kv/txn", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_txn(reply, key));
}

result<std::int64_t> etcd_coord::del(std::string_view key) {
  json req = {{"key", b64(key)}};
  std::string reply;
  auto where = unary("kv/deleterange", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_deleterange(reply));
}

result<lease_grant> etcd_coord::grant_lease(std::chrono::seconds ttl) {
  if (ttl.count() < 1 || ttl.count() > INT32_MAX)
    return make_error(errc::invalid_argument, "etcd grant_lease: TTL must be 1 s or more");
  json req = {{"TTL", ttl.count()}};
  std::string reply;
  auto where = unary("lease/grant", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_lease_grant(reply));
}

result<std::chrono::seconds> etcd_coord::keep_alive(std::int64_t lease) {
  json req = {{"ID", i64(lease)}};
  std::optional<etcd_reply::keepalive_message> first;
  exchange x;
  x.on_line = [&](std::string_view line) -> result<bool> {
    auto m = etcd_reply::parse_keepalive_line(line, lease);
    if (!m) return std::unexpected(std::move(m.error()));
    first = std::move(*m);
    return true;  // one answer is all a keep-alive needs
  };
  auto ep = call("lease/keepalive", req.dump(), retry::read, x, opts_.request_timeout);
  if (!ep) return std::unexpected(std::move(ep.error()));
  return from("etcd " + *ep + " /v3/lease/keepalive", etcd_reply::keepalive_outcome(first, lease));
}

result<void> etcd_coord::revoke_lease(std::int64_t lease) {
  json req = {{"ID", i64(lease)}};
  std::string reply;
  auto where = unary("lease/revoke", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return from(*where, etcd_reply::parse_lease_revoke(reply));
}

result<watch_result> etcd_coord::watch_prefix(std::string_view prefix, std::int64_t from_revision,
                                              std::chrono::milliseconds timeout) {
  if (from_revision < 0 || timeout.count() <= 0)
    return make_error(errc::invalid_argument, "etcd watch: negative revision or no timeout");
  std::string start = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
  json create = {{"key", b64(start)}, {"range_end", b64(prefix_end(prefix))}};
  if (from_revision > 0) create["start_revision"] = i64(from_revision);
  json req = {{"create_request", create}};

  etcd_reply::watch_collector seen(from_revision);
  exchange x;
  x.on_line = [&](std::string_view line) -> result<bool> {
    auto m = etcd_reply::parse_watch_line(line, prefix, from_revision);
    if (!m) return std::unexpected(std::move(m.error()));
    return seen.take(std::move(*m));
  };
  auto ep = call("watch", req.dump(), retry::read, x, timeout);
  if (!ep) return std::unexpected(std::move(ep.error()));
  return from("etcd " + *ep + " /v3/watch", seen.finish(x.ran_out, timeout));
}

}  // namespace conveyor::kv::cluster
