// The TCP front end (resp_server_impl.hpp): running a client's commands in
// order — the pipeline up to the output pause, commands held by CLIENT PAUSE,
// and the clients parked by BLPOP/BRPOP (served when a key they wait on is
// pushed to, or answered at their deadline).
#include "blocking.hpp"
#include "resp_server_impl.hpp"
#include "script.hpp"
#include "store.hpp"  // now_ms

namespace conveyor::kv {

// One command of `c`: its reply may take what is left of the output limit,
// and `running` names its client while it executes (a script serving others).
void resp_server::impl::run(client& c, std::span<const std::string_view> command) {
  c.sess.max_reply = opts.output_limit > c.unsent() ? opts.output_limit - c.unsent() : 0;
  const auto outer = running;
  running = c.sess.id;
  const std::size_t start = c.out.size();
  exec.execute(c.sess, command, c.out);
  running = outer;
  gate(c, start);
}

// Runs the complete commands the parser holds, in order, until the output
// reaches the pause mark: the rest waits in the parser (paused) until the
// client has read its replies, so a pipeline of large replies holds about
// output_pause bytes, not the sum of its replies.
void resp_server::impl::process(client& c) {
  std::vector<std::string_view> nested_argv;  // a command run while another executes
  auto& args = running != 0 ? nested_argv : argv;
  if (!c.held.empty()) {
    std::vector<std::string_view> h(c.held.begin(), c.held.end());
    if (exec.paused_for(c.sess, h, now_ms())) {
      held.insert(c.sess.id);
      c.paused = true;
      return;
    }
    run(c, h);
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
    run(c, args);
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

void resp_server::impl::park(client& c, std::span<const std::string_view> command) {
  c.sess.blocked = false;
  c.blocked = true;
  c.blocked_argv.assign(command.begin(), command.end());
  exec.blocking().add(c.sess.id, c.sess.block_keys, c.sess.block_deadline);
}

// The client's command has its answer (a reply or a timeout's): the
// pipeline after it goes on.
void resp_server::impl::unpark(client& c) {
  c.blocked = false;
  c.blocked_argv.clear();
  mark_pending(c.sess.id, c);
  process(c);
}

// Runs the parked commands of the clients waiting on ready keys, in arrival
// order, until one finds its keys empty again (the rest keep waiting).
void resp_server::impl::serve_blocked() {
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
      run(c, args);
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

void resp_server::impl::expire_blocked() {
  if (exec.scripts().busy()) return;
  for (auto id : exec.blocking().expired(now_ms())) {
    auto it = clients.find(id);
    if (it == clients.end() || !it->second->blocked) continue;
    reply(it->second->out, it->second->sess.resp).null_array();
    unpark(*it->second);
  }
}

void resp_server::impl::resume_held() {
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

}  // namespace conveyor::kv
