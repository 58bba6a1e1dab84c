// conveyor::kv::blocking_registry — clients parked by BLPOP/BRPOP: which keys
// each waits on, in arrival order per key, and their deadlines. A push to a
// watched key, from any path (RESP, an RDMA RPC, a script), marks the key
// ready; the front end that parked the clients (resp_server) runs their
// command again in order, and answers the ones whose deadline passed.
// Loop thread only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace conveyor::kv {

class blocking_registry {
 public:
  // At most this many clients are blocked at once; one more gets an error.
  static constexpr std::size_t max_blocked = 10000;

  bool full() const noexcept { return clients_.size() >= max_blocked; }
  std::size_t blocked() const noexcept { return clients_.size(); }

  // Parks client `id` on `keys` until `deadline` (ms since the epoch; 0: none).
  void add(std::uint64_t id, const std::vector<std::string>& keys, std::int64_t deadline) {
    remove(id);
    auto& e = clients_[id];
    e.deadline = deadline;
    for (const auto& k : keys) {
      if (std::find(e.keys.begin(), e.keys.end(), k) != e.keys.end()) continue;
      e.keys.push_back(k);
      waiters_[k].push_back(id);
    }
    if (deadline != 0) deadlines_.emplace(deadline, id);
  }

  void remove(std::uint64_t id) {
    auto it = clients_.find(id);
    if (it == clients_.end()) return;
    for (const auto& k : it->second.keys) {
      auto w = waiters_.find(k);
      if (w == waiters_.end()) continue;
      std::erase(w->second, id);
      if (w->second.empty()) waiters_.erase(w);
    }
    if (it->second.deadline != 0) deadlines_.erase({it->second.deadline, id});
    clients_.erase(it);
  }

  bool is_blocked(std::uint64_t id) const { return clients_.count(id) != 0; }

  // A key that may have become non-empty (a push): its waiters get a turn.
  void signal(std::string_view key) {
    if (waiters_.empty()) return;
    std::string k(key);
    if (waiters_.count(k) == 0 || ready_set_.count(k) != 0) return;
    ready_set_.insert(k);
    ready_.push_back(std::move(k));
  }
  bool any_ready() const noexcept { return !ready_.empty(); }
  // The next ready key and its waiters in arrival order (a copy: serving them
  // changes the registry).
  bool next_ready(std::string& key, std::vector<std::uint64_t>& ids) {
    while (!ready_.empty()) {
      key = std::move(ready_.front());
      ready_.pop_front();
      ready_set_.erase(key);
      auto w = waiters_.find(key);
      if (w == waiters_.end()) continue;
      ids.assign(w->second.begin(), w->second.end());
      return true;
    }
    return false;
  }
  // Clients whose deadline is at or before `now` (removed from the registry).
  std::vector<std::uint64_t> expired(std::int64_t now) {
    std::vector<std::uint64_t> out;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now)
      out.push_back(deadlines_.begin()->second), remove(deadlines_.begin()->second);
    return out;
  }

 private:
  struct entry {
    std::vector<std::string> keys;
    std::int64_t deadline = 0;
  };
  std::unordered_map<std::uint64_t, entry> clients_;
  std::unordered_map<std::string, std::deque<std::uint64_t>> waiters_;
  std::set<std::pair<std::int64_t, std::uint64_t>> deadlines_;
  std::deque<std::string> ready_;
  std::unordered_set<std::string> ready_set_;
};

}  // namespace conveyor::kv
