// conveyor/mr.hpp — memory regions, access rights, scatter/gather elements and
// the remote_region value that a peer needs to access registered memory.
//
//   auto mr = pd.register_memory(buf, access::local_write | access::remote_read).value();
//   std::vector<std::byte> wire = mr.remote().encode();   // send to the peer
//   auto peer = remote_region::decode(wire).value();       // on the other side
//
// A memory_region owns its registration: destroying it (or calling
// deregister()) revokes the keys at once. Operations in flight that use the key
// afterwards fail with rem_access_err / loc_prot_err; the memory is never touched
// after deregister() returns, by this process's own requests either (a SEND or
// WRITE still reading it, a receive or READ sink, on soft and shm alike;
// verbs leaves that case to the application, docs/VERBS.md).
// Thread safety: a memory_region is thread-compatible; its keys are checked by
// the provider engine concurrently and safely.
//
// The software providers do not pin registered memory: a registered file
// mapping whose file is truncated under it faults (SIGBUS, the process ends)
// when the engine touches the lost pages, for a peer's READ too. Register
// file-backed memory only from files nobody else can shrink (a memfd sealed
// with F_SEAL_SHRINK cannot be).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "conveyor/error.hpp"
#include "conveyor/export.hpp"

namespace conveyor {

namespace detail {
class mr_impl;
}

// Access rights of a registration (bit flags, combine with |).
enum class access : std::uint32_t {
  none = 0,
  local_write = 1u << 0,    // the local NIC may write (receive, read sink, atomic result)
  remote_write = 1u << 1,   // peers may RDMA WRITE into it
  remote_read = 1u << 2,    // peers may RDMA READ from it
  remote_atomic = 1u << 3,  // peers may run atomics on it
  // A peer's Send with Invalidate naming this region's rkey may revoke it
  // (verbs: what memory windows and fast-registered keys allow). Without it
  // (the default) the region is never remotely invalidatable: soft and shm
  // refuse such a Send with a Terminate (the sender's SEND completes with
  // rem_access_err, the receive with rem_inv_req_err, the connection fails)
  // and the key stays valid. Only set it for a region whose rkey you hand to
  // a peer that may end the region's use: every peer given the rkey can revoke
  // it for every other peer of the protection domain. verbs: a plain MR cannot
  // express it; the bit is accepted and grants nothing (docs/VERBS.md).
  remote_invalidate = 1u << 4,
};
constexpr access operator|(access a, access b) noexcept {
  return static_cast<access>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr access operator&(access a, access b) noexcept {
  return static_cast<access>(static_cast<std::uint32_t>(a) & static_cast<std::uint32_t>(b));
}
constexpr bool has(access set, access bit) noexcept {
  return (set & bit) == bit;
}

// A scatter/gather element: a span of registered local memory (verbs ibv_sge).
struct sge {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

// What a peer needs to access registered memory: a plain value.
struct CONVEYOR_API remote_region {
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  std::uint32_t rkey = 0;

  // The sub-range [offset, offset+len); no bounds check (the target's engine checks).
  remote_region slice(std::uint64_t offset, std::uint64_t len) const noexcept {
    return {addr + offset, len, rkey};
  }

  // Stable, versioned byte encoding (28 bytes): magic "CVRR", version 1, three
  // reserved bytes, addr (8, big-endian), length (8, BE), rkey (4, BE).
  static constexpr std::size_t encoded_size = 28;
  std::vector<std::byte> encode() const;
  void encode_to(std::span<std::byte, encoded_size> out) const noexcept;
  // Fails with invalid_argument on a short buffer, wrong magic or unknown version.
  static result<remote_region> decode(std::span<const std::byte> bytes);

  friend bool operator==(const remote_region&, const remote_region&) = default;
};

// A registration: move-only RAII handle. Keeps its protection domain alive.
class CONVEYOR_API memory_region {
 public:
  memory_region() = default;
  explicit memory_region(std::shared_ptr<detail::mr_impl> impl) noexcept;
  memory_region(memory_region&&) noexcept = default;
  memory_region& operator=(memory_region&&) noexcept;
  memory_region(const memory_region&) = delete;
  memory_region& operator=(const memory_region&) = delete;
  ~memory_region();

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  std::byte* data() const noexcept;
  std::size_t size() const noexcept;
  std::uint64_t addr() const noexcept;
  std::uint32_t lkey() const noexcept;
  std::uint32_t rkey() const noexcept;
  access rights() const noexcept;

  // The whole region (or a slice) as an SGE for local use in work requests.
  // An SGE's length is 32 bits: a longer slice saturates at 2^32 - 1 bytes, a
  // length every provider's post refuses with invalid_argument, never a
  // silently shorter transfer.
  sge as_sge() const noexcept { return slice(0, size()); }
  sge slice(std::size_t offset, std::size_t len) const noexcept {
    constexpr std::size_t max_len = 0xFFFFFFFFu;
    return {addr() + offset, static_cast<std::uint32_t>(len < max_len ? len : max_len), lkey()};
  }
  // What a peer needs: {addr, length, rkey}.
  remote_region remote() const noexcept { return {addr(), size(), rkey()}; }

  // Revokes the keys now (the destructor does the same). Waits only for an
  // engine access already under way (bounded: one non-blocking system call).
  // The handle is empty afterwards; a region from allocate_memory also frees
  // its memory (on shm a peer's racing direct access lands in pages that only
  // the peer still maps; its next access fails).
  void deregister() noexcept;

 private:
  std::shared_ptr<detail::mr_impl> impl_;
};

}  // namespace conveyor
