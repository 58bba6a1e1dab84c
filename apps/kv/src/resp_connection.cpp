// The TCP front end (resp_server_impl.hpp): one connection — reading what
// arrives, sending replies (never before their AOF record), pausing reads
// above the output mark, its buffers and the budget all clients share
// (maxmemory_clients), and closing it.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "aof.hpp"
#include "resp_server_impl.hpp"
#include "server_loop.hpp"

namespace conveyor::kv {

void resp_server::impl::close_client(std::uint64_t id) {
  auto it = clients.find(id);
  if (it == clients.end()) return;
  client_mem -= it->second->mem;
  exec.forget(it->second->sess);
  exec.blocking().remove(id);  // a client that leaves while blocked leaves nothing
  gated.erase(id);
  loop.remove_fd(it->second->fd);
  ::close(it->second->fd);
  clients.erase(it);
  --exec.stats().connections_current;
}

void resp_server::impl::account(client& c) {
  // A transaction's queue and its watched keys count too (maxmemory-clients).
  const std::size_t now =
      c.parser.memory() + c.out.capacity() + c.sess.queued_bytes + c.sess.watched_bytes;
  client_mem = client_mem - c.mem + now;
  c.mem = now;
}

// While the clients' buffers together pass maxmemory_clients, closes the one
// holding the most. False if `self` was closed.
bool resp_server::impl::enforce_client_memory(std::uint64_t self) {
  bool self_open = true;
  while (opts.maxmemory_clients != 0 && client_mem > opts.maxmemory_clients) {
    std::uint64_t worst = 0;
    std::size_t most = 0;
    for (auto& [id, c] : clients)
      if (c->mem > most && id != running) {
        most = c->mem;
        worst = id;
      }
    if (most == 0) break;
    if (opts.log)
      std::fprintf(stderr,
                   "conveyor kv serve: closed client %llu holding %zu bytes of buffers: all "
                   "clients' buffers passed --maxmemory-clients (%zu bytes)\n",
                   static_cast<unsigned long long>(worst), most, opts.maxmemory_clients);
    ++exec.stats().evicted_clients;
    close_client(worst);
    if (worst == self) self_open = false;
  }
  return self_open;
}

void resp_server::impl::update_events(client& c) {
  // EPOLLRDHUP only while reading: a half-closed peer would otherwise keep
  // the level-triggered event firing while reading is paused.
  unsigned ev = (c.reading ? EPOLLIN | EPOLLRDHUP : 0u) | (c.want_out ? EPOLLOUT : 0u);
  loop.modify_fd(c.fd, ev);
}

void resp_server::impl::mark_pending(std::uint64_t id, client& c) {
  if (!c.pending) {
    c.pending = true;
    pending.push_back(id);
  }
}

// Sends what it can; false if the client was closed.
bool resp_server::impl::send(std::uint64_t id, client& c) {
  if (log() != nullptr && log()->pending()) log()->flush();  // never a reply before its log record
  // Replies held for replication stay (resp_sync.cpp).
  const std::size_t end = sendable(c);
  while (c.out_pos < end) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, end - c.out_pos, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_client(id);
      return false;
    }
    c.out_pos += static_cast<std::size_t>(n);
    exec.stats().net_output_bytes += static_cast<std::uint64_t>(n);
  }
  if (c.unsent() == 0) {
    c.out_base += c.out.size();
    c.out.clear();
    c.out_pos = 0;
    if (c.out.capacity() > (1u << 20)) c.out.shrink_to_fit();
    if (c.closing) {
      close_client(id);
      return false;
    }
  } else if (c.out_pos > (1u << 20)) {
    c.out_base += c.out_pos;
    c.out.erase(0, c.out_pos);
    c.out_pos = 0;
  }
  if (c.paused && !c.closing && c.unsent() < opts.output_pause) {
    // Held-back commands run now; their replies (and AOF records) go out
    // through the next send, which flushes the AOF first.
    process(c);
    if (c.closing && c.unsent() == 0) {
      close_client(id);
      return false;
    }
  }
  account(c);
  if (!enforce_client_memory(id)) return false;
  bool want_out = c.out_pos < sendable(c);  // held bytes wait for replicated()
  bool reading = !c.closing && !c.paused && c.unsent() < opts.output_pause;
  if (want_out != c.want_out || reading != c.reading) {
    c.want_out = want_out;
    c.reading = reading;
    update_events(c);
  }
  return true;
}

// Reads and runs what arrived; false if the client was closed.
bool resp_server::impl::on_readable(std::uint64_t id, client& c) {
  char buf[16384];
  for (int rounds = 0; rounds < 4 && c.reading && !c.closing; ++rounds) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_client(id);
      return false;
    }
    if (n == 0) {  // peer closed: replies to what it sent may still go out
      c.closing = true;
      c.reading = false;
      update_events(c);
      mark_pending(id, c);
      break;
    }
    exec.stats().net_input_bytes += static_cast<std::uint64_t>(n);
    c.last_active = clock::now();
    c.parser.feed(std::string_view(buf, static_cast<std::size_t>(n)));
    process(c);
    account(c);
    if (!enforce_client_memory(id)) return false;
    if (c.unsent() > opts.output_limit) {
      ++exec.stats().output_limit_closes;
      close_client(id);
      return false;
    }
    if ((c.paused || c.unsent() >= opts.output_pause) && c.reading) {
      c.reading = false;
      update_events(c);
    }
    if (static_cast<std::size_t>(n) < sizeof buf) break;  // probably drained
  }
  if (c.unsent() != 0 || c.closing) mark_pending(id, c);
  return true;
}

}  // namespace conveyor::kv
