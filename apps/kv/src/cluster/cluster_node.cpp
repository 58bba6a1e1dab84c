// A server's membership in the cluster (cluster_node.hpp).
#include "cluster/cluster_node.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "cluster/etcd.hpp"

namespace conveyor::kv::cluster {

namespace {

using steady = std::chrono::steady_clock;
using namespace std::chrono_literals;

}  // namespace

struct cluster_node::state {
  node_options opts;
  std::string id;
  std::string boot_id;
  std::unique_ptr<etcd_coord> etcd;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;                // under mu
  std::optional<offset_report> report;  // under mu: to publish
  // Under mu: the sequence number of the last report queued, and of the
  // last one in etcd (publish_offset waits for it).
  std::uint64_t report_seq = 0, published_seq = 0;
  // under mu: the isr changes to write, in order (replica, add or remove);
  // at most one per replica (a later request replaces an earlier one).
  std::vector<std::pair<std::string, bool>> isr_changes;
  std::optional<std::string> handover_to;  // under mu: the hand-over's CAS to write
  // The node's thread only: the map delivered last, and the revision of the
  // last hand-over request acted on.
  std::shared_ptr<const cluster_view> view;
  std::int64_t handover_rev = 0;
  std::atomic<bool> controlling{false};
  std::atomic<std::int64_t> lease{0};
  // The lease's renewals run on their own thread (keeper), so that a slow
  // etcd call of the node's thread (a controller pass, a watch) never delays
  // one. Under lease_mu: the lease renewed, its fence deadline, whether the
  // node's thread still holds it back (it must read the map first), whether
  // the keeper found the lease gone. fence() is called under lease_mu so that
  // the deadlines reach the loop in order.
  std::thread keeper;
  std::unique_ptr<etcd_coord> keeper_etcd;  // its own client, with a shorter timeout
  std::chrono::milliseconds renew_every{1000};
  std::mutex lease_mu;
  std::int64_t cur_lease = 0;
  std::chrono::seconds cur_ttl{0};
  steady::time_point fence_until = steady::time_point::min();
  bool held = true;
  // Under lease_mu: the map names this node primary under another boot
  // (routing.hpp's restarted_primary): its lease vouches for nothing.
  bool withheld = false;
  steady::time_point served_until() const {
    return withheld ? steady::time_point::min() : fence_until;
  }
  bool lease_lost = false;
  std::string last_log;        // the node's thread only: the last error's kind (log_error)
  std::string last_isr_error;  // the node's thread only: the last isr change's failure logged

  void log(const std::string& line) {
    if (opts.log) opts.log(line);
  }
  // An etcd call that failed: logged when the kind of failure changes, not
  // at every retry while etcd stays away (renewals and watches alternate,
  // and the texts differ in their timings).
  void log_error(const std::string& what, const conveyor::error& e) {
    std::string key(to_string(e.code));
    if (key == last_log) return;
    last_log = std::move(key);
    log("etcd: " + what + ": " + e.to_string());
  }
  // An etcd call that worked: after errors, say so once.
  void answered() {
    if (last_log.empty()) return;
    last_log.clear();
    log("etcd answers again");
  }

  // Sleeps `d` unless stop() comes first; false when stopping.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock lk(mu);
    return !cv.wait_for(lk, d, [&] { return stopping; });
  }
  void fence(steady::time_point until) {
    if (opts.on_lease) opts.on_lease(until);
  }
  bool stopped() {
    std::lock_guard lk(mu);
    return stopping;
  }

  void deliver(const key_value& kv, std::int64_t& applied) {
    if (kv.mod_revision <= applied) return;
    auto m = parse_shard_map(kv.value);
    if (!m) {
      log("ignoring the shard map at revision " + std::to_string(kv.mod_revision) + ": " +
          m.error().to_string() + " (keeping the map of revision " + std::to_string(applied) + ")");
      return;
    }
    const auto epoch = m->epoch;
    auto v = make_view(std::move(*m), id, kv.mod_revision, boot_id);
    if (!v) {
      log("ignoring the shard map at revision " + std::to_string(kv.mod_revision) + ": " +
          v.error().to_string());
      return;
    }
    applied = kv.mod_revision;
    log("shard map epoch " + std::to_string(epoch) + " (revision " +
        std::to_string(kv.mod_revision) + ")");
    const bool restarted = restarted_primary_of(**v) != nullptr;
    view = *v;
    if (opts.on_view) opts.on_view(std::move(*v));
    std::lock_guard lk(lease_mu);
    if (restarted == withheld) return;
    withheld = restarted;
    log(restarted ? "the map names this node a primary under another process (boot): it "
                    "restarted and serves nothing until the shard fails over"
                  : "the map no longer names this node a restarted primary");
    if (!held) fence(served_until());
  }

  // A hand-over request (handover/<shard id>): acted on once, and only by
  // the primary of that shard (this process, per the map delivered last).
  void handover_requested(const key_value& kv) {
    if (kv.mod_revision <= handover_rev) return;
    handover_rev = kv.mod_revision;
    const auto prefix = handover_prefix(opts.cluster_name);
    const shard* sh = view ? primary_of(*view) : nullptr;
    if (sh == nullptr || std::string_view(kv.key).substr(prefix.size()) != sh->id) return;
    auto to = parse_handover_request(kv.value);
    if (!to) {
      log("ignoring a hand-over request: " + to.error().to_string());
      return;
    }
    log("hand-over to " + to->substr(0, 8) + " requested: fencing, then promoting it");
    if (opts.on_handover) opts.on_handover(*to);
  }

  // ---- the controller role (controller.hpp) ----------------------------------

  steady::time_point next_claim{};                                 // when to try the key again
  std::map<std::string, steady::time_point, std::less<>> missing;  // shard -> primary gone since
  bool control_due = true;
  // The revision of this node's claim: events of the controller key at or
  // before it (the previous holder's key deleted, seen by a watch that
  // resumes from before the claim) say nothing about this claim.
  std::int64_t claimed_rev = 0;

  void claim_controller(std::int64_t l) {
    if (!opts.controller || controlling.load() || steady::now() < next_claim) return;
    next_claim = steady::now() + 500ms;
    auto r = etcd->put_if(controller_key(opts.cluster_name), id, 0, l);
    if (r && r->succeeded) {
      claimed_rev = r->revision;
      controlling.store(true);
      control_due = true;
      log("controller: this node holds the controller role");
    }
  }

  // One pass of the controller: read registrations, reports and the map;
  // write the failover decision, if any, by CAS.
  void control() {
    control_due = false;
    auto nodes = etcd->range_prefix(nodes_prefix(opts.cluster_name));
    auto offs = nodes ? etcd->range_prefix(offsets_prefix(opts.cluster_name))
                      : result<range_result>(std::unexpected(nodes.error()));
    auto cfg = offs ? etcd->get(config_key(opts.cluster_name))
                    : result<std::optional<key_value>>(std::unexpected(offs.error()));
    if (!cfg) {
      log_error("controller: reading the cluster", cfg.error());
      control_due = true;
      return;
    }
    if (!*cfg) return;
    auto m = parse_shard_map((*cfg)->value);
    if (!m) return;  // the node's own watch logs an invalid map
    const auto np = nodes_prefix(opts.cluster_name);
    const auto op = offsets_prefix(opts.cluster_name);
    std::map<std::string, node_registration, std::less<>> live;
    for (auto& r : registrations_in(nodes->kvs, np)) live.emplace(r.id, std::move(r));
    std::map<std::string, offset_report, std::less<>> reports;
    for (const auto& kv : offs->kvs) {
      std::string_view k = kv.key;
      if (!k.starts_with(op)) continue;
      k.remove_prefix(op.size());
      if (!valid_id(k)) continue;
      if (auto r = parse_offset_report(kv.value)) reports.emplace(std::string(k), std::move(*r));
    }
    const auto now = steady::now();
    std::set<std::string, std::less<>> grace_over;
    std::map<std::string, steady::time_point, std::less<>> still;
    for (const auto& sh : m->shards) {
      if (primary_alive(sh, live)) continue;
      auto it = missing.find(sh.id);
      const auto since = it != missing.end() ? it->second : now;
      still[sh.id] = since;
      if (now - since >= opts.failover_grace) grace_over.insert(sh.id);
    }
    missing = std::move(still);
    if (!missing.empty()) control_due = true;  // look again soon: reports may come
    auto d = decide_failover(*m, live, reports, grace_over);
    if (!d) return;
    std::vector<std::string> absent;  // a restarted primary's registration may stay
    for (const auto& p : d->deposed)
      if (!live.contains(p)) absent.push_back(np + p);
    auto w = etcd->put_if_absent(config_key(opts.cluster_name), to_json(d->map),
                                 (*cfg)->mod_revision, absent);
    if (!w) {
      log_error("controller: writing the failover", w.error());
      return;
    }
    if (!w->succeeded) {  // the map or a registration changed: decide again
      control_due = true;
      return;
    }
    if (d->deposed.empty())
      log("controller: node addresses refreshed from their registrations (epoch " +
          std::to_string(d->map.epoch) + ")");
    for (std::size_t i = 0; i < d->deposed.size(); ++i)
      log("controller: primary " + d->deposed[i].substr(0, 8) + " is gone: promoted " +
          d->promoted[i].substr(0, 8) + " (epoch " + std::to_string(d->map.epoch) + ")");
  }

  // The replica's report and the primary's isr changes, when registered and
  // within the fence (a fenced primary changes nothing: it may have been
  // replaced; the CAS would fail then anyway, as the map changed).
  void publish(std::int64_t l) {
    std::optional<offset_report> rep;
    std::vector<std::pair<std::string, bool>> changes;
    std::optional<std::string> hand_to;
    std::uint64_t rep_seq = 0;
    {
      std::lock_guard lk(mu);
      rep_seq = report_seq;
      rep = std::move(report);
      report.reset();
      changes.swap(isr_changes);
      hand_to.swap(handover_to);
    }
    if (hand_to) {
      const auto c = propose_handover(*etcd, opts.cluster_name, id, boot_id, *hand_to);
      const bool ok = c.result == isr_change::outcome::written;
      log(ok ? "hand-over: " + hand_to->substr(0, 8) + " is the primary (epoch " +
                   std::to_string(c.epoch) + ")"
             : "hand-over to " + hand_to->substr(0, 8) + " not written: " + c.error);
      if (opts.on_handover_done) opts.on_handover_done(ok, c.error);
    }
    if (rep) {
      auto p = etcd->put(offsets_prefix(opts.cluster_name) + id, to_json(*rep), l);
      if (!p) {
        log_error("publishing the replication offset", p.error());
        std::lock_guard lk(mu);
        if (!report) report = std::move(rep);
      } else {
        {
          std::lock_guard lk(mu);
          published_seq = std::max(published_seq, rep_seq);
        }
        cv.notify_all();
      }
    }
    std::vector<std::pair<std::string, bool>> retry;
    for (auto& [r, add] : changes) {
      const auto c = propose_isr_change(*etcd, opts.cluster_name, id, r, add);
      if (c.result == isr_change::outcome::written) {
        log(add ? "replica " + r.substr(0, 8) + " caught up: back in the in-sync set (epoch " +
                      std::to_string(c.epoch) + ")"
                : "replica " + r.substr(0, 8) +
                      " did not acknowledge in time: removed from the in-sync set (epoch " +
                      std::to_string(c.epoch) + ")");
        continue;
      }
      if (c.result == isr_change::outcome::failed) {
        // Logged when the reason changes, not at every retry.
        std::string line = "the in-sync set's " +
                           std::string(add ? "addition of " : "removal of ") + r.substr(0, 8) +
                           " is not written yet: " + c.error + " (trying again)";
        if (line != last_isr_error) log(line);
        last_isr_error = std::move(line);
        retry.emplace_back(std::move(r), add);
      } else {
        last_isr_error.clear();
      }
    }
    if (!retry.empty()) {
      std::lock_guard lk(mu);
      for (auto& ch : retry) {
        // A request made meanwhile for the same replica is newer: it wins.
        const bool newer = std::any_of(isr_changes.begin(), isr_changes.end(),
                                       [&](const auto& q) { return q.first == ch.first; });
        if (!newer) isr_changes.push_back(std::move(ch));
      }
    }
  }

  void request_isr_change(std::string replica, bool add) {
    {
      std::lock_guard lk(mu);
      std::erase_if(isr_changes, [&](const auto& q) { return q.first == replica; });
      isr_changes.emplace_back(std::move(replica), add);
    }
    cv.notify_all();
  }

  bool work_queued() {
    std::lock_guard lk(mu);
    return report.has_value() || !isr_changes.empty() || handover_to.has_value();
  }

  // The keeper thread: renews the current lease every quarter of its TTL,
  // each request bounded by that quarter (a failed one again after 100 ms:
  // the fence, at TTL - margin after a renewal was sent, leaves room for
  // about three), and moves the fence deadline.
  void keep() {
    std::string last_error;  // this thread's: logged when its kind changes
    auto next = steady::now();
    for (;;) {
      {
        std::unique_lock lk(mu);
        if (cv.wait_until(lk, next, [&] { return stopping; })) return;
      }
      std::int64_t l;
      std::chrono::seconds ttl;
      {
        std::lock_guard lk(lease_mu);
        l = cur_lease;
        ttl = cur_ttl;
      }
      if (l == 0) {
        next = steady::now() + 50ms;
        continue;
      }
      const auto sent = steady::now();
      auto k = keeper_etcd->keep_alive(l);
      if (!k && k.error().code == errc::not_found) {
        {
          std::lock_guard lk(lease_mu);
          if (cur_lease == l) {
            cur_lease = 0;
            lease_lost = true;
            fence(fence_until = steady::time_point::min());
          }
        }
        log("the lease " + std::to_string(l) +
            " is gone (expired or revoked): fenced; registering again");
        next = steady::now() + 50ms;
        continue;
      }
      if (!k) {
        std::string kind(to_string(k.error().code));
        if (kind != last_error) log("etcd: renewing the lease: " + k.error().to_string());
        last_error = std::move(kind);
        next = steady::now() + 100ms;  // the lease may still hold: again soon
        continue;
      }
      if (!last_error.empty()) log("the lease is renewed again");
      last_error.clear();
      {
        std::lock_guard lk(lease_mu);
        if (cur_lease == l) {
          const auto d = fence_deadline(sent, std::min(*k, ttl));
          if (d > fence_until) {
            fence_until = d;
            if (!held && !withheld) fence(d);
          }
        }
      }
      next = sent + renew_every;
    }
  }

  void run() {
    const std::string reg_key = nodes_prefix(opts.cluster_name) + id;
    const std::string cfg_key = config_key(opts.cluster_name);
    const std::string prefix = cluster_prefix(opts.cluster_name);
    const std::string ctl_key = controller_key(opts.cluster_name);
    const std::string reg =
        to_json(node_registration{id, opts.resp, opts.rdma, boot_id, opts.repl});
    bool registered = false;
    std::int64_t watch_from = 0;  // 0: read the key first
    std::int64_t applied = 0;     // the revision of the last map delivered
    // After a registration the fence stays down (held) until the map was
    // read again (a node that lost its lease may have been deposed meanwhile).
    bool holding = false;
    while (!stopped()) {
      {
        std::lock_guard lk(lease_mu);
        if (lease_lost) {  // the keeper found it gone
          lease_lost = false;
          registered = false;
          holding = false;
          controlling.store(false);
          lease.store(0);
        }
      }
      if (!registered) {
        const auto sent = steady::now();
        auto g = etcd->grant_lease(opts.lease_ttl);
        if (!g) {
          log_error("granting a lease", g.error());
          if (!pause(500ms)) break;
          continue;
        }
        lease.store(g->id);
        auto p = etcd->put(reg_key, reg, g->id);
        if (!p) {
          log_error("registering " + reg_key, p.error());
          (void)etcd->revoke_lease(g->id);
          lease.store(0);
          if (!pause(500ms)) break;
          continue;
        }
        registered = true;
        answered();
        {
          std::lock_guard lk(lease_mu);
          cur_lease = g->id;
          cur_ttl = g->ttl;
          fence_until = fence_deadline(sent, g->ttl);
          held = true;
          lease_lost = false;
        }
        cv.notify_all();  // the keeper renews from now on
        holding = true;
        watch_from = 0;  // read the map again before acting on this lease
        next_claim = {};
        log("registered as " + id + " (" + opts.resp + ") under " + reg_key + ", lease " +
            std::to_string(g->id) + " of " + std::to_string(g->ttl.count()) + " s");
      }
      if (watch_from == 0) {
        auto r = etcd->range_prefix(cfg_key);
        if (!r) {
          log_error("reading " + cfg_key, r.error());
          if (!pause(500ms)) break;
          continue;
        }
        for (const auto& kv : r->kvs)
          if (kv.key == cfg_key) deliver(kv, applied);
        watch_from = r->revision + 1;
      }
      bool in_time;
      {
        std::lock_guard lk(lease_mu);
        if (holding) {  // the map as of after the registration was delivered
          holding = false;
          held = false;
          fence(served_until());
        }
        in_time = !held && steady::now() < fence_until;
      }
      if (in_time) {
        claim_controller(lease.load());
        if (work_queued()) publish(lease.load());
        if (controlling.load() && control_due) control();
      }
      // At most 500 ms: a report or an isr addition queued meanwhile waits
      // for the poll to end (the failover's time includes it).
      auto wait = std::chrono::milliseconds(500);
      if (control_due && controlling.load()) wait = std::min(wait, 250ms);
      if (work_queued() || (opts.controller && !controlling.load())) wait = std::min(wait, 250ms);
      auto w = etcd->watch_prefix(prefix, watch_from, wait);
      if (!w) {
        log_error("watching " + prefix, w.error());
        if (!pause(500ms)) break;
        continue;
      }
      answered();
      if (w->compact_revision != 0) {
        watch_from = 0;  // events lost: read the key again
        continue;
      }
      const auto hp = handover_prefix(opts.cluster_name);
      for (const auto& ev : w->events) {
        if (ev.kv.key.starts_with(hp)) {
          if (ev.type == watch_event::kind::put) handover_requested(ev.kv);
          continue;
        }
        if (ev.kv.key != cfg_key) {
          // Registrations, reports, the controller key: the controller looks again.
          control_due = true;
          if (ev.kv.key == ctl_key && ev.kv.mod_revision > claimed_rev &&
              (ev.type == watch_event::kind::del || ev.kv.value != id)) {
            if (controlling.exchange(false)) log("controller: this node no longer holds the role");
            next_claim = {};
          }
          continue;
        }
        control_due = true;
        if (ev.type == watch_event::kind::put)
          deliver(ev.kv, applied);
        else
          log("the shard map was deleted from etcd: keeping the map of revision " +
              std::to_string(applied));
      }
      watch_from = w->next_revision;
    }
  }
};

cluster_node::cluster_node(std::unique_ptr<state> s) : s_(std::move(s)) {}

cluster_node::~cluster_node() {
  stop();
}

const std::string& cluster_node::id() const noexcept {
  return s_->id;
}

result<std::unique_ptr<cluster_node>> cluster_node::start(node_options opts) {
  if (opts.endpoints.empty())
    return make_error(errc::invalid_argument, "cluster: no etcd endpoint");
  if (!valid_cluster_name(opts.cluster_name))
    return make_error(errc::invalid_argument, "cluster name '" + opts.cluster_name.substr(0, 80) +
                                                  "': 1 to 64 of A-Z a-z 0-9 _ - .");
  if (!valid_address(opts.resp))
    return make_error(errc::invalid_argument,
                      "cluster: announced address '" + opts.resp + "' is not host:port");
  if (!opts.repl.empty() && !valid_address(opts.repl))
    return make_error(errc::invalid_argument,
                      "cluster: replication address '" + opts.repl + "' is not host:port");
  if (!opts.rdma.empty() && !valid_address(opts.rdma))
    return make_error(errc::invalid_argument,
                      "cluster: RDMA address '" + opts.rdma + "' is not host:port");
  if (opts.lease_ttl < 1s || opts.lease_ttl > 3600s)
    return make_error(errc::invalid_argument, "cluster: the lease must be 1 to 3600 s");
  auto id = load_or_create_node_id(opts.dir);
  if (!id) return std::unexpected(id.error());
  auto etcd = etcd_coord::open({.endpoints = opts.endpoints,
                                .connect_timeout = 300ms,
                                .request_timeout = opts.request_timeout});
  if (!etcd) return std::unexpected(etcd.error());
  auto s = std::make_unique<state>();
  s->opts = std::move(opts);
  s->id = std::move(*id);
  s->boot_id = random_id().substr(0, 16);
  s->etcd = std::move(*etcd);
  s->renew_every = std::max<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(s->opts.lease_ttl) / 4, 200ms);
  auto ke =
      etcd_coord::open({.endpoints = s->opts.endpoints,
                        .connect_timeout = 300ms,
                        .request_timeout = std::min(s->opts.request_timeout, s->renew_every)});
  if (!ke) return std::unexpected(ke.error());
  s->keeper_etcd = std::move(*ke);
  auto* raw = s.get();
  s->thread = std::thread([raw] { raw->run(); });
  s->keeper = std::thread([raw] { raw->keep(); });
  return std::unique_ptr<cluster_node>(new cluster_node(std::move(s)));
}

void cluster_node::report_offset(offset_report r) {
  r.boot = s_->boot_id;
  {
    std::lock_guard lk(s_->mu);
    s_->report = std::move(r);
    ++s_->report_seq;
  }
  s_->cv.notify_all();
}

bool cluster_node::publish_offset(offset_report r, std::chrono::milliseconds timeout) {
  r.boot = s_->boot_id;
  std::unique_lock lk(s_->mu);
  s_->report = std::move(r);
  const auto seq = ++s_->report_seq;
  s_->cv.notify_all();
  return s_->cv.wait_for(lk, timeout, [&] { return s_->stopping || s_->published_seq >= seq; }) &&
         s_->published_seq >= seq;
}

void cluster_node::write_handover(std::string to) {
  {
    std::lock_guard lk(s_->mu);
    s_->handover_to = std::move(to);
  }
  s_->cv.notify_all();
}

void cluster_node::request_isr_add(std::string replica) {
  s_->request_isr_change(std::move(replica), true);
}

void cluster_node::request_isr_remove(std::string replica) {
  s_->request_isr_change(std::move(replica), false);
}

bool cluster_node::is_controller() const noexcept {
  return s_->controlling.load();
}

void cluster_node::stop() {
  if (!s_ || !s_->thread.joinable()) return;
  {
    std::lock_guard lk(s_->mu);
    s_->stopping = true;
  }
  s_->cv.notify_all();
  s_->thread.join();
  s_->keeper.join();
  // Leave at once rather than a lease later (a clean stop is not a failure).
  if (const auto l = s_->lease.exchange(0); l != 0) (void)s_->etcd->revoke_lease(l);
}

}  // namespace conveyor::kv::cluster
