// conveyor::kv::client — one-sided GETs (one READ of a remembered item, else
// the bucket groups, then the item, all verified) with many READs in flight,
// and write RPCs (client.hpp). The class is client_impl.hpp's; its GET engine
// is client_gets.cpp.
#include <charconv>

#include "client_impl.hpp"

namespace conveyor::kv {

using detail::client_impl;
using detail::lane_item_bytes;
namespace L = layout;

std::string_view provider_for_address(std::string_view address) noexcept {
  return address.starts_with('@') ? "shm" : "soft";
}

result<std::unique_ptr<client>> client::connect(std::string_view device_name,
                                                std::string_view address,
                                                const client_options& opts) {
  if (opts.password.size() > L::max_password)
    return make_error(errc::invalid_argument, "kv client: password longer than 200 bytes");
  auto dev = device::open(device_name, opts.device);
  if (!dev) return std::unexpected(dev.error());
  auto pd = dev->alloc_pd();
  if (!pd) return std::unexpected(pd.error());
  const std::uint32_t want = std::clamp<std::uint32_t>(opts.depth, 1, 128);
  auto cq = dev->create_cq({.depth = 4 * want + 16});
  if (!cq) return std::unexpected(cq.error());
  qp_init_attr qa{.send_cq = &*cq, .recv_cq = &*cq};
  qa.cap.max_send_wr = 3 * want + 8;  // two READs per GET, a cluster node's header READs
  qa.cap.max_recv_wr = 4;
  qa.max_rd_atomic = std::min<std::uint32_t>(
      2 * want, dev->attr().max_qp_rd_atom ? dev->attr().max_qp_rd_atom : 16);
  auto qp = pd->create_qp(qa);
  if (!qp) return std::unexpected(qp.error());
  const auto hello = L::encode_hello(opts.password);
  auto info = conveyor::connect(*qp, address, {.private_data = hello, .timeout = opts.timeout});
  if (!info) {
    // The usual cause: the address of the server's RESP port (or a Redis
    // server), which waits for a text line the handshake never sends.
    auto e = info.error();
    if (e.code == errc::timed_out || e.code == errc::protocol_error)
      e.context = "the peer at " + std::string(address) + " did not answer the RDMA handshake (" +
                  e.context +
                  "); is this a RESP port (kv serve --port, Redis)? RDMA clients connect to "
                  "kv serve --rdma-listen's address; use redis-cli for RESP";
    return std::unexpected(std::move(e));
  }
  auto d = L::decode(info->private_data);
  if (!d)
    return make_error(errc::protocol_error, "kv client: the server's description is malformed");
  // Lanes: GETs in flight, two READs each at most, within the negotiated ORD.
  const std::uint32_t ord = std::max<std::uint32_t>(info->attr.ord, 2);
  const std::uint32_t lanes = std::clamp<std::uint32_t>(std::min(want, ord / 2), 1, want);
  auto scratch = pd->allocate_memory(std::size_t{lanes} * (2 * L::group_bytes + lane_item_bytes),
                                     access::local_write);
  if (!scratch) return std::unexpected(scratch.error());
  auto c = std::make_unique<client_impl>(std::move(*dev), std::move(*pd), std::move(*cq),
                                         std::move(*qp), std::move(*scratch), *d, lanes, opts);
  if (auto r = c->init_rpc(); !r) return std::unexpected(r.error());
  return std::unique_ptr<client>(std::move(c));
}

}  // namespace conveyor::kv
