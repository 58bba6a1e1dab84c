// The shm provider's shared segment: one memfd per connection, created by the
// initiator sealed against shrinking and growing (the target maps no other;
// shm_memfd.hpp) and passed to the target over the Unix socket (SCM_RIGHTS), holding
// four single-producer/single-consumer rings of fixed-size slots:
//   req[s]  requests side s sends (SEND, WRITE, READ, atomic, immediate data)
//   resp[s] responses side s sends (staged READ data, atomic results)
// Side 0 is the initiator, side 1 the target. Responses have their own rings so
// that a side always drains them without needing room to answer anything: two
// peers that flood each other with READs cannot deadlock.
//
// A request ring's tail is also the consumer's acknowledgement: the consumer
// advances it only after the request was fully executed (bytes placed, response
// queued), so "tail passed my request" means "done". A request the consumer
// refuses (bad key, no receive) is named by err_pos/err_status instead.
//
// Nothing here is trusted by the consumer: indices are range-checked and every
// slot header is copied out once, validated once, and only that copy is used
// until the request retires (the peer may change the slot under us); docs/SHM.md,
// "What a peer is trusted with".
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace conveyor::shm {

inline constexpr std::uint32_t seg_magic = 0x43565348;  // "CVSH"
inline constexpr std::uint32_t seg_version = 4;   // 2: map_req/map_resp, 3: hints, 4: CMA fence
inline constexpr std::uint32_t ring_slots = 256;  // per ring, power of two
inline constexpr std::uint32_t slot_size = 8192;  // header + payload
inline constexpr std::uint32_t slot_header = 64;
inline constexpr std::uint32_t slot_payload = slot_size - slot_header;

struct alignas(64) ring_ctl {
  alignas(64) std::atomic<std::uint64_t> head{0};  // producer: next slot to fill
  alignas(64) std::atomic<std::uint64_t> tail{0};  // consumer: next slot to execute
  std::atomic<std::uint32_t> err_status{0};        // consumer: nonzero = refused (wc_status + 1)
  std::atomic<std::uint64_t> err_pos{0};           // the refused slot
};

enum class msg_op : std::uint8_t {
  send = 1,     // staged SEND bytes (one slot of a message)
  send_cma,     // SEND whose bytes the target pulls from the initiator's SGEs
  write,        // staged WRITE bytes
  write_cma,    // WRITE the target pulls with process_vm_readv
  immediate,    // WRITE_WITH_IMM's immediate: consumes a receive
  read,         // READ request (sink SGEs in the payload when served by CMA)
  atomic,       // fetch-add / compare-swap
  read_resp,    // staged READ data (resp ring)
  atomic_resp,  // atomic original value (resp ring)
  map_req,      // may I map the region of rkey? (no work request of its own)
  map_resp,     // the answer: a map_answer in the payload (resp ring)
};

namespace msg_flag {
inline constexpr std::uint8_t first = 1, last = 2, with_imm = 4, with_inv = 8, cma = 16,
                              fetch_add = 32, solicited = 64;
}

// The slot header. sges (CMA ops) follow in the payload as {addr, len} pairs.
struct msg_header {
  msg_op op;
  std::uint8_t flags;
  std::uint16_t nsge;
  std::uint32_t len;  // payload bytes in this slot
  std::uint32_t rkey;
  std::uint32_t imm;        // immediate data / invalidated rkey
  std::uint64_t raddr;      // remote address of the message start
  std::uint64_t total;      // message length
  std::uint64_t off;        // offset of this slot's bytes in the message
  std::uint64_t id;         // request id (the initiator's SQ position)
  std::uint64_t cmp, swap;  // atomics: compare/add, swap; atomic_resp: cmp = original
};
static_assert(sizeof(msg_header) <= slot_header);

// Direct mapping (docs/SHM.md): the target's answer to map_req. The region is
// a sealed memfd of the target; the initiator takes it with pidfd_getfd (the
// same ptrace permission cross-memory attach needs), checks the inode and the
// seals, maps it (read-only for a key without remote_write/remote_atomic) and
// from then on serves its own READ/WRITE/atomics to it, as long as word `word`
// of the target's revocation page (also a sealed memfd) still holds `gen`.
struct map_answer {
  std::uint32_t ok;  // 0: not mappable (registered, not allocated memory; other PD; dead key)
  std::uint32_t rights;
  std::int32_t fd, rev_fd;  // descriptors in the target process
  std::uint64_t ino, rev_ino;
  std::uint64_t base, len, map_len;  // the region's address (as peers name it) and size
  std::uint64_t gen;                 // the registration's generation (never 0)
  std::uint32_t word;                // its revocation word
  std::uint32_t pad;
};
inline constexpr std::uint32_t revocation_words = 65536;  // one per key-table slot (slot_of)

struct iov_pair {
  std::uint64_t addr, len;
};
inline constexpr std::uint32_t max_cma_sge = 16;

struct alignas(64) seg_header {
  std::uint32_t magic, version, slots, slot_bytes;
  // Side s is about to block and wants a doorbell (one byte on the socket) on
  // any change; the peer clears it when ringing, so one byte per sleep.
  // cold<s>: side s's engine stopped looking at this connection at every step
  // and wants a hint (its bit set in side s's hint page, see hint_page) on any
  // change; the peer clears it when hinting, so one hint per cold spell. Each
  // pair shares a cache line: the peer reads both after every publish.
  alignas(64) std::atomic<std::uint32_t> sleeping0{0};
  std::atomic<std::uint32_t> cold0{0};
  alignas(64) std::atomic<std::uint32_t> sleeping1{0};
  std::atomic<std::uint32_t> cold1{0};
  // The cross-memory-attach fence (docs/SHM.md, "Data paths"). Side s sets
  // cma_fence<s> when a region that is the sink of one of its outstanding
  // READs is deregistered: from then on the peer writes nothing more into
  // side s's memory. cma_busy<s> is odd while side s's engine is inside a
  // process_vm_writev into its peer; side s raises it before it reads the
  // peer's fence word, so the fencing side, having set its word, waits only
  // for a write already under way (Dekker, every access seq_cst).
  alignas(64) std::atomic<std::uint32_t> cma_fence0{0};
  std::atomic<std::uint32_t> cma_fence1{0};
  alignas(64) std::atomic<std::uint64_t> cma_busy0{0};
  alignas(64) std::atomic<std::uint64_t> cma_busy1{0};
  ring_ctl req[2];
  ring_ctl resp[2];
};

inline constexpr std::size_t ring_bytes = std::size_t(ring_slots) * slot_size;
inline constexpr std::size_t seg_data_off = (sizeof(seg_header) + 4095) & ~std::size_t(4095);
inline constexpr std::size_t seg_size = seg_data_off + 4 * ring_bytes;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

// Slots of a ring mapped at once during its first lap (see seg_view::slot).
inline constexpr std::uint32_t warm_slots = 8;

// Views of one mapped segment from one side.
struct seg_view {
  seg_header* hdr = nullptr;
  std::byte* base = nullptr;
  int side = 0;
  // Slots of each ring this side has mapped so far (all of them: ~0). A ring
  // page's first touch through a mapping is a page fault, about 11 us for the
  // side that writes it first and 5 us for the other on this project's virtual
  // machines, against 1 and 0.2 us a page when populated by one madvise: a
  // connection's first lap of its rings ran at 1/100 of its speed (64 QPs
  // moving 4 KiB WRITEs: 129 MB/s for the first 0.3 s, 12.7 GB/s after). Each
  // ring is therefore mapped warm_slots at a time, just before its first use;
  // a connection that sends little maps little. Each ring has one user per
  // side (the lock that orders its positions orders this too).
  mutable std::uint64_t mapped[4] = {};

  std::atomic<std::uint32_t>& sleeping(int s) const noexcept {
    return s == 0 ? hdr->sleeping0 : hdr->sleeping1;
  }
  std::atomic<std::uint32_t>& cold(int s) const noexcept {
    return s == 0 ? hdr->cold0 : hdr->cold1;
  }
  std::atomic<std::uint32_t>& cma_fence(int s) const noexcept {
    return s == 0 ? hdr->cma_fence0 : hdr->cma_fence1;
  }
  std::atomic<std::uint64_t>& cma_busy(int s) const noexcept {
    return s == 0 ? hdr->cma_busy0 : hdr->cma_busy1;
  }
  // ring index: req[0]=0, req[1]=1, resp[0]=2, resp[1]=3
  std::byte* slot(int ring, std::uint64_t pos) const noexcept {
    std::byte* r = base + seg_data_off + std::size_t(ring) * ring_bytes;
    if (pos >= mapped[ring]) map_ahead(r, ring, pos);
    return r + std::size_t(pos % ring_slots) * slot_size;
  }

 private:
  void map_ahead(std::byte* r, int ring, std::uint64_t pos) const noexcept {
    std::uint64_t& m = mapped[ring];
    const std::uint64_t to =
        pos >= ring_slots
            ? ring_slots
            : std::min<std::uint64_t>(ring_slots, (pos / warm_slots + 1) * warm_slots);
    // Best effort: without it (an older kernel, no memory) the pages fault in
    // one by one as before; the contents are not touched either way.
    if (to > m) ::madvise(r + m * slot_size, std::size_t(to - m) * slot_size, MADV_POPULATE_WRITE);
    m = to >= ring_slots ? ~std::uint64_t(0) : to;
  }
};

// A device's hint page (a sealed memfd, one per device, mapped by every peer
// that connects to it): one bit per QP of the device. A peer that publishes
// work on a connection whose consumer flagged itself cold (seg_header::cold)
// sets that QP's bit, so the device's engine finds the few connections that
// moved without looking at every idle one. Every peer of the device can write
// every bit: a bit is only ever a reason to look at a QP (which validates
// whatever it finds), never a fact, and a QP that is not hinted is looked at
// in turn as before.
inline constexpr std::uint32_t hint_bits = 32768;  // QPs of a device that get a bit
inline constexpr std::size_t hint_page_bytes = hint_bits / 8;
inline constexpr std::uint32_t no_hint = ~std::uint32_t(0);

// The handshake on the Unix socket (engine/shm_cm.cpp): request (with the segment's
// memfd), accept or reject, ready.
inline constexpr std::uint32_t hs_magic = 0x43564853;  // "CVHS"
enum class hs_kind : std::uint16_t { request = 1, accept = 2, reject = 3, ready = 4 };

struct hs_msg {
  std::uint32_t magic = hs_magic;
  std::uint16_t version = seg_version;
  hs_kind kind = hs_kind::request;
  std::uint32_t qpn = 0;
  std::uint32_t ird = 0, ord = 0;
  std::uint64_t probe_addr = 0, probe_value = 0;
  std::uint32_t cma_ok = 0;
  // The sender's bit in its hint page (no_hint: none), whose descriptor comes
  // with the request (after the segment's) and with the accept.
  std::uint32_t hint_bit = no_hint;
  // accept and ready: the sender mapped the receiver's hint page and will set
  // its bit (else the receiver looks at that QP in turn).
  std::uint32_t hints_peer = 0;
  std::uint32_t pd_len = 0;
  std::uint8_t pd[256]{};
};

// What a receiver checks before it uses a handshake message or a mapped
// segment (segment.cpp): a Conveyor shm handshake of this version whose
// private data fits; a segment header of this version and geometry. The
// message is the receiver's own copy; the header is read once here, and
// nothing else of it is trusted afterwards.
bool handshake_valid(const hs_msg& m) noexcept;
bool segment_header_valid(const seg_header& h) noexcept;

}  // namespace conveyor::shm
