// libFuzzer target: every reader of what etcd's v3 JSON gateway answers
// (apps/kv/src/cluster/etcd_reply.*), as etcd_coord hands them a reply body
// or a stream's lines.
// Input: byte 0's low 4 bits pick the parser (mod 11): 0 etcd's error object,
// 1 range of one key, 2 range of the prefix "p/", 3 put, 4 txn (put_if of key
// "k"), 5 deleterange, 6 lease grant, 7 lease revoke, 8 the keepalive stream
// (lease 12), 9 the watch stream (prefix "p/"), 10 base64; its high 4 bits are
// the watch's from_revision and, odd, write int64s as JSON numbers when
// re-encoding. The rest is the body, or the stream (split at '\n' as the client
// splits it, blank lines skipped, an unfinished last line dropped).
// Properties: every failure is protocol_error with a context (the outcome of a
// stream also rejected, not_found or timed_out where the client says so); what
// parses keeps every promise the header makes (keys under the prefix, the one
// key asked for, revisions and TTLs > 0, deleted 0 or 1, events at or after
// from_revision, next_revision one past the last event); kvs and events
// re-encoded in etcd's shape parse back the same; base64 that decodes
// re-encodes to the same text, and any bytes encode and decode back.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/etcd_reply.hpp"
#include "fuzz_check.hpp"

namespace {

namespace cl = conveyor::kv::cluster;
namespace er = conveyor::kv::cluster::etcd_reply;
using conveyor::errc;
using json = nlohmann::json;

constexpr std::string_view prefix = "p/";
constexpr std::string_view the_key = "k";
constexpr std::int64_t the_lease = 12;

template <class T>
void check_failure(const conveyor::result<T>& r) {
  if (!r) FUZZ_CHECK(r.error().code == errc::protocol_error && !r.error().context.empty());
}

bool is_printable(std::string_view s) {
  for (char c : s)
    if (c < 0x20 || c >= 0x7f) return false;
  return true;
}

json int64_json(std::int64_t v, bool as_number) {
  return as_number ? json(v) : json(std::to_string(v));
}

// A kv as etcd writes it (fields at their default left out).
json kv_json(const cl::key_value& kv, bool as_number) {
  json j = {{"key", cl::base64_encode(kv.key)}};
  if (!kv.value.empty()) j["value"] = cl::base64_encode(kv.value);
  if (kv.create_revision != 0) j["create_revision"] = int64_json(kv.create_revision, as_number);
  j["mod_revision"] = int64_json(kv.mod_revision, as_number);
  if (kv.version != 0) j["version"] = int64_json(kv.version, as_number);
  if (kv.lease != 0) j["lease"] = int64_json(kv.lease, as_number);
  return j;
}

bool same(const cl::key_value& a, const cl::key_value& b) {
  return a.key == b.key && a.value == b.value && a.create_revision == b.create_revision &&
         a.mod_revision == b.mod_revision && a.version == b.version && a.lease == b.lease;
}

void check_kv(const cl::key_value& kv) {
  FUZZ_CHECK(!kv.key.empty());
  FUZZ_CHECK(kv.mod_revision > 0);
}

// The client's stream framing (etcd.cpp on_data): complete lines that are not blank.
std::vector<std::string_view> stream_lines(std::string_view in) {
  std::vector<std::string_view> out;
  std::size_t nl;
  while ((nl = in.find('\n')) != std::string_view::npos) {
    auto line = in.substr(0, nl);
    if (line.find_first_not_of(" \r\t") != std::string_view::npos) out.push_back(line);
    in.remove_prefix(nl + 1);
  }
  return out;
}

void range_one(std::string_view body) {
  auto r = er::parse_range_one(body);
  check_failure(r);
  if (r && *r) check_kv(**r);
}

void range_prefix(std::string_view body, bool as_number) {
  auto r = er::parse_range_prefix(body, prefix);
  check_failure(r);
  if (!r) return;
  json kvs = json::array();
  for (const auto& kv : r->kvs) {
    check_kv(kv);
    FUZZ_CHECK(kv.key.starts_with(prefix));
    kvs.push_back(kv_json(kv, as_number));
  }
  // Re-encoded as etcd writes it, it reads back the same.
  json again = {{"header", {{"revision", int64_json(r->revision, as_number)}}}};
  if (!r->kvs.empty()) again["kvs"] = kvs;
  if (r->more) again["more"] = true;
  auto back = er::parse_range_prefix(again.dump(), prefix);
  FUZZ_CHECK(back.has_value());
  FUZZ_CHECK(back->revision == r->revision && back->more == r->more);
  FUZZ_CHECK(back->kvs.size() == r->kvs.size());
  for (std::size_t i = 0; i < r->kvs.size(); ++i) FUZZ_CHECK(same(back->kvs[i], r->kvs[i]));
}

void txn(std::string_view body) {
  auto r = er::parse_txn(body, the_key);
  check_failure(r);
  if (!r) return;
  if (r->succeeded) {
    FUZZ_CHECK(r->revision > 0);
    FUZZ_CHECK(!r->current.has_value());
  } else if (r->current) {
    check_kv(*r->current);
    FUZZ_CHECK(r->current->key == the_key);
  }
}

void keepalive(std::string_view stream) {
  std::optional<er::keepalive_message> first;
  for (auto line : stream_lines(stream)) {
    auto m = er::parse_keepalive_line(line, the_lease);
    check_failure(m);
    if (!m) return;  // the client fails the call with protocol_error
    if (m->error) FUZZ_CHECK(is_printable(*m->error));
    first = std::move(*m);
    break;  // one answer is all a keep-alive reads
  }
  auto r = er::keepalive_outcome(first, the_lease);
  if (r) {
    FUZZ_CHECK(first && !first->error && r->count() > 0 && r->count() == first->ttl);
  } else {
    const auto c = r.error().code;
    FUZZ_CHECK(c == errc::protocol_error || c == errc::rejected || c == errc::not_found);
    FUZZ_CHECK((c == errc::protocol_error) == !first);
  }
}

void watch(std::string_view stream, std::int64_t from, bool as_number) {
  er::watch_collector seen(from);
  bool created = false;
  for (auto line : stream_lines(stream)) {
    auto m = er::parse_watch_line(line, prefix, from);
    check_failure(m);
    if (!m) return;  // the client fails the call with protocol_error
    if (m->error) FUZZ_CHECK(is_printable(*m->error));
    FUZZ_CHECK(is_printable(m->cancel_reason));
    created |= m->created;
    json events = json::array();
    for (const auto& ev : m->events) {
      check_kv(ev.kv);
      FUZZ_CHECK(ev.kv.key.starts_with(prefix));
      FUZZ_CHECK(ev.kv.mod_revision >= from);
      json e = {{"kv", kv_json(ev.kv, as_number)}};
      if (ev.type == cl::watch_event::kind::del) e["type"] = "DELETE";
      events.push_back(e);
    }
    if (!m->error && !m->canceled && !m->events.empty()) {
      // Re-encoded as etcd writes it, the events read back the same.
      json again = {{"result", {{"header", {{"revision", "1"}}}, {"events", events}}}};
      auto back = er::parse_watch_line(again.dump(), prefix, from);
      FUZZ_CHECK(back.has_value() && back->events.size() == m->events.size());
      for (std::size_t i = 0; i < m->events.size(); ++i) {
        FUZZ_CHECK(back->events[i].type == m->events[i].type);
        FUZZ_CHECK(same(back->events[i].kv, m->events[i].kv));
      }
    }
    if (seen.take(std::move(*m))) break;
  }
  for (bool ran_out : {false, true}) {
    auto r = seen.finish(ran_out, std::chrono::milliseconds(1000));
    if (!r) {
      const auto c = r.error().code;
      FUZZ_CHECK(c == errc::protocol_error || c == errc::rejected || c == errc::timed_out);
      FUZZ_CHECK(c != errc::timed_out || ran_out);
      FUZZ_CHECK(!r.error().context.empty());
      continue;
    }
    if (r->compact_revision > 0) {
      FUZZ_CHECK(r->events.empty());
    } else if (!r->events.empty()) {
      for (const auto& ev : r->events) FUZZ_CHECK(ev.kv.mod_revision >= from);
      FUZZ_CHECK(r->next_revision == r->events.back().kv.mod_revision + 1);
    } else {
      FUZZ_CHECK(created);
      FUZZ_CHECK(r->next_revision > 0 && (from == 0 || r->next_revision == from));
    }
  }
}

void base64(std::string_view text) {
  auto d = cl::base64_decode(text);
  check_failure(d);
  if (d) FUZZ_CHECK(cl::base64_encode(*d) == text);  // only canonical base64 decodes
  auto back = cl::base64_decode(cl::base64_encode(text));
  FUZZ_CHECK(back.has_value() && *back == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned which = (data[0] & 0x0fu) % 11;
  const unsigned variant = data[0] >> 4;
  const bool as_number = (variant & 1) != 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  switch (which) {
    case 0: {
      auto e = er::parse_error(in);
      check_failure(e);
      if (e) {
        FUZZ_CHECK(e->code == er::from_grpc(e->grpc_code));
        FUZZ_CHECK(is_printable(e->message) && e->message.size() <= 123);
      }
      break;
    }
    case 1:
      range_one(in);
      break;
    case 2:
      range_prefix(in, as_number);
      break;
    case 3: {
      auto r = er::parse_put(in);
      check_failure(r);
      if (r) FUZZ_CHECK(*r > 0);
      break;
    }
    case 4:
      txn(in);
      break;
    case 5: {
      auto r = er::parse_deleterange(in);
      check_failure(r);
      if (r) FUZZ_CHECK(*r == 0 || *r == 1);
      break;
    }
    case 6: {
      auto r = er::parse_lease_grant(in);
      check_failure(r);
      if (r) FUZZ_CHECK(r->id != 0 && r->ttl.count() > 0);
      break;
    }
    case 7:
      check_failure(er::parse_lease_revoke(in));
      break;
    case 8:
      keepalive(in);
      break;
    case 9:
      watch(in, variant, as_number);
      break;
    default:
      base64(in);
      break;
  }
  return 0;
}
