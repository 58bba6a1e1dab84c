// A node's identity and its etcd key names (cluster_node.hpp): the cluster
// name's rule, the keys under /conveyor-kv/<name>/, the registrations in a
// range, random ids and the node id kept in its directory.
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cluster/cluster_node.hpp"

namespace conveyor::kv::cluster {

namespace {

bool fill_random(unsigned char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

result<void> write_file_durably(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(errc::io_error, "creating " + tmp, errno);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::fsync(fd) == 0 && ok;
  const int saved = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return make_error(errc::io_error, "writing " + path, ok ? errno : saved);
  }
  return {};
}

}  // namespace

bool valid_cluster_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

std::string cluster_prefix(std::string_view name) {
  return "/conveyor-kv/" + std::string(name) + "/";
}
std::string config_key(std::string_view name) {
  return cluster_prefix(name) + "config";
}
std::string nodes_prefix(std::string_view name) {
  return cluster_prefix(name) + "nodes/";
}

std::vector<node_registration> registrations_in(const std::vector<key_value>& kvs,
                                                std::string_view prefix, std::size_t* bad) {
  std::vector<node_registration> out;
  for (const auto& kv : kvs) {
    auto reg = parse_node_registration(kv.value);
    if (!reg || !kv.key.starts_with(prefix) ||
        std::string_view(kv.key).substr(prefix.size()) != reg->id) {
      if (bad) ++*bad;
      continue;
    }
    out.push_back(std::move(*reg));
  }
  return out;
}

std::string random_id() {
  unsigned char b[20];
  if (!fill_random(b, sizeof b)) {
    // getrandom does not fail for 20 bytes once the pool is initialized; were
    // it to, an id must still never be predictable.
    std::terminate();
  }
  return hex(b, sizeof b);
}

result<std::string> load_or_create_node_id(const std::string& dir) {
  const std::string path = dir + "/" + std::string(node_id_file);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[64];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    ::close(fd);
    std::string_view s(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    if (!s.empty() && s.back() == '\n') s.remove_suffix(1);
    if (n < 0 || !valid_id(s))
      return make_error(errc::invalid_argument,
                        path +
                            " does not hold a node id (40 lowercase hex characters); remove it to "
                            "give this node a new id");
    return std::string(s);
  }
  if (errno != ENOENT) return make_error(errc::io_error, "reading " + path, errno);
  std::string id = random_id();
  if (auto w = write_file_durably(path, id + "\n"); !w) return std::unexpected(w.error());
  return id;
}

}  // namespace conveyor::kv::cluster
