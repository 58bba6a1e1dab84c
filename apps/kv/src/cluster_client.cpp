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
#include "cluster_reply.hpp"
#include "conveyor_kv/client.hpp"
#include "reply_text.hpp"

namespace conveyor::kv {

namespace {

using clock = std::chrono::steady_clock;
constexpr auto retry_pause = std::chrono::milliseconds(100);
using cluster_reply::node_ref;
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
        auto addr = reader(keys[i]);
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

  // Where a GET of `key` goes: one of the slot's replicas with an RDMA
  // front end (in turn) when the caller asked for replica reads, else the
  // slot's primary (owner).
  result<std::string> reader(std::string_view key) {
    if (!opts_.replica_reads) return owner(key);
    if (owner_.empty())
      if (auto r = refresh(); !r) return std::unexpected(r.error());
    const auto set = replica_set_[cluster::slot_of(key)];
    if (set >= 0) {
      const auto& reps = replica_sets_[static_cast<std::size_t>(set)];
      for (std::size_t k = 0; k < reps.size(); ++k) {
        const auto& n = nodes_[static_cast<std::size_t>(reps[(next_replica_ + k) % reps.size()])];
        if (n.rdma.empty()) continue;
        next_replica_ = (next_replica_ + k + 1) % reps.size();
        ++stats_.replica_reads;
        return n.rdma;
      }
    }
    return owner(key);
  }

  static result<std::uint64_t> info_epoch(client& c) {
    std::array<std::string_view, 2> a{"CLUSTER", "INFO"};
    auto r = c.command(a);
    if (!r) return std::unexpected(r.error());
    return cluster_reply::parse_info_epoch(*r);
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
      auto t = cluster_reply::parse_slots(*r);
      if (!t) return std::unexpected(t.error());
      nodes_ = std::move(t->nodes);
      owner_ = std::move(t->owner);
      replica_sets_ = std::move(t->replica_sets);
      replica_set_ = std::move(t->replica_set);
      map_epoch_ = *e1;
      return {};
    }
    return make_error(errc::not_found, "kv cluster client: the map kept changing while read");
  }

  static std::unexpected<error> reply_error(std::string_view r) {
    return reply_text::error_of(r, "kv cluster client");
  }
  result<std::int64_t> integer(std::string_view key, std::span<const std::string_view> argv) {
    auto r = command(key, argv);
    if (!r) return std::unexpected(r.error());
    return reply_text::integer_of(*r, "kv cluster client");
  }

  std::string device_, seed_;
  client_options opts_;
  std::map<std::string, std::unique_ptr<client>> conns_;  // by RDMA address
  std::vector<node_ref> nodes_;
  std::vector<std::int32_t> owner_;                      // slot -> nodes_ index, -1: not served
  std::vector<std::vector<std::int32_t>> replica_sets_;  // cluster_reply::slot_table's
  std::vector<std::int32_t> replica_set_;
  std::size_t next_replica_ = 0;
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
