// Commands about a key's type and object (Redis's object.c, db.c): OBJECT
// ENCODING, RENAME, RENAMENX. OBJECT ENCODING reports Redis 7.0's names: a
// string is int, embstr or raw; a hash and a sorted set listpack until they
// pass their thresholds (encoding_limits), then hashtable and skiplist; a set
// intset while all its members are integers within set-max-intset-entries,
// then hashtable; a list quicklist (7.0 has no other).
#include <string>

#include "type_commands.hpp"

namespace conveyor::kv {

void cmd_object(exec_context& c) {
  if (!iequal(c.argv[1], "ENCODING")) {
    std::string e = "ERR unknown subcommand '";
    e += c.argv[1].substr(0, 128);
    e += "'. Try OBJECT HELP.";
    return c.r.error(e);
  }
  if (c.argv.size() != 3)
    return c.r.error("ERR wrong number of arguments for 'object|encoding' command");
  auto key = c.argv[2];
  auto t = c.st().type_of(key, c.now);
  if (!t) return c.r.null();
  if (*t == value_type::string) {
    auto v = c.st().get(key, c.now);
    std::int64_t n;
    if (v && v->size() <= 20 && to_i64(*v, n)) return c.r.bulk("int");
    return c.r.bulk(v && v->size() <= 44 ? "embstr" : "raw");
  }
  bool wrong;
  auto* o = c.st().find_collection(key, *t, c.now, &wrong);
  const bool big = o != nullptr && o->big;
  switch (*t) {
    case value_type::hash:
      return c.r.bulk(big ? "hashtable" : "listpack");
    case value_type::zset:
      return c.r.bulk(big ? "skiplist" : "listpack");
    case value_type::set:
      return c.r.bulk(big ? "hashtable" : "intset");
    case value_type::list:
      return c.r.bulk("quicklist");
    case value_type::string:
      break;
  }
  c.r.null();
}

namespace {
void rename_generic(exec_context& c, bool nx) {
  if (!c.st().contains(c.argv[1], c.now)) return c.r.error("ERR no such key");
  if (nx && c.argv[1] != c.argv[2] && c.st().contains(c.argv[2], c.now)) return c.r.integer(0);
  if (nx && c.argv[1] == c.argv[2]) return c.r.integer(0);
  bool oom = false;
  if (!c.st().rename(c.argv[1], c.argv[2], c.now, &oom)) return c.r.error(err_oom);
  c.log({"RENAME", c.argv[1], c.argv[2]});
  c.ex.blocking().signal(c.argv[2]);
  nx ? c.r.integer(1) : c.r.simple("OK");
}
}  // namespace

void cmd_rename(exec_context& c) {
  rename_generic(c, false);
}
void cmd_renamenx(exec_context& c) {
  rename_generic(c, true);
}

}  // namespace conveyor::kv
