// conveyor::kv::detail::client_impl — the C++ client's implementation class
// (client.hpp): its public surface, the hash reads and the write RPCs here;
// the one-sided GET engine (lanes, doorbells, the checks of buckets and items,
// a cluster node's header words) in client_gets.cpp; connect in client.cpp.
// Not installed; only those two files include it.
#pragma once

#include "conveyor_kv/client.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "location_cache.hpp"
#include "reply_text.hpp"
#include "store_layout.hpp"

namespace conveyor::kv::detail {

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

// What a GET found, handed to the caller's callback: (index in the batch,
// type, value bytes, length). A function pointer and its context, so the GET
// engine (client_gets.cpp) is not a template.
struct sink_ref {
  void* ctx;
  void (*fn)(void*, std::size_t, L::value_type, const std::byte*, std::size_t);
  template <class F>
  static sink_ref of(F& f) {
    return {&f, [](void* c, std::size_t i, L::value_type t, const std::byte* p, std::size_t n) {
              (*static_cast<F*>(c))(i, t, p, n);
            }};
  }
  void operator()(std::size_t i, L::value_type t, const std::byte* p, std::size_t n) const {
    fn(ctx, i, t, p, n);
  }
};

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

  // The GET engine (client_gets.cpp): every key's one-sided read, `depth`
  // in flight, each answer given to `sink`.
  template <class Sink>
  result<void> run_gets(std::span<const std::string_view> keys, Sink&& sink) {
    return run_gets_ref(keys, sink_ref::of(sink));
  }
  result<void> run_gets_ref(std::span<const std::string_view> keys, sink_ref sink);
  // For a timed-out batch: how many GETs were left, how long the slowest had
  // been running since its last (re)start, and how many rounds were repeated.
  std::string unfinished(std::size_t left, const std::vector<std::uint32_t>& free_lanes) const;
  // The status of the completion that failed the QP, for the error message.
  std::string first_error();
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
  result<void> post(std::span<send_wr> wrs);
  // A cluster node's header words arrived (READ number `seq`, after every
  // READ posted before it): each GET waiting on it is answered, refused, or
  // waits for another READ of the words (store_layout.hpp judge).
  template <class Sink, class Finish>
  result<void> judge_headers(std::uint64_t seq, Sink& sink, Finish& finish);
  result<void> flush();
  result<void> read_groups(std::uint32_t l);
  result<void> restart(std::uint32_t l);
  template <class Answer>
  result<void> next_candidate(std::uint32_t l, Answer& answer);
  result<void> read_item(std::uint32_t l, std::uint64_t off, std::uint64_t bytes);

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

}  // namespace conveyor::kv::detail
