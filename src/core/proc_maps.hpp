// /proc/self/maps read as text, for the registration cache's monitor on
// kernels without PROCMAP_QUERY (before Linux 6.11, e.g. Debian 12's 6.1):
// whether an address range lies wholly in private anonymous mappings, the
// only memory whose changes the monitor's userfaultfd events report.
// Allocation-free (the monitor's rules, memory_monitor.hpp) and bounded.
#pragma once

#include <cstdint>
#include <string_view>

namespace conveyor::detail {

// One line of /proc/<pid>/maps: "start-end perms offset major:minor inode [name]".
struct maps_entry {
  std::uintptr_t start = 0, end = 0;
  bool shared = false;  // perms[3] == 's'
  std::uint32_t dev_major = 0, dev_minor = 0;
  std::uint64_t inode = 0;
  bool private_anonymous() const noexcept {
    return !shared && dev_major == 0 && dev_minor == 0 && inode == 0;
  }
};

// Parses one line (without its newline); false for anything malformed.
bool parse_maps_line(std::string_view line, maps_entry& out) noexcept;

// Walks the entries of a maps text in address order and answers whether
// [start, end) is covered, without gaps, by private anonymous mappings.
class maps_range_check {
 public:
  maps_range_check(std::uintptr_t start, std::uintptr_t end) noexcept : at_(start), end_(end) {}
  // Feeds the next entry; false once the answer is known (done() says it).
  bool feed(const maps_entry& e) noexcept;
  bool done() const noexcept { return done_; }
  // The answer: true only when the whole range was covered.
  bool ok() const noexcept { return ok_; }

 private:
  std::uintptr_t at_, end_;
  bool done_ = false, ok_ = false;
};

// The check on this process's own /proc/self/maps (opened, read in chunks
// into a fixed buffer, closed): false also when it cannot be read or a line
// is malformed or longer than the buffer.
bool maps_private_anonymous(std::uintptr_t start, std::uintptr_t end) noexcept;

}  // namespace conveyor::detail
