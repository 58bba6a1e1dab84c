// /proc/self/maps as text (proc_maps.hpp).
#include "core/proc_maps.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace conveyor::detail {

namespace {

// The next space-separated field of `s` (spaces before it skipped), removed
// from `s`.
std::string_view next_field(std::string_view& s) noexcept {
  std::size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  std::size_t j = i;
  while (j < s.size() && s[j] != ' ') ++j;
  const std::string_view f = s.substr(i, j - i);
  s.remove_prefix(j);
  return f;
}

template <class T>
bool parse_number(std::string_view s, T& v, int base) noexcept {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  return ec == std::errc() && p == s.data() + s.size();
}

// "a<sep>b" as two numbers in `base`.
template <class T>
bool parse_pair(std::string_view s, char sep, T& a, T& b, int base) noexcept {
  const auto at = s.find(sep);
  if (at == std::string_view::npos) return false;
  return parse_number(s.substr(0, at), a, base) && parse_number(s.substr(at + 1), b, base);
}

}  // namespace

bool parse_maps_line(std::string_view line, maps_entry& out) noexcept {
  const std::string_view range = next_field(line);
  const std::string_view perms = next_field(line);
  const std::string_view offset = next_field(line);
  const std::string_view dev = next_field(line);
  const std::string_view inode = next_field(line);
  std::uint64_t off = 0;
  maps_entry e;
  if (!parse_pair(range, '-', e.start, e.end, 16) || e.end <= e.start) return false;
  if (perms.size() != 4 || (perms[3] != 's' && perms[3] != 'p')) return false;
  e.shared = perms[3] == 's';
  if (!parse_number(offset, off, 16)) return false;
  if (!parse_pair(dev, ':', e.dev_major, e.dev_minor, 16)) return false;
  if (!parse_number(inode, e.inode, 10)) return false;
  out = e;
  return true;
}

bool maps_range_check::feed(const maps_entry& e) noexcept {
  if (done_) return false;
  if (e.end <= at_) return true;  // before the part still to cover
  // Out of order, a gap before this entry, or memory the monitor cannot see change.
  if (e.start > at_ || !e.private_anonymous()) {
    done_ = true;
    return false;
  }
  at_ = e.end;
  if (at_ >= end_) {
    ok_ = true;
    done_ = true;
  }
  return !done_;
}

bool maps_private_anonymous(std::uintptr_t start, std::uintptr_t end) noexcept {
  if (end <= start) return false;
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  maps_range_check check(start, end);
  // A line is at most about 100 bytes plus a path (PATH_MAX 4096).
  char buf[8192];
  std::size_t have = 0;
  bool bad = false;
  while (!check.done() && !bad) {
    const ssize_t n = ::read(fd, buf + have, sizeof buf - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the end (or an error): the range was not covered
    have += static_cast<std::size_t>(n);
    std::size_t from = 0;
    for (;;) {
      const void* nl = std::memchr(buf + from, '\n', have - from);
      if (nl == nullptr) break;
      const std::size_t to = static_cast<std::size_t>(static_cast<const char*>(nl) - buf);
      maps_entry e;
      if (!parse_maps_line(std::string_view(buf + from, to - from), e)) {
        bad = true;
        break;
      }
      from = to + 1;
      if (!check.feed(e)) break;
    }
    if (from == 0 && have == sizeof buf) bad = true;  // a line longer than the buffer
    std::memmove(buf, buf + from, have - from);
    have -= from;
  }
  ::close(fd);
  return !bad && check.ok();
}

}  // namespace conveyor::detail
