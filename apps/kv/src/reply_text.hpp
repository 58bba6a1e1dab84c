// conveyor::kv::reply_text — what the RDMA clients (client.cpp,
// cluster_client.cpp) make of a command's raw RESP reply: an error reply as
// errc::rejected with its text, an integer reply's value. Pure functions.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include <conveyor/error.hpp>

namespace conveyor::kv::reply_text {

// "-ERR ..." as errc::rejected ("ERR ..."); anything else as a protocol
// error naming `who` and the reply's first bytes.
inline std::unexpected<error> error_of(std::string_view r, std::string_view who) {
  if (!r.empty() && r[0] == '-') {
    auto e = r.substr(1);
    if (e.ends_with("\r\n")) e.remove_suffix(2);
    return make_error(errc::rejected, std::string(e));
  }
  return make_error(errc::protocol_error,
                    std::string(who) + ": unexpected reply: " + std::string(r.substr(0, 64)));
}

// ":<n>\r\n" as n; otherwise error_of.
inline result<std::int64_t> integer_of(std::string_view r, std::string_view who) {
  std::int64_t v = 0;
  if (r.size() < 4 || r[0] != ':' || !r.ends_with("\r\n")) return error_of(r, who);
  auto [p, ec] = std::from_chars(r.data() + 1, r.data() + r.size() - 2, v);
  if (ec != std::errc{} || p != r.data() + r.size() - 2) return error_of(r, who);
  return v;
}

}  // namespace conveyor::kv::reply_text
