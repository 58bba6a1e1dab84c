// Connection manager and negotiated connection attributes.
#include <chrono>
#include <string>
#include <thread>

#include <conveyor/conveyor.hpp>

#include "common/caps.hpp"
#include "common/pair.hpp"
#include "common/raw_tcp.hpp"

namespace cvt {
namespace {

using conveyor::errc;
using conveyor::qp_state;
using std::chrono::milliseconds;

class connection : public pair_test {
 protected:
  void check_attributes(bool init_crc, bool tgt_crc);
  // The crc_is_on_* tests assert that CRC is in force: where the provider has
  // no CRC to report they skip, saying why, rather than pass on nothing.
  void skip_unless_crc_is_reported() {
    const auto& a = device_attr_of(param().provider);
    if (!has_wire(a)) GTEST_SKIP() << "no wire (shared memory): there is no CRC to negotiate";
    if (!has_wire_crc(a))
      GTEST_SKIP()
          << "CRC is negotiated inside the kernel or the NIC (iWARP) or does not exist "
             "(IB/RoCE), and the device does not report it (tests/vm checks that siw honours "
             "soft's CRC request)";
  }
};

std::string attr_diff(const conveyor::qp_connection_attr& a,
                      const conveyor::qp_connection_attr& b) {
  std::string d;
  if (a.local_address != b.local_address) d += " local_address";
  if (a.peer_address != b.peer_address) d += " peer_address";
  if (a.ird != b.ird) d += " ird";
  if (a.ord != b.ord) d += " ord";
  if (a.extensions != b.extensions) d += " extensions";
  if (a.iwarp != b.iwarp) d += " iwarp";
  if (a.shm != b.shm) d += " shm";
  if (a.verbs != b.verbs) d += " verbs";
  return d;
}

void connection::check_attributes(bool init_crc, bool tgt_crc) {
  pair_options o;
  o.init_crc = init_crc;
  o.tgt_crc = tgt_crc;
  o.init_max_rd_atomic = 8;
  o.init_max_dest_rd_atomic = 12;
  o.tgt_max_rd_atomic = 10;
  o.tgt_max_dest_rd_atomic = 6;
  ASSERT_NO_FATAL_FAILURE(connect_pair(o));
  EXPECT_EQ(name(init.qp.state()), name(qp_state::rts));
  EXPECT_EQ(name(tgt.qp.state()), name(qp_state::rts));

  auto ic = init.qp.connection();
  CVT_ASSERT_OK(ic);
  auto tc = tgt.qp.connection();
  CVT_ASSERT_OK(tc);
  // MPA: CRC is in force when either side asked for it. Shared memory has no
  // wire and no MPA: no MPA part; it names its bulk data path instead. Where
  // the kernel or the NIC runs MPA (or IB/RoCE, which have none), CRC and the
  // MPA revision are not exposed: no MPA part either.
  const auto& da = init.dev.attr();
  const bool want_crc = init_crc || tgt_crc;
  for (const auto* c : {&*ic, &*tc}) {
    SCOPED_TRACE(c == &*ic ? "initiator" : "target");
    EXPECT_GT(c->ird, 0u);
    EXPECT_GT(c->ord, 0u);
    EXPECT_EQ(has_mpa(*c), runs_mpa(da)) << "MPA facts exactly where Conveyor runs MPA";
    EXPECT_EQ(c->shm.has_value(), !has_wire(da)) << "the shm part exactly without a wire";
    EXPECT_EQ(int{c->iwarp.has_value()} + int{c->shm.has_value()} + int{c->verbs.has_value()}, 1)
        << "one transport part per connection";
    if (c->iwarp) {
      EXPECT_GT(c->iwarp->mss, 0u);
      EXPECT_GT(c->iwarp->max_fpdu, 0u);
      // soft<->soft with the default software.large_fpdus: FPDUs of 64 KiB
      // (one GSO segment); otherwise an FPDU fits in one TCP segment.
      if (conveyor_peer(param().provider)) {
        EXPECT_TRUE(c->iwarp->large_fpdus) << "both sides are soft with large_fpdus on";
      }
      if (c->iwarp->large_fpdus) {
        EXPECT_EQ(c->iwarp->max_fpdu, 65536u);
      } else {
        EXPECT_LE(c->iwarp->max_fpdu, c->iwarp->mss) << "an FPDU must fit in one TCP segment";
      }
      EXPECT_EQ(c->iwarp->crc, want_crc)
          << "requested: initiator " << init_crc << ", target " << tgt_crc;
      EXPECT_GE(c->iwarp->mpa_revision, 1u);
      EXPECT_TRUE(c->iwarp->rtr == "write" || c->iwarp->rtr == "read" || c->iwarp->rtr == "none")
          << c->iwarp->rtr;
    }
    if (c->shm) {
      EXPECT_TRUE(c->shm->data_path == "cma" || c->shm->data_path == "staged") << c->shm->data_path;
      EXPECT_GT(c->shm->slot_payload, 0u);
    }
    if (c->verbs) {
      EXPECT_GT(c->verbs->port_mtu, 0u);
      // IB/RoCE: the QP's path MTU; iWARP: TCP's segments, not exposed.
      if (da.transport_type == conveyor::transport::iwarp)
        EXPECT_EQ(c->verbs->path_mtu, 0u);
      else
        EXPECT_GT(c->verbs->path_mtu, 0u);
    }
    EXPECT_FALSE(c->local_address.empty());
    EXPECT_FALSE(c->peer_address.empty());
    if (conveyor_peer(param().provider)) {
      EXPECT_TRUE(c->extensions) << "Conveyor<->Conveyor must negotiate RFC 7306 extensions";
    }
  }
  // Negotiation: neither side may have more READs outstanding than the other
  // accepts, and no ORD exceeds what its side asked for. (An IRD may grow to
  // cover the peer's ORD: IWARP.md, "its IRD should cover the Initiator's ORD".)
  EXPECT_LE(ic->ord, tc->ird);
  EXPECT_LE(tc->ord, ic->ird);
  EXPECT_LE(ic->ord, 8u);
  EXPECT_LE(tc->ord, 10u);
  EXPECT_EQ(ic->peer_address, listen_address_);
  EXPECT_EQ(ic->local_address, tc->peer_address);
  EXPECT_EQ(ic->peer_address, tc->local_address);
  ASSERT_EQ(ic->iwarp.has_value(), tc->iwarp.has_value());
  if (ic->iwarp) {
    EXPECT_EQ(ic->iwarp->mpa_revision, tc->iwarp->mpa_revision);
    EXPECT_EQ(ic->iwarp->crc, tc->iwarp->crc);
  }
  EXPECT_EQ(ic->extensions, tc->extensions);
  // What connect() and accept() returned is what the QP reports.
  EXPECT_EQ(attr_diff(init.info.attr, *ic), "") << "connect() result differs from qp.connection()";
  EXPECT_EQ(attr_diff(tgt.info.attr, *tc), "") << "accept() result differs from qp.connection()";
}

TEST_P(connection, qp_is_rts_and_attributes_are_sane_with_crc) {
  check_attributes(true, true);
}

TEST_P(connection, qp_is_rts_and_attributes_are_sane_without_crc) {
  check_attributes(false, false);
}

TEST_P(connection, crc_is_on_when_only_the_initiator_requests_it) {
  skip_unless_crc_is_reported();
  if (IsSkipped()) return;
  check_attributes(true, false);
}

TEST_P(connection, crc_is_on_when_only_the_target_requests_it) {
  skip_unless_crc_is_reported();
  if (IsSkipped()) return;
  check_attributes(false, true);
}

TEST_P(connection, connection_attributes_are_invalid_state_before_connect) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  EXPECT_EQ(name(init.qp.state()), name(qp_state::init));
  CVT_EXPECT_ERRC(init.qp.connection(), errc::invalid_state);
}

TEST_P(connection, private_data_of_max_size_passes_both_ways) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  if (init.dev.attr().transport_type == conveyor::transport::infiniband ||
      init.dev.attr().transport_type == conveyor::transport::roce)
    GTEST_SKIP() << "IB/RoCE connection requests carry at most 55 bytes of private data (IB CM "
                    "REQ), not 251";
  auto lis = conveyor::listener::bind(tgt.dev);
  CVT_ASSERT_OK(lis);
  const std::string addr = lis->address();
  const auto to_tgt = make_pattern(conveyor::max_private_data, 0x51);
  const auto to_init = make_pattern(conveyor::max_private_data, 0x52);
  std::string err;
  std::vector<std::byte> seen;
  std::thread acceptor([&] {
    auto req = lis->accept(scaled(milliseconds(10000)));
    if (!req) {
      err = req.error().to_string();
      return;
    }
    seen.assign(req->private_data().begin(), req->private_data().end());
    auto r = req->accept(tgt.qp, to_init);
    if (!r) err = r.error().to_string();
  });
  auto info = conveyor::connect(init.qp, addr,
                                {.private_data = to_tgt, .timeout = scaled(milliseconds(10000))});
  acceptor.join();
  CVT_ASSERT_OK(info);
  ASSERT_EQ(err, "");
  EXPECT_EQ(check_equal(seen, to_tgt), "");
  EXPECT_EQ(check_equal(info->private_data, to_init), "");
}

// listener::bind(dev) with no address: the provider picks an ephemeral one in
// its own syntax, and a peer reaches it at the address the listener reports.
TEST_P(connection, listener_bound_without_an_address_is_reached_at_the_address_it_reports) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  auto lis = conveyor::listener::bind(tgt.dev);
  CVT_ASSERT_OK(lis);
  const std::string addr = lis->address();
  ASSERT_FALSE(addr.empty());
  if (has_wire(tgt.dev.attr())) {
    EXPECT_NE(lis->port(), 0) << addr;
    EXPECT_TRUE(addr.ends_with(":" + std::to_string(lis->port()))) << addr;
  } else {
    EXPECT_EQ(addr[0], '@') << "an abstract name (nothing in the filesystem): " << addr;
  }
  {
    auto second = conveyor::listener::bind(tgt.dev);
    CVT_ASSERT_OK(second);
    EXPECT_NE(second->address(), addr) << "two live listeners got one address";
  }
  std::string err;
  std::thread acceptor([&] {
    auto req = lis->accept(scaled(milliseconds(10000)));
    if (!req) {
      err = "accept: " + req.error().to_string();
      return;
    }
    auto r = req->accept(tgt.qp);
    if (!r) err = "accept: " + r.error().to_string();
  });
  auto info = conveyor::connect(init.qp, addr, {.timeout = scaled(milliseconds(10000))});
  acceptor.join();
  CVT_ASSERT_OK(info);
  ASSERT_EQ(err, "");
  EXPECT_EQ(info->attr.peer_address, addr);

  auto sink = make_region(tgt.pd, 64, conveyor::access::local_write, 0x6100);
  CVT_ASSERT_OK(sink);
  auto src = make_region(init.pd, 64, conveyor::access::local_write, 0x6200);
  CVT_ASSERT_OK(src);
  CVT_ASSERT_POST_OK(tgt.qp.post_recv(sink->sge(0, 64), 0x61));
  CVT_ASSERT_POST_OK(init.qp.post_send_msg(src->sge(0, 64), 0x62));
  std::vector<conveyor::work_completion> tw;
  ASSERT_TRUE(wait_ok(tgt.recv_reader(), 1, op_timeout(64), &tw));
  EXPECT_EQ(tw[0].wr_id, 0x61u);
  ASSERT_TRUE(wait_ok(init.send_reader(), 1, op_timeout(64)));
  EXPECT_TRUE(ok(check_equal(sink->bytes(), src->bytes()))) << "the message's bytes";
}

TEST_P(connection, listener_reject_reason_reaches_the_connector_as_rejected) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  auto lis = conveyor::listener::bind(tgt.dev);
  CVT_ASSERT_OK(lis);
  const std::string addr = lis->address();
  const std::string reason = "no room at the inn (cvt-reason-42)";
  std::string err;
  std::thread acceptor([&] {
    auto req = lis->accept(scaled(milliseconds(10000)));
    if (!req) {
      err = "accept: " + req.error().to_string();
      return;
    }
    auto r = req->reject(reason);
    if (!r) err = "reject: " + r.error().to_string();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto info = conveyor::connect(init.qp, addr, {.timeout = scaled(milliseconds(10000))});
  const auto took = std::chrono::steady_clock::now() - t0;
  acceptor.join();
  ASSERT_EQ(err, "");
  CVT_EXPECT_ERRC(info, errc::rejected);
  if (!info) {
    EXPECT_NE(info.error().context.find(reason), std::string::npos)
        << "the reason is missing from the error: " << info.error().to_string();
  }
  EXPECT_LT(took, scaled(milliseconds(5000))) << "a reject must not wait for a timeout";
  EXPECT_NE(name(init.qp.state()), name(qp_state::rts));
}

TEST_P(connection, connect_to_port_without_listener_is_connection_refused) {
  ASSERT_NO_FATAL_FAILURE(prepare_pair());
  std::string addr;
  {
    // Where a listener of this provider just was, in its own syntax (a free
    // port of the host its listeners use, a fresh abstract name), and nothing
    // listens any more.
    auto lis = conveyor::listener::bind(tgt.dev);
    CVT_ASSERT_OK(lis);
    addr = lis->address();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto info = conveyor::connect(init.qp, addr, {.timeout = milliseconds(5000)});
  const auto took = std::chrono::steady_clock::now() - t0;
  CVT_EXPECT_ERRC(info, errc::connection_refused);
  if (!info) {
    EXPECT_NE(info.error().context.find(addr), std::string::npos)
        << "the address is missing from the error: " << info.error().to_string();
  }
  EXPECT_LT(took, milliseconds(4000)) << "a refused connection must fail at once, not time out";
  EXPECT_NE(name(init.qp.state()), name(qp_state::rts));
}

INSTANTIATE_TEST_SUITE_P(providers, connection, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace cvt
