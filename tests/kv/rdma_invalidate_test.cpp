// conveyor-kv over RDMA: what a client given the store's rkeys cannot do to the
// other clients. Every client learns the index and data rkeys at connect time;
// an RPC sent as a Send with Invalidate naming one of them must not revoke it
// (the store's regions are not registered remotely invalidatable), so one-sided
// GETs keep working for every client, new ones included. The attacker's own
// connection fails (its SEND completes with rem_access_err).
#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

#include <chrono>
#include <string>

#include "conveyor_kv/client.hpp"
#include "rdma_server_fixture.hpp"
#include "store_layout.hpp"

namespace kv = conveyor::kv;
namespace L = kv::layout;
using namespace std::chrono_literals;
using kvtest::must;
using kvtest::server;

namespace {

class kv_rdma_invalidate : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<kv::client> connect(server& s) {
    auto c = kv::client::connect(GetParam() + ":kvc", s.rdma->address(), {});
    EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().to_string());
    return c ? std::move(*c) : nullptr;
  }
};

// One client sends an ordinary RPC as SEND_WITH_INV naming `which` of the
// store's rkeys (from its own connect description); returns the status its
// SEND completed with.
conveyor::wc_status rpc_with_invalidate(server& s, const std::string& provider, bool data_key) {
  auto dev = must(conveyor::device::open(provider + ":attacker"));
  auto pd = must(dev.alloc_pd());
  auto cq = must(dev.create_cq({.depth = 16}));
  auto qp = must(pd.create_qp({.send_cq = &cq, .recv_cq = &cq}));
  const auto hello = L::encode_hello("");
  auto info = must(conveyor::connect(qp, s.rdma->address(), {.private_data = hello}));
  auto d = L::decode(info.private_data);
  EXPECT_TRUE(d.has_value()) << "not a store description";
  if (!d) return conveyor::wc_status::general_err;
  std::string req = "*1\r\n$4\r\nPING\r\n";
  auto req_mr = must(pd.register_memory(
      std::span(reinterpret_cast<std::byte*>(req.data()), req.size()), conveyor::access::none));
  auto reply_mr = must(pd.allocate_memory(d->max_message, conveyor::access::local_write));
  EXPECT_EQ(qp.post_recv(reply_mr.as_sge(), 1), conveyor::errc::ok);
  const conveyor::sge sg = req_mr.as_sge();
  EXPECT_EQ(
      qp.post_send(conveyor::send_wr{.wr_id = 2,
                                     .opcode = conveyor::wr_opcode::send_with_inv,
                                     .sg_list = std::span(&sg, 1),
                                     .invalidate_rkey = data_key ? d->data.rkey : d->index.rkey}),
      conveyor::errc::ok);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto wc = cq.wait_one(100ms);
    if (wc && wc->wr_id == 2) return wc->status;
  }
  ADD_FAILURE() << "the SEND with invalidate never completed";
  return conveyor::wc_status::general_err;
}

TEST_P(kv_rdma_invalidate, an_rpc_with_invalidate_does_not_revoke_the_store_keys) {
  server s(GetParam());
  auto legit = connect(s);
  ASSERT_TRUE(legit);
  ASSERT_TRUE(legit->set("k", "hello"));
  auto before = legit->get("k");
  ASSERT_TRUE(before.has_value()) << before.error().to_string();
  EXPECT_EQ(*before, "hello");

  for (const bool data_key : {true, false}) {
    SCOPED_TRACE(data_key ? "data rkey" : "index rkey");
    // Refused: the regions are not remotely invalidatable; the attacker's
    // connection fails, nobody else's. (Its SEND completes with
    // rem_access_err, or, on shm, retry_exc_err when the server drops the
    // failed connection before the error response reaches it.)
    const auto st = rpc_with_invalidate(s, GetParam(), data_key);
    EXPECT_TRUE(st == conveyor::wc_status::rem_access_err ||
                st == conveyor::wc_status::retry_exc_err)
        << "the RPC with invalidate completed with " << conveyor::to_string(st);
    // One-sided GETs still work, for the client connected before and for a new one.
    auto again = legit->get("k");
    ASSERT_TRUE(again.has_value())
        << "one-sided GET after the attack: " << again.error().to_string();
    EXPECT_EQ(*again, "hello");
    auto fresh = connect(s);
    ASSERT_TRUE(fresh);
    auto got = fresh->get("k");
    ASSERT_TRUE(got.has_value()) << "a new client's one-sided GET: " << got.error().to_string();
    EXPECT_EQ(*got, "hello");
  }
}

INSTANTIATE_TEST_SUITE_P(providers, kv_rdma_invalidate, ::testing::Values("soft", "shm"),
                         [](const auto& p) { return p.param; });

}  // namespace
