// The soft provider's connection manager: MPA (RFC 5044) with the RFC 6581
// enhanced setup, as initiator (connect) and responder (listener/accept).
//
// Initiator: TCP connect, MPA Request rev 2 with H, the IRD/ORD words, peer-to-
// peer mode offering Write and Read RTRs, C if the device asks for CRC,
// Conveyor's RFC 7306 offer bit and, with software.large_fpdus, 0x08 ("I
// accept FPDUs larger than the MSS"). Reply parsed; the RTR the Reply chose is
// sent as the first FPDU. Responder: accepts rev 1 and rev 2 requests, refuses
// markers, echoes C and A, picks the Write RTR when offered (else Read),
// answers the extension offer with ext_ack (never by echoing the offer) and
// sets 0x08 with software.large_fpdus. Each side sends FPDUs larger than the
// MSS only when its own option is on and the peer's frame said 0x08 (a Reply's
// only next to ext_ack: wire::reply_accepts_large_fpdus).
// accept() returns once the Reply is sent; the device's RTR pump reads the
// initiator's RTR and then starts the QP (or fails it at the deadline).
#include "providers/soft/engine/soft_qp.hpp"
#include "providers/soft/soft_device.hpp"
#include "providers/swnic/handshake_pump.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <cstdio>

namespace conveyor::soft {

using namespace wire;
using clk = net::clock;

namespace {

std::string seconds_text(std::chrono::milliseconds ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g s", static_cast<double>(ms.count()) / 1000.0);
  return b;
}

std::string printable(std::span<const std::byte> pd) {
  std::string s;
  for (auto b : pd) {
    const char c = static_cast<char>(b);
    if (c == 0) break;
    s += (c >= 32 && c < 127) ? c : '?';
  }
  return s;
}

// Reads one MPA frame (header, then exactly PD_Length bytes) before the deadline.
result<mpa_frame> read_mpa(int fd, bool reply, clk::time_point deadline,
                           std::chrono::milliseconds t, const std::string& peer,
                           bool* markers = nullptr) {
  std::byte hdr[mpa_header_size];
  const std::string what = "MPA handshake with " + peer;
  auto r = net::read_exact(fd, hdr, deadline, what);
  if (!r) {
    if (r.error().code == errc::timed_out)
      return make_error(errc::timed_out, what + " timed out after " + seconds_text(t));
    return std::unexpected(r.error());
  }
  if (markers != nullptr) *markers = std::to_integer<std::uint8_t>(hdr[16]) & mpa_flag::markers;
  auto pdlen = mpa_pd_length(hdr, reply);
  if (!pdlen)
    return make_error(errc::protocol_error, what + ": " + std::string(to_string(pdlen.error())));
  std::vector<std::byte> frame(hdr, hdr + mpa_header_size);
  frame.resize(mpa_header_size + *pdlen);
  r = net::read_exact(fd, std::span(frame).subspan(mpa_header_size), deadline, what);
  if (!r) {
    if (r.error().code == errc::timed_out)
      return make_error(errc::timed_out, what + " timed out after " + seconds_text(t));
    return std::unexpected(r.error());
  }
  auto f = decode_mpa(frame, reply);
  if (!f) return make_error(errc::protocol_error, what + ": " + std::string(to_string(f.error())));
  return std::move(*f);
}

class soft_conn_request final : public detail::conn_request_impl {
 public:
  soft_conn_request(std::shared_ptr<soft_device> dev, net::fd_guard fd, mpa_frame req,
                    std::string peer)
      : dev_(std::move(dev)), fd_(std::move(fd)), req_(std::move(req)), peer_(std::move(peer)) {}
  ~soft_conn_request() override {
    if (fd_) (void)reject(std::as_bytes(std::span("not accepted", 12)));
  }
  std::span<const std::byte> private_data() const noexcept override { return req_.private_data; }
  std::string peer_address() const override { return peer_; }
  result<connection_info> accept(queue_pair& qp, std::span<const std::byte> pd) override;
  result<void> reject(std::span<const std::byte> reason) override;

 private:
  mpa_frame reply_base() const {
    mpa_frame rep;
    rep.reply = true;
    rep.revision = req_.revision == 2 ? 2 : 1;
    return rep;
  }
  std::shared_ptr<soft_device> dev_;
  net::fd_guard fd_;
  mpa_frame req_;
  std::string peer_;
};

// Sends a small frame on a non-blocking socket without waiting: the listener
// thread never blocks on a peer. A peer whose receive buffer cannot take a
// reply this small does not get one.
void send_now(int fd, std::span<const std::byte> bytes) noexcept {
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

// One MPA request being read by the listener thread: the 20-byte header, then
// exactly PD_Length bytes (at most 512, RFC 5044), never a byte more.
class mpa_request_reader final : public detail::pending_handshake {
 public:
  mpa_request_reader(std::shared_ptr<soft_device> dev, int fd)
      : dev_(std::move(dev)), fd_(fd), peer_(net::peer_endpoint(fd).to_string()) {
    buf_.resize(mpa_header_size);
  }
  int fd() const noexcept override { return fd_.get(); }
  step on_readable(std::string& why) override {
    while (got_ < buf_.size()) {
      const ssize_t n = ::recv(fd_.get(), buf_.data() + got_, buf_.size() - got_, MSG_DONTWAIT);
      if (n == 0) {
        why = "MPA handshake with " + peer_ + ": the peer closed the connection";
        return step::failed;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return step::more;
        why = "MPA handshake with " + peer_ + ": " + std::strerror(errno);
        return step::failed;
      }
      got_ += static_cast<std::size_t>(n);
      if (got_ == mpa_header_size && buf_.size() == mpa_header_size) {
        if (std::to_integer<std::uint8_t>(buf_[16]) & mpa_flag::markers) {
          // A request asking for markers gets a rejecting Reply (as siw does).
          mpa_frame rep;
          rep.reply = true;
          rep.revision = 2;
          rep.flags = mpa_flag::reject;
          send_now(fd_.get(), encode_mpa(rep));
          why = "MPA request from " + peer_ + " asks for markers (refused)";
          return step::failed;
        }
        auto pdlen = mpa_pd_length(buf_, false);
        if (!pdlen) {
          why = "MPA handshake with " + peer_ + ": " + std::string(to_string(pdlen.error()));
          return step::failed;
        }
        buf_.resize(mpa_header_size + *pdlen);
      }
    }
    auto f = decode_mpa(buf_, false);
    if (!f) {
      why = "MPA handshake with " + peer_ + ": " + std::string(to_string(f.error()));
      return step::failed;
    }
    req_ = std::move(*f);
    return step::done;
  }
  std::unique_ptr<detail::conn_request_impl> take() override {
    return std::make_unique<soft_conn_request>(dev_, std::move(fd_), std::move(req_), peer_);
  }
  void refuse_busy() noexcept override {
    try {
      mpa_frame rep;
      rep.reply = true;
      rep.revision = req_.revision == 2 ? 2 : 1;
      rep.flags = mpa_flag::reject;
      if (req_.v2) rep.v2 = mpa_v2_words{};
      static constexpr std::string_view busy = "listener busy: too many requests wait for accept()";
      const auto b = std::as_bytes(std::span(busy.data(), busy.size()));
      rep.private_data.assign(b.begin(), b.end());
      send_now(fd_.get(), encode_mpa(rep));
      ::shutdown(fd_.get(), SHUT_WR);
    } catch (...) {
    }
  }

 private:
  std::shared_ptr<soft_device> dev_;
  net::fd_guard fd_;
  std::string peer_;
  std::vector<std::byte> buf_;
  std::size_t got_ = 0;
  mpa_frame req_;
};

// The responder's last handshake step, on the device's RTR pump: exactly the
// initiator's RTR (a zero-length FPDU, never a byte more: what follows belongs
// to the QP), then the QP goes live. Destroyed without it (the peer closed,
// sent something else, or missed the deadline, or the pump evicted it to stay
// within max_pending_handshakes), it fails the QP and closes the socket.
class rtr_reader final : public detail::pending_handshake {
 public:
  rtr_reader(net::fd_guard fd, std::shared_ptr<rtr_link> link, bool read_rtr, bool crc,
             std::string peer)
      : fd_(std::move(fd)),
        link_(std::move(link)),
        read_rtr_(read_rtr),
        crc_(crc),
        n_(read_rtr ? fpdu_size(ddp::untagged_hdr + read_request_hdr) : fpdu_size(ddp::tagged_hdr)),
        peer_(std::move(peer)) {}
  ~rtr_reader() override {
    if (done_) return;
    std::lock_guard lk(link_->mu);
    if (link_->qp)
      link_->qp->fail_rtr(
          why_.empty() ? "no MPA RTR from " + peer_ + " within the handshake timeout" : why_);
  }
  int fd() const noexcept override { return fd_.get(); }
  step on_readable(std::string& why) override {
    while (got_ < n_) {
      const ssize_t r = ::recv(fd_.get(), buf_ + got_, n_ - got_, MSG_DONTWAIT);
      if (r == 0) {
        why = why_ = "MPA handshake with " + peer_ + ": the peer closed before its RTR";
        return step::failed;
      }
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return step::more;
        why = why_ = "MPA RTR from " + peer_ + ": " + std::strerror(errno);
        return step::failed;
      }
      got_ += static_cast<std::size_t>(r);
    }
    const std::span<const std::byte> f(buf_, n_);
    auto h = parse_fpdu_header(f);
    const bool ok =
        h && h->total() == n_ && h->payload_len == 0 &&
        (read_rtr_ ? h->opcode == rdmap_op::read_request : h->opcode == rdmap_op::write) &&
        (!crc_ || check_fpdu_crc(f));
    if (!ok) {
      why = why_ = "MPA handshake with " + peer_ + ": bad RTR frame";
      return step::failed;
    }
    if (read_rtr_ && h->msn != 1) {
      why = why_ = "MPA handshake with " + peer_ + ": read RTR MSN != 1";
      return step::failed;
    }
    return step::done;
  }
  std::unique_ptr<detail::conn_request_impl> take() override {
    done_ = true;
    std::lock_guard lk(link_->mu);
    if (link_->qp) (void)link_->qp->resume_after_rtr(std::move(fd_));
    return nullptr;  // fd_, if not taken, closes: the QP left the wait
  }
  void refuse_busy() noexcept override {}

 private:
  net::fd_guard fd_;
  std::shared_ptr<rtr_link> link_;
  bool read_rtr_, crc_;
  std::size_t n_;
  std::string peer_;
  std::string why_;
  std::byte buf_[64];
  std::size_t got_ = 0;
  bool done_ = false;
};

class soft_listener final : public detail::listener_impl {
 public:
  soft_listener(std::shared_ptr<soft_device> dev, net::fd_guard fd, int backlog)
      : dev_(std::move(dev)),
        fd_(std::move(fd)),
        local_(net::local_endpoint(fd_.get())),
        pump_(fd_.get(), "accept on " + local_.to_string(), limits(*dev_, backlog),
              [d = dev_](int c) {
                // The pump accepts the socket itself: turn Nagle off here, as
                // connect_tcp does for the active side (without it every small
                // message on the accepted side waited out TCP's delayed ACK).
                net::set_nodelay(c);
                return std::make_unique<mpa_request_reader>(d, c);
              }) {}
  std::string address() const override { return local_.to_string(); }
  std::uint16_t port() const noexcept override {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&local_.ss);
    return ntohs(a->sin_port);
  }
  result<std::unique_ptr<detail::conn_request_impl>> accept(
      std::chrono::milliseconds timeout) override {
    return pump_.accept(timeout);
  }

 private:
  static detail::handshake_limits limits(const soft_device& d, int backlog) {
    detail::handshake_limits l;
    l.max_pending = std::max<std::uint32_t>(1, d.options().software.max_pending_handshakes);
    l.deadline = std::chrono::milliseconds(d.options().handshake_timeout_ms);
    l.max_ready = static_cast<std::size_t>(std::max(1, backlog));
    return l;
  }
  std::shared_ptr<soft_device> dev_;
  net::fd_guard fd_;
  net::endpoint local_;
  detail::handshake_pump pump_;  // last: its thread stops before the socket closes
};

result<void> soft_conn_request::reject(std::span<const std::byte> reason) {
  if (!fd_) return make_error(errc::invalid_state, "reject: request already answered");
  mpa_frame rep = reply_base();
  rep.flags = mpa_flag::reject;
  if (req_.v2) rep.v2 = mpa_v2_words{};
  rep.private_data.assign(reason.begin(),
                          reason.begin() + std::min(reason.size(), max_private_data));
  auto bytes = encode_mpa(rep);
  auto r = net::write_all(fd_.get(), bytes, clk::now() + std::chrono::seconds(1),
                          "MPA reject to " + peer_);
  ::shutdown(fd_.get(), SHUT_WR);
  fd_ = net::fd_guard();
  return r;
}

result<connection_info> soft_conn_request::accept(queue_pair& qp, std::span<const std::byte> pd) {
  auto target = swnic::accept_target(qp, *dev_, "accept from " + peer_, pd.size());
  if (!target) return std::unexpected(target.error());
  auto* sq = static_cast<soft_qp*>(*target);  // a QP of this (soft) device
  const auto hs = std::chrono::milliseconds(dev_->options().handshake_timeout_ms);
  const auto deadline = clk::now() + hs;
  mpa_frame rep = reply_base();
  const bool crc = req_.crc() || dev_->options().software.request_crc;
  rep.flags = crc ? mpa_flag::crc : 0;
  const bool ext = (req_.flags & mpa_flag::ext_offer) != 0;
  if (ext) rep.flags |= mpa_flag::ext_ack;  // never ext_offer: an echo proves nothing
  const bool large = dev_->options().software.large_fpdus;
  if (large) rep.flags |= mpa_flag::large_fpdus;
  conn_params cp;
  cp.crc = crc;
  cp.ext = ext;
  cp.large_fpdus = large && request_accepts_large_fpdus(req_.flags);
  std::string rtr = "none";
  bool p2p = false;
  bool read_rtr = false;
  if (req_.v2) {
    mpa_v2_words w;
    // Our IRD: the initiator's ORD, never more than this QP's own
    // max_dest_rd_atomic; our ORD stays within its IRD.
    cp.ird =
        std::clamp<std::uint32_t>(std::min<std::uint32_t>(sq->want_ird(), req_.v2->ord), 1, 128);
    cp.ord =
        std::clamp<std::uint32_t>(std::min<std::uint32_t>(sq->want_ord(), req_.v2->ird), 1, 128);
    w.ird = static_cast<std::uint16_t>(cp.ird);
    w.ord = static_cast<std::uint16_t>(cp.ord);
    if (req_.v2->peer2peer) {
      p2p = true;
      w.peer2peer = true;
      if (req_.v2->write_rtr || !req_.v2->read_rtr) {
        w.write_rtr = true;
        rtr = "write";
      } else {
        w.read_rtr = true;
        read_rtr = true;
        rtr = "read";
      }
    }
    rep.v2 = w;
  } else {
    cp.ird = sq->want_ird();
    cp.ord = sq->want_ord();
  }
  rep.private_data.assign(pd.begin(), pd.end());
  // With peer-to-peer, the RTR is read by the device's RTR pump, not here:
  // accept() returns once the Reply is sent (as rdma_accept does; the
  // connection is established later), so a peer that never sends its RTR
  // holds no thread, and its QP fails at the handshake deadline. Get the pump
  // before anything is sent: a failure leaves the QP in INIT.
  detail::handshake_pump* pump = nullptr;
  if (p2p) {
    auto r = dev_->rtr_pump();
    if (!r) return std::unexpected(r.error());
    pump = *r;
  }
  auto bytes = encode_mpa(rep);
  auto w = net::write_all(fd_.get(), bytes, deadline, "MPA reply to " + peer_);
  if (!w) return std::unexpected(w.error());
  cp.answer_read_rtr = p2p && read_rtr;
  qp_connection_attr attr;
  attr.local_address = net::local_endpoint(fd_.get()).to_string();
  attr.peer_address = peer_;
  attr.ird = cp.ird;
  attr.ord = cp.ord;
  attr.extensions = ext;
  attr.iwarp = iwarp_connection_attr{.mpa_revision = rep.revision, .crc = crc, .rtr = rtr};
  if (!p2p) {
    sq->start(std::move(fd_), cp, attr, false);
  } else {
    auto link = std::make_shared<rtr_link>();
    sq->await_rtr(fd_.get(), cp, attr, link);
    // Fails only when the pump's thread is gone, which rtr_pump() ruled out; the
    // reader then fails the QP as it is destroyed.
    auto a = pump->adopt(std::make_unique<rtr_reader>(std::move(fd_), link, read_rtr, crc, peer_));
    if (!a) return std::unexpected(a.error());
  }
  connection_info info{req_.private_data, *sq->connection()};
  return info;
}

}  // namespace

result<std::unique_ptr<detail::listener_impl>> soft_device::bind_listener(std::string_view address,
                                                                          int backlog) {
  auto ep = net::parse_endpoint(address);
  if (!ep) return std::unexpected(ep.error());
  auto fd = net::listen_tcp(*ep, detail::kernel_accept_queue);
  if (!fd) return std::unexpected(fd.error());
  auto self = std::static_pointer_cast<soft_device>(shared_from_this());
  return std::unique_ptr<detail::listener_impl>(
      new soft_listener(std::move(self), std::move(*fd), backlog));
}

soft_device::~soft_device() = default;

result<detail::handshake_pump*> soft_device::rtr_pump() {
  std::lock_guard lk(rtr_mu_);
  if (!rtr_pump_) {
    detail::handshake_limits l;
    l.max_pending = std::max<std::uint32_t>(1, options().software.max_pending_handshakes);
    l.deadline = std::chrono::milliseconds(options().handshake_timeout_ms);
    l.max_ready = 1;  // nothing is handed out
    rtr_pump_ = std::make_unique<detail::handshake_pump>(
        -1, attr().name + ": MPA RTR of accepted connections", l,
        [](int) -> std::unique_ptr<detail::pending_handshake> { return nullptr; });
  }
  if (auto ok = rtr_pump_->started(); !ok) return std::unexpected(ok.error());
  return rtr_pump_.get();
}

result<connection_info> soft_qp::connect(std::string_view address, const connect_options& opts) {
  if (auto ok = check_connect(opts); !ok) return std::unexpected(ok.error());
  auto ep = net::parse_endpoint(address);
  if (!ep) return std::unexpected(ep.error());
  const std::string peer = ep->to_string();
  const auto deadline = clk::now() + opts.timeout;
  auto fd = net::connect_tcp(*ep, deadline, "timeout " + seconds_text(opts.timeout));
  if (!fd) return std::unexpected(fd.error());
  const auto& dopts = dev_->options();
  mpa_frame req;
  req.reply = false;
  req.revision = 2;
  req.flags = static_cast<std::uint8_t>((dopts.software.request_crc ? mpa_flag::crc : 0) |
                                        mpa_flag::ext_offer |
                                        (dopts.software.large_fpdus ? mpa_flag::large_fpdus : 0));
  mpa_v2_words w;
  w.ird = static_cast<std::uint16_t>(want_ird_);
  w.ord = static_cast<std::uint16_t>(want_ord_);
  w.peer2peer = true;
  w.write_rtr = true;
  w.read_rtr = true;
  req.v2 = w;
  req.private_data.assign(opts.private_data.begin(), opts.private_data.end());
  auto bytes = encode_mpa(req);
  auto wr = net::write_all(fd->get(), bytes, deadline, "MPA request to " + peer);
  if (!wr) return std::unexpected(wr.error());
  auto rep = read_mpa(fd->get(), true, deadline, opts.timeout, peer);
  if (!rep) return std::unexpected(rep.error());
  if (rep->rejected()) {
    const std::string why = printable(rep->private_data);
    return make_error(errc::rejected, "peer " + peer + " rejected: " +
                                          (why.empty() ? std::string("(no reason given)") : why));
  }
  conn_params cp;
  cp.crc = dopts.software.request_crc || rep->crc();
  // Confirmed only by the ack bit *without* the offer bit: an echo of our flags
  // (what Linux siw sends back) has the offer bit and no ack.
  cp.ext = (rep->flags & mpa_flag::ext_ack) && !(rep->flags & mpa_flag::ext_offer);
  // Linux siw's Reply echoes our 0x08 along with ext_offer: that is no answer.
  cp.large_fpdus = dopts.software.large_fpdus && reply_accepts_large_fpdus(rep->flags);
  std::string rtr = "none";
  if (rep->v2) {
    cp.ord = std::clamp<std::uint32_t>(std::min<std::uint32_t>(want_ord_, rep->v2->ird), 1, 128);
    // The responder's ORD is at most the IRD we offered; a larger one is not
    // honoured (our IRD never exceeds this QP's max_dest_rd_atomic).
    cp.ird = std::clamp<std::uint32_t>(std::min<std::uint32_t>(want_ird_, rep->v2->ord), 1, 128);
    if (rep->v2->peer2peer) {
      std::byte f[control_fpdu_max];
      std::size_t n;
      if (rep->v2->write_rtr) {
        n = fpdu_size(ddp::tagged_hdr);
        write_tagged_header(f, rdmap_op::write, true, 1, 0, 0);
        rtr = "write";
      } else if (rep->v2->read_rtr) {
        n = write_read_request(f, {1, 0, 0, 1, 0}, 1, cp.crc);  // zero-length, STags 1, MSN 1
        rtr = "read";
      } else {
        return make_error(errc::protocol_error,
                          "MPA reply from " + peer + ": no matching RTR option");
      }
      finish_fpdu(std::span(f, n), cp.crc);
      auto r = net::write_all(fd->get(), std::span(f, n), deadline, "MPA RTR to " + peer);
      if (!r) return std::unexpected(r.error());
    }
  } else {
    cp.ird = want_ird_;
    cp.ord = want_ord_;
  }
  qp_connection_attr attr;
  attr.local_address = net::local_endpoint(fd->get()).to_string();
  attr.peer_address = peer;
  attr.ird = cp.ird;
  attr.ord = cp.ord;
  attr.extensions = cp.ext;
  attr.iwarp = iwarp_connection_attr{.mpa_revision = rep->revision, .crc = cp.crc, .rtr = rtr};
  const bool read_rtr_sent = rtr == "read";
  start(std::move(*fd), cp, attr, read_rtr_sent);
  connection_info info{std::move(rep->private_data), *connection()};
  return info;
}

}  // namespace conveyor::soft
