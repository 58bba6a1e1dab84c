// conveyor::kv::pubsub — Redis's publish/subscribe: channels, glob patterns,
// and the messages PUBLISH delivers to the subscribed RESP clients (RESP2
// arrays, RESP3 push frames, per subscriber). Delivery goes through the front
// end's hook (front_end_hooks::deliver), which appends to the client's output
// and enforces client-output-buffer-limit pubsub: a subscriber that does not
// read is closed, so a fast publisher cannot make the server hold its messages
// without bound.
//
// Thread safety: loop thread only (the executor owns it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "commands.hpp"

namespace conveyor::kv {

class pubsub {
 public:
  explicit pubsub(front_end_hooks& hooks) : hooks_(hooks) {}

  // False if the session was already subscribed to it.
  bool subscribe(session& s, std::string_view channel);
  bool unsubscribe(session& s, std::string_view channel);
  bool psubscribe(session& s, std::string_view pattern);
  bool punsubscribe(session& s, std::string_view pattern);
  // Every subscription of the session goes (the client closed).
  void forget(session& s);
  // Delivers to the channel's subscribers and the matching patterns'; returns
  // how many deliveries were made (Redis's PUBLISH reply).
  std::size_t publish(std::string_view channel, std::string_view message);

  // PUBSUB CHANNELS [pattern], NUMSUB, NUMPAT.
  std::vector<std::string_view> active_channels(std::string_view pattern, bool all) const;
  std::size_t subscribers(std::string_view channel) const;
  std::size_t patterns() const noexcept { return patterns_.size(); }

  // MONITOR: each command run is shown to these sessions (their line is
  // delivered as pub/sub messages are).
  void add_monitor(session& s);
  bool has_monitors() const noexcept { return !monitors_.empty(); }
  void feed_monitors(std::string_view line);

 private:
  struct pattern_subs {
    glob_pattern glob;
    std::map<std::uint64_t, const session*> subs;
  };
  front_end_hooks& hooks_;
  std::unordered_map<std::string, std::map<std::uint64_t, const session*>> channels_;
  std::map<std::string, pattern_subs, std::less<>> patterns_;
  std::map<std::uint64_t, const session*> monitors_;
};

// The reply to SUBSCRIBE and its kin: one frame per channel ("subscribe",
// channel, count), a push frame in RESP3. channel may be null (nullptr: an
// UNSUBSCRIBE with nothing to leave).
void pubsub_frame(std::string& out, int resp, std::string_view kind, const std::string_view* name,
                  std::size_t count);

}  // namespace conveyor::kv
