// The TCP front end (resp_server.hpp; its state is resp_server_impl.hpp's):
// listening and accepting (maxclients, protected mode, out of file
// descriptors), the loop's events for each connection, and what the front end
// does on the loop each iteration (sends, closes) and on its timers (timeouts,
// the accept pause).
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
#include <system_error>

#include "aof.hpp"
#include "resp_server_impl.hpp"
#include "server_loop.hpp"
#include "store.hpp"  // now_ms

namespace conveyor::kv {

namespace {
constexpr std::string_view denied =
    "-DENIED Redis is running in protected mode because protected mode is enabled and no password "
    "is set for the default user. In this mode connections are only accepted from the loopback "
    "interface. If you want to connect from external computers to Redis you may adopt one of the "
    "following solutions: 1) Just disable protected mode sending the command 'CONFIG SET "
    "protected-mode no' from the loopback interface by connecting to Redis from the same host the "
    "server is running, however MAKE SURE Redis is not publicly accessible from internet if you do "
    "so. Use CONFIG REWRITE to make this change permanent. 2) Alternatively you can just disable "
    "the protected mode by editing the Redis configuration file, and setting the protected mode "
    "option to 'no', and then restarting the server. 3) If you started the server manually just "
    "for testing, restart it with the '--protected-mode no' option. 4) Setup a an authentication "
    "password for the default user. NOTE: You only need to do one of the above things in order for "
    "the server to start accepting connections from the outside.\r\n";

void refuse(int fd) {
  static constexpr char msg[] = "-ERR max number of clients reached\r\n";
  [[maybe_unused]] auto r = ::send(fd, msg, sizeof msg - 1, MSG_NOSIGNAL);
  ::close(fd);
}

std::string address_of(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

bool loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return a.ss_family == AF_UNIX;
}

}  // namespace

int resp_server::impl::accept_one(sockaddr_storage* peer_out) {
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  int fd =
      ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (peer_out) *peer_out = peer;
  return fd;
}

// Out of file descriptors: the waiting connection stays in the backlog and
// the level-triggered listener stays readable, so returning would spin. The
// spare descriptor makes room to accept it and say why it is refused; if
// that fails too, the listener is left alone until sweep() resumes it.
bool resp_server::impl::refuse_without_fds() {
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

void resp_server::impl::on_accept() {
  // Bounded per readiness, so a connection flood cannot hold the loop.
  for (int n = 0; n < 512; ++n) {
    sockaddr_storage peer{};
    int fd = accept_one(&peer);
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
    if (exec.config().protected_mode && exec.config().requirepass.empty() && !loopback(peer)) {
      // Redis's protected mode: no password and a client from elsewhere.
      ++exec.stats().rejected_connections;
      [[maybe_unused]] auto r = ::send(fd, denied.data(), denied.size(), MSG_NOSIGNAL);
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<client>(opts.limits);
    c->fd = fd;
    c->sess.id = exec.next_client_id();
    c->sess.resp_client = true;
    c->sess.addr = address_of(peer);
    sockaddr_storage local{};
    socklen_t llen = sizeof local;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0)
      c->sess.laddr = address_of(local);
    c->sess.created_ms = now_ms();
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

void resp_server::impl::on_client(std::uint64_t id, unsigned events) {
  auto it = clients.find(id);
  if (it == clients.end() || id == running) return;
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

void resp_server::impl::before_wait() {
  // Pushes by any path (an RDMA RPC, a script, EXEC) wake the clients they unblock.
  if (exec.blocking().any_ready()) serve_blocked();
  if (!doomed.empty()) {
    auto ids = std::move(doomed);
    doomed.clear();
    for (auto id : ids) {
      if (clients.count(id) == 0) continue;
      if (id == running) {  // its command is still executing (a script serving others)
        doomed.push_back(id);
        continue;
      }
      close_client(id);
    }
  }
  if (pending.empty()) {
    if (log() != nullptr && log()->pending()) log()->flush();
    return;
  }
  if (log() != nullptr && log()->pending()) log()->flush();
  auto ids = std::move(pending);
  pending.clear();
  for (auto id : ids) {
    auto it = clients.find(id);
    if (it == clients.end()) continue;
    if (id == running) {  // its command is still executing: after it returns
      pending.push_back(id);
      continue;
    }
    it->second->pending = false;
    send(id, *it->second);
  }
}

void resp_server::impl::sweep() {
  auto now = clock::now();
  if (accept_paused && now >= accept_resume) {
    accept_paused = false;
    loop.modify_fd(listen_fd, EPOLLIN);
  }
  std::vector<std::uint64_t> gone;
  const std::chrono::seconds idle(exec.config().timeout_s);  // CONFIG SET timeout applies at once
  for (auto& [id, c] : clients) {
    if (c->closing && !c->reading) continue;
    const bool subscriber = !c->sess.channels.empty() || !c->sess.patterns.empty();
    if (c->partial && now - c->partial_since > opts.partial_timeout)
      gone.push_back(id);
    else if (idle.count() > 0 && now - c->last_active > idle && c->unsent() == 0 && !subscriber &&
             !c->sess.monitor &&
             !c->blocked)  // as Redis: pub/sub, MONITOR and blocked clients stay
      gone.push_back(id);
    else if (subscriber && c->unsent() != 0 && over_output_limit(*c, now)) {
      ++exec.stats().output_limit_closes;
      doom(id, *c);
    }
  }
  for (auto id : gone) {
    ++exec.stats().timed_out_clients;
    close_client(id);
  }
}

resp_server::resp_server(server_loop& loop, executor& exec, const resp_server_options& opts)
    : p_(std::make_unique<impl>(loop, exec, opts)) {}

resp_server::~resp_server() {
  for (auto id : p_->loop_callbacks) p_->loop.cancel(id);
  auto& h = p_->exec.hooks();
  h.deliver = nullptr;
  h.list_clients = nullptr;
  h.kill = nullptr;
  h.blocked_clients = nullptr;
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
  auto& cbs = p_->loop_callbacks;
  cbs.push_back(p_->loop.before_wait([this] { p_->before_wait(); }));
  cbs.push_back(p_->loop.every(std::chrono::milliseconds(250), [this] { p_->sweep(); }));
  cbs.push_back(p_->loop.every(std::chrono::milliseconds(10), [this] { p_->resume_held(); }));
  auto& h = p_->exec.hooks();
  h.deliver = [this](std::uint64_t id, std::string_view bytes) { p_->deliver(id, bytes); };
  h.list_clients = [this](std::string& out, std::uint64_t only) { p_->list_clients(out, only); };
  h.kill = [this](const std::function<bool(const session&)>& m) { return p_->kill(m); };
  h.blocked_clients = [this] { return p_->exec.blocking().blocked(); };  // INFO clients
  // BLPOP/BRPOP deadlines, to within 10 ms.
  cbs.push_back(p_->loop.every(std::chrono::milliseconds(10), [this] { p_->expire_blocked(); }));
  return true;
}

std::uint16_t resp_server::port() const noexcept {
  return p_->bound_port;
}
std::size_t resp_server::clients() const noexcept {
  return p_->clients.size();
}
void resp_server::replicated() {
  p_->replicated();
}

}  // namespace conveyor::kv
