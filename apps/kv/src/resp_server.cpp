// The TCP front end (resp_server.hpp).
#include "resp_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <unordered_map>
#include <vector>

#include "aof.hpp"
#include "commands.hpp"
#include "server_loop.hpp"
#include "store.hpp"

namespace conveyor::kv {

namespace {
using clock = std::chrono::steady_clock;

struct client {
  int fd = -1;
  session sess;
  request_parser parser;
  std::string out;
  std::size_t out_pos = 0;
  clock::time_point last_active;
  clock::time_point partial_since;
  bool partial = false;
  bool reading = true;    // EPOLLIN wanted
  bool want_out = false;  // EPOLLOUT wanted
  bool closing = false;   // close once the output is sent
  bool pending = false;   // in the pending-write list
  bool paused = false;    // complete commands held back by the output bound
  std::size_t mem = 0;    // buffer bytes counted in impl::client_mem
  // Parked by BLPOP/BRPOP (executor::blocking()): the command runs again when a
  // key it waits on is pushed to; the pipeline after it waits.
  bool blocked = false;
  std::vector<std::string> blocked_argv;
  explicit client(const parser_limits& l) : parser(l) {}
  std::size_t unsent() const { return out.size() - out_pos; }
};
}  // namespace

struct resp_server::impl {
  server_loop& loop;
  executor& exec;
  aof* log;
  resp_server_options opts;
  int listen_fd = -1;
  std::uint16_t bound_port = 0;
  std::unordered_map<std::uint64_t, std::unique_ptr<client>> clients;
  std::vector<std::uint64_t> pending;
  std::vector<std::string_view> argv;
  std::size_t client_mem = 0;  // every client's query and output buffers
  // Kept open so that a connection arriving while the process is out of file
  // descriptors can still be accepted, told why, and closed.
  int spare_fd = -1;
  bool accept_paused = false;
  clock::time_point accept_resume;

  impl(server_loop& l, executor& e, aof* a, const resp_server_options& o)
      : loop(l), exec(e), log(a), opts(o) {}

  void close_client(std::uint64_t id) {
    auto it = clients.find(id);
    if (it == clients.end()) return;
    client_mem -= it->second->mem;
    exec.blocking().remove(id);  // a client that leaves while blocked leaves nothing
    loop.remove_fd(it->second->fd);
    ::close(it->second->fd);
    clients.erase(it);
    --exec.stats().connections_current;
  }

  void account(client& c) {
    const std::size_t now = c.parser.memory() + c.out.capacity();
    client_mem = client_mem - c.mem + now;
    c.mem = now;
  }

  // While the clients' buffers together pass maxmemory_clients, closes the one
  // holding the most. False if `self` was closed.
  bool enforce_client_memory(std::uint64_t self) {
    bool self_open = true;
    while (opts.maxmemory_clients != 0 && client_mem > opts.maxmemory_clients) {
      std::uint64_t worst = 0;
      std::size_t most = 0;
      for (auto& [id, c] : clients)
        if (c->mem > most) {
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

  void update_events(client& c) {
    // EPOLLRDHUP only while reading: a half-closed peer would otherwise keep
    // the level-triggered event firing while reading is paused.
    unsigned ev = (c.reading ? EPOLLIN | EPOLLRDHUP : 0u) | (c.want_out ? EPOLLOUT : 0u);
    loop.modify_fd(c.fd, ev);
  }

  void mark_pending(std::uint64_t id, client& c) {
    if (!c.pending) {
      c.pending = true;
      pending.push_back(id);
    }
  }

  // Sends what it can; false if the client was closed.
  bool send(std::uint64_t id, client& c) {
    if (log != nullptr && log->pending()) log->flush();  // never a reply before its log record
    while (c.unsent() != 0) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.unsent(), MSG_NOSIGNAL);
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
      c.out.clear();
      c.out_pos = 0;
      if (c.out.capacity() > (1u << 20)) c.out.shrink_to_fit();
      if (c.closing) {
        close_client(id);
        return false;
      }
    } else if (c.out_pos > (1u << 20)) {
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
    bool want_out = c.unsent() != 0;
    bool reading = !c.closing && !c.paused && c.unsent() < opts.output_pause;
    if (want_out != c.want_out || reading != c.reading) {
      c.want_out = want_out;
      c.reading = reading;
      update_events(c);
    }
    return true;
  }

  void on_client(std::uint64_t id, unsigned events) {
    auto it = clients.find(id);
    if (it == clients.end()) return;
    client& c = *it->second;
    if ((events & (EPOLLHUP | EPOLLERR)) && !c.reading) {  // gone; its replies cannot arrive
      close_client(id);
      return;
    }
    try {
      if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        if (!on_readable(id, c)) return;
      }
      if (events & EPOLLOUT) send(id, c);
    } catch (const std::bad_alloc&) {
      // The connection's own buffers could not grow (a command's failure is
      // answered by the executor): this client goes, the server stays.
      if (opts.log)
        std::fprintf(stderr, "conveyor kv serve: closed client %llu: out of memory\n",
                     static_cast<unsigned long long>(id));
      close_client(id);
    }
  }

  // Runs the complete commands the parser holds, in order, until the output
  // reaches the pause mark: the rest waits in the parser (paused) until the
  // client has read its replies, so a pipeline of large replies holds about
  // output_pause bytes, not the sum of its replies.
  void process(client& c) {
    c.paused = false;
    bool completed = false;  // a command completed: the next one starts its clock now
    while (!c.closing && !c.blocked) {
      if (c.unsent() >= opts.output_pause) {
        c.paused = c.parser.buffered() != 0;
        break;
      }
      auto st = c.parser.next(argv);
      if (st == parse_status::need_more) break;
      if (st == parse_status::error) {
        reply(c.out, c.sess.resp).error("ERR " + c.parser.error());
        ++exec.stats().protocol_errors;
        c.closing = true;
        c.reading = false;
        update_events(c);
        break;
      }
      completed = true;
      if (argv.empty()) continue;
      // This command's reply may take what is left of the output limit.
      c.sess.max_reply = opts.output_limit > c.unsent() ? opts.output_limit - c.unsent() : 0;
      exec.execute(c.sess, argv, c.out);
      if (c.sess.blocked) {
        park(c);
        break;
      }
      if (c.sess.close_after_reply) {
        c.closing = true;
        c.reading = false;
        update_events(c);
      }
      if (exec.blocking().any_ready()) serve_blocked();
    }
    // Only an incomplete command counts against partial_timeout, and only from
    // when the command before it completed (a long pipeline whose reads end
    // mid-command is making progress); commands held back by the output bound
    // are the server's choice.
    bool partial = !c.paused && c.parser.partial();
    if (partial && completed)
      c.partial_since = clock::now();
    else if (partial && !c.partial)
      c.partial_since = c.last_active;
    c.partial = partial;
  }

  // ---- clients blocked by BLPOP/BRPOP --------------------------------------
  bool serving_blocked = false;

  void park(client& c) {
    c.sess.blocked = false;
    c.blocked = true;
    c.blocked_argv.assign(argv.begin(), argv.end());
    exec.blocking().add(c.sess.id, c.sess.block_keys, c.sess.block_deadline);
  }

  // The client's command has its answer (a reply or a timeout's): the
  // pipeline after it goes on.
  void unpark(client& c) {
    c.blocked = false;
    c.blocked_argv.clear();
    mark_pending(c.sess.id, c);
    process(c);
  }

  // Runs the parked commands of the clients waiting on ready keys, in arrival
  // order, until one finds its keys empty again (the rest keep waiting).
  void serve_blocked() {
    if (serving_blocked) return;  // the outer call drains what this one would
    serving_blocked = true;
    std::string key;
    std::vector<std::uint64_t> ids;
    std::vector<std::string_view> args;
    while (exec.blocking().next_ready(key, ids)) {
      for (auto id : ids) {
        auto it = clients.find(id);
        if (it == clients.end() || !it->second->blocked) continue;
        client& c = *it->second;
        args.assign(c.blocked_argv.begin(), c.blocked_argv.end());
        c.sess.max_reply = opts.output_limit > c.unsent() ? opts.output_limit - c.unsent() : 0;
        exec.execute(c.sess, args, c.out);
        if (c.sess.blocked) {  // empty again: still waiting, in its place
          c.sess.blocked = false;
          break;
        }
        exec.blocking().remove(id);
        unpark(c);
      }
    }
    serving_blocked = false;
  }

  void expire_blocked() {
    for (auto id : exec.blocking().expired(now_ms())) {
      auto it = clients.find(id);
      if (it == clients.end() || !it->second->blocked) continue;
      reply(it->second->out, it->second->sess.resp).null_array();
      unpark(*it->second);
    }
  }

  // Reads and runs what arrived; false if the client was closed.
  bool on_readable(std::uint64_t id, client& c) {
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

  static void refuse(int fd) {
    static constexpr char msg[] = "-ERR max number of clients reached\r\n";
    [[maybe_unused]] auto r = ::send(fd, msg, sizeof msg - 1, MSG_NOSIGNAL);
    ::close(fd);
  }

  int accept_one() {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    return ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
  }

  // Out of file descriptors: the waiting connection stays in the backlog and
  // the level-triggered listener stays readable, so returning would spin. The
  // spare descriptor makes room to accept it and say why it is refused; if
  // that fails too, the listener is left alone until sweep() resumes it.
  bool refuse_without_fds() {
    if (spare_fd >= 0) {
      ::close(spare_fd);
      spare_fd = -1;
      int fd = accept_one();
      if (fd >= 0) {
        ++exec.stats().connections_total;
        ++exec.stats().rejected_connections;
        refuse(fd);
      }
      spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd >= 0) return true;
    }
    accept_paused = true;
    accept_resume = clock::now() + std::chrono::milliseconds(250);
    loop.modify_fd(listen_fd, 0);
    return false;
  }

  void on_accept() {
    // Bounded per readiness, so a connection flood cannot hold the loop.
    for (int n = 0; n < 512; ++n) {
      int fd = accept_one();
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          if (refuse_without_fds()) continue;
          return;
        }
        if (errno == ENOBUFS || errno == ENOMEM) refuse_without_fds();
        return;  // EAGAIN: nothing more waits
      }
      ++exec.stats().connections_total;
      if (clients.size() >= opts.maxclients) {
        ++exec.stats().rejected_connections;
        refuse(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<client>(opts.limits);
      c->fd = fd;
      c->sess.id = exec.next_client_id();
      c->sess.may_block = true;
      c->last_active = clock::now();
      std::uint64_t id = c->sess.id;
      try {
        loop.add_fd(fd, EPOLLIN | EPOLLRDHUP, [this, id](unsigned ev) { on_client(id, ev); });
      } catch (const std::system_error&) {
        ::close(fd);
        continue;
      }
      clients.emplace(id, std::move(c));
      ++exec.stats().connections_current;
    }
  }

  void before_wait() {
    // Pushes by any path (an RDMA RPC, a script) wake the clients they unblock.
    if (exec.blocking().any_ready()) serve_blocked();
    if (pending.empty()) {
      if (log != nullptr && log->pending()) log->flush();
      return;
    }
    if (log != nullptr && log->pending()) log->flush();
    auto ids = std::move(pending);
    pending.clear();
    for (auto id : ids) {
      auto it = clients.find(id);
      if (it == clients.end()) continue;
      it->second->pending = false;
      send(id, *it->second);
    }
  }

  void sweep() {
    auto now = clock::now();
    if (accept_paused && now >= accept_resume) {
      accept_paused = false;
      loop.modify_fd(listen_fd, EPOLLIN);
    }
    std::vector<std::uint64_t> doomed;
    for (auto& [id, c] : clients) {
      if (c->partial && now - c->partial_since > opts.partial_timeout)
        doomed.push_back(id);
      else if (opts.idle_timeout.count() > 0 && now - c->last_active > opts.idle_timeout &&
               c->unsent() == 0 && !c->blocked)
        doomed.push_back(id);
    }
    for (auto id : doomed) {
      ++exec.stats().timed_out_clients;
      close_client(id);
    }
  }
};

resp_server::resp_server(server_loop& loop, executor& exec, aof* log,
                         const resp_server_options& opts)
    : p_(std::make_unique<impl>(loop, exec, log, opts)) {}

resp_server::~resp_server() {
  std::vector<std::uint64_t> ids;
  for (auto& [id, c] : p_->clients) ids.push_back(id);
  for (auto id : ids) p_->close_client(id);
  if (p_->listen_fd >= 0) {
    p_->loop.remove_fd(p_->listen_fd);
    ::close(p_->listen_fd);
  }
  if (p_->spare_fd >= 0) ::close(p_->spare_fd);
}

bool resp_server::listen(std::string& why) {
  sockaddr_storage ss{};
  socklen_t len;
  int family;
  const auto& b = p_->opts.bind;
  if (b.find(':') != std::string::npos) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(p_->opts.port);
    if (::inet_pton(AF_INET6, b.c_str(), &a6->sin6_addr) != 1) {
      why = "bad bind address " + b;
      return false;
    }
    len = sizeof *a6;
    family = AF_INET6;
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(p_->opts.port);
    std::string host = b == "localhost" ? "127.0.0.1" : b;
    if (::inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1) {
      why = "bad bind address " + b + " (an IPv4 or IPv6 address)";
      return false;
    }
    len = sizeof *a4;
    family = AF_INET;
  }
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 511) != 0) {
    why = "listening on " + b + ":" + std::to_string(p_->opts.port) + ": " + std::strerror(errno);
    ::close(fd);
    return false;
  }
  sockaddr_storage got{};
  socklen_t glen = sizeof got;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&got), &glen);
  p_->bound_port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  p_->listen_fd = fd;
  p_->spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  p_->loop.add_fd(fd, EPOLLIN, [this](unsigned) { p_->on_accept(); });
  p_->loop.before_wait([this] { p_->before_wait(); });
  p_->loop.every(std::chrono::milliseconds(250), [this] { p_->sweep(); });
  // BLPOP/BRPOP deadlines, to within 10 ms.
  p_->loop.every(std::chrono::milliseconds(10), [this] { p_->expire_blocked(); });
  return true;
}

std::uint16_t resp_server::port() const noexcept {
  return p_->bound_port;
}
std::size_t resp_server::clients() const noexcept {
  return p_->clients.size();
}

}  // namespace conveyor::kv
