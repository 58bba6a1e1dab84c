// conveyor/pd.hpp — protection domains: memory registration and QP creation.
//
//   auto pd = dev.alloc_pd().value();
//   auto mr = pd.register_memory(std::as_writable_bytes(std::span(buf)),
//                                access::local_write | access::remote_write).value();
//   auto qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
//
// A key is usable only by QPs of the protection domain that registered it; the
// engine checks this on every remote access. Handles keep the device alive.
// Thread safety: register_memory and create_qp may be called concurrently.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>

#include "conveyor/error.hpp"
#include "conveyor/export.hpp"
#include "conveyor/mr.hpp"
#include "conveyor/qp.hpp"
#include "conveyor/srq.hpp"

namespace conveyor {

namespace detail {
struct handle_access;
class pd_impl;
}  // namespace detail

class CONVEYOR_API protection_domain {
 public:
  protection_domain() = default;
  explicit protection_domain(std::shared_ptr<detail::pd_impl> impl) noexcept;
  protection_domain(protection_domain&&) noexcept = default;
  protection_domain& operator=(protection_domain&&) noexcept = default;
  protection_domain(const protection_domain&) = delete;
  protection_domain& operator=(const protection_domain&) = delete;
  ~protection_domain();

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  // Registers any user buffer (it must outlive the registration). Errors:
  // invalid_argument (empty span, remote_write/atomic without local_write),
  // resource_exhausted (key table full). Rights `none` make a region that is
  // only a local source (SEND/WRITE data), as in verbs.
  result<memory_region> register_memory(std::span<std::byte> buf, access rights);
  // Any span, of any extent. A span of const elements is read-only memory: it
  // takes only rights that never write it (none, remote_read); local_write,
  // remote_write and remote_atomic are invalid_argument.
  template <class T, std::size_t N>
  result<memory_region> register_memory(std::span<T, N> buf, access rights) {
    if constexpr (std::is_const_v<T>)
      return register_read_only(std::as_bytes(buf), rights);
    else
      return register_memory(std::span<std::byte>(std::as_writable_bytes(buf)), rights);
  }

  // Allocates `len` bytes of zeroed, page-aligned memory owned by the returned
  // region and registers them with `rights` (same errors as register_memory,
  // plus resource_exhausted when the memory cannot be had). deregister() or the
  // destructor revokes the keys and frees the memory. On `shm` the memory is a
  // sealed memfd that a connected peer may map, serving its READ, WRITE and
  // atomics to this region with plain loads and stores (docs/SHM.md, "Direct
  // mapping"); on other providers it is ordinary registered memory.
  result<memory_region> allocate_memory(std::size_t len, access rights);

  // Creates an RC QP in state INIT (ready for post_recv and for connecting).
  result<queue_pair> create_qp(const qp_init_attr& attr);

  // Creates a shared receive queue (srq.hpp) for QPs of this PD. Errors:
  // invalid_argument (max_wr 0 or above device_attr::max_srq_wr, max_sge 0 or
  // above max_srq_sge, srq_limit above max_wr), unsupported (max_srq is 0),
  // resource_exhausted (max_srq SRQs exist, or no memory).
  result<shared_receive_queue> create_srq(const srq_attr& attr);

 private:
  result<memory_region> register_read_only(std::span<const std::byte> buf, access rights);
  friend struct detail::handle_access;  // the library reaches the implementation
  std::shared_ptr<detail::pd_impl> impl_;
};

}  // namespace conveyor
