// Replies held until the writes before them are replicated (issue 35's
// synchronous replication, docs/KV-CLUSTER.md). After each command the log
// offset at that moment is the reply's `need`: the reply, and everything after
// it on the connection, goes out once every in-sync replica has acknowledged
// that offset (sync_point::acked). Reads wait too: a read may show a write a
// failover could still lose, so it is shown only once that write is
// replicated. A reply still waiting after sync_point::timeout_ms is replaced
// by -NOREPLICAS (the write may be applied here and on some replicas, or not:
// the client must not count it as done).
#include "cluster/routing.hpp"
#include "resp_server_impl.hpp"

namespace conveyor::kv {

void resp_server::impl::gate(client& c, std::size_t start) {
  sync_point* sp = exec.sync();
  // A reply behind a held one gets a gate too (already passed unless
  // fenced), so that each gate stands for one reply.
  if (sp == nullptr || (!sp->waiting() && c.gates.empty()) || c.out.size() == start) return;
  c.gates.push_back(
      {c.out_base + start, sp->offset, clock::now() + std::chrono::milliseconds(sp->timeout_ms)});
  gated.insert(c.sess.id);
}

// Where in c.out the bytes that may be sent end.
std::size_t resp_server::impl::sendable(client& c) {
  sync_point* sp = exec.sync();
  const std::uint64_t acked = sp ? sp->acked : static_cast<std::uint64_t>(-1);
  // A fenced node releases no held reply (replicated() turns them into errors).
  while (!c.gates.empty() && c.gates.front().need <= acked && !exec.fenced()) c.gates.pop_front();
  if (c.gates.empty()) return c.out.size();
  return static_cast<std::size_t>(c.gates.front().at - c.out_base);
}

void resp_server::impl::replicated() {
  sync_point* sp = exec.sync();
  const auto now = clock::now();
  for (auto it = gated.begin(); it != gated.end();) {
    const auto id = *it;
    auto ci = clients.find(id);
    if (ci == clients.end()) {
      it = gated.erase(it);
      continue;
    }
    // A client whose command is executing (a long script serving the others)
    // is building its reply in c.out: it is looked at after it returns.
    if (id == running) {
      ++it;
      continue;
    }
    client& c = *ci->second;
    const std::size_t end = sendable(c);  // drops the gates passed
    // The waits past their bound, oldest first: each reply becomes the error.
    // A fenced node's are all errors: its lease may be gone and it may have
    // been replaced, so it tells no client of a write (which may or may not
    // be applied, as after a timeout).
    const bool fenced = exec.fenced();
    std::size_t k = 0;
    while (sp != nullptr && k < c.gates.size() && (fenced || c.gates[k].deadline <= now)) ++k;
    if (k != 0) {
      const auto from = static_cast<std::size_t>(c.gates[0].at - c.out_base);
      const std::size_t to =
          k < c.gates.size() ? static_cast<std::size_t>(c.gates[k].at - c.out_base) : c.out.size();
      std::string errs;
      for (std::size_t i = 0; i < k; ++i)
        if (fenced)
          reply(errs, c.sess.resp).error(std::string(cluster::err_fenced));
        else
          reply(errs, c.sess.resp)
              .error("NOREPLICAS Not enough good replicas to write: no acknowledgement within " +
                     std::to_string(sp->timeout_ms) + " ms (the write may or may not be applied)");
      c.out.replace(from, to - from, errs);
      for (std::size_t i = k; i < c.gates.size(); ++i)
        c.gates[i].at = c.gates[i].at - (to - from) + errs.size();
      c.gates.erase(c.gates.begin(), c.gates.begin() + static_cast<std::ptrdiff_t>(k));
    }
    if (k != 0 || end > c.out_pos) mark_pending(id, c);
    it = c.gates.empty() ? gated.erase(it) : std::next(it);
  }
}

}  // namespace conveyor::kv
