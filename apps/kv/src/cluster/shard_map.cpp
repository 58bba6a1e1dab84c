// The shard map and node registration: checks and JSON (shard_map.hpp).
#include "cluster/shard_map.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "cluster/slots.hpp"

namespace conveyor::kv::cluster {

using json = nlohmann::json;

namespace {

std::unexpected<error> invalid(std::string what) {
  return make_error(errc::invalid_argument, std::move(what));
}

// For error texts: at most 48 printable characters of something a peer wrote.
std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 48)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 48) out += "...";
  return "'" + out + "'";
}

bool valid_dns_name(std::string_view h) {
  if (h.empty() || h.size() > 253) return false;
  std::size_t label = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    char c = h[i];
    if (c == '.') {
      if (label == 0 || h[i - 1] == '-') return false;
      label = 0;
      continue;
    }
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              (c == '-' && label > 0);
    if (!ok || ++label > 63) return false;
  }
  return label > 0 && h.back() != '-';
}

}  // namespace

bool valid_id(std::string_view id) noexcept {
  return id.size() == 40 && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool valid_address(std::string_view addr) noexcept {
  if (addr.size() > max_address_bytes) return false;
  auto colon = addr.rfind(':');
  if (colon == std::string_view::npos) return false;
  auto host = addr.substr(0, colon), port = addr.substr(colon + 1);
  unsigned p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || p == 0 || p > 65535)
    return false;
  char buf[64] = {};
  unsigned char bin[16];
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']' || host.size() - 2 >= sizeof buf) return false;
    host.substr(1, host.size() - 2).copy(buf, host.size() - 2);
    return inet_pton(AF_INET6, buf, bin) == 1;
  }
  bool dotted = !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.';
  });
  if (dotted) {
    if (host.size() >= sizeof buf) return false;
    host.copy(buf, host.size());
    return inet_pton(AF_INET, buf, bin) == 1;
  }
  return valid_dns_name(host);
}

// ---------------------------------------------------------------- validation

result<void> validate(const shard_map& m) {
  if (m.shards.size() > max_shards)
    return invalid("shard map: " + std::to_string(m.shards.size()) + " shards (at most " +
                   std::to_string(max_shards) + ")");
  if (m.nodes.size() > max_nodes)
    return invalid("shard map: " + std::to_string(m.nodes.size()) + " nodes (at most " +
                   std::to_string(max_nodes) + ")");
  std::set<std::string_view> node_ids;
  for (std::size_t i = 0; i < m.nodes.size(); ++i) {
    const auto& n = m.nodes[i];
    const std::string where = "shard map: node " + std::to_string(i);
    if (!valid_id(n.id)) return invalid(where + ": id " + shown(n.id) + " is not 40 hex");
    if (!node_ids.insert(n.id).second) return invalid(where + ": id " + n.id + " appears twice");
    if (!valid_address(n.resp))
      return invalid(where + " (" + n.id + "): resp " + shown(n.resp) + " is not host:port");
    if (!n.rdma.empty() && !valid_address(n.rdma))
      return invalid(where + " (" + n.id + "): rdma " + shown(n.rdma) + " is not host:port");
    if (!n.repl.empty() && !valid_address(n.repl))
      return invalid(where + " (" + n.id + "): repl " + shown(n.repl) + " is not host:port");
  }

  std::set<std::string_view> shard_ids, serving;
  std::vector<std::int32_t> owner(slot_count, -1);
  std::size_t ranges = 0;
  for (std::size_t i = 0; i < m.shards.size(); ++i) {
    const auto& s = m.shards[i];
    std::string where = "shard map: shard " + std::to_string(i);
    if (!valid_id(s.id)) return invalid(where + ": id " + shown(s.id) + " is not 40 hex");
    where += " (" + s.id + ")";
    if (!shard_ids.insert(s.id).second) return invalid(where + ": the id appears twice");
    if (s.replicas.size() > max_replicas)
      return invalid(where + ": " + std::to_string(s.replicas.size()) + " replicas (at most " +
                     std::to_string(max_replicas) + ")");

    auto known = [&](const std::string& id, const char* role) -> result<void> {
      if (!valid_id(id)) return invalid(where + ": " + role + " " + shown(id) + " is not 40 hex");
      if (!node_ids.count(id)) return invalid(where + ": " + role + " " + id + " is not in nodes");
      if (!serving.insert(id).second)
        return invalid(where + ": " + role + " " + id + " already serves a shard");
      return {};
    };
    if (auto r = known(s.primary, "primary"); !r) return r;
    if (!s.primary_boot.empty() && !valid_boot_id(s.primary_boot))
      return invalid(where + ": primary_boot " + shown(s.primary_boot) +
                     " is not 1..64 of [A-Za-z0-9_-]");
    for (const auto& id : s.replicas)
      if (auto r = known(id, "replica"); !r) return r;

    if (s.isr.empty()) return invalid(where + ": isr is empty (it holds the primary)");
    std::set<std::string_view> in_sync;
    for (const auto& id : s.isr) {
      bool member = id == s.primary ||
                    std::find(s.replicas.begin(), s.replicas.end(), id) != s.replicas.end();
      if (!member) return invalid(where + ": isr member " + shown(id) + " is not of this shard");
      if (!in_sync.insert(id).second) return invalid(where + ": isr lists " + id + " twice");
    }
    if (!in_sync.count(s.primary)) return invalid(where + ": isr does not hold the primary");

    ranges += s.slots.size();
    if (ranges > max_slot_ranges)
      return invalid("shard map: more than " + std::to_string(max_slot_ranges) + " slot ranges");
    for (const auto& r : s.slots) {
      const std::string range = "[" + std::to_string(r.first) + "," + std::to_string(r.last) + "]";
      if (r.first > r.last || r.last >= slot_count)
        return invalid(where + ": slot range " + range + " is not within 0..16383 in order");
      for (std::uint32_t slot = r.first; slot <= r.last; ++slot) {
        if (owner[slot] >= 0)
          return invalid(where + ": slot " + std::to_string(slot) + " (in " + range +
                         ") also belongs to shard " + std::to_string(owner[slot]));
        owner[slot] = static_cast<std::int32_t>(i);
      }
    }
  }
  return {};
}

bool valid_boot_id(std::string_view boot) noexcept {
  return !boot.empty() && boot.size() <= max_boot_id_bytes &&
         std::all_of(boot.begin(), boot.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  c == '-' || c == '_';
         });
}

result<void> validate(const node_registration& r) {
  if (!valid_id(r.id)) return invalid("node registration: id " + shown(r.id) + " is not 40 hex");
  const std::string where = "node registration " + r.id;
  if (!valid_address(r.resp))
    return invalid(where + ": resp " + shown(r.resp) + " is not host:port");
  if (!r.rdma.empty() && !valid_address(r.rdma))
    return invalid(where + ": rdma " + shown(r.rdma) + " is not host:port");
  if (!r.repl.empty() && !valid_address(r.repl))
    return invalid(where + ": repl " + shown(r.repl) + " is not host:port");
  if (!valid_boot_id(r.boot_id))
    return invalid(where + ": boot_id " + shown(r.boot_id) + " is not 1..64 of [A-Za-z0-9_-]");
  return {};
}

std::vector<slot_range> uncovered_slots(const shard_map& m) {
  std::vector<bool> owned(slot_count, false);
  for (const auto& s : m.shards)
    for (const auto& r : s.slots)
      for (std::uint32_t slot = r.first; slot <= r.last && slot < slot_count; ++slot)
        owned[slot] = true;
  std::vector<slot_range> out;
  for (std::uint32_t slot = 0; slot < slot_count; ++slot) {
    if (owned[slot]) continue;
    if (!out.empty() && out.back().last + 1u == slot)
      out.back().last = static_cast<std::uint16_t>(slot);
    else
      out.push_back({static_cast<std::uint16_t>(slot), static_cast<std::uint16_t>(slot)});
  }
  return out;
}

const node_info* find_node(const shard_map& m, std::string_view id) noexcept {
  for (const auto& n : m.nodes)
    if (n.id == id) return &n;
  return nullptr;
}

// ---------------------------------------------------------------- JSON

namespace {

std::string dump(const json& j) {
  // Never throws: strings that are not UTF-8 (only in a map that fails
  // validate) are written with U+FFFD in their place.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json node_json(std::string_view id, std::string_view resp, std::string_view rdma,
               std::string_view repl) {
  json j = {{"id", id}, {"resp", resp}};
  if (!rdma.empty()) j["rdma"] = rdma;
  if (!repl.empty()) j["repl"] = repl;
  return j;
}

// A field-by-field reader of one JSON object that refuses what it was not
// asked about. Errors go up as `bad_doc`, caught by the parse_* functions.
struct bad_doc {
  std::string what;
};

class object_reader {
 public:
  object_reader(const json& j, std::string where, std::initializer_list<const char*> fields)
      : j_(j), where_(std::move(where)) {
    if (!j.is_object()) fail("is not an object");
    for (const auto& [k, v] : j.items()) {
      bool known = std::any_of(fields.begin(), fields.end(), [&](const char* f) { return k == f; });
      if (!known) fail("has an unknown field " + shown(k));
    }
  }
  [[noreturn]] void fail(const std::string& why) const { throw bad_doc{where_ + " " + why}; }
  const std::string& where() const { return where_; }

  const json* find(const char* name) const {
    auto it = j_.find(name);
    return it == j_.end() ? nullptr : &*it;
  }
  const json& need(const char* name) const {
    const json* v = find(name);
    if (!v) fail(std::string("has no ") + name);
    return *v;
  }
  std::string string(const char* name, bool required = true, std::size_t max = 256) const {
    const json* v = required ? &need(name) : find(name);
    if (!v) return {};
    if (!v->is_string()) fail(std::string(name) + " is not a string");
    const auto& s = v->get_ref<const std::string&>();
    if (s.size() > max) fail(std::string(name) + " is longer than " + std::to_string(max));
    return s;
  }
  std::uint64_t unsigned_number(const char* name) const {
    const json& v = need(name);
    if (!v.is_number_unsigned()) fail(std::string(name) + " is not a non-negative integer");
    return v.get<std::uint64_t>();
  }
  const json& array(const char* name, std::size_t max) const {
    const json& v = need(name);
    if (!v.is_array()) fail(std::string(name) + " is not an array");
    if (v.size() > max)
      fail(std::string(name) + " has more than " + std::to_string(max) + " entries");
    return v;
  }
  std::vector<std::string> ids(const char* name, std::size_t max) const {
    std::vector<std::string> out;
    for (const auto& v : array(name, max)) {
      if (!v.is_string()) fail(std::string(name) + " holds something that is not a string");
      const auto& s = v.get_ref<const std::string&>();
      if (!valid_id(s)) fail(std::string(name) + " holds " + shown(s) + ", not 40 hex");
      out.push_back(s);
    }
    return out;
  }

 private:
  const json& j_;
  std::string where_;
};

json parse_document(std::string_view text, const char* what) {
  if (text.size() > max_document_bytes)
    throw bad_doc{std::string(what) + ": " + std::to_string(text.size()) + " bytes (at most " +
                  std::to_string(max_document_bytes) + ")"};
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad_doc{std::string(what) + ": not JSON"};
  return j;
}

template <class T, class F>
result<T> guarded(F&& f) {
  try {
    return f();
  } catch (const bad_doc& b) {
    return invalid(b.what);
  } catch (const json::exception& e) {
    return invalid(std::string("JSON: ") + e.what());
  }
}

}  // namespace

std::string to_json(const shard_map& m) {
  json shards = json::array();
  for (const auto& s : m.shards) {
    json slots = json::array();
    for (const auto& r : s.slots) slots.push_back({r.first, r.last});
    json sj = {{"id", s.id},
               {"slots", std::move(slots)},
               {"primary", s.primary},
               {"isr", s.isr},
               {"replicas", s.replicas}};
    if (!s.primary_boot.empty()) sj["primary_boot"] = s.primary_boot;
    shards.push_back(std::move(sj));
  }
  json nodes = json::array();
  for (const auto& n : m.nodes) nodes.push_back(node_json(n.id, n.resp, n.rdma, n.repl));
  return dump({{"epoch", m.epoch}, {"shards", std::move(shards)}, {"nodes", std::move(nodes)}});
}

std::string to_json(const node_registration& r) {
  json j = node_json(r.id, r.resp, r.rdma, r.repl);
  j["boot_id"] = r.boot_id;
  return dump(j);
}

result<shard_map> parse_shard_map(std::string_view text) {
  auto m = guarded<shard_map>([&] {
    json j = parse_document(text, "shard map");
    object_reader doc(j, "shard map", {"epoch", "shards", "nodes"});
    shard_map out;
    out.epoch = doc.unsigned_number("epoch");
    std::size_t i = 0;
    for (const auto& nj : doc.array("nodes", max_nodes)) {
      object_reader n(nj, "shard map: node " + std::to_string(i++), {"id", "resp", "rdma", "repl"});
      out.nodes.push_back({n.string("id"), n.string("resp", true, max_address_bytes),
                           n.string("rdma", false, max_address_bytes),
                           n.string("repl", false, max_address_bytes)});
    }
    i = 0;
    std::size_t ranges = 0;
    for (const auto& sj : doc.array("shards", max_shards)) {
      object_reader s(sj, "shard map: shard " + std::to_string(i++),
                      {"id", "slots", "primary", "primary_boot", "isr", "replicas"});
      shard sh;
      sh.id = s.string("id");
      sh.primary = s.string("primary");
      sh.primary_boot = s.string("primary_boot", false, max_boot_id_bytes);
      sh.replicas = s.ids("replicas", max_replicas);
      sh.isr = s.ids("isr", max_replicas + 1);
      const json& slots = s.array("slots", max_slot_ranges);
      ranges += slots.size();
      if (ranges > max_slot_ranges)
        s.fail("takes the map over " + std::to_string(max_slot_ranges) + " slot ranges");
      for (const auto& r : slots) {
        auto in_range = [](const json& v) {
          return v.is_number_unsigned() && v.get<std::uint64_t>() < slot_count;
        };
        if (!r.is_array() || r.size() != 2 || !in_range(r[0]) || !in_range(r[1]))
          s.fail("has a slot range that is not [first, last] within 0..16383");
        sh.slots.push_back({r[0].get<std::uint16_t>(), r[1].get<std::uint16_t>()});
      }
      out.shards.push_back(std::move(sh));
    }
    return out;
  });
  if (!m) return m;
  if (auto v = validate(*m); !v) return std::unexpected(std::move(v.error()));
  return m;
}

result<node_registration> parse_node_registration(std::string_view text) {
  auto r = guarded<node_registration>([&] {
    json j = parse_document(text, "node registration");
    object_reader n(j, "node registration", {"id", "resp", "rdma", "boot_id", "repl"});
    return node_registration{n.string("id"), n.string("resp", true, max_address_bytes),
                             n.string("rdma", false, max_address_bytes),
                             n.string("boot_id", true, max_boot_id_bytes),
                             n.string("repl", false, max_address_bytes)};
  });
  if (!r) return r;
  if (auto v = validate(*r); !v) return std::unexpected(std::move(v.error()));
  return r;
}

// ---------------------------------------------------------------- slot_table

result<slot_table> slot_table::build(const shard_map& m) {
  if (auto v = validate(m); !v) return std::unexpected(std::move(v.error()));
  slot_table t;
  t.owner_.assign(slot_count, none);
  for (std::size_t i = 0; i < m.shards.size(); ++i)
    for (const auto& r : m.shards[i].slots)
      for (std::uint32_t slot = r.first; slot <= r.last; ++slot)
        t.owner_[slot] = static_cast<std::uint16_t>(i);
  return t;
}

std::optional<std::size_t> slot_table::shard_of(std::uint16_t slot) const noexcept {
  if (slot >= owner_.size() || owner_[slot] == none) return std::nullopt;
  return owner_[slot];
}

}  // namespace conveyor::kv::cluster
