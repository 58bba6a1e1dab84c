// handshake.cpp — a pair's connection setup: the lower rank's listeners (soft,
// shm, verbs) and its checks of each connection request, the higher rank's
// hello, the choice of provider both sides make from the two addresses.
// docs/GLOO.md ("Connection setup", "What a local process or peer is trusted
// with"); auth.hpp has the MACs, wire.hpp the hello.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "auth.hpp"
#include "log.hpp"
#include "pair.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {
namespace {

// What a connection negotiated, for CONVEYOR_GLOO_DEBUG=INFO's line.
std::string describe(const conveyor::qp_connection_attr& a) {
  std::string s = "local " + a.local_address + ", peer " + a.peer_address + ", ird " +
                  std::to_string(a.ird) + " ord " + std::to_string(a.ord);
  if (a.iwarp)
    s += ", MPA rev " + std::to_string(a.iwarp->mpa_revision) + " CRC " +
         (a.iwarp->crc ? "on" : "off") + " MSS " + std::to_string(a.iwarp->mss);
  if (a.shm) s += ", " + a.shm->data_path + (a.shm->direct_mapping ? ", direct mapping" : "");
  if (a.verbs) s += ", path MTU " + std::to_string(a.verbs->path_mtu);
  return s;
}

// A pair's listener expects one peer: complete connection requests beyond
// this many wait for accept() are refused ("listener busy"; the real peer
// retries). Half-open ones are bounded by the device (max_pending_handshakes,
// handshake_timeout_ms).
constexpr int listen_backlog = 16;
// Refused connections a pair's listener logs one line each for; later ones
// are counted and reported once the pair connects.
constexpr unsigned max_refusals_logged = 8;

// The uid a process runs as (the owner of /proc/<pid>), or nullopt when its
// pid is unknown or not visible from here (another pid namespace).
std::optional<uid_t> uid_of_pid(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) return std::nullopt;
  return st.st_uid;
}

// shm names its peers "pid <pid> qp <qpn>" (SO_PEERCRED's pid): 0 if not that.
pid_t shm_peer_pid(const std::string& peer) {
  unsigned long pid = 0, qpn = 0;
  if (std::sscanf(peer.c_str(), "pid %lu qp %lu", &pid, &qpn) != 2 || pid > 0x7fffffff) return 0;
  return pid_t(pid);
}

}  // namespace

Pair::Pair(Context& ctx, int peer) : ctx_(ctx), peer_(peer) {
  peer_name_ = "rank " + std::to_string(peer);
  auto& dev = *ctx.device_;
  wire::address a;
  a.rank = std::uint32_t(ctx.rank);
  std::memcpy(a.host_id, dev.host_id(), sizeof a.host_id);
  a.forced = dev.forced_base();
  if (ctx.rank < peer) {  // the lower rank accepts, the higher connects
    // The pair's secret and the acceptor's challenge: they reach the peer
    // through the rendezvous store only (never a name, never a log line).
    if (!auth::random_bytes(a.key, sizeof a.key) || !auth::random_bytes(a.nonce, sizeof a.nonce))
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: no random bytes for the pair's key");
    if (auto* p = dev.find("soft")) {
      auto l = conveyor::listener::bind(p->dev, dev.ip() + ":0", listen_backlog);
      if (!l) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: soft listen: ", l.error().to_string());
      a.soft = l->address();
      soft_lis_ = std::move(*l);
    }
    if (auto* p = dev.find("shm")) {
      // A random name unrelated to the key: abstract socket names are public
      // (/proc/net/unix). Another bind of the same name fails; try again.
      for (int attempt = 0; attempt < 4 && a.shm.empty(); ++attempt) {
        std::uint8_t r[8];
        if (!auth::random_bytes(r, sizeof r)) break;
        char name[32];
        std::snprintf(name, sizeof name, "@cvgloo-%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1],
                      r[2], r[3], r[4], r[5], r[6], r[7]);
        auto l = conveyor::listener::bind(p->dev, name, listen_backlog);
        if (l) {
          a.shm = name;
          shm_lis_ = std::move(*l);
        }
      }
    }
    if (auto* p = dev.find("verbs")) {
      auto l = conveyor::listener::bind(p->dev, dev.ip() + ":0", listen_backlog);
      if (!l) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: verbs listen: ", l.error().to_string());
      a.verbs = l->address();
      verbs_lis_ = std::move(*l);
    }
  }
  self_ = std::make_unique<Address>(std::move(a));
}

// A fresh QP on the context's shared completion queue of this provider (the
// first call reserves the pair's room in it). A replaced QP leaves the
// poller's map first, and its work requests carry the old serial, so its
// flushes are dropped rather than taken for the new connection's.
void Pair::make_qp() {
  {
    std::lock_guard g(ctx_.mu_);
    leave_poller();
    if (poller_ && poller_->dead) {
      Context::release(*poller_);
      poller_ = nullptr;
    }
    if (!poller_) poller_ = &ctx_.poller_for(*prov_);
    serial_ = ctx_.next_serial_++;
    early_.clear();
  }
  qp_ = {};
  conveyor::qp_init_attr qa;
  qa.send_cq = &poller_->cq;
  qa.recv_cq = &poller_->cq;
  qa.cap.max_send_wr = sq_depth;
  qa.cap.max_recv_wr = recv_depth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = 0;  // never used: small payloads go through staging
  auto qp = prov_->pd.create_qp(qa);
  if (!qp) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: create_qp: ", qp.error().to_string());
  qp_ = std::move(*qp);
  {
    std::lock_guard g(ctx_.mu_);
    qpn_ = qp_.qp_num();
    poller_->by_qp[qpn_] = {this, serial_};
  }
  for (std::uint32_t i = 0; i < recv_depth; ++i) {
    auto s = qp_.post_recv(recv_mem_.slice(i * staging_size, staging_size),
                           make_wr(wr_kind::recv, serial_, i));
    if (s != conveyor::errc::ok)
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: post_recv: ", conveyor::to_string(s));
  }
}

// A pair that cannot connect is the failure users most need to see (torch
// may report only the first rank's exception, or none while others wait):
// each rank names its side on stderr whatever CONVEYOR_GLOO_DEBUG says.
void Pair::connect(const std::vector<char>& bytes) {
  try {
    establish(bytes);
  } catch (const std::exception& e) {
    log_line(log_level::error, "rank " + std::to_string(ctx_.rank) + ": connecting to rank " +
                                   std::to_string(peer_) + " failed: " + e.what());
    throw;
  }
}

void Pair::establish(const std::vector<char>& bytes) {
  auto pa = wire::decode_address(bytes);
  if (!pa || int(pa->rank) != peer_)
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: malformed address for rank ", peer_);
  auto& dev = *ctx_.device_;
  if (pa->forced != dev.forced_base())
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: CONVEYOR_GLOO_DEVICE differs: rank ",
                                           ctx_.rank, " '", dev.forced_base(), "', rank ", peer_,
                                           " '", pa->forced, "'");
  std::string kind = dev.forced_base();
  bool same_host = std::memcmp(pa->host_id, dev.host_id(), sizeof pa->host_id) == 0;
  bool lower = ctx_.rank < peer_;
  const wire::address& acceptor = lower ? self_->value() : *pa;
  if (kind.empty()) kind = (same_host && !acceptor.shm.empty() && dev.find("shm")) ? "shm" : "soft";
  prov_ = dev.find(kind);
  if (!prov_) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: provider ", kind, " not available");
  const std::string& target = kind == "shm"    ? acceptor.shm
                              : kind == "soft" ? acceptor.soft
                                               : acceptor.verbs;
  if (target.empty())
    GLOO_THROW_IO_EXCEPTION("conveyor-gloo: rank ", lower ? ctx_.rank : peer_, " has no ", kind,
                            " listener");
  // A loopback address reaches this host, not the peer's: say so now rather
  // than time out (or reach whatever listens there).
  if (!same_host && kind != "shm" && loopback_target(target))
    GLOO_THROW_IO_EXCEPTION("conveyor-gloo: rank ", lower ? ctx_.rank : peer_,
                            " is on another host but listens on a loopback address (", target,
                            "): choose its network with GLOO_SOCKET_IFNAME (or the host name "
                            "it advertises)");

  auto rm = prov_->pd.allocate_memory(staging_size * recv_depth, conveyor::access::local_write);
  auto sm = prov_->pd.allocate_memory(staging_size * recv_depth, conveyor::access::local_write);
  if (!rm || !sm) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: cannot allocate staging memory");
  recv_mem_ = std::move(*rm);
  send_mem_ = std::move(*sm);
  staging_.assign(recv_depth, {});
  free_staging_.clear();
  for (std::uint32_t i = recv_depth; i-- > 0;) free_staging_.push_back(i);
  if (prov_->dev.attr().max_msg_size > 0)
    max_write_ = std::min<std::uint32_t>(max_write_, prov_->dev.attr().max_msg_size);

  auto deadline = clock_type::now() + ctx_.getTimeout();
  auto remaining = [&] {
    return std::max(
        1ms, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()));
  };
  std::string last;
  auto attr = lower ? accept_peer(kind, target, deadline, remaining, last)
                    : connect_peer(*pa, target, deadline, remaining, last);
  soft_lis_ = {};
  shm_lis_ = {};
  verbs_lis_ = {};
  peer_name_ = "rank " + std::to_string(peer_) + " (" + kind + " " + target + ")";
  {
    // From now on the context's progress thread handles this pair's
    // completions as they come; those that came before, now.
    std::lock_guard g(ctx_.mu_);
    credits_ = recv_depth;
    connected_ = true;
    if (same_host) ctx_.local_peers_.fetch_add(1, std::memory_order_relaxed);
    auto early = std::move(early_);
    early_.clear();
    for (auto& wc : early) handle(wc);
    pump();
  }
  if (log_enabled(log_level::info))
    log_line(log_level::info, "rank " + std::to_string(ctx_.rank) + " <-> rank " +
                                  std::to_string(peer_) + ": connected over " + kind + " (" +
                                  (lower ? "accepted on " : "to ") + target + "); " +
                                  describe(attr));
}

// The lower rank's side of the handshake. Every connection request is checked
// before anything is set up for it: a hello from the peer rank whose MAC
// proves the pair's key over this side's nonce and the peer's (and, on shm,
// a process of this user). Anything else is refused and logged, and the
// listener goes on waiting for the real peer until the deadline.
template <class Remaining>
conveyor::qp_connection_attr Pair::accept_peer(const std::string& kind, const std::string& target,
                                               clock_type::time_point deadline, Remaining remaining,
                                               std::string& last) {
  auto& lis = kind == "shm" ? shm_lis_ : kind == "soft" ? soft_lis_ : verbs_lis_;
  const wire::address& me = self_->value();
  unsigned refused = 0;
  bool need_qp = true;
  conveyor::qp_connection_attr attr;
  while (true) {
    if (clock_type::now() >= deadline)
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: waiting for rank ", peer_, " on ", target,
                              " timed out after ", ctx_.getTimeout().count(), "ms: ", last);
    if (need_qp) {
      make_qp();
      need_qp = false;
    }
    auto req = lis.accept(std::min<std::chrono::milliseconds>(remaining(), 1000ms));
    if (!req) {
      last = req.error().to_string();
      continue;
    }
    std::string peer = req->peer_address();
    auto pd = req->private_data();
    auto h = wire::decode_hello(pd.data(), pd.size());
    std::string why;
    if (!h) {
      why = "not a conveyor-gloo hello";
    } else if (h->from_rank != std::uint32_t(peer_) || h->to_rank != std::uint32_t(ctx_.rank)) {
      why = "claims rank " + std::to_string(h->from_rank) + " -> " + std::to_string(h->to_rank);
    } else if (!auth::verify(auth::compute(me.key, auth::role::hello, h->from_rank, h->to_rank,
                                           me.nonce, h->nonce),
                             h->mac)) {
      why = "claims rank " + std::to_string(peer_) + " without the pair's key";
    } else if (kind == "shm") {
      auto uid = uid_of_pid(shm_peer_pid(peer));
      if (uid && *uid != ::geteuid())
        why = "runs as uid " + std::to_string(*uid) + ", not " + std::to_string(::geteuid());
    }
    if (!why.empty()) {
      // The same reason for every refusal: the peer learns nothing about which check failed.
      (void)req->reject("conveyor-gloo: authentication failed");
      last = "refused " + peer + ": " + why;
      if (++refused <= max_refusals_logged)
        log_line(log_level::warn, "rank " + std::to_string(ctx_.rank) +
                                      " refused a connection on " + target + " from " + peer +
                                      ": " + why);
      if (refused == max_refusals_logged)
        log_line(log_level::warn, "rank " + std::to_string(ctx_.rank) + ": further refusals on " +
                                      target + " are counted, not logged");
      continue;
    }
    wire::hello_reply r;
    r.rank = std::uint32_t(ctx_.rank);
    auto m = auth::compute(me.key, auth::role::reply, h->from_rank, h->to_rank, me.nonce, h->nonce);
    std::memcpy(r.mac, m.data(), m.size());
    auto info = req->accept(qp_, wire::encode(r));
    if (!info) {
      last = info.error().to_string();
      need_qp = true;  // the QP may have gone to error
      continue;
    }
    attr = std::move(info->attr);
    break;
  }
  if (refused > max_refusals_logged)
    log_line(log_level::warn, "rank " + std::to_string(ctx_.rank) + " refused " +
                                  std::to_string(refused) + " connections on " + target +
                                  " in all");
  return attr;
}

// The higher rank's side: a hello with a fresh nonce and its MAC; the reply
// must prove the key over both nonces too. Busy or not yet listening: try
// again until the deadline; refused for authentication: the ranks do not share
// the pair's key (mixed versions), which no retry mends.
template <class Remaining>
conveyor::qp_connection_attr Pair::connect_peer(const wire::address& acceptor,
                                                const std::string& target,
                                                clock_type::time_point deadline,
                                                Remaining remaining, std::string& last) {
  while (true) {
    if (clock_type::now() >= deadline)
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: connecting to rank ", peer_, " (", target,
                              ") timed out after ", ctx_.getTimeout().count(), "ms: ", last);
    make_qp();
    wire::hello h;
    h.from_rank = std::uint32_t(ctx_.rank);
    h.to_rank = std::uint32_t(peer_);
    if (!auth::random_bytes(h.nonce, sizeof h.nonce))
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: no random bytes for the handshake's nonce");
    auto m = auth::compute(acceptor.key, auth::role::hello, h.from_rank, h.to_rank, acceptor.nonce,
                           h.nonce);
    std::memcpy(h.mac, m.data(), m.size());
    auto priv = wire::encode(h);
    auto info = conveyor::connect(qp_, target, {.private_data = priv, .timeout = remaining()});
    if (!info) {
      last = info.error().to_string();
      if (info.error().code == conveyor::errc::rejected &&
          last.find("conveyor-gloo: authentication failed") != std::string::npos)
        GLOO_THROW_IO_EXCEPTION("conveyor-gloo: rank ", peer_, " refused: ", last);
      std::this_thread::sleep_for(10ms);
      continue;
    }
    auto r = wire::decode_reply(info->private_data.data(), info->private_data.size());
    if (!r || r->rank != std::uint32_t(peer_) ||
        !auth::verify(auth::compute(acceptor.key, auth::role::reply, h.from_rank, h.to_rank,
                                    acceptor.nonce, h.nonce),
                      r->mac)) {
      qp_.disconnect();
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: ", target, " answered as rank ", peer_,
                              " without the pair's key");
    }
    return std::move(info->attr);
  }
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
