// The TCP front end (resp_server_impl.hpp): what the commands ask of it
// (front_end_hooks, commands.hpp) — pub/sub messages and MONITOR lines to a
// client, closing a subscriber or monitor past its output limits, CLIENT LIST
// and CLIENT KILL.
#include <algorithm>

#include "resp_server_impl.hpp"
#include "store.hpp"  // now_ms

namespace conveyor::kv {

// A pub/sub message or MONITOR line for client `id`. A subscriber past its
// hard output limit, or past the soft one for longer than its seconds, is
// closed (Redis's client-output-buffer-limit pubsub); a monitor past the
// output limit of every client likewise. The close happens at the next
// before_wait, never inside the publisher's command.
void resp_server::impl::deliver(std::uint64_t id, std::string_view bytes) {
  auto it = clients.find(id);
  if (it == clients.end()) return;
  client& c = *it->second;
  if (c.closing) return;
  c.out += bytes;
  mark_pending(id, c);
  if (over_output_limit(c, clock::now())) {
    ++exec.stats().output_limit_closes;
    doom(id, c);
  }
}

bool resp_server::impl::over_output_limit(client& c, clock::time_point now) {
  const auto& cfg = exec.config();
  const bool subscriber = !c.sess.channels.empty() || !c.sess.patterns.empty();
  const std::size_t unsent = c.unsent();
  // Every client: the fixed output limit (also a subscriber whose pubsub
  // limits were set to 0, which Redis reads as none).
  if (unsent > opts.output_limit) return true;
  if (!subscriber) return false;
  if (cfg.pubsub_hard != 0 && unsent > cfg.pubsub_hard) return true;
  if (cfg.pubsub_soft != 0 && unsent > cfg.pubsub_soft) {
    if (!c.over_soft) {
      c.over_soft = true;
      c.soft_since = now;
    }
    return now - c.soft_since >= std::chrono::seconds(cfg.pubsub_soft_s);
  }
  c.over_soft = false;
  return false;
}

void resp_server::impl::doom(std::uint64_t id, client& c) {
  c.closing = true;
  c.reading = false;
  doomed.push_back(id);
}

void resp_server::impl::list_clients(std::string& out, std::uint64_t only) {
  const auto now = clock::now();
  const auto ms = now_ms();
  auto line = [&](const client& c) {
    client_io io;
    io.fd = c.fd;
    io.qbuf = c.parser.buffered();
    io.omem = c.unsent();
    io.idle_s = std::chrono::duration_cast<std::chrono::seconds>(now - c.last_active).count();
    client_line(out, c.sess, io, ms);
  };
  if (only != 0) {
    if (auto it = clients.find(only); it != clients.end()) line(*it->second);
    return;
  }
  std::vector<std::uint64_t> ids;
  for (auto& [id, c] : clients) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (auto id : ids) line(*clients[id]);
}

// CLIENT KILL: the calling client closes after its reply; the others at the
// next before_wait (their pending output is dropped, as Redis does).
std::size_t resp_server::impl::kill(const std::function<bool(const session&)>& match) {
  std::size_t n = 0;
  for (auto& [id, c] : clients) {
    if (c->closing && !c->reading && std::find(doomed.begin(), doomed.end(), id) != doomed.end())
      continue;
    if (!match(c->sess)) continue;
    ++n;
    if (id == running)
      c->sess.close_after_reply = true;
    else
      doom(id, *c);
  }
  return n;
}

}  // namespace conveyor::kv
