// conveyor::kv::client's GET engine (client_impl.hpp): a batch of keys on
// the lanes, one READ of a remembered item or the two bucket groups then the
// item, every read checked (torn, freed, moved: read again, never returned),
// the READs of a round posted with one doorbell, and on a cluster node the
// header words READ last in each doorbell judged before an answer is given
// (docs/KV.md "One READ", docs/KV-CLUSTER.md "What a one-sided reader checks").
#include <thread>

#include "client_impl.hpp"

namespace conveyor::kv::detail {

result<void> client_impl::run_gets_ref(std::span<const std::string_view> keys, sink_ref sink) {
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
std::string client_impl::unfinished(std::size_t left,
                                    const std::vector<std::uint32_t>& free_lanes) const {
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
std::string client_impl::first_error() {
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

// READs are collected while a round of lanes starts or a batch of
// completions is handled, then posted together: one doorbell for them all
// (an MGET of remembered keys is one post of all its READs).
result<void> client_impl::post(std::span<send_wr> wrs) {
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
result<void> client_impl::judge_headers(std::uint64_t seq, Sink& sink, Finish& finish) {
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

result<void> client_impl::flush() {
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

result<void> client_impl::read_groups(std::uint32_t l) {
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

result<void> client_impl::restart(std::uint32_t l) {
  ++stats_.retries;
  if (++lanes_[l].restarts > max_restarts)
    return fail(errc::timed_out, "kv client: GET kept reading torn or moving data");
  return read_groups(l);
}

template <class Answer>
result<void> client_impl::next_candidate(std::uint32_t l, Answer& answer) {
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

result<void> client_impl::read_item(std::uint32_t l, std::uint64_t off, std::uint64_t bytes) {
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

}  // namespace conveyor::kv::detail
