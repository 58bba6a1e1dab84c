// A conveyor-kv RDMA server in the test's process, as `kv serve` builds it
// (the store's regions and the connections' QPs share one protection domain),
// with a handler that knows SET and answers anything else +PONG.
#pragma once

#include <conveyor/conveyor.hpp>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include <unistd.h>

#include "rdma_server.hpp"
#include "server_loop.hpp"
#include "store.hpp"

namespace kvtest {

namespace kv = conveyor::kv;

template <class T>
T must(conveyor::result<T> r) {
  if (!r) throw std::runtime_error(r.error().to_string());
  return std::move(*r);
}

// A kv RDMA server in this process (as kv serve builds it: the store's regions
// and the connections' QPs share one protection domain); SET and PING only.
struct server {
  conveyor::device dev;
  conveyor::protection_domain pd;
  std::unique_ptr<kv::store> st;
  kv::server_loop loop;
  std::unique_ptr<kv::rdma_server> rdma;
  std::thread thread;

  explicit server(const std::string& provider) {
    static std::atomic<int> n{0};
    kv::rdma_server_options ro;
    if (provider == "shm")  // name check: address syntax (shm listens on "@name")
      ro.address = "@cvkv-fixture-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
    kv::store_options so;
    so.index_buckets = 4096;
    so.data_bytes = 4u << 20;
    dev = must(conveyor::device::open(provider + ":kvs"));
    pd = must(dev.alloc_pd());
    st = must(kv::store::create(pd, so));
    rdma = must(kv::rdma_server::start(
        dev, pd, *st, loop,
        [this](kv::session&, std::span<const std::string_view> a, std::string& out) {
          if (a.size() == 3 && a[0] == "SET") {
            st->put(a[1], a[2], {}, kv::now_ms());
            out += "+OK\r\n";
          } else {
            out += "+PONG\r\n";
          }
        },
        ro));
    thread = std::thread([this] { loop.run(); });
  }
  ~server() {
    loop.stop();
    if (thread.joinable()) thread.join();
    rdma.reset();
  }
};

}  // namespace kvtest
