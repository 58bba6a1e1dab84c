// Sealed memfds: the one way the shm provider shares memory with a peer (the
// connection segment, allocated regions, the revocation page). A mapping of a
// file that another process can shrink faults (SIGBUS) on every access past the
// new end, so whoever maps a peer's memfd first checks that it is sealed
// against shrinking and growing and at least as large as what it maps.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace conveyor::shm {

inline constexpr int required_seals = F_SEAL_SHRINK | F_SEAL_GROW;

// A memfd of `len` bytes that can neither shrink nor grow (and whose seals
// cannot change); its inode in *ino. -1 with errno on failure.
inline int sealed_memfd(const char* name, std::size_t len, std::uint64_t* ino) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  struct stat st {};
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, required_seals | F_SEAL_SEAL) != 0 || ::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  if (ino) *ino = st.st_ino;
  return fd;
}

// A peer's descriptor is safe to map over [0, len): a regular file sealed
// against shrinking and growing, at least len bytes (exactly len when `exact`),
// and, when ino is nonzero, the very file the peer named.
inline bool sealed_memfd_ok(int fd, std::uint64_t len, bool exact, std::uint64_t ino) {
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & required_seals) != required_seals) return false;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (exact ? size != len : size < len) return false;
  return ino == 0 || static_cast<std::uint64_t>(st.st_ino) == ino;
}

}  // namespace conveyor::shm
