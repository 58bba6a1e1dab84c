// etcd's v3 JSON gateway replies, read and checked (etcd_reply.hpp).
//
// The reply shapes this file accepts were checked against Debian 12's etcd
// 3.4.23 with curl (and are exercised by tests/kv/cluster/etcd_test.cpp and
// tests/fuzz/fuzz_etcd_reply.cpp):
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
#include "cluster/etcd_reply.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <nlohmann/json.hpp>
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
  auto sextet = [](unsigned char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (std::size_t i = 0; i < text.size() - pad; ++i)
    if (sextet(static_cast<unsigned char>(text[i])) < 0)
      return bad("a character outside the alphabet");
  // Before padding, the last character carries bits past the last byte (2 of
  // them before "=", 4 before "=="): canonical base64 has them 0, and
  // EVP_DecodeBlock would drop them silently, so "QR==" would read as "A".
  if (pad != 0 && (sextet(static_cast<unsigned char>(text[text.size() - pad - 1])) &
                   (pad == 1 ? 0x3 : 0xf)) != 0)
    return bad("bits set past the last byte");
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

namespace etcd_reply {

std::string printable(std::string_view s, std::size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max) out += "...";
  return out;
}

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

namespace {

// ---------------------------------------------------------------- field checks

// A reply field that is not what the gateway sends; caught by `guarded`.
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

// A stream's error object ({"error":{..}} in place of a result), as text.
std::optional<std::string> stream_error(const json& msg) {
  const json* e = member(msg, "error");
  if (!e) return std::nullopt;
  return "etcd: " + printable(e->dump());
}

// Runs `parse` over `text` parsed as one JSON object (`not_object` says what
// else it was); bad_reply and JSON surprises become protocol_error.
template <class T, class F>
result<T> guarded(std::string_view text, const char* not_object, const char* json_error,
                  F&& parse) {
  try {
    json reply = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded() || !reply.is_object()) throw bad_reply{not_object};
    if constexpr (std::is_void_v<T>) {
      parse(reply);
      return {};
    } else {
      return parse(reply);
    }
  } catch (const bad_reply& b) {
    return make_error(errc::protocol_error, b.what);
  } catch (const json::exception& e) {
    return make_error(errc::protocol_error, json_error + std::string(e.what()));
  }
}

// A unary reply: the whole body is one object.
template <class T, class F>
result<T> unary(std::string_view body, F&& parse) {
  return guarded<T>(body, "the reply is not a JSON object", "", std::forward<F>(parse));
}

// One line of a stream.
template <class T, class F>
result<T> line(std::string_view text, F&& parse) {
  return guarded<T>(text, "a stream line is not JSON", "a stream line: ", std::forward<F>(parse));
}

}  // namespace

// ---------------------------------------------------------------- unary replies

result<error_body> parse_error(std::string_view body) {
  json err = json::parse(body, nullptr, /*allow_exceptions=*/false);
  const json* msg = err.is_object() ? member(err, "message") : nullptr;
  const json* grpc = err.is_object() ? member(err, "code") : nullptr;
  if (!msg || !msg->is_string() || !grpc || !grpc->is_number_integer())
    return make_error(errc::protocol_error, "not etcd's error object");
  error_body out;
  out.grpc_code = grpc->get<std::int64_t>();
  out.code = from_grpc(out.grpc_code);
  out.message = printable(msg->get_ref<const std::string&>());
  return out;
}

result<std::optional<key_value>> parse_range_one(std::string_view body) {
  using R = std::optional<key_value>;
  return unary<R>(body, [](const json& r) -> R {
    header_revision(r);
    auto kvs = parse_kvs(r);
    if (kvs.size() > 1) throw bad_reply{"more than one kv for one key"};
    if (kvs.empty()) return std::nullopt;
    return std::move(kvs.front());
  });
}

result<range_result> parse_range_prefix(std::string_view body, std::string_view prefix) {
  return unary<range_result>(body, [&](const json& r) {
    range_result out;
    out.revision = header_revision(r);
    out.kvs = parse_kvs(r);
    out.more = bool_at(r, "more");
    for (const auto& kv : out.kvs)
      if (!kv.key.starts_with(prefix)) throw bad_reply{"a kv outside the prefix"};
    return out;
  });
}

result<std::int64_t> parse_put(std::string_view body) {
  return unary<std::int64_t>(body, [](const json& r) {
    auto rev = header_revision(r);
    if (rev <= 0) throw bad_reply{"no revision after a put"};
    return rev;
  });
}

result<cas_result> parse_txn(std::string_view body, std::string_view key) {
  return unary<cas_result>(body, [&](const json& r) {
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

result<std::int64_t> parse_deleterange(std::string_view body) {
  return unary<std::int64_t>(body, [](const json& r) {
    header_revision(r);
    auto n = int64_at(r, "deleted");
    if (n < 0 || n > 1) throw bad_reply{"deleted is not 0 or 1"};
    return n;
  });
}

result<lease_grant> parse_lease_grant(std::string_view body) {
  return unary<lease_grant>(body, [](const json& r) {
    header_revision(r);
    if (auto e = string_at(r, "error"); !e.empty())
      throw bad_reply{"etcd refused the lease: " + printable(e)};
    lease_grant g{int64_at(r, "ID"), std::chrono::seconds(int64_at(r, "TTL"))};
    if (g.id == 0 || g.ttl.count() <= 0) throw bad_reply{"a grant without ID or TTL"};
    return g;
  });
}

result<void> parse_lease_revoke(std::string_view body) {
  return unary<void>(body, [](const json& r) { header_revision(r); });
}

// ---------------------------------------------------------------- streams

result<keepalive_message> parse_keepalive_line(std::string_view text, std::int64_t lease) {
  return line<keepalive_message>(text, [&](const json& msg) {
    keepalive_message out;
    if ((out.error = stream_error(msg))) return out;
    const json& res = object_at(msg, "result");
    header_revision(res);
    if (int64_at(res, "ID") != lease) throw bad_reply{"a keepalive answer for another lease"};
    out.ttl = int64_at(res, "TTL");
    return out;
  });
}

result<std::chrono::seconds> keepalive_outcome(const std::optional<keepalive_message>& first,
                                               std::int64_t lease) {
  if (!first) return make_error(errc::protocol_error, "the stream ended without an answer");
  if (first->error) return make_error(errc::rejected, *first->error);
  if (first->ttl <= 0)
    return make_error(errc::not_found,
                      "lease " + std::to_string(lease) + " expired or was revoked");
  return std::chrono::seconds(first->ttl);
}

result<watch_message> parse_watch_line(std::string_view text, std::string_view prefix,
                                       std::int64_t from_revision) {
  return line<watch_message>(text, [&](const json& msg) {
    watch_message out;
    if ((out.error = stream_error(msg))) return out;
    const json& res = object_at(msg, "result");
    if ((out.created = bool_at(res, "created"))) out.created_revision = header_revision(res);
    if ((out.canceled = bool_at(res, "canceled"))) {
      out.compact_revision = int64_at(res, "compact_revision");
      if (out.compact_revision <= 0) out.cancel_reason = printable(string_at(res, "cancel_reason"));
      return out;
    }
    const json* events = member(res, "events");
    if (!events) return out;  // created, or a progress notification
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
    return out;
  });
}

bool watch_collector::take(watch_message m) {
  if (m.error) {
    canceled_ = std::move(m.error);
    return true;
  }
  if (m.created) {
    created_ = true;
    created_revision_ = m.created_revision;
  }
  if (m.canceled) {
    out_.compact_revision = m.compact_revision;
    if (out_.compact_revision <= 0) canceled_ = "etcd canceled the watch: " + m.cancel_reason;
    return true;
  }
  for (auto& e : m.events) out_.events.push_back(std::move(e));
  return !out_.events.empty();
}

result<watch_result> watch_collector::finish(bool ran_out,
                                             std::chrono::milliseconds timeout) const {
  if (canceled_) return make_error(errc::rejected, *canceled_);
  watch_result out = out_;
  if (out.compact_revision > 0) return out;
  if (!out.events.empty()) {
    // A peer can name any int64; the one past INT64_MAX does not exist.
    const std::int64_t last = out.events.back().kv.mod_revision;
    if (last == INT64_MAX)
      return make_error(errc::protocol_error, "an event at revision " + std::to_string(last) +
                                                  ", which no revision follows");
    out.next_revision = last + 1;
    return out;
  }
  if (!created_ && ran_out)
    return make_error(errc::timed_out, "etcd did not start the watch within " +
                                           std::to_string(timeout.count()) + " ms");
  if (!created_)
    return make_error(errc::protocol_error, "the stream ended before the watch started");
  // No events before the timeout. From a given revision, etcd may still be
  // about to send past events (it sends "created" first and catches up after),
  // so resume there; from "now", resume after the revision the watch began at.
  if (from_revision_ > 0) {
    out.next_revision = from_revision_;
    return out;
  }
  // From "now", the header's revision is where the watch began: without a
  // usable one the next call would start nowhere (at 0: from "now" again,
  // losing what happened in between) or at an invalid revision.
  if (created_revision_ <= 0 || created_revision_ == INT64_MAX)
    return make_error(errc::protocol_error, "the watch began at revision " +
                                                std::to_string(created_revision_) +
                                                ", not one to resume after");
  out.next_revision = created_revision_ + 1;
  return out;
}

}  // namespace etcd_reply
}  // namespace conveyor::kv::cluster
