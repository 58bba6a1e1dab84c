// The public handles: thin forwarding to the provider's *_impl objects.
#include <conveyor/conveyor.hpp>

#include "core/byte_order.hpp"
#include "core/impl.hpp"

#include <cstring>

namespace conveyor {

using namespace detail;

// ------------------------------------------------------------ remote_region ----
void remote_region::encode_to(std::span<std::byte, encoded_size> out) const noexcept {
  std::memcpy(out.data(), "CVRR", 4);
  out[4] = std::byte{1};
  out[5] = out[6] = out[7] = std::byte{0};
  detail::put_be64(out.data() + 8, addr);
  detail::put_be64(out.data() + 16, length);
  detail::put_be32(out.data() + 24, rkey);
}

std::vector<std::byte> remote_region::encode() const {
  std::vector<std::byte> v(encoded_size);
  encode_to(std::span<std::byte, encoded_size>(v.data(), encoded_size));
  return v;
}

result<remote_region> remote_region::decode(std::span<const std::byte> b) {
  if (b.size() < encoded_size)
    return make_error(errc::invalid_argument,
                      "remote_region: need 28 bytes, got " + std::to_string(b.size()));
  if (std::memcmp(b.data(), "CVRR", 4) != 0)
    return make_error(errc::invalid_argument, "remote_region: bad magic");
  if (b[4] != std::byte{1})
    return make_error(errc::invalid_argument, "remote_region: unknown version " +
                                                  std::to_string(std::to_integer<int>(b[4])));
  return remote_region{detail::get_be64(b.data() + 8), detail::get_be64(b.data() + 16),
                       detail::get_be32(b.data() + 24)};
}

// ------------------------------------------------------------ memory_region ----
memory_region::memory_region(std::shared_ptr<mr_impl> impl) noexcept : impl_(std::move(impl)) {}
memory_region& memory_region::operator=(memory_region&& o) noexcept {
  if (this != &o) {
    deregister();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
memory_region::~memory_region() {
  deregister();
}
std::byte* memory_region::data() const noexcept {
  return impl_ ? impl_->data() : nullptr;
}
std::size_t memory_region::size() const noexcept {
  return impl_ ? impl_->size() : 0;
}
std::uint64_t memory_region::addr() const noexcept {
  return reinterpret_cast<std::uint64_t>(data());
}
std::uint32_t memory_region::lkey() const noexcept {
  return impl_ ? impl_->lkey() : 0;
}
std::uint32_t memory_region::rkey() const noexcept {
  return impl_ ? impl_->rkey() : 0;
}
access memory_region::rights() const noexcept {
  return impl_ ? impl_->rights() : access::none;
}
void memory_region::deregister() noexcept {
  if (impl_) {
    impl_->deregister();
    impl_.reset();
  }
}

// ---------------------------------------------------------- completion_queue ----
completion_queue::completion_queue(std::shared_ptr<cq_impl> impl) noexcept
    : impl_(std::move(impl)) {}
completion_queue::~completion_queue() = default;
std::uint32_t completion_queue::depth() const noexcept {
  return impl_->depth();
}
std::expected<std::size_t, errc> completion_queue::poll(std::span<work_completion> out) noexcept {
  return impl_->poll(out);
}
std::expected<std::size_t, errc> completion_queue::wait(std::span<work_completion> out,
                                                        std::chrono::nanoseconds t) noexcept {
  return impl_->wait(out, t);
}
std::expected<work_completion, errc> completion_queue::wait_one(
    std::chrono::nanoseconds t) noexcept {
  work_completion wc;
  auto r = impl_->wait(std::span(&wc, 1), t);
  if (!r) return std::unexpected(r.error());
  return wc;
}
int completion_queue::fd() const noexcept {
  return impl_->fd();
}
void completion_queue::arm() noexcept {
  impl_->arm();
}

// ---------------------------------------------------------------- queue_pair ----
queue_pair::queue_pair(std::shared_ptr<qp_impl> impl) noexcept : impl_(std::move(impl)) {}
queue_pair& queue_pair::operator=(queue_pair&& o) noexcept {
  if (this != &o) {
    if (impl_) impl_->disconnect();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
queue_pair::~queue_pair() {
  if (impl_) impl_->disconnect();
}
std::uint32_t queue_pair::qp_num() const noexcept {
  return impl_->qp_num();
}
qp_state queue_pair::state() const noexcept {
  return impl_->state();
}
const qp_caps& queue_pair::caps() const noexcept {
  return impl_->caps();
}
status queue_pair::post_send(std::span<const send_wr> wrs, std::size_t* bad) noexcept {
  return impl_->post_send(wrs, bad);
}
status queue_pair::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept {
  return impl_->post_recv(wrs, bad);
}
status queue_pair::post_recv(const sge& local, std::uint64_t wr_id) noexcept {
  recv_wr wr{wr_id, std::span(&local, 1)};
  return impl_->post_recv(std::span(&wr, 1), nullptr);
}
status queue_pair::post_send_msg(const sge& local, std::uint64_t wr_id) noexcept {
  send_wr wr{.wr_id = wr_id, .opcode = wr_opcode::send, .sg_list = std::span(&local, 1)};
  return post_send(wr);
}
// One WRITE or READ of one local SGE against a peer's region.
static status post_one_sided(queue_pair& qp, wr_opcode op, const sge& local, const remote_region& r,
                             std::uint64_t wr_id) noexcept {
  send_wr wr{.wr_id = wr_id,
             .opcode = op,
             .sg_list = std::span(&local, 1),
             .remote_addr = r.addr,
             .rkey = r.rkey};
  return qp.post_send(wr);
}
status queue_pair::post_write(const sge& local, const remote_region& r,
                              std::uint64_t wr_id) noexcept {
  return post_one_sided(*this, wr_opcode::rdma_write, local, r, wr_id);
}
status queue_pair::post_read(const sge& local, const remote_region& r,
                             std::uint64_t wr_id) noexcept {
  return post_one_sided(*this, wr_opcode::rdma_read, local, r, wr_id);
}
status queue_pair::post_fetch_add(const sge& result8, const remote_region& r, std::uint64_t add,
                                  std::uint64_t wr_id) noexcept {
  send_wr wr{.wr_id = wr_id,
             .opcode = wr_opcode::atomic_fetch_and_add,
             .sg_list = std::span(&result8, 1),
             .remote_addr = r.addr,
             .rkey = r.rkey,
             .compare_add = add};
  return post_send(wr);
}
status queue_pair::post_cmp_swap(const sge& result8, const remote_region& r, std::uint64_t compare,
                                 std::uint64_t swap, std::uint64_t wr_id) noexcept {
  send_wr wr{.wr_id = wr_id,
             .opcode = wr_opcode::atomic_cmp_and_swp,
             .sg_list = std::span(&result8, 1),
             .remote_addr = r.addr,
             .rkey = r.rkey,
             .compare_add = compare,
             .swap = swap};
  return post_send(wr);
}
result<void> queue_pair::modify(qp_state target) {
  if (!impl_) return make_error(errc::invalid_state, "modify: empty queue_pair handle");
  return impl_->modify(target);
}
result<qp_connection_attr> queue_pair::connection() const {
  if (!impl_) return make_error(errc::invalid_state, "connection: empty queue_pair handle");
  return impl_->connection();
}
qp_counters queue_pair::counters() const noexcept {
  return impl_ ? impl_->counters() : qp_counters{};
}
void queue_pair::disconnect() noexcept {
  if (impl_) impl_->disconnect();
}

bool detail::qp_transition_allowed(qp_state from, qp_state to) noexcept {
  if (to == qp_state::error || to == qp_state::reset) return true;  // from any state
  switch (from) {
    case qp_state::reset:
      return to == qp_state::init;
    case qp_state::init:
      return to == qp_state::init || to == qp_state::rtr;
    case qp_state::rtr:
      return to == qp_state::rts;
    case qp_state::rts:
      return to == qp_state::rts;
    case qp_state::error:
      return false;
  }
  return false;
}

// --------------------------------------------------------- protection_domain ----
protection_domain::protection_domain(std::shared_ptr<pd_impl> impl) noexcept
    : impl_(std::move(impl)) {}
protection_domain::~protection_domain() = default;
result<memory_region> protection_domain::register_memory(std::span<std::byte> buf, access rights) {
  if (!impl_) return make_error(errc::invalid_state, "register_memory: empty protection_domain");
  auto r = impl_->register_memory(buf, rights);
  if (!r) return std::unexpected(r.error());
  return memory_region(std::move(*r));
}
result<memory_region> protection_domain::register_read_only(std::span<const std::byte> buf,
                                                            access rights) {
  if (has(rights, access::local_write) || has(rights, access::remote_write) ||
      has(rights, access::remote_atomic))
    return make_error(
        errc::invalid_argument,
        "register_memory: read-only (const) memory takes no write rights "
        "(local_write, remote_write, remote_atomic); remote_read and none are allowed");
  // Nothing writes a region without one of those rights: every engine and NIC
  // checks them on each access.
  return register_memory(std::span<std::byte>(const_cast<std::byte*>(buf.data()), buf.size()),
                         rights);
}
result<memory_region> protection_domain::allocate_memory(std::size_t len, access rights) {
  if (!impl_) return make_error(errc::invalid_state, "allocate_memory: empty protection_domain");
  auto r = impl_->allocate_memory(len, rights);
  if (!r) return std::unexpected(r.error());
  return memory_region(std::move(*r));
}
result<queue_pair> protection_domain::create_qp(const qp_init_attr& attr) {
  if (!impl_) return make_error(errc::invalid_state, "create_qp: empty protection_domain");
  auto r = impl_->create_qp(attr);
  if (!r) return std::unexpected(r.error());
  return queue_pair(std::move(*r));
}

result<shared_receive_queue> protection_domain::create_srq(const srq_attr& attr) {
  if (!impl_) return make_error(errc::invalid_state, "create_srq: empty protection_domain");
  auto r = impl_->create_srq(attr);
  if (!r) return std::unexpected(r.error());
  return shared_receive_queue(std::move(*r));
}

// ------------------------------------------------------ shared_receive_queue ----
shared_receive_queue::shared_receive_queue(std::shared_ptr<srq_impl> impl) noexcept
    : impl_(std::move(impl)) {}
shared_receive_queue::~shared_receive_queue() = default;
std::uint32_t shared_receive_queue::srq_num() const noexcept {
  return impl_ ? impl_->srq_num() : 0;
}
status shared_receive_queue::post_recv(std::span<const recv_wr> wrs, std::size_t* bad) noexcept {
  if (!impl_) {
    if (bad) *bad = 0;
    return errc::invalid_state;
  }
  return impl_->post_recv(wrs, bad);
}
status shared_receive_queue::post_recv(const sge& local, std::uint64_t wr_id) noexcept {
  recv_wr wr{wr_id, std::span(&local, 1)};
  return post_recv(std::span(&wr, 1), nullptr);
}
result<void> shared_receive_queue::arm_limit(std::uint32_t limit) {
  if (!impl_) return make_error(errc::invalid_state, "arm_limit: empty shared_receive_queue");
  return impl_->arm_limit(limit);
}
result<srq_attr> shared_receive_queue::query() const {
  if (!impl_) return make_error(errc::invalid_state, "query: empty shared_receive_queue");
  return impl_->query();
}

// -------------------------------------------------------------------- device ----
device::device(std::shared_ptr<device_impl> impl) noexcept : impl_(std::move(impl)) {}
device device::share() const noexcept {
  return device(impl_);
}
device::~device() = default;
const device_attr& device::attr() const noexcept {
  return impl_->attr();
}
const device_options& device::options() const noexcept {
  return impl_->options();
}
result<protection_domain> device::alloc_pd() {
  auto r = impl_->alloc_pd();
  if (!r) return std::unexpected(r.error());
  return protection_domain(std::move(*r));
}
result<completion_queue> device::create_cq(const cq_options& opts) {
  auto r = impl_->create_cq(opts);
  if (!r) return std::unexpected(r.error());
  return completion_queue(std::move(*r));
}

std::vector<device_info> device::list() {
  std::vector<device_info> all;
  for (const auto& p : providers()) {
    auto l = p.list();
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

result<device> device::open(std::string_view name, const device_options& opts) {
  std::string known;
  for (const auto& p : providers()) {
    for (const auto& info : p.list()) {
      if (!known.empty()) known += ", ";
      known += info.name;
    }
    const bool match = name == p.name || name.substr(0, name.find(':')) == p.name;
    if (!match) continue;
    auto r = p.open(name, opts);
    if (!r) return std::unexpected(r.error());
    return device(std::move(*r));
  }
  return make_error(errc::not_found, "open device \"" + std::string(name) +
                                         "\": no such device (known: " + known + ")");
}

// ------------------------------------------------------------------------ cm ----
connect_request::connect_request() noexcept = default;
connect_request::connect_request(std::unique_ptr<conn_request_impl> impl) noexcept
    : impl_(std::move(impl)) {}
connect_request::connect_request(connect_request&&) noexcept = default;
connect_request& connect_request::operator=(connect_request&&) noexcept = default;
connect_request::~connect_request() = default;
std::span<const std::byte> connect_request::private_data() const noexcept {
  return impl_ ? impl_->private_data() : std::span<const std::byte>{};
}
std::string connect_request::peer_address() const {
  return impl_ ? impl_->peer_address() : "";
}
result<connection_info> connect_request::accept(queue_pair& qp, std::span<const std::byte> pd) {
  if (!impl_) return make_error(errc::invalid_state, "accept: request already answered");
  auto r = impl_->accept(qp, pd);
  impl_.reset();
  return r;
}
result<void> connect_request::reject(std::span<const std::byte> reason) {
  if (!impl_) return make_error(errc::invalid_state, "reject: request already answered");
  auto r = impl_->reject(reason);
  impl_.reset();
  return r;
}
result<void> connect_request::reject(std::string_view reason) {
  return reject(std::as_bytes(std::span(reason.data(), reason.size())));
}

listener::listener() noexcept = default;
listener::listener(std::unique_ptr<listener_impl> impl) noexcept : impl_(std::move(impl)) {}
listener::listener(listener&&) noexcept = default;
listener& listener::operator=(listener&&) noexcept = default;
listener::~listener() = default;
result<listener> listener::bind(const device& dev, std::string_view address, int backlog) {
  if (!dev) return make_error(errc::invalid_state, "listener::bind: empty device handle");
  auto r = detail::handle_access::shared(dev)->bind_listener(address, backlog);
  if (!r) return std::unexpected(r.error());
  return listener(std::move(*r));
}
result<listener> listener::bind(const device& dev, int backlog) {
  if (!dev) return make_error(errc::invalid_state, "listener::bind: empty device handle");
  auto r = detail::handle_access::shared(dev)->bind_ephemeral_listener(backlog);
  if (!r) return std::unexpected(r.error());
  return listener(std::move(*r));
}
std::string listener::address() const {
  return impl_ ? impl_->address() : "";
}
std::uint16_t listener::port() const noexcept {
  return impl_ ? impl_->port() : 0;
}
result<connect_request> listener::accept(std::chrono::milliseconds timeout) {
  if (!impl_) return make_error(errc::invalid_state, "accept: empty listener");
  auto r = impl_->accept(timeout);
  if (!r) return std::unexpected(r.error());
  return connect_request(std::move(*r));
}

result<connection_info> connect(queue_pair& qp, std::string_view address,
                                const connect_options& opts) {
  if (!qp) return make_error(errc::invalid_state, "connect: empty queue_pair handle");
  return detail::handle_access::impl(qp)->connect(address, opts);
}

}  // namespace conveyor
