// conveyor::kv::cluster_client — a whole cluster through the public client:
// the map from CLUSTER INFO + CLUSTER SLOTS (whose node metadata names each
// node's RDMA front end), keys routed by slot, stale maps noticed from the
// header words' epoch (client.hpp).
#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <thread>

#include "cluster/slots.hpp"
#include "conveyor_kv/client.hpp"

namespace conveyor::kv {

namespace {

using clock = std::chrono::steady_clock;
constexpr auto retry_pause = std::chrono::milliseconds(100);
constexpr std::size_t max_reply_depth = 6;
constexpr std::size_t max_nodes = 4096;

// A RESP2 reply, read from a node's bytes: hostile until it parsed whole
// within these bounds (depth, element counts no larger than the bytes left).
struct reply_value {
  char type = 0;  // + - : $ * ('$' with null: nil)
  bool nil = false;
  std::string text;
  std::int64_t integer = 0;
  std::vector<reply_value> items;
};

bool parse_line(std::string_view& in, std::string_view& line) {
  const auto e = in.find("\r\n");
  if (e == std::string_view::npos) return false;
  line = in.substr(0, e);
  in.remove_prefix(e + 2);
  return true;
}

bool parse_int(std::string_view s, std::int64_t& v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc{} && p == s.data() + s.size();
}

bool parse_reply(std::string_view& in, reply_value& out, std::size_t depth) {
  if (in.empty() || depth > max_reply_depth) return false;
  out.type = in[0];
  in.remove_prefix(1);
  std::string_view line;
  if (!parse_line(in, line)) return false;
  switch (out.type) {
    case '+':
    case '-':
      out.text = line;
      return true;
    case ':':
      return parse_int(line, out.integer);
    case '$': {
      std::int64_t n;
      if (!parse_int(line, n) || n < -1) return false;
      if (n == -1) return out.nil = true;
      if (in.size() < static_cast<std::size_t>(n) + 2 || in.substr(n, 2) != "\r\n") return false;
      out.text = in.substr(0, n);
      in.remove_prefix(n + 2);
      return true;
    }
    case '*': {
      std::int64_t n;
      if (!parse_int(line, n) || n < -1) return false;
      if (n == -1) return out.nil = true;
      if (static_cast<std::size_t>(n) > in.size() / 3)
        return false;  // 3 bytes per element at least
      out.items.resize(static_cast<std::size_t>(n));
      for (auto& it : out.items)
        if (!parse_reply(in, it, depth + 1)) return false;
      return true;
    }
    default:
      return false;
  }
}

std::optional<reply_value> parse_whole(std::string_view in) {
  reply_value v;
  if (!parse_reply(in, v, 0) || !in.empty()) return std::nullopt;
  return v;
}

std::unexpected<error> bad_map(const std::string& why) {
  return make_error(errc::protocol_error, "kv cluster client: " + why);
}

bool starts_with_error(const result<std::string>& r, std::string_view code) {
  return r && r->size() > code.size() && (*r)[0] == '-' &&
         std::string_view(*r).substr(1).starts_with(code);
}

// Errors after which the connection is of no more use.
bool connection_lost(const error& e) {
  return e.code == errc::connection_reset || e.code == errc::invalid_state ||
         e.code == errc::timed_out || e.code == errc::connection_refused ||
         e.code == errc::io_error;
}
bool lease_refused(const error& e) {
  return e.code == errc::rejected && e.context.starts_with("CLUSTERDOWN");
}

struct node_ref {
  std::string id, rdma;
};

class cluster_client_impl final : public cluster_client {
 public:
  cluster_client_impl(std::string device, std::string seed, client_options o)
      : device_(std::move(device)), seed_(std::move(seed)), opts_(std::move(o)) {}

  result<void> refresh() {
    ++stats_.map_reads;
    std::vector<std::string> tries;
    for (const auto& [addr, c] : conns_)
      if (c) tries.push_back(addr);
    if (std::find(tries.begin(), tries.end(), seed_) == tries.end()) tries.push_back(seed_);
    for (const auto& n : nodes_)
      if (!n.rdma.empty() && std::find(tries.begin(), tries.end(), n.rdma) == tries.end())
        tries.push_back(n.rdma);
    error last{errc::not_found, 0, "kv cluster client: no node to read the map from"};
    for (const auto& addr : tries) {
      auto c = conn(addr);
      if (!c) {
        last = c.error();
        continue;
      }
      auto r = read_map(**c);
      if (r) return r;
      last = r.error();
      // A node that has not taken the map another node showed: ask the next.
      if (connection_lost(last)) conns_.erase(addr);
    }
    return std::unexpected(last);
  }

  result<std::optional<std::string>> get(std::string_view key) override {
    std::array<std::string_view, 1> k{key};
    auto r = mget(k);
    if (!r) return std::unexpected(r.error());
    return std::move((*r)[0]);
  }

  result<std::vector<std::optional<std::string>>> mget(
      std::span<const std::string_view> keys) override {
    std::vector<std::optional<std::string>> out(keys.size());
    std::vector<std::size_t> left(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) left[i] = i;
    const auto deadline = clock::now() + opts_.timeout;
    for (;;) {
      // By node under the current map.
      std::map<std::string, std::vector<std::size_t>> by_node;
      std::optional<error> failed;
      for (auto i : left) {
        auto addr = owner(keys[i]);
        if (!addr) {
          failed = addr.error();
          break;
        }
        by_node[*addr].push_back(i);
      }
      std::vector<std::size_t> again;
      bool refresh_needed = false, pause = false;
      if (failed) {
        if (failed->code != errc::not_found) return std::unexpected(*failed);
        again = left;
        refresh_needed = pause = true;
      }
      for (auto& [addr, idx] : by_node) {
        if (failed) break;
        std::vector<std::string_view> ks;
        for (auto i : idx) ks.push_back(keys[i]);
        auto c = conn(addr);
        result<std::vector<std::optional<std::string>>> r =
            c ? (*c)->mget(ks)
              : result<std::vector<std::optional<std::string>>>(std::unexpected(c.error()));
        if (r && c && (*c)->node_epoch() > map_epoch_) {
          ++stats_.stale_epochs;  // the node took a newer map: the keys may be elsewhere
          want_epoch_ = std::max(want_epoch_, (*c)->node_epoch());
          again.insert(again.end(), idx.begin(), idx.end());
          refresh_needed = true;
          continue;
        }
        if (!r) {
          const auto& e = r.error();
          if (!lease_refused(e) && !connection_lost(e) && e.code != errc::connection_refused)
            return std::unexpected(e);  // WRONGTYPE, a protocol error: the caller's
          if (connection_lost(e)) conns_.erase(addr);
          if (clock::now() >= deadline) return std::unexpected(e);
          ++stats_.retries;
          again.insert(again.end(), idx.begin(), idx.end());
          refresh_needed = pause = true;
          continue;
        }
        for (std::size_t j = 0; j < idx.size(); ++j) out[idx[j]] = std::move((*r)[j]);
      }
      if (again.empty()) return out;
      if (clock::now() >= deadline)
        return make_error(errc::timed_out, "kv cluster client: GET: the map kept changing");
      if (pause) std::this_thread::sleep_for(retry_pause);
      if (refresh_needed)
        if (auto m = refresh(); !m && clock::now() >= deadline) return std::unexpected(m.error());
      std::sort(again.begin(), again.end());
      left = std::move(again);
    }
  }

  result<void> set(std::string_view key, std::string_view value) override {
    std::array<std::string_view, 3> a{"SET", key, value};
    auto r = command(key, a);
    if (!r) return std::unexpected(r.error());
    if (*r != "+OK\r\n") return reply_error(*r);
    return {};
  }
  result<bool> del(std::string_view key) override {
    std::array<std::string_view, 2> a{"DEL", key};
    auto n = integer(key, a);
    if (!n) return std::unexpected(n.error());
    return *n > 0;
  }
  result<std::int64_t> incr(std::string_view key, std::int64_t by) override {
    const auto s = std::to_string(by);
    std::array<std::string_view, 3> a{"INCRBY", key, s};
    return integer(key, a);
  }

  // Retried only where the command was not run: -MOVED (another node's
  // slot), -TRYAGAIN, -CLUSTERDOWN Hash slot not served (refused by routing),
  // and a connection that could not be made. A fenced node's -CLUSTERDOWN
  // and a connection lost after the request left are the caller's: the
  // write may or may not have been applied (the map is read again for the
  // next call).
  result<std::string> command(std::string_view key,
                              std::span<const std::string_view> argv) override {
    const auto deadline = clock::now() + opts_.timeout;
    for (;;) {
      auto addr = owner(key);
      if (!addr && addr.error().code != errc::not_found) return std::unexpected(addr.error());
      bool pause = !addr;
      if (addr) {
        auto c = conn(*addr);
        if (c) {
          auto r = (*c)->command(argv);
          if (!r) {
            conns_.erase(*addr);
            (void)refresh();
            return std::unexpected(r.error());
          }
          if (starts_with_error(r, "MOVED ")) {
            ++stats_.moved;
          } else if (starts_with_error(r, "TRYAGAIN") ||
                     starts_with_error(r, "CLUSTERDOWN Hash slot not served")) {
            pause = true;
          } else {
            if (starts_with_error(r, "CLUSTERDOWN")) (void)refresh();
            return r;
          }
        } else {
          pause = true;
        }
      }
      if (clock::now() >= deadline)
        return make_error(errc::timed_out,
                          "kv cluster client: no node took the command within the timeout");
      ++stats_.retries;
      if (pause) std::this_thread::sleep_for(retry_pause);
      (void)refresh();
    }
  }

  cluster_client_stats stats() const override {
    auto s = stats_;
    s.epoch = map_epoch_;
    return s;
  }

 private:
  result<client*> conn(const std::string& addr) {
    if (auto it = conns_.find(addr); it != conns_.end() && it->second) return it->second.get();
    auto c = client::connect(device_, addr, opts_);
    if (!c) return std::unexpected(c.error());
    ++stats_.nodes_connected;
    auto* p = c->get();
    conns_[addr] = std::move(*c);
    return p;
  }

  // The slot's primary's RDMA address; errc::not_found when the map has
  // no such node (not served, or no map yet: worth reading it again).
  result<std::string> owner(std::string_view key) {
    if (owner_.empty())
      if (auto r = refresh(); !r) return std::unexpected(r.error());
    const auto i = owner_[cluster::slot_of(key)];
    if (i < 0)
      return make_error(errc::not_found,
                        "kv cluster client: the key's slot is not served by the map");
    if (nodes_[static_cast<std::size_t>(i)].rdma.empty())
      return make_error(errc::invalid_argument,
                        "kv cluster client: the slot's primary " +
                            nodes_[static_cast<std::size_t>(i)].id.substr(0, 8) +
                            " has no RDMA front end (kv serve --rdma-listen)");
    return nodes_[static_cast<std::size_t>(i)].rdma;
  }

  static result<std::uint64_t> info_epoch(client& c) {
    std::array<std::string_view, 2> a{"CLUSTER", "INFO"};
    auto r = c.command(a);
    if (!r) return std::unexpected(r.error());
    auto v = parse_whole(*r);
    if (!v || v->type != '$' || v->nil) return bad_map("CLUSTER INFO: not a bulk string");
    constexpr std::string_view field = "cluster_current_epoch:";
    const auto at = v->text.find(field);
    if (at == std::string::npos) return bad_map("CLUSTER INFO: no cluster_current_epoch");
    auto rest = std::string_view(v->text).substr(at + field.size());
    rest = rest.substr(0, rest.find("\r\n"));
    std::int64_t e;
    if (!parse_int(rest, e) || e < 0) return bad_map("CLUSTER INFO: a bad epoch");
    return static_cast<std::uint64_t>(e);
  }

  // The map as one node has it, read between two equal epochs (so from one
  // map: a node's epoch only grows, and every map change bumps it).
  result<void> read_map(client& c) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto e1 = info_epoch(c);
      if (!e1) return std::unexpected(e1.error());
      std::array<std::string_view, 2> a{"CLUSTER", "SLOTS"};
      auto r = c.command(a);
      if (!r) return std::unexpected(r.error());
      auto e2 = info_epoch(c);
      if (!e2) return std::unexpected(e2.error());
      if (*e1 != *e2) continue;
      if (*e1 < want_epoch_)
        return make_error(errc::not_found, "kv cluster client: the node's map (epoch " +
                                               std::to_string(*e1) + ") is older than epoch " +
                                               std::to_string(want_epoch_) + " seen");
      auto v = parse_whole(*r);
      if (!v) return bad_map("CLUSTER SLOTS: not a RESP reply");
      if (v->type == '-') return make_error(errc::rejected, v->text);
      if (v->type != '*') return bad_map("CLUSTER SLOTS: not an array");
      std::vector<node_ref> nodes;
      std::vector<std::int32_t> owner(cluster::slot_count, -1);
      for (const auto& range : v->items) {
        if (range.type != '*' || range.items.size() < 3 || range.items[0].type != ':' ||
            range.items[1].type != ':')
          return bad_map("CLUSTER SLOTS: a range is not [first, last, node...]");
        const auto first = range.items[0].integer, last = range.items[1].integer;
        if (first < 0 || last < first || last >= cluster::slot_count)
          return bad_map("CLUSTER SLOTS: a range out of 0..16383");
        const auto& pn = range.items[2];
        if (pn.type != '*' || pn.items.size() < 3 || pn.items[2].type != '$')
          return bad_map("CLUSTER SLOTS: a node is not [host, port, id, ...]");
        node_ref n{pn.items[2].text, {}};
        if (pn.items.size() >= 4 && pn.items[3].type == '*') {
          const auto& meta = pn.items[3].items;
          for (std::size_t k = 0; k + 1 < meta.size(); k += 2)
            if (meta[k].type == '$' && meta[k].text == "rdma" && meta[k + 1].type == '$')
              n.rdma = meta[k + 1].text;
        }
        if (n.rdma.size() > 262) return bad_map("CLUSTER SLOTS: an RDMA address too long");
        auto it = std::find_if(nodes.begin(), nodes.end(),
                               [&](const node_ref& x) { return x.id == n.id; });
        if (it == nodes.end()) {
          if (nodes.size() >= max_nodes) return bad_map("CLUSTER SLOTS: too many nodes");
          nodes.push_back(n);
          it = nodes.end() - 1;
        }
        for (auto s = first; s <= last; ++s)
          owner[static_cast<std::size_t>(s)] = static_cast<std::int32_t>(it - nodes.begin());
      }
      nodes_ = std::move(nodes);
      owner_ = std::move(owner);
      map_epoch_ = *e1;
      return {};
    }
    return make_error(errc::not_found, "kv cluster client: the map kept changing while read");
  }

  static std::unexpected<error> reply_error(std::string_view r) {
    if (!r.empty() && r[0] == '-') {
      auto e = r.substr(1);
      if (e.ends_with("\r\n")) e.remove_suffix(2);
      return make_error(errc::rejected, std::string(e));
    }
    return make_error(errc::protocol_error,
                      "kv cluster client: unexpected reply: " + std::string(r.substr(0, 64)));
  }
  result<std::int64_t> integer(std::string_view key, std::span<const std::string_view> argv) {
    auto r = command(key, argv);
    if (!r) return std::unexpected(r.error());
    auto v = parse_whole(*r);
    if (!v || v->type != ':') return reply_error(*r);
    return v->integer;
  }

  std::string device_, seed_;
  client_options opts_;
  std::map<std::string, std::unique_ptr<client>> conns_;  // by RDMA address
  std::vector<node_ref> nodes_;
  std::vector<std::int32_t> owner_;  // slot -> nodes_ index, -1: not served
  std::uint64_t map_epoch_ = 0;
  std::uint64_t want_epoch_ = 0;  // the newest epoch a node's header words showed
  cluster_client_stats stats_;
};

}  // namespace

result<std::unique_ptr<cluster_client>> cluster_client::connect(std::string_view device_name,
                                                                std::string_view address,
                                                                const client_options& opts) {
  auto c =
      std::make_unique<cluster_client_impl>(std::string(device_name), std::string(address), opts);
  if (auto r = c->refresh(); !r) return std::unexpected(r.error());
  return std::unique_ptr<cluster_client>(std::move(c));
}

}  // namespace conveyor::kv
