// conveyor::kv::cluster_reply — CLUSTER INFO's epoch and CLUSTER SLOTS's
// table out of a node's RESP2 bytes (cluster_reply.hpp).
#include "cluster_reply.hpp"

#include <algorithm>
#include <charconv>
#include <optional>

namespace conveyor::kv::cluster_reply {

namespace {

constexpr std::size_t max_depth = 6;
constexpr std::uint16_t slot_count = 16384;

// A RESP2 value as parsed: '+' '-' ':' '$' '*' (nil: a null bulk or array).
struct value {
  char type = 0;
  bool nil = false;
  std::string text;
  std::int64_t integer = 0;
  std::vector<value> items;
};

bool take_line(std::string_view& in, std::string_view& line) {
  const auto e = in.find("\r\n");
  if (e == std::string_view::npos) return false;
  line = in.substr(0, e);
  in.remove_prefix(e + 2);
  return true;
}

bool to_int(std::string_view s, std::int64_t& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc{} && p == s.data() + s.size();
}

bool parse(std::string_view& in, value& out, std::size_t depth) {
  if (in.empty() || depth > max_depth) return false;
  out.type = in[0];
  in.remove_prefix(1);
  std::string_view line;
  if (!take_line(in, line)) return false;
  switch (out.type) {
    case '+':
    case '-':
      out.text = line;
      return true;
    case ':':
      return to_int(line, out.integer);
    case '$': {
      std::int64_t n;
      if (!to_int(line, n) || n < -1) return false;
      if (n == -1) return out.nil = true;
      const auto len = static_cast<std::size_t>(n);
      if (in.size() < len || in.size() - len < 2 || in.substr(len, 2) != "\r\n") return false;
      out.text = in.substr(0, len);
      in.remove_prefix(len + 2);
      return true;
    }
    case '*': {
      std::int64_t n;
      if (!to_int(line, n) || n < -1) return false;
      if (n == -1) return out.nil = true;
      // Every element takes 3 bytes at least: no count the bytes cannot hold.
      if (static_cast<std::size_t>(n) > in.size() / 3) return false;
      out.items.resize(static_cast<std::size_t>(n));
      for (auto& it : out.items)
        if (!parse(in, it, depth + 1)) return false;
      return true;
    }
    default:
      return false;
  }
}

std::optional<value> parse_whole(std::string_view in) {
  value v;
  if (!parse(in, v, 0) || !in.empty()) return std::nullopt;
  return v;
}

std::unexpected<error> bad(const std::string& why) {
  return make_error(errc::protocol_error, "kv cluster client: " + why);
}

}  // namespace

result<std::uint64_t> parse_info_epoch(std::string_view reply) {
  auto v = parse_whole(reply);
  if (!v) return bad("CLUSTER INFO: not a RESP reply");
  if (v->type == '-') return make_error(errc::rejected, v->text);
  if (v->type != '$' || v->nil) return bad("CLUSTER INFO: not a bulk string");
  constexpr std::string_view field = "cluster_current_epoch:";
  const auto at = v->text.find(field);
  if (at == std::string::npos) return bad("CLUSTER INFO: no cluster_current_epoch");
  auto rest = std::string_view(v->text).substr(at + field.size());
  rest = rest.substr(0, rest.find("\r\n"));
  std::int64_t e;
  if (!to_int(rest, e) || e < 0) return bad("CLUSTER INFO: a bad epoch");
  return static_cast<std::uint64_t>(e);
}

result<slot_table> parse_slots(std::string_view reply) {
  auto v = parse_whole(reply);
  if (!v) return bad("CLUSTER SLOTS: not a RESP reply");
  if (v->type == '-') return make_error(errc::rejected, v->text);
  if (v->type != '*' || v->nil) return bad("CLUSTER SLOTS: not an array");
  slot_table t;
  t.owner.assign(slot_count, -1);
  t.replica_set.assign(slot_count, -1);
  for (const auto& range : v->items) {
    if (range.type != '*' || range.items.size() < 3 || range.items[0].type != ':' ||
        range.items[1].type != ':')
      return bad("CLUSTER SLOTS: a range is not [first, last, node...]");
    const auto first = range.items[0].integer, last = range.items[1].integer;
    if (first < 0 || last < first || last >= slot_count)
      return bad("CLUSTER SLOTS: a range out of 0..16383");
    if (range.items.size() > 3 + max_replicas_per_range)
      return bad("CLUSTER SLOTS: a range with too many replicas");
    // Each node of the range: [host, port, id, {meta}], its index in t.nodes.
    std::vector<std::int32_t> at;
    for (std::size_t j = 2; j < range.items.size(); ++j) {
      const auto& pn = range.items[j];
      if (pn.type != '*' || pn.items.size() < 3 || pn.items[2].type != '$' ||
          pn.items[2].text.empty())
        return bad("CLUSTER SLOTS: a node is not [host, port, id, ...]");
      node_ref n{pn.items[2].text, {}};
      if (pn.items.size() >= 4 && pn.items[3].type == '*') {
        const auto& meta = pn.items[3].items;
        for (std::size_t k = 0; k + 1 < meta.size(); k += 2)
          if (meta[k].type == '$' && meta[k].text == "rdma" && meta[k + 1].type == '$')
            n.rdma = meta[k + 1].text;
      }
      if (n.rdma.size() > max_address_bytes || n.id.size() > max_address_bytes)
        return bad("CLUSTER SLOTS: a node's id or RDMA address is too long");
      auto it = std::find_if(t.nodes.begin(), t.nodes.end(),
                             [&](const node_ref& x) { return x.id == n.id; });
      if (it == t.nodes.end()) {
        if (t.nodes.size() >= max_nodes) return bad("CLUSTER SLOTS: too many nodes");
        t.nodes.push_back(std::move(n));
        it = t.nodes.end() - 1;
      } else if (it->rdma != n.rdma) {
        return bad("CLUSTER SLOTS: a node with two RDMA addresses");
      }
      const auto idx = static_cast<std::int32_t>(it - t.nodes.begin());
      if (std::find(at.begin(), at.end(), idx) != at.end())
        return bad("CLUSTER SLOTS: a node twice in one range");
      at.push_back(idx);
    }
    std::int32_t set = -1;
    if (at.size() > 1) {
      std::vector<std::int32_t> reps(at.begin() + 1, at.end());
      auto same = std::find(t.replica_sets.begin(), t.replica_sets.end(), reps);
      if (same == t.replica_sets.end()) {
        if (t.replica_sets.size() >= max_nodes) return bad("CLUSTER SLOTS: too many replica sets");
        t.replica_sets.push_back(std::move(reps));
        same = t.replica_sets.end() - 1;
      }
      set = static_cast<std::int32_t>(same - t.replica_sets.begin());
    }
    for (auto s = first; s <= last; ++s) {
      t.owner[static_cast<std::size_t>(s)] = at[0];
      t.replica_set[static_cast<std::size_t>(s)] = set;
    }
  }
  return t;
}

}  // namespace conveyor::kv::cluster_reply
