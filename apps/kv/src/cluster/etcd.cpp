// etcd_coord: the coord interface over etcd 3.4's v3 JSON gateway (etcd.hpp).
//
// The reply shapes this file accepts were checked against Debian 12's etcd
// 3.4.23 with curl (and are exercised by tests/kv/cluster/etcd_test.cpp):
//   range        {"header":{..,"revision":"7"},"kvs":[{"key":b64,"create_revision":"2",
//                 "mod_revision":"3","version":"2","value":b64,"lease":"N"}],"count":"1",
//                 "more":true}; an empty answer has neither kvs nor count
//   put          {"header":{..,"revision":"8"}}
//   txn          {"header":..,"succeeded":true,"responses":[{"response_put":{..}}]};
//                 "succeeded" is left out when false
//   deleterange  {"header":..,"deleted":"1"}; "deleted" left out when 0
//   lease/grant  {"header":..,"ID":"4111120489190086675","TTL":"2"}
//   lease/keepalive (a stream) {"result":{"header":..,"ID":"..","TTL":"5"}}\n, and
//                 for a lease that is gone the same without "TTL"
//   lease/revoke {"header":..}; a lease that is gone: HTTP 404
//                 {"error":"etcdserver: requested lease not found","message":..,"code":5}
//   watch        (a stream, one object per line) {"result":{"header":..,"created":true}},
//                 then {"result":{"header":..,"events":[{"kv":{..}},{"type":"DELETE",
//                 "kv":{"key":..,"mod_revision":".."}}]}} ("type" left out for PUT);
//                 a compacted start: {"result":{..,"canceled":true,"compact_revision":"11"}}
// Errors before a stream starts, and every unary error, come as a non-200
// status with {"error":text,"message":text,"code":<gRPC code>}.
#include "cluster/etcd.hpp"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>
#include <utility>

namespace conveyor::kv::cluster {

using json = nlohmann::json;

// ---------------------------------------------------------------- base64

std::string base64_encode(std::string_view bytes) {
  // EVP_EncodeBlock takes an int length, so whole groups of 3 bytes go in
  // chunks; it writes straight into the result (and a NUL after each chunk).
  constexpr std::size_t chunk = std::size_t{3} << 20;
  std::string out((bytes.size() + 2) / 3 * 4 + 1, '\0');
  std::size_t w = 0;
  for (std::size_t at = 0; at < bytes.size(); at += chunk) {
    auto n = std::min(chunk, bytes.size() - at);
    w += static_cast<std::size_t>(EVP_EncodeBlock(
        reinterpret_cast<unsigned char*>(out.data() + w),
        reinterpret_cast<const unsigned char*>(bytes.data() + at), static_cast<int>(n)));
  }
  out.resize(w);
  return out;
}

result<std::string> base64_decode(std::string_view text) {
  auto bad = [&](const char* why) {
    return make_error(errc::protocol_error, std::string("base64: ") + why);
  };
  if (text.size() % 4 != 0) return bad("length is not a multiple of 4");
  std::size_t pad = 0;
  if (!text.empty() && text.back() == '=') pad = text[text.size() - 2] == '=' ? 2 : 1;
  for (std::size_t i = 0; i < text.size() - pad; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '/';
    if (!ok) return bad("a character outside the alphabet");
  }
  // EVP_DecodeBlock takes an int length (so: chunks of whole quads) and counts
  // the padding as zero bytes (taken off at the end).
  constexpr std::size_t chunk = std::size_t{4} << 20;
  std::string out(text.size() / 4 * 3, '\0');
  std::size_t w = 0;
  for (std::size_t at = 0; at < text.size(); at += chunk) {
    auto n = std::min(chunk, text.size() - at);
    int got = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data() + w),
                              reinterpret_cast<const unsigned char*>(text.data() + at),
                              static_cast<int>(n));
    if (got < 0 || static_cast<std::size_t>(got) != n / 4 * 3) return bad("undecodable");
    w += static_cast<std::size_t>(got);
  }
  out.resize(w - pad);
  return out;
}

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

// ---------------------------------------------------------------- reply checks

// A reply field that is not what the gateway sends.
struct bad_reply {
  std::string what;
};

const json* member(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

const json& object_at(const json& obj, const char* name) {
  const json* v = member(obj, name);
  if (!v || !v->is_object()) throw bad_reply{std::string(name) + " is not an object"};
  return *v;
}

// protobuf's JSON int64: a decimal string (what etcd writes) or a JSON
// integer (what the mapping also allows); absent means 0.
std::int64_t int64_at(const json& obj, const char* name) {
  const json* v = member(obj, name);
  if (!v) return 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > std::uint64_t{INT64_MAX})
      throw bad_reply{std::string(name) + " is out of range"};
    return v->get<std::int64_t>();
  }
  if (!v->is_string()) throw bad_reply{std::string(name) + " is not an int64"};
  const auto& s = v->get_ref<const std::string&>();
  std::int64_t out = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size())
    throw bad_reply{std::string(name) + " is not an int64"};
  return out;
}

bool bool_at(const json& obj, const char* name) {
  const json* v = member(obj, name);
  if (!v) return false;
  if (!v->is_boolean()) throw bad_reply{std::string(name) + " is not a bool"};
  return v->get<bool>();
}

std::string string_at(const json& obj, const char* name) {
  const json* v = member(obj, name);
  if (!v) return {};
  if (!v->is_string()) throw bad_reply{std::string(name) + " is not a string"};
  return v->get<std::string>();
}

std::string bytes_at(const json& obj, const char* name) {
  auto d = base64_decode(string_at(obj, name));
  if (!d) throw bad_reply{std::string(name) + ": " + d.error().context};
  return std::move(*d);
}

std::int64_t header_revision(const json& reply) {
  return int64_at(object_at(reply, "header"), "revision");
}

key_value parse_kv(const json& v) {
  if (!v.is_object()) throw bad_reply{"a kv is not an object"};
  key_value kv;
  kv.key = bytes_at(v, "key");
  if (kv.key.empty()) throw bad_reply{"a kv has no key"};
  kv.value = bytes_at(v, "value");
  kv.create_revision = int64_at(v, "create_revision");
  kv.mod_revision = int64_at(v, "mod_revision");
  kv.version = int64_at(v, "version");
  kv.lease = int64_at(v, "lease");
  if (kv.mod_revision <= 0) throw bad_reply{"a kv has no mod_revision"};
  return kv;
}

std::vector<key_value> parse_kvs(const json& reply) {
  std::vector<key_value> out;
  const json* kvs = member(reply, "kvs");
  if (!kvs) return out;
  if (!kvs->is_array()) throw bad_reply{"kvs is not an array"};
  out.reserve(kvs->size());
  for (const auto& v : *kvs) out.push_back(parse_kv(v));
  return out;
}

// gRPC status codes (etcd's "code") to ours.
errc from_grpc(std::int64_t code) {
  switch (code) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE (a compacted or future revision)
      return errc::invalid_argument;
    case 5:  // NOT_FOUND (a lease)
      return errc::not_found;
    case 4:   // DEADLINE_EXCEEDED
    case 14:  // UNAVAILABLE (no leader, request timed out: the outcome is unknown)
      return errc::timed_out;
    case 8:  // RESOURCE_EXHAUSTED (too many requests, no space)
      return errc::resource_exhausted;
    case 9:  // FAILED_PRECONDITION
      return errc::invalid_state;
    default:
      return errc::rejected;
  }
}

std::string printable(std::string_view s, std::size_t max = 120) {
  std::string out;
  for (char c : s.substr(0, max)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max) out += "...";
  return out;
}

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
  // each complete line and returns true when it has what it needs.
  std::function<bool(const json&)> on_line;
  std::size_t cap = 0;
  CURL* handle = nullptr;
  std::string body;       // a unary reply, or a stream's unfinished line
  bool over_cap = false;  // the peer sent more than cap: transfer aborted
  bool stopped = false;   // on_line had enough: transfer aborted on purpose
  bool as_unary = false;  // a stream answered with an error status: read it whole
  bool checked_status = false;
  bool ran_out = false;              // a stream ran to its time bound (as a long-poll does)
  std::optional<bad_reply> garbage;  // a stream line that was not what etcd sends

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
        json msg = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (msg.is_discarded() || !msg.is_object()) throw bad_reply{"a stream line is not JSON"};
        done = x.on_line(msg);
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
  } catch (const bad_reply& b) {
    x.garbage = b;
  } catch (const std::exception& e) {
    x.garbage = bad_reply{std::string("a stream line: ") + e.what()};
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
      why = x.garbage->what;
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
      json err = json::parse(x.body, nullptr, false);
      const json* msg = err.is_object() ? member(err, "message") : nullptr;
      const json* grpc = err.is_object() ? member(err, "code") : nullptr;
      if (msg && msg->is_string() && grpc && grpc->is_number_integer()) {
        code = from_grpc(grpc->get<std::int64_t>());
        why = "HTTP " + std::to_string(status) + ": " + printable(msg->get<std::string>());
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

// Runs `parse` over a unary reply; bad_reply and JSON surprises become protocol_error.
template <class T, class F>
result<T> parse_unary(const std::string& where, const std::string& body, F&& parse) {
  json reply = json::parse(body, nullptr, false);
  try {
    if (reply.is_discarded() || !reply.is_object())
      throw bad_reply{"the reply is not a JSON object"};
    if constexpr (std::is_void_v<T>) {
      parse(reply);
      return {};
    } else {
      return parse(reply);
    }
  } catch (const bad_reply& b) {
    return make_error(errc::protocol_error, where + ": " + b.what);
  } catch (const json::exception& e) {
    return make_error(errc::protocol_error, where + ": " + e.what());
  }
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
  using R = std::optional<key_value>;
  std::string reply;
  auto where = unary("kv/range", req.dump(), retry::read, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return parse_unary<R>(*where, reply, [](const json& r) -> R {
    header_revision(r);
    auto kvs = parse_kvs(r);
    if (kvs.size() > 1) throw bad_reply{"more than one kv for one key"};
    if (kvs.empty()) return std::nullopt;
    return std::move(kvs.front());
  });
}

result<range_result> etcd_coord::range_prefix(std::string_view prefix, std::int64_t limit) {
  std::string start = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
  json req = {{"key", b64(start)}, {"range_end", b64(prefix_end(prefix))}};
  if (limit > 0) req["limit"] = i64(limit);
  std::string reply;
  auto where = unary("kv/range", req.dump(), retry::read, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return parse_unary<range_result>(*where, reply, [&](const json& r) {
    range_result out;
    out.revision = header_revision(r);
    out.kvs = parse_kvs(r);
    out.more = bool_at(r, "more");
    for (const auto& kv : out.kvs)
      if (!kv.key.starts_with(prefix)) throw bad_reply{"a kv outside the prefix"};
    return out;
  });
}

result<std::int64_t> etcd_coord::put(std::string_view key, std::string_view value,
                                     std::int64_t lease) {
  json req = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease != 0) req["lease"] = i64(lease);
  std::string reply;
  auto where = unary("kv/put", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return parse_unary<std::int64_t>(*where, reply, [](const json& r) {
    auto rev = header_revision(r);
    if (rev <= 0) throw bad_reply{"no revision after a put"};
    return rev;
  });
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
  return parse_unary<cas_result>(*where, reply, [&](const json& r) {
    cas_result out;
    out.revision = header_revision(r);
    out.succeeded = bool_at(r, "succeeded");
    const json* resp = member(r, "responses");
    if (!resp || !resp->is_array() || resp->size() != 1 || !(*resp)[0].is_object())
      throw bad_reply{"responses is not one response"};
    if (out.succeeded) {
      object_at((*resp)[0], "response_put");
      if (out.revision <= 0) throw bad_reply{"no revision after a put"};
    } else {
      auto kvs = parse_kvs(object_at((*resp)[0], "response_range"));
      if (kvs.size() > 1) throw bad_reply{"more than one kv for one key"};
      if (!kvs.empty()) {
        if (kvs.front().key != key) throw bad_reply{"the range answered another key"};
        out.current = std::move(kvs.front());
      }
    }
    return out;
  });
}

result<std::int64_t> etcd_coord::del(std::string_view key) {
  json req = {{"key", b64(key)}};
  std::string reply;
  auto where = unary("kv/deleterange", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return parse_unary<std::int64_t>(*where, reply, [](const json& r) {
    header_revision(r);
    auto n = int64_at(r, "deleted");
    if (n < 0 || n > 1) throw bad_reply{"deleted is not 0 or 1"};
    return n;
  });
}

result<lease_grant> etcd_coord::grant_lease(std::chrono::seconds ttl) {
  if (ttl.count() < 1 || ttl.count() > INT32_MAX)
    return make_error(errc::invalid_argument, "etcd grant_lease: TTL must be 1 s or more");
  json req = {{"TTL", ttl.count()}};
  std::string reply;
  auto where = unary("lease/grant", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return parse_unary<lease_grant>(*where, reply, [](const json& r) {
    header_revision(r);
    if (auto e = string_at(r, "error"); !e.empty())
      throw bad_reply{"etcd refused the lease: " + printable(e)};
    lease_grant g{int64_at(r, "ID"), std::chrono::seconds(int64_at(r, "TTL"))};
    if (g.id == 0 || g.ttl.count() <= 0) throw bad_reply{"a grant without ID or TTL"};
    return g;
  });
}

result<std::chrono::seconds> etcd_coord::keep_alive(std::int64_t lease) {
  json req = {{"ID", i64(lease)}};
  std::optional<std::int64_t> ttl;
  std::optional<bad_reply> stream_error;
  exchange x;
  x.on_line = [&](const json& msg) {
    if (const json* e = member(msg, "error")) {
      stream_error = bad_reply{"etcd: " + printable(e->dump())};
      return true;
    }
    const json& res = object_at(msg, "result");
    header_revision(res);
    if (int64_at(res, "ID") != lease) throw bad_reply{"a keepalive answer for another lease"};
    ttl = int64_at(res, "TTL");
    return true;
  };
  auto ep = call("lease/keepalive", req.dump(), retry::read, x, opts_.request_timeout);
  if (!ep) return std::unexpected(std::move(ep.error()));
  const std::string where = "etcd " + *ep + " /v3/lease/keepalive";
  if (stream_error) return make_error(errc::rejected, where + ": " + stream_error->what);
  if (!ttl) return make_error(errc::protocol_error, where + ": the stream ended without an answer");
  if (*ttl <= 0)
    return make_error(errc::not_found, where + ": lease " + i64(lease) + " expired or was revoked");
  return std::chrono::seconds(*ttl);
}

result<void> etcd_coord::revoke_lease(std::int64_t lease) {
  json req = {{"ID", i64(lease)}};
  std::string reply;
  auto where = unary("lease/revoke", req.dump(), retry::write, reply);
  if (!where) return std::unexpected(std::move(where.error()));
  return parse_unary<void>(*where, reply, [](const json& r) { header_revision(r); });
}

result<watch_result> etcd_coord::watch_prefix(std::string_view prefix, std::int64_t from_revision,
                                              std::chrono::milliseconds timeout) {
  if (from_revision < 0 || timeout.count() <= 0)
    return make_error(errc::invalid_argument, "etcd watch: negative revision or no timeout");
  std::string start = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
  json create = {{"key", b64(start)}, {"range_end", b64(prefix_end(prefix))}};
  if (from_revision > 0) create["start_revision"] = i64(from_revision);
  json req = {{"create_request", create}};

  watch_result out;
  bool created = false;
  std::int64_t created_revision = 0;
  std::optional<std::string> canceled;
  exchange x;
  x.on_line = [&](const json& msg) {
    if (const json* e = member(msg, "error")) {
      canceled = "etcd: " + printable(e->dump());
      return true;
    }
    const json& res = object_at(msg, "result");
    if (bool_at(res, "created")) {
      created = true;
      created_revision = header_revision(res);
    }
    if (bool_at(res, "canceled")) {
      out.compact_revision = int64_at(res, "compact_revision");
      if (out.compact_revision <= 0)
        canceled = "etcd canceled the watch: " + printable(string_at(res, "cancel_reason"));
      return true;
    }
    const json* events = member(res, "events");
    if (!events) return false;  // created, or a progress notification
    if (!events->is_array()) throw bad_reply{"events is not an array"};
    for (const auto& ev : *events) {
      if (!ev.is_object()) throw bad_reply{"an event is not an object"};
      auto type = string_at(ev, "type");
      if (!type.empty() && type != "PUT" && type != "DELETE")
        throw bad_reply{"an event of type " + printable(type)};
      watch_event we;
      we.type = type == "DELETE" ? watch_event::kind::del : watch_event::kind::put;
      we.kv = parse_kv(object_at(ev, "kv"));
      if (!we.kv.key.starts_with(prefix)) throw bad_reply{"an event outside the prefix"};
      if (we.kv.mod_revision < from_revision) throw bad_reply{"an event before the start"};
      out.events.push_back(std::move(we));
    }
    return !out.events.empty();
  };
  auto ep = call("watch", req.dump(), retry::read, x, timeout);
  if (!ep) return std::unexpected(std::move(ep.error()));
  const std::string where = "etcd " + *ep + " /v3/watch";
  if (canceled) return make_error(errc::rejected, where + ": " + *canceled);
  if (out.compact_revision > 0) return out;
  if (!out.events.empty()) {
    out.next_revision = out.events.back().kv.mod_revision + 1;
    return out;
  }
  if (!created && x.ran_out)
    return make_error(errc::timed_out, where + ": etcd did not start the watch within " +
                                           std::to_string(timeout.count()) + " ms");
  if (!created)
    return make_error(errc::protocol_error, where + ": the stream ended before the watch started");
  // No events before the timeout. From a given revision, etcd may still be
  // about to send past events (it sends "created" first and catches up after),
  // so resume there; from "now", resume after the revision the watch began at.
  out.next_revision = from_revision > 0 ? from_revision : created_revision + 1;
  return out;
}

}  // namespace conveyor::kv::cluster
