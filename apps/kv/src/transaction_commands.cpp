// Transactions (Redis's multi.c): MULTI, EXEC, DISCARD, WATCH, UNWATCH.
//
// Between MULTI and EXEC a client's commands are checked (name, arity) and
// queued, not run; a refused one marks the transaction and EXEC answers
// EXECABORT. EXEC runs the queue in one go on the loop thread, so nothing
// interleaves; an error inside one command is that command's reply (no
// rollback, as Redis). WATCH records each key's store version
// (store::key_version); EXEC compares them and answers a null array if any
// changed, whichever path changed it: another RESP client, an RDMA write RPC
// (same executor), expiry or eviction (the key is gone), and a key created and
// deleted again in between (an absent key's version changes when it is written).
//
// The AOF gets the transaction's records between MULTI and EXEC records, so a
// replay of a file cut inside them applies none of it (aof.cpp's loader).
#include <string>
#include <utility>
#include <vector>

#include "aof.hpp"
#include "command_context.hpp"

namespace conveyor::kv {

namespace {

void discard(session& s) {
  s.in_multi = false;
  s.multi_failed = false;
  s.queued.clear();
  s.queued.shrink_to_fit();
  s.queued_bytes = 0;
}

void unwatch(session& s) {
  s.watched.clear();
  s.watched.shrink_to_fit();
  s.watched_bytes = 0;
}

}  // namespace

void abort_transaction(session& s) {
  discard(s);
  unwatch(s);
}

void cmd_multi(exec_context& c) {
  if (c.sess.in_multi) return c.r.error("ERR MULTI calls can not be nested");
  c.sess.in_multi = true;
  c.sess.multi_failed = false;
  c.r.simple("OK");
}

void cmd_discard(exec_context& c) {
  if (!c.sess.in_multi) return c.r.error("ERR DISCARD without MULTI");
  discard(c.sess);
  unwatch(c.sess);
  c.r.simple("OK");
}

void cmd_watch(exec_context& c) {
  if (c.sess.in_multi) return c.r.error("ERR WATCH inside MULTI is not allowed");
  const auto& cfg = c.ex.config();
  for (std::size_t i = 1; i < c.argv.size(); ++i) {
    bool have = false;
    for (auto& [k, v] : c.sess.watched)
      if (k == c.argv[i]) {
        have = true;
        break;
      }
    if (have) continue;
    if (c.sess.watched.size() >= cfg.watch_max_keys ||
        c.sess.watched_bytes + c.argv[i].size() > cfg.multi_max_bytes)
      return c.r.error("ERR too many watched keys (at most " + std::to_string(cfg.watch_max_keys) +
                       " per client)");
    c.sess.watched.emplace_back(std::string(c.argv[i]), c.st().key_version(c.argv[i], c.now));
    c.sess.watched_bytes += c.argv[i].size();
  }
  c.r.simple("OK");
}

void cmd_unwatch(exec_context& c) {
  unwatch(c.sess);
  c.r.simple("OK");
}

void cmd_exec(exec_context& c) {
  if (!c.sess.in_multi) return c.r.error("ERR EXEC without MULTI");
  if (c.sess.multi_failed) {
    discard(c.sess);
    unwatch(c.sess);
    ++c.ex.stats().exec_aborts;
    return c.r.error("EXECABORT Transaction discarded because of previous errors.");
  }
  for (auto& [key, version] : c.sess.watched)
    if (c.st().key_version(key, c.now) != version) {
      discard(c.sess);
      unwatch(c.sess);
      ++c.ex.stats().watch_aborts;
      return c.r.null_array();
    }
  c.ex.run_queued(c.sess, c.r.out());
}

// Queues the command of `c` (the session is in MULTI): +QUEUED, or an error
// that marks the transaction when a bound is passed.
void queue_command(exec_context& c) {
  const auto& cfg = c.ex.config();
  std::size_t bytes = 0;
  for (auto a : c.argv) bytes += a.size() + 16;
  if (c.sess.queued.size() >= cfg.multi_max_commands ||
      bytes > cfg.multi_max_bytes - std::min(cfg.multi_max_bytes, c.sess.queued_bytes)) {
    c.sess.multi_failed = true;
    return c.r.error("ERR MULTI queue limit reached (" + std::to_string(cfg.multi_max_commands) +
                     " commands, " + std::to_string(cfg.multi_max_bytes) +
                     " bytes); the transaction will be discarded");
  }
  std::vector<std::string> copy;
  copy.reserve(c.argv.size());
  for (auto a : c.argv) copy.emplace_back(a);
  c.sess.queued.push_back(std::move(copy));
  c.sess.queued_bytes += bytes;
  c.r.simple("QUEUED");
}

void executor::run_queued(session& sess, std::string& out) {
  auto queued = std::move(sess.queued);
  discard(sess);
  unwatch(sess);
  reply r(out, sess.resp);
  r.array(queued.size());
  const std::size_t start = out.size();
  const std::size_t budget = sess.max_reply;
  in_exec_ = true;
  exec_logged_ = false;
  // Inside EXEC nothing blocks: BLPOP/BRPOP answer as on their timeout (Redis).
  const bool may_block = std::exchange(sess.may_block, false);
  std::vector<std::string_view> argv;
  for (auto& cmd : queued) {
    if (abandon_exec_) {  // SHUTDOWN NOSAVE abandoned a script of this queue
      reply(out, sess.resp).error("ERR the server is shutting down");
      continue;  // the reply's array stays whole; nothing more runs
    }
    argv.assign(cmd.begin(), cmd.end());
    // Each command may take what is left of the reply's bound.
    const std::size_t used = out.size() - start;
    sess.max_reply = used < budget ? budget - used : 0;
    execute(sess, argv, out);
  }
  sess.max_reply = budget;
  sess.may_block = may_block;
  in_exec_ = false;
  if (std::exchange(abandon_exec_, false)) return;  // no EXEC record: the block is cut
  if (exec_logged_) {
    const std::string_view end[] = {"EXEC"};
    emit(end);
  }
}

}  // namespace conveyor::kv
