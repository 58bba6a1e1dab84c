// conveyor::kv::client — one-sided GETs (one READ of a remembered item, else
// the bucket groups, then the item, all verified) with many READs in flight,
// and write RPCs (client.hpp).
#include "conveyor_kv/client.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "location_cache.hpp"
#include "reply_text.hpp"
#include "store_layout.hpp"

namespace conveyor::kv {

namespace {

namespace L = layout;
using clock = std::chrono::steady_clock;

constexpr std::size_t lane_item_bytes = 32u
                                        << 10;  // items up to this size land in the lane's scratch
constexpr std::uint64_t rpc_send_id = ~0ull, rpc_recv_id = ~0ull - 1;
constexpr int max_restarts = 1000;
constexpr int max_slow = 8;  // re-reads because a GET outlasted the grace time

enum kind : std::uint64_t { k_group0 = 0, k_group1 = 1, k_item = 2 };
// A READ of a cluster node's header words (store_layout.hpp): its wr_id.
constexpr std::uint64_t header_wr_bit = 1ull << 62;

struct lane {
  std::byte* groups = nullptr;  // 2 x 128 bytes, registered
  std::byte* item = nullptr;    // lane_item_bytes, registered
  std::uint32_t lkey = 0;
  std::vector<std::byte> big;  // items larger than the scratch
  memory_region big_mr;
  // the GET this lane runs
  std::size_t index = 0;
  std::string_view key;
  L::placement p{};
  int pending = 0;
  std::vector<std::uint64_t> cands;
  std::size_t cand = 0;
  std::uint64_t item_off = 0, item_len = 0;
  std::uint64_t hash = 0;
  clock::time_point start;
  int restarts = 0, slow = 0, rounds = 0;
  bool suspect = false;
  bool remembered = false;  // the item READ in flight is at a remembered location
  // A cluster node's answer waits for the header words READ after its data
  // (the flush's header READ, number `seq`): the value stays in the lane.
  bool ready = false, hit = false;
  L::value_type type = L::value_type::string;
  const std::byte* value = nullptr;
  std::size_t value_len = 0;
  std::uint64_t item_version = 0, seq = 0, need = 0;
};

class client_impl final : public client {
 public:
  client_impl(device dev, protection_domain pd, completion_queue cq, queue_pair qp,
              memory_region scratch, L::description d, std::uint32_t lanes, client_options o)
      : dev_(std::move(dev)),
        pd_(std::move(pd)),
        cq_(std::move(cq)),
        qp_(std::move(qp)),
        scratch_(std::move(scratch)),
        d_(d),
        opts_(std::move(o)),
        cache_(shared_location_cache(d_, opts_.location_cache)),
        lanes_(lanes),
        cluster_((d_.flags & L::header_cluster) != 0),
        headers_(cluster_ ? 2 * std::size_t{lanes} + 8 : 0) {
    pending_wr_.reserve(2 * lanes + 4);
    pending_sge_.reserve(2 * lanes + 4);
    for (std::uint32_t i = 0; i < lanes; ++i) {
      lanes_[i].groups = scratch_.data() + i * (2 * L::group_bytes + lane_item_bytes);
      lanes_[i].item = lanes_[i].groups + 2 * L::group_bytes;
      lanes_[i].lkey = scratch_.lkey();
    }
  }

  result<void> init_rpc() {
    if (cluster_) {
      header_buf_.assign(headers_ * L::header_words_bytes, std::byte{0});
      auto h = pd_.register_memory(std::span(header_buf_), access::local_write);
      if (!h) return std::unexpected(h.error());
      header_mr_ = std::move(*h);
    }
    const std::size_t m = std::max<std::size_t>(d_.max_message, 64);
    auto s =
        pd_.register_memory(std::span(send_buf_ = std::vector<std::byte>(m)), access::local_write);
    auto r =
        pd_.register_memory(std::span(recv_buf_ = std::vector<std::byte>(m)), access::local_write);
    if (!s) return std::unexpected(s.error());
    if (!r) return std::unexpected(r.error());
    send_mr_ = std::move(*s);
    recv_mr_ = std::move(*r);
    if (auto st = qp_.post_recv(recv_mr_.as_sge(), rpc_recv_id); st != errc::ok)
      return make_error(st, "kv client: post_recv");
    return {};
  }

  result<std::optional<std::string>> get(std::string_view key) override {
    std::optional<std::string> out;
    bool wrong = false;
    auto r = run_gets(std::span(&key, 1),
                      [&](std::size_t, L::value_type t, const std::byte* p, std::size_t n) {
                        if (t != L::value_type::string) return void(wrong = true);
                        out.emplace(reinterpret_cast<const char*>(p), n);
                      });
    if (!r) return std::unexpected(r.error());
    if (wrong) return wrongtype();
    return out;
  }

  result<std::optional<std::string>> hget(std::string_view key, std::string_view field) override {
    std::array<std::string_view, 1> f{field};
    auto r = hmget(key, f);
    if (!r) return std::unexpected(r.error());
    return std::move((*r)[0]);
  }

  result<std::vector<std::optional<std::string>>> hmget(
      std::string_view key, std::span<const std::string_view> fields) override {
    bool served = false;
    std::vector<std::optional<std::string>> out(fields.size());
    auto r = read_hash(key, served, [&](std::string_view f, std::string_view v) {
      for (std::size_t i = 0; i < fields.size(); ++i)
        if (fields[i] == f) out[i].emplace(v);
    });
    if (!r) return std::unexpected(r.error());
    if (!served) return out;
    std::vector<std::string_view> argv{"HMGET", key};
    argv.insert(argv.end(), fields.begin(), fields.end());
    auto reply = command(argv);
    if (!reply) return std::unexpected(reply.error());
    out.clear();
    if (!parse_bulks(*reply, out) || out.size() != fields.size()) return reply_error(*reply);
    return out;
  }

  result<std::vector<std::pair<std::string, std::string>>> hgetall(std::string_view key) override {
    bool served = false;
    std::vector<std::pair<std::string, std::string>> out;
    auto r = read_hash(key, served,
                       [&](std::string_view f, std::string_view v) { out.emplace_back(f, v); });
    if (!r) return std::unexpected(r.error());
    if (!served) return out;
    std::array<std::string_view, 2> argv{"HGETALL", key};
    auto reply = command(argv);
    if (!reply) return std::unexpected(reply.error());
    std::vector<std::optional<std::string>> flat;
    if (!parse_bulks(*reply, flat) || flat.size() % 2 != 0) return reply_error(*reply);
    for (std::size_t i = 0; i < flat.size(); i += 2) {
      if (!flat[i] || !flat[i + 1]) return reply_error(*reply);
      out.emplace_back(std::move(*flat[i]), std::move(*flat[i + 1]));
    }
    return out;
  }

  result<std::optional<std::size_t>> get_into(std::string_view key,
                                              std::span<std::byte> buf) override {
    std::optional<std::size_t> len;
    bool wrong = false;
    auto r = run_gets(std::span(&key, 1),
                      [&](std::size_t, L::value_type t, const std::byte* p, std::size_t n) {
                        if (t != L::value_type::string) return void(wrong = true);
                        std::memcpy(buf.data(), p, std::min(n, buf.size()));
                        len = n;
                      });
    if (!r) return std::unexpected(r.error());
    if (wrong) return wrongtype();
    return len;
  }

  result<std::vector<std::optional<std::string>>> mget(
      std::span<const std::string_view> keys) override {
    std::vector<std::optional<std::string>> out(keys.size());
    auto r = run_gets(keys, [&](std::size_t i, L::value_type t, const std::byte* p, std::size_t n) {
      if (t == L::value_type::string) out[i].emplace(reinterpret_cast<const char*>(p), n);
    });
    if (!r) return std::unexpected(r.error());
    return out;
  }

  result<std::string> command(std::span<const std::string_view> argv) override {
    if (broken_) return make_error(errc::invalid_state, "kv client: the connection failed earlier");
    std::string req = "*" + std::to_string(argv.size()) + "\r\n";
    for (auto a : argv) {
      req += "$" + std::to_string(a.size()) + "\r\n";
      req += a;
      req += "\r\n";
    }
    if (req.size() > send_buf_.size())
      return make_error(errc::invalid_argument,
                        "kv client: request larger than the server's RDMA message limit (" +
                            std::to_string(send_buf_.size()) + " bytes)");
    std::memcpy(send_buf_.data(), req.data(), req.size());
    if (auto st = qp_.post_send_msg(send_mr_.slice(0, req.size()), rpc_send_id); st != errc::ok)
      return fail(st, "kv client: post_send");
    const auto deadline = clock::now() + opts_.timeout;
    for (;;) {
      std::array<work_completion, 8> wcs;
      auto n = cq_.wait(wcs, std::max(deadline - clock::now(), clock::duration::zero()));
      if (!n) return fail(n.error(), "kv client: waiting for the RPC reply");
      for (std::size_t i = 0; i < *n; ++i) {
        const auto& wc = wcs[i];
        if (wc.status != wc_status::success)
          return fail(errc::connection_reset,
                      "kv client: RPC failed: " + std::string(to_string(wc.status)));
        if (wc.wr_id == rpc_recv_id) {
          std::string reply(reinterpret_cast<const char*>(recv_buf_.data()), wc.byte_len);
          if (auto st = qp_.post_recv(recv_mr_.as_sge(), rpc_recv_id); st != errc::ok)
            return fail(st, "kv client: post_recv");
          return reply;
        }
      }
    }
  }

  result<void> set(std::string_view key, std::string_view value) override {
    std::array<std::string_view, 3> a{"SET", key, value};
    auto r = command(a);
    if (!r) return std::unexpected(r.error());
    if (*r != "+OK\r\n") return reply_error(*r);
    return {};
  }
  result<bool> del(std::string_view key) override {
    std::array<std::string_view, 2> a{"DEL", key};
    auto n = integer(a);
    if (!n) return std::unexpected(n.error());
    return *n > 0;
  }
  result<std::int64_t> incr(std::string_view key, std::int64_t by) override {
    const auto s = std::to_string(by);
    std::array<std::string_view, 3> a{"INCRBY", key, s};
    return integer(a);
  }
  result<bool> expire(std::string_view key, std::chrono::milliseconds ttl) override {
    const auto s = std::to_string(ttl.count());
    std::array<std::string_view, 3> a{"PEXPIRE", key, s};
    auto n = integer(a);
    if (!n) return std::unexpected(n.error());
    return *n == 1;
  }

  client_stats stats() const override { return stats_; }
  std::uint64_t node_epoch() const override { return last_epoch_; }
  qp_counters counters() const override { return qp_.counters(); }
  remote_region index_region() const override { return d_.index; }
  remote_region data_region() const override { return d_.data; }

  result<wc_status> raw_access(bool write, std::uint64_t addr, std::uint32_t rkey,
                               std::uint32_t len) override {
    if (len > lane_item_bytes)
      return make_error(errc::invalid_argument, "kv client: raw_access too long");
    sge s{reinterpret_cast<std::uint64_t>(lanes_[0].item), len, lanes_[0].lkey};
    send_wr wr{.wr_id = 7,
               .opcode = write ? wr_opcode::rdma_write : wr_opcode::rdma_read,
               .flags = send_flags::signaled,
               .sg_list = std::span(&s, 1),
               .remote_addr = addr,
               .rkey = rkey};
    if (auto st = qp_.post_send(wr); st != errc::ok) return make_error(st, "kv client: post");
    const auto deadline = clock::now() + opts_.timeout;
    for (;;) {
      std::array<work_completion, 8> wcs;
      auto n = cq_.wait(wcs, std::max(deadline - clock::now(), clock::duration::zero()));
      if (!n) return fail(n.error(), "kv client: raw access");
      for (std::size_t i = 0; i < *n; ++i)
        if (wcs[i].wr_id == 7) {
          if (wcs[i].status != wc_status::success) broken_ = true;
          return wcs[i].status;
        }
    }
  }

 private:
  static std::unexpected<error> wrongtype() {
    return make_error(errc::rejected,
                      "WRONGTYPE Operation against a key holding the wrong kind of value");
  }

  // One-sided read of a hash's item: fn(field, value) for each field of a
  // small hash (the encoding checked whole first); `served` when the hash is
  // too large to be published (the caller asks the server).
  template <class Fn>
  result<void> read_hash(std::string_view key, bool& served, Fn&& fn) {
    bool wrong = false, invalid = false;
    std::string item;  // the value, copied out of the lane before decoding
    bool found = false;
    auto r = run_gets(std::span(&key, 1),
                      [&](std::size_t, L::value_type t, const std::byte* p, std::size_t n) {
                        if (t != L::value_type::hash) return void(wrong = true);
                        found = true;
                        item.assign(reinterpret_cast<const char*>(p), n);
                      });
    if (!r) return r;
    if (wrong) return wrongtype();
    if (!found) return {};
    const auto form = L::decode_hash(reinterpret_cast<const std::byte*>(item.data()), item.size(),
                                     [&](std::string_view f, std::string_view v) { fn(f, v); });
    invalid = form == L::hash_form::invalid;
    if (invalid)  // checksummed, yet not an encoding: not a conveyor-kv server's item
      return make_error(errc::protocol_error, "kv client: a hash item that does not decode");
    served = form == L::hash_form::served;
    ++(served ? stats_.hash_rpc_reads : stats_.hash_one_sided);
    return {};
  }

  // A RESP2 array of bulk strings or nulls (HMGET, HGETALL's RESP2 form).
  static bool parse_bulks(std::string_view r, std::vector<std::optional<std::string>>& out) {
    auto line = [&](std::int64_t& v) {
      auto e = r.find("\r\n");
      if (e == std::string_view::npos || e < 2) return false;
      auto [p, ec] = std::from_chars(r.data() + 1, r.data() + e, v);
      if (ec != std::errc{} || p != r.data() + e) return false;
      r.remove_prefix(e + 2);
      return true;
    };
    std::int64_t n;
    if (r.empty() || r[0] != '*' || !line(n) || n < 0) return false;
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t len;
      if (r.empty() || r[0] != '$' || !line(len)) return false;
      if (len < 0) {
        out.emplace_back();
        continue;
      }
      if (r.size() < static_cast<std::size_t>(len) + 2) return false;
      out.emplace_back(std::string(r.substr(0, static_cast<std::size_t>(len))));
      r.remove_prefix(static_cast<std::size_t>(len) + 2);
    }
    return r.empty();
  }

  template <class T>
  std::unexpected<error> fail(T code, std::string what) {
    broken_ = true;
    if constexpr (std::is_same_v<T, errc>)
      return make_error(code, std::move(what));
    else
      return make_error(errc::io_error, std::move(what));
  }
  static std::unexpected<error> reply_error(std::string_view r) {
    return reply_text::error_of(r, "kv client");
  }
  result<std::int64_t> integer(std::span<const std::string_view> argv) {
    auto r = command(argv);
    if (!r) return std::unexpected(r.error());
    return reply_text::integer_of(*r, "kv client");
  }

  template <class Sink>
  result<void> run_gets(std::span<const std::string_view> keys, Sink&& sink) {
    if (broken_) return make_error(errc::invalid_state, "kv client: the connection failed earlier");
    pending_wr_.clear();  // nothing left over from a GET that failed
    pending_sge_.clear();
    std::size_t next = 0, done = 0;
    std::vector<std::uint32_t> free_lanes;
    for (std::uint32_t i = 0; i < lanes_.size(); ++i)
      free_lanes.push_back(static_cast<std::uint32_t>(lanes_.size()) - 1 - i);
    const auto deadline = clock::now() + opts_.timeout;
    auto finish = [&](std::uint32_t l) {
      ++done;
      ++stats_.rounds[std::min(lanes_[l].rounds, 4) - 1];
      free_lanes.push_back(l);
    };
    // An answer: at once, or on a cluster node once the header words READ
    // after the data vouch for it (judge_headers).
    auto answer = [&](std::uint32_t l, bool hit, L::value_type t, const std::byte* p, std::size_t n,
                      std::uint64_t version) {
      auto& ln = lanes_[l];
      if (!cluster_) {
        if (hit) {
          ++stats_.hits;
          sink(ln.index, t, p, n);
        }
        return finish(l);
      }
      ln.ready = true;
      ln.hit = hit;
      ln.type = t;
      ln.value = p;
      ln.value_len = n;
      ln.item_version = hit ? version : 0;
    };
    int header_only = 0;  // doorbells in a row that only read a cluster node's words
    while (done < keys.size()) {
      while (next < keys.size() && !free_lanes.empty()) {
        const auto l = free_lanes.back();
        free_lanes.pop_back();
        auto& ln = lanes_[l];
        ln.index = next;
        ln.key = keys[next++];
        ln.hash = L::hash_key(ln.key, d_.seed);
        ln.p = L::place(ln.hash, d_.buckets);
        ln.restarts = 0;
        ln.slow = 0;
        ln.rounds = 0;
        ln.ready = false;
        ln.need = 0;
        ++stats_.gets;
        if (auto at = cache_ ? cache_->find(ln.hash) : std::nullopt;
            at && at->second <= d_.data.length && at->first <= d_.data.length - at->second) {
          ln.remembered = true;
          ln.start = clock::now();
          if (auto r = read_item(l, at->first, at->second); !r) return r;
          continue;
        }
        if (auto r = read_groups(l); !r) return r;
      }
      if (want_header_ && pending_wr_.empty()) {
        // Only a GET waiting for replicas' acknowledgements: its own data is
        // read, the words are read again. The deadline bounds the wait (the
        // completions keep coming, so the CQ's wait would not), and after a
        // few rounds each waits 50 us: replication takes a round trip of its own.
        if (clock::now() >= deadline)
          return fail(errc::timed_out,
                      "kv client: GET: what it read is not yet on every in-sync replica "
                      "(acknowledged up to version " +
                          std::to_string(last_acked_) + ")");
        if (++header_only > 8) std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        header_only = 0;
      }
      if (auto r = flush(); !r) return r;
      if (done == keys.size()) break;  // every GET answered without another READ
      std::array<work_completion, 32> wcs;
      auto n = cq_.wait(wcs, std::max(deadline - clock::now(), clock::duration::zero()));
      if (!n) return fail(n.error(), "kv client: GET" + unfinished(keys.size() - done, free_lanes));
      for (std::size_t i = 0; i < *n; ++i) {
        const auto& wc = wcs[i];
        if (wc.wr_id == rpc_send_id) continue;
        if (wc.status != wc_status::success)
          return fail(errc::connection_reset,
                      "kv client: READ failed: " + std::string(to_string(wc.status)) +
                          " vendor_err " + std::to_string(wc.vendor_err) + " wr " +
                          std::to_string(wc.wr_id));
        if (wc.wr_id & header_wr_bit) {
          if (auto r = judge_headers(wc.wr_id & ~header_wr_bit, sink, finish); !r) return r;
          continue;
        }
        const auto l = static_cast<std::uint32_t>(wc.wr_id >> 8);
        const auto k = wc.wr_id & 0xff;
        if (l >= lanes_.size()) continue;
        auto& ln = lanes_[l];
        if (k != k_item) {
          if (--ln.pending > 0) continue;
          ln.cands.clear();
          bool torn = false;
          for (int g = 0; g < 2; ++g)
            torn |= L::match_group(ln.groups + g * L::group_bytes, ln.p.group[g], ln.p.tag, d_.seed,
                                   ln.cands) != L::bucket_result::ok;
          if (torn) {
            if (auto r = restart(l); !r) return r;
            continue;
          }
          ln.cand = 0;
          if (auto r = next_candidate(l, answer); !r) return r;
          continue;
        }
        // the item
        const std::byte* buf = ln.item_len > lane_item_bytes ? ln.big.data() : ln.item;
        auto c = L::check_item(buf, ln.item_len, ln.key, d_.seed);
        if (ln.remembered) {
          // One READ at a remembered location: only the key's live item
          // answers (it was the key's current value when its checksum word
          // was read; docs/KV.md, "One READ"). Anything else: the buckets.
          ln.remembered = false;
          if (c.result != L::item_result::ok || !c.live) {
            ++stats_.stale_cache;
            cache_->forget(ln.hash);
            if (auto r = read_groups(l); !r) return r;
            continue;
          }
          ++stats_.one_read;
          const bool hit = !c.expire_at || c.expire_at > L::now_ms();
          answer(l, hit, c.type, buf + c.value_offset, c.value_len, c.version);
          continue;
        }
        // Slower than the grace time: the item may have been freed and reused
        // meanwhile. Read again; after a few slow tries the checksum and the
        // key (checked above) are the guard (docs/KV.md, "Reclamation").
        if (c.result == L::item_result::ok && too_late(ln) && ln.slow < max_slow) {
          ++ln.slow;
          c.result = L::item_result::torn;
        }
        switch (c.result) {
          case L::item_result::ok:
            if (c.live && cache_) cache_->remember(ln.hash, ln.item_off, ln.item_len);
            // expired: absent, as the server would say
            answer(l, !c.expire_at || c.expire_at > L::now_ms(), c.type, buf + c.value_offset,
                   c.value_len, c.version);
            break;
          case L::item_result::other_key:
            // Within the grace time this is a tag collision. Later, the memory
            // may have been reused by another key while this one still exists:
            // a miss concluded from it is read again (next_candidate).
            if (too_late(ln)) ln.suspect = true;
            ++ln.cand;
            if (auto r = next_candidate(l, answer); !r) return r;
            break;
          case L::item_result::need_more:
            if (c.need > d_.data.length - ln.item_off) {  // never READ past the region
              if (auto r = restart(l); !r) return r;
              break;
            }
            if (auto r = read_item(l, ln.item_off, c.need); !r) return r;
            break;
          case L::item_result::torn:
            if (auto r = restart(l); !r) return r;
            break;
        }
      }
    }
    return {};
  }

  // For a timed-out batch: how many GETs were left, how long the slowest had
  // been running since its last (re)start, and how many rounds were repeated.
  std::string unfinished(std::size_t left, const std::vector<std::uint32_t>& free_lanes) const {
    int restarts = 0, slow = 0, pending = 0;
    clock::duration oldest{};
    const auto now = clock::now();
    for (std::uint32_t l = 0; l < lanes_.size(); ++l) {
      if (std::find(free_lanes.begin(), free_lanes.end(), l) != free_lanes.end()) continue;
      const auto& ln = lanes_[l];
      restarts += ln.restarts;
      slow += ln.slow;
      pending += ln.pending;
      oldest = std::max(oldest, now - ln.start);
    }
    return " (" + std::to_string(left) + " of the batch unfinished; the oldest round started " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(oldest).count()) +
           " ms ago; " + std::to_string(restarts) + " restarts, " + std::to_string(slow) +
           " re-reads after the grace time, " + std::to_string(pending) + " bucket READs pending)";
  }

  // The status of the completion that failed the QP, for the error message.
  std::string first_error() {
    std::array<work_completion, 32> wcs;
    for (int i = 0; i < 8; ++i) {
      auto n = cq_.poll(wcs);
      if (!n || *n == 0) break;
      for (std::size_t k = 0; k < *n; ++k)
        if (wcs[k].status != wc_status::success && wcs[k].status != wc_status::wr_flush_err)
          return std::string(" after a READ failed: ") + std::string(to_string(wcs[k].status)) +
                 " wr " + std::to_string(wcs[k].wr_id);
    }
    return {};
  }

  std::chrono::milliseconds grace() const { return std::chrono::milliseconds(d_.reclaim_grace_ms); }
  // Whether the item just read may have been freed and reused since the GET's
  // start. Only an elapsed time strictly below the grace proves it was not: an
  // item unlinked right after the bucket READ is free at start + grace, and a
  // clock that did not advance (coarse, or an equal reading) proves nothing.
  // With a grace of 0 every item read is too late, whatever the clock says:
  // the `>` this replaced could let an other-key item in reused memory pass as a tag
  // collision when the elapsed time read 0, and the GET return a miss for a
  // key present throughout (readers_never_see_a_mixed_value_with_immediate_reuse).
  bool too_late(const lane& ln) const {
    return d_.reclaim_grace_ms == 0 || clock::now() - ln.start >= grace();
  }

  // READs are collected while a round of lanes starts or a batch of
  // completions is handled, then posted together: one doorbell for them all
  // (an MGET of remembered keys is one post of all its READs).
  result<void> post(std::span<send_wr> wrs) {
    // One entry is kept for flush's header READ.
    if (pending_wr_.size() + wrs.size() + 1 > pending_wr_.capacity())
      if (auto r = flush(); !r) return r;
    for (auto& w : wrs) {
      pending_sge_.push_back(w.sg_list[0]);  // capacity reserved: no reallocation
      w.sg_list = std::span(&pending_sge_.back(), 1);
      pending_wr_.push_back(w);
    }
    return {};
  }
  // A cluster node's header words arrived (READ number `seq`, after every
  // READ posted before it): each GET waiting on it is answered, refused, or
  // waits for another READ of the words (store_layout.hpp judge).
  template <class Sink, class Finish>
  result<void> judge_headers(std::uint64_t seq, Sink& sink, Finish& finish) {
    const auto w =
        L::decode_header_words(header_buf_.data() + (seq % headers_) * L::header_words_bytes);
    const auto now = L::now_ms();
    last_acked_ = w.acked_version;
    last_epoch_ = w.epoch;
    for (std::uint32_t l = 0; l < lanes_.size(); ++l) {
      auto& ln = lanes_[l];
      if (!ln.ready || ln.seq > seq) continue;
      switch (L::judge(w, ln.item_version, now, opts_.max_clock_skew.count(), ln.need)) {
        case L::header_verdict::ok:
          ln.ready = false;
          if (ln.hit) {
            ++stats_.hits;
            sink(ln.index, ln.type, ln.value, ln.value_len);
          }
          finish(l);
          break;
        case L::header_verdict::lease:
          ++stats_.lease_refusals;
          return make_error(
              errc::rejected,
              "CLUSTERDOWN The node's lease does not vouch for its data now (fenced, stopped, or "
              "its clock more than " +
                  std::to_string(opts_.max_clock_skew.count()) + " ms from this host's)");
        case L::header_verdict::wait_acked:
          ++stats_.acked_waits;
          ln.seq = next_header_;
          want_header_ = true;
          break;
      }
    }
    return {};
  }

  result<void> flush() {
    if (cluster_ && (want_header_ || !pending_wr_.empty())) {
      // The header words last, after every READ of this doorbell.
      want_header_ = false;
      const auto seq = next_header_++;
      pending_sge_.push_back(sge{reinterpret_cast<std::uint64_t>(
                                     header_buf_.data() + (seq % headers_) * L::header_words_bytes),
                                 static_cast<std::uint32_t>(L::header_words_bytes),
                                 header_mr_.lkey()});
      pending_wr_.push_back(send_wr{.wr_id = header_wr_bit | seq,
                                    .opcode = wr_opcode::rdma_read,
                                    .flags = send_flags::signaled,
                                    .sg_list = std::span(&pending_sge_.back(), 1),
                                    .remote_addr = d_.index.addr + L::header_words_offset,
                                    .rkey = d_.index.rkey});
      ++stats_.header_reads;
    }
    if (pending_wr_.empty()) return {};
    ++stats_.doorbells;
    const auto st = qp_.post_send(pending_wr_);
    pending_wr_.clear();
    pending_sge_.clear();
    if (st != errc::ok) return fail(st, "kv client: post READ" + first_error());
    return {};
  }

  result<void> read_groups(std::uint32_t l) {
    auto& ln = lanes_[l];
    ln.start = clock::now();
    ++ln.rounds;
    ln.pending = 2;
    ln.suspect = false;
    std::array<sge, 2> s;
    std::array<send_wr, 2> wr;
    for (int g = 0; g < 2; ++g) {
      s[g] = {reinterpret_cast<std::uint64_t>(ln.groups + g * L::group_bytes), L::group_bytes,
              ln.lkey};
      wr[g] = send_wr{.wr_id = (std::uint64_t{l} << 8) | static_cast<std::uint64_t>(g),
                      .opcode = wr_opcode::rdma_read,
                      .flags = send_flags::signaled,
                      .sg_list = std::span(&s[g], 1),
                      .remote_addr = d_.index.addr + L::bucket_offset(ln.p.group[g]),
                      .rkey = d_.index.rkey};
    }
    stats_.reads += 2;
    auto r = post(wr);
    ln.seq = next_header_;  // the header READ of the doorbell that carries these
    return r;
  }

  result<void> restart(std::uint32_t l) {
    ++stats_.retries;
    if (++lanes_[l].restarts > max_restarts)
      return fail(errc::timed_out, "kv client: GET kept reading torn or moving data");
    return read_groups(l);
  }

  template <class Answer>
  result<void> next_candidate(std::uint32_t l, Answer& answer) {
    auto& ln = lanes_[l];
    while (ln.cand < ln.cands.size()) {
      auto span = L::item_of(ln.cands[ln.cand], d_.data.length);
      if (!span) return restart(l);  // a slot outside the data region: never READ it
      return read_item(l, span->offset, span->bytes);
    }
    // A miss concluded from an item read after the grace time cannot be
    // trusted (the key's item may have been reused): read again, until a read
    // within the bound (or max_restarts: an error, never a wrong miss).
    if (ln.suspect) return restart(l);
    answer(l, false, L::value_type::string, nullptr, 0, 0);  // no candidate is this key's: a miss
    return {};
  }

  result<void> read_item(std::uint32_t l, std::uint64_t off, std::uint64_t bytes) {
    auto& ln = lanes_[l];
    ++ln.rounds;
    ln.item_off = off;
    ln.item_len = bytes;
    std::uint64_t addr = reinterpret_cast<std::uint64_t>(ln.item);
    std::uint32_t lkey = ln.lkey;
    if (bytes > lane_item_bytes) {
      if (ln.big.size() < bytes || !ln.big_mr) {
        ln.big_mr = memory_region{};
        ln.big.assign(bytes, std::byte{0});
        auto mr = pd_.register_memory(std::span(ln.big), access::local_write);
        if (!mr) return std::unexpected(mr.error());
        ln.big_mr = std::move(*mr);
      }
      addr = reinterpret_cast<std::uint64_t>(ln.big.data());
      lkey = ln.big_mr.lkey();
    }
    sge s{addr, static_cast<std::uint32_t>(bytes), lkey};
    send_wr wr{.wr_id = (std::uint64_t{l} << 8) | k_item,
               .opcode = wr_opcode::rdma_read,
               .flags = send_flags::signaled,
               .sg_list = std::span(&s, 1),
               .remote_addr = d_.data.addr + off,
               .rkey = d_.data.rkey};
    ++stats_.reads;
    auto r = post(std::span(&wr, 1));
    ln.seq = next_header_;
    return r;
  }

  device dev_;
  protection_domain pd_;
  completion_queue cq_;
  queue_pair qp_;
  memory_region scratch_;
  L::description d_;
  client_options opts_;
  std::shared_ptr<location_cache> cache_;  // shared with this process's other clients of the store
  std::vector<lane> lanes_;
  std::vector<send_wr> pending_wr_;  // READs not yet posted (post, flush)
  std::vector<sge> pending_sge_;
  std::vector<std::byte> send_buf_, recv_buf_;
  memory_region send_mr_, recv_mr_;
  client_stats stats_;
  bool broken_ = false;
  // A cluster node's header words (store_layout.hpp): read after the data of
  // every doorbell, into a ring of slots (more than READs can be in flight).
  bool cluster_ = false;
  std::size_t headers_ = 0;
  std::vector<std::byte> header_buf_;
  memory_region header_mr_;
  std::uint64_t next_header_ = 0, last_acked_ = 0, last_epoch_ = 0;
  bool want_header_ = false;
};

}  // namespace

std::string_view provider_for_address(std::string_view address) noexcept {
  return address.starts_with('@') ? "shm" : "soft";
}

result<std::unique_ptr<client>> client::connect(std::string_view device_name,
                                                std::string_view address,
                                                const client_options& opts) {
  if (opts.password.size() > L::max_password)
    return make_error(errc::invalid_argument, "kv client: password longer than 200 bytes");
  auto dev = device::open(device_name, opts.device);
  if (!dev) return std::unexpected(dev.error());
  auto pd = dev->alloc_pd();
  if (!pd) return std::unexpected(pd.error());
  const std::uint32_t want = std::clamp<std::uint32_t>(opts.depth, 1, 128);
  auto cq = dev->create_cq({.depth = 4 * want + 16});
  if (!cq) return std::unexpected(cq.error());
  qp_init_attr qa{.send_cq = &*cq, .recv_cq = &*cq};
  qa.cap.max_send_wr = 3 * want + 8;  // two READs per GET, a cluster node's header READs
  qa.cap.max_recv_wr = 4;
  qa.max_rd_atomic = std::min<std::uint32_t>(
      2 * want, dev->attr().max_qp_rd_atom ? dev->attr().max_qp_rd_atom : 16);
  auto qp = pd->create_qp(qa);
  if (!qp) return std::unexpected(qp.error());
  const auto hello = L::encode_hello(opts.password);
  auto info = conveyor::connect(*qp, address, {.private_data = hello, .timeout = opts.timeout});
  if (!info) {
    // The usual cause: the address of the server's RESP port (or a Redis
    // server), which waits for a text line the handshake never sends.
    auto e = info.error();
    if (e.code == errc::timed_out || e.code == errc::protocol_error)
      e.context = "the peer at " + std::string(address) + " did not answer the RDMA handshake (" +
                  e.context +
                  "); is this a RESP port (kv serve --port, Redis)? RDMA clients connect to "
                  "kv serve --rdma-listen's address; use redis-cli for RESP";
    return std::unexpected(std::move(e));
  }
  auto d = L::decode(info->private_data);
  if (!d)
    return make_error(errc::protocol_error, "kv client: the server's description is malformed");
  // Lanes: GETs in flight, two READs each at most, within the negotiated ORD.
  const std::uint32_t ord = std::max<std::uint32_t>(info->attr.ord, 2);
  const std::uint32_t lanes = std::clamp<std::uint32_t>(std::min(want, ord / 2), 1, want);
  auto scratch = pd->allocate_memory(std::size_t{lanes} * (2 * L::group_bytes + lane_item_bytes),
                                     access::local_write);
  if (!scratch) return std::unexpected(scratch.error());
  auto c = std::make_unique<client_impl>(std::move(*dev), std::move(*pd), std::move(*cq),
                                         std::move(*qp), std::move(*scratch), *d, lanes, opts);
  if (auto r = c->init_rpc(); !r) return std::unexpected(r.error());
  return std::unique_ptr<client>(std::move(c));
}

}  // namespace conveyor::kv
