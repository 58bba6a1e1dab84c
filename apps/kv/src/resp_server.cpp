// The TCP front end (resp_server.hpp).
#include "resp_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "aof.hpp"
#include "commands.hpp"
#include "pubsub.hpp"
#include "script.hpp"
#include "server_loop.hpp"
#include "store.hpp"

namespace conveyor::kv {

namespace {
using clock = std::chrono::steady_clock;

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

struct client {
  int fd = -1;
  session sess;
  request_parser parser;
  std::string out;
  std::size_t out_pos = 0;
  clock::time_point last_active;
  clock::time_point partial_since;
  bool partial = false;
  bool reading = true;            // EPOLLIN wanted
  bool want_out = false;          // EPOLLOUT wanted
  bool closing = false;           // close once the output is sent
  bool pending = false;           // in the pending-write list
  bool paused = false;            // complete commands held back by the output bound
  std::vector<std::string> held;  // a command held back by CLIENT PAUSE
  clock::time_point soft_since;   // pubsub: above the soft output limit since then
  bool over_soft = false;
  std::size_t mem = 0;  // buffer bytes counted in impl::client_mem
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
  // The executor's AOF (set once it is open: the ports are bound before the replay).
  aof* log() { return exec.log_file(); }
  resp_server_options opts;
  int listen_fd = -1;
  std::uint16_t bound_port = 0;
  std::unordered_map<std::uint64_t, std::unique_ptr<client>> clients;
  std::vector<std::uint64_t> pending;
  std::vector<std::uint64_t>
      doomed;                    // closed at the next before_wait (killed, over a pubsub limit)
  std::set<std::uint64_t> held;  // clients with a command held by CLIENT PAUSE
  std::vector<std::string_view> argv;
  // The client whose command is executing (0: none). A long script serves the
  // other clients from inside it (server_loop::serve_ready_now): this one is
  // neither read, sent to nor closed until its command returns, and commands
  // run meanwhile parse into their own argv.
  std::uint64_t running = 0;
  std::size_t client_mem = 0;  // every client's query and output buffers
  // Kept open so that a connection arriving while the process is out of file
  // descriptors can still be accepted, told why, and closed.
  int spare_fd = -1;
  bool accept_paused = false;
  clock::time_point accept_resume;

  impl(server_loop& l, executor& e, aof* a, const resp_server_options& o)
      : loop(l), exec(e), opts(o) {
    (void)a;
  }

  void close_client(std::uint64_t id) {
    auto it = clients.find(id);
    if (it == clients.end()) return;
    client_mem -= it->second->mem;
    exec.forget(it->second->sess);
    exec.blocking().remove(id);  // a client that leaves while blocked leaves nothing
    loop.remove_fd(it->second->fd);
    ::close(it->second->fd);
    clients.erase(it);
    --exec.stats().connections_current;
  }

  void account(client& c) {
    // A transaction's queue and its watched keys count too (maxmemory-clients).
    const std::size_t now =
        c.parser.memory() + c.out.capacity() + c.sess.queued_bytes + c.sess.watched_bytes;
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
    if (log() != nullptr && log()->pending())
      log()->flush();  // never a reply before its log record
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

  // Runs the complete commands the parser holds, in order, until the output
  // reaches the pause mark: the rest waits in the parser (paused) until the
  // client has read its replies, so a pipeline of large replies holds about
  // output_pause bytes, not the sum of its replies.
  void process(client& c) {
    std::vector<std::string_view> nested_argv;  // a command run while another executes
    auto& args = running != 0 ? nested_argv : argv;
    if (!c.held.empty()) {
      std::vector<std::string_view> h(c.held.begin(), c.held.end());
      if (exec.paused_for(c.sess, h, now_ms())) {
        held.insert(c.sess.id);
        c.paused = true;
        return;
      }
      c.sess.max_reply = opts.output_limit > c.unsent() ? opts.output_limit - c.unsent() : 0;
      const auto outer = running;
      running = c.sess.id;
      exec.execute(c.sess, h, c.out);
      running = outer;
      if (c.sess.blocked) park(c, h);  // a held BLPOP that must wait
      c.held.clear();
      if (c.blocked) return;
      if (c.sess.close_after_reply) {
        c.closing = true;
        c.reading = false;
        update_events(c);
        c.paused = false;
        return;
      }
    }
    c.paused = false;
    bool completed = false;  // a command completed: the next one starts its clock now
    while (!c.closing && !c.blocked) {
      if (c.unsent() >= opts.output_pause) {
        c.paused = c.parser.buffered() != 0;
        break;
      }
      auto st = c.parser.next(args);
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
      if (args.empty()) continue;
      if (exec.paused_for(c.sess, args, now_ms())) {  // CLIENT PAUSE: held until it ends
        c.held.assign(args.begin(), args.end());
        held.insert(c.sess.id);
        c.paused = true;
        break;
      }
      // This command's reply may take what is left of the output limit.
      c.sess.max_reply = opts.output_limit > c.unsent() ? opts.output_limit - c.unsent() : 0;
      const auto outer = running;
      running = c.sess.id;
      exec.execute(c.sess, args, c.out);
      running = outer;
      if (c.sess.blocked) {
        park(c, args);
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

  void park(client& c, std::span<const std::string_view> command) {
    c.sess.blocked = false;
    c.blocked = true;
    c.blocked_argv.assign(command.begin(), command.end());
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
    // A script serving the others from its hook (busy): they wait for its end,
    // as every other command does (the keys stay ready until then).
    if (exec.scripts().busy()) return;
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
        const auto outer = running;
        running = c.sess.id;
        exec.execute(c.sess, args, c.out);
        running = outer;
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
    if (exec.scripts().busy()) return;
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

  int accept_one(sockaddr_storage* peer_out = nullptr) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (peer_out) *peer_out = peer;
    return fd;
  }

  static std::string address_of(const sockaddr_storage& a) {
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

  static bool loopback(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET)
      return (ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
    if (a.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
      if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
      return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
    }
    return a.ss_family == AF_UNIX;
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

  // ---- what the commands ask of the front end (front_end_hooks) ----------------

  // A pub/sub message or MONITOR line for client `id`. A subscriber past its
  // hard output limit, or past the soft one for longer than its seconds, is
  // closed (Redis's client-output-buffer-limit pubsub); a monitor past the
  // output limit of every client likewise. The close happens at the next
  // before_wait, never inside the publisher's command.
  void deliver(std::uint64_t id, std::string_view bytes) {
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

  bool over_output_limit(client& c, clock::time_point now) {
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

  void doom(std::uint64_t id, client& c) {
    c.closing = true;
    c.reading = false;
    doomed.push_back(id);
  }

  void list_clients(std::string& out, std::uint64_t only) {
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
  std::size_t kill(const std::function<bool(const session&)>& match) {
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

  void resume_held() {
    if (held.empty()) return;
    auto ids = std::move(held);
    held.clear();
    for (auto id : ids) {
      auto it = clients.find(id);
      if (it == clients.end()) continue;
      client& c = *it->second;
      process(c);
      mark_pending(id, c);
    }
  }

  void before_wait() {
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

  void sweep() {
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
};

resp_server::resp_server(server_loop& loop, executor& exec, aof* log,
                         const resp_server_options& opts)
    : p_(std::make_unique<impl>(loop, exec, log, opts)) {}

resp_server::~resp_server() {
  auto& h = p_->exec.hooks();
  h.deliver = nullptr;
  h.list_clients = nullptr;
  h.kill = nullptr;
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
  p_->loop.every(std::chrono::milliseconds(10), [this] { p_->resume_held(); });
  auto& h = p_->exec.hooks();
  h.deliver = [this](std::uint64_t id, std::string_view bytes) { p_->deliver(id, bytes); };
  h.list_clients = [this](std::string& out, std::uint64_t only) { p_->list_clients(out, only); };
  h.kill = [this](const std::function<bool(const session&)>& m) { return p_->kill(m); };
  h.blocked_clients = [this] { return p_->exec.blocking().blocked(); };  // INFO clients
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
