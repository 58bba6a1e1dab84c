// libFuzzer target: conveyor-kv's RDMA RPC request decoder (parse_rpc_request,
// apps/kv/src/rdma_server.*), and what the loop does with what it accepts.
// Input: byte 0 picks the argument bound and the reply bound; the rest is one
// received message, as the server copies it out of a receive buffer.
// Properties: an accepted request's arguments lie inside the message, number
// 1..max_args, re-encode to a request that decodes to the same arguments, and
// are what the RESP parser makes of the same bytes; running it through the
// executor (on a real store) gives one well-formed reply no larger than the
// reply bound (or an error of at most 2 KiB), and never crashes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "commands.hpp"
#include "fuzz_check.hpp"
#include "rdma_server.hpp"
#include "resp.hpp"
#include "store.hpp"

namespace {

namespace kv = conveyor::kv;

struct world {
  conveyor::device dev = conveyor::device::open("soft").value();
  conveyor::protection_domain pd = dev.alloc_pd().value();
  std::unique_ptr<kv::store> st;
  kv::server_config cfg;
  std::unique_ptr<kv::executor> exec;
  world() {
    kv::store_options o;
    o.index_buckets = 1024;
    o.data_bytes = 4u << 20;
    o.max_value = 64u << 10;
    o.max_key = 4u << 10;
    o.maxmemory = 4u << 20;
    o.policy = kv::eviction_policy::allkeys_lru;  // the store never fills up for good
    st = std::move(kv::store::create(pd, o).value());
    exec = std::make_unique<kv::executor>(*st, nullptr, cfg);
  }
};

world& the_world() {
  static world w;
  return w;
}

// One RESP2 reply's length at the start of r (0 if malformed or incomplete).
std::size_t reply_length(std::string_view r, std::size_t pos, int depth) {
  if (pos >= r.size() || depth > 8) return 0;
  const auto eol = r.find("\r\n", pos);
  if (eol == std::string_view::npos) return 0;
  const char type = r[pos];
  if (type == '+' || type == '-' || type == ':') return eol + 2 - pos;
  long long n = 0;
  try {
    n = std::stoll(std::string(r.substr(pos + 1, eol - pos - 1)));
  } catch (...) {
    return 0;
  }
  if (type == '$') {
    if (n < 0) return eol + 2 - pos;
    const auto end = eol + 2 + static_cast<std::size_t>(n);
    if (end + 2 > r.size() || r.substr(end, 2) != "\r\n") return 0;
    return end + 2 - pos;
  }
  if (type == '*') {
    std::size_t at = eol + 2;
    for (long long i = 0; i < n; ++i) {
      const auto len = reply_length(r, at, depth + 1);
      if (len == 0) return 0;
      at += len;
    }
    return at - pos;
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t max_args = 1 + data[0] % 16;
  const std::size_t max_reply = std::size_t{64} << (data[0] >> 4);  // 64 B .. 2 MiB
  const std::string msg(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::vector<std::string_view> argv;
  if (!kv::parse_rpc_request(msg, argv, max_args)) return 0;
  FUZZ_CHECK(!argv.empty() && argv.size() <= max_args);
  for (auto a : argv)
    FUZZ_CHECK(a.data() >= msg.data() && a.data() + a.size() <= msg.data() + msg.size());

  // Re-encoded, it decodes to the same arguments (and is no longer: the
  // decoder's only slack is leading zeros in lengths).
  std::string enc;
  kv::encode_command(enc, argv);
  FUZZ_CHECK(enc.size() <= msg.size());
  std::vector<std::string_view> back;
  FUZZ_CHECK(kv::parse_rpc_request(enc, back, max_args));
  FUZZ_CHECK(std::vector<std::string>(back.begin(), back.end()) ==
             std::vector<std::string>(argv.begin(), argv.end()));

  // The RESP parser reads the same bytes as the same one command.
  kv::parser_limits lim;
  kv::request_parser p(lim);
  p.feed(msg);
  std::vector<std::string_view> resp_argv;
  FUZZ_CHECK(p.next(resp_argv) == kv::parse_status::command);
  FUZZ_CHECK(std::vector<std::string>(resp_argv.begin(), resp_argv.end()) ==
             std::vector<std::string>(argv.begin(), argv.end()));
  FUZZ_CHECK(p.consumed() == msg.size());

  // What the loop does with it: one reply, within the bound.
  auto& w = the_world();
  kv::session s;
  s.authenticated = true;
  s.max_reply = max_reply;
  std::string out;
  w.exec->execute(s, argv, out);
  FUZZ_CHECK(!out.empty());
  // Errors are short (an unknown command quotes at most ~1 KiB of itself).
  FUZZ_CHECK(out.size() <= max_reply || (out[0] == '-' && out.size() <= 2048));
  if (s.resp == 2) FUZZ_CHECK(reply_length(out, 0, 0) == out.size());
  return 0;
}
