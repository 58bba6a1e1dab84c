// The AOF rewrite's form of a collection (object.hpp): the commands that build
// it again, 64 elements a command (as Redis's AOF_REWRITE_ITEMS_PER_CMD), so no
// record grows with the collection.
#include <cmath>
#include <cstdio>
#include <vector>

#include "object.hpp"
#include "resp.hpp"

namespace conveyor::kv {

std::string score_str(double d) {
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  int n = std::snprintf(buf, sizeof buf, "%.17g", d);
  return std::string(buf, static_cast<std::size_t>(n));
}

namespace {

constexpr std::size_t per_command = 64;

// Collects arguments and writes a command every per_command elements.
struct batcher {
  std::string& out;
  std::string_view cmd, key;
  std::vector<std::string> args;
  std::size_t per;  // arguments per element
  void add(std::string a) {
    args.push_back(std::move(a));
    if (args.size() >= per_command * per) flush();
  }
  void flush() {
    if (args.empty()) return;
    std::vector<std::string_view> argv{cmd, key};
    for (auto& a : args) argv.emplace_back(a);
    encode_command(out, argv);
    args.clear();
  }
};

}  // namespace

void encode_collection(std::string& out, std::string_view key, const collection& c) {
  switch (c.type) {
    case value_type::hash: {
      batcher b{out, "HSET", key, {}, 2};
      for (const auto* e : static_cast<const hash_object&>(c).fields) {
        b.add(std::string(e->key()));
        b.add(e->value);
      }
      b.flush();
      break;
    }
    case value_type::list: {
      batcher b{out, "RPUSH", key, {}, 1};
      for (const auto& v : static_cast<const list_object&>(c).items) b.add(v);
      b.flush();
      break;
    }
    case value_type::set: {
      batcher b{out, "SADD", key, {}, 1};
      for (const auto* m : static_cast<const set_object&>(c).members) b.add(std::string(m->key()));
      b.flush();
      break;
    }
    case value_type::zset: {
      batcher b{out, "ZADD", key, {}, 2};
      for (const auto& [s, m] : static_cast<const zset_object&>(c).order) {
        b.add(score_str(s));
        b.add(m);
      }
      b.flush();
      break;
    }
    case value_type::string:
      break;
  }
}

}  // namespace conveyor::kv
