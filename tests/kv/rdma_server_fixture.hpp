// The conveyor-kv RDMA suites' server: an rdma_server in the test's process, as
// `kv serve` builds it (the store's regions and the connections' QPs share one
// protection domain; the loop polls, then sleeps in epoll, so soft's engine
// does not park), on its own loop thread. Its RPCs go to a handler that runs
// the few commands these suites need straight on the store (SET, DEL, INCRBY,
// PEXPIRE, PING; the executor has its own suite), or to the real executor
// (commands.hpp) where a suite tests the RPCs themselves.
#pragma once

#include <gtest/gtest.h>
#include <conveyor/conveyor.hpp>

#include <atomic>
#include <charconv>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include <unistd.h>

#include "commands.hpp"
#include "rdma_server.hpp"
#include "server_loop.hpp"
#include "store.hpp"

namespace kvtest {

namespace kv = conveyor::kv;

// The value, or the test stops here (a throw gtest reports with the error).
template <class T>
T must(conveyor::result<T> r) {
  if (!r) throw std::runtime_error(r.error().to_string());
  return std::move(*r);
}

inline kv::store_options small_store() {
  kv::store_options o;
  o.index_buckets = 4096;
  o.data_bytes = 16u << 20;
  return o;
}

// The commands the RDMA suites need, straight on the store.
inline void mini_handler(kv::store& st, kv::session&, std::span<const std::string_view> a,
                         std::string& out) {
  const auto now = kv::now_ms();
  auto cmd = a.empty() ? std::string() : std::string(a[0]);
  if (cmd == "SET" && a.size() == 3) {
    out += st.put(a[1], a[2], {}, now) == kv::put_status::stored ? "+OK\r\n" : "-OOM\r\n";
  } else if (cmd == "DEL" && a.size() == 2) {
    out += st.erase(a[1], now) ? ":1\r\n" : ":0\r\n";
  } else if (cmd == "INCRBY" && a.size() == 3) {
    std::int64_t v = 0, by = 0;
    if (auto cur = st.get(a[1], now)) std::from_chars(cur->data(), cur->data() + cur->size(), v);
    std::from_chars(a[2].data(), a[2].data() + a[2].size(), by);
    v += by;
    st.put(a[1], std::to_string(v),
           {.cond = kv::put_cond::always, .expire_at = std::nullopt, .keep_ttl = true}, now);
    out += ":" + std::to_string(v) + "\r\n";
  } else if (cmd == "PEXPIRE" && a.size() == 3) {
    std::int64_t ms = 0;
    std::from_chars(a[2].data(), a[2].data() + a[2].size(), ms);
    out += st.set_expiry(a[1], now + ms, now) ? ":1\r\n" : ":0\r\n";
  } else if (cmd == "PING" && a.size() == 1) {
    out += "+PONG\r\n";
  } else {
    out += "-ERR unknown command\r\n";
  }
}

// Which handler the server's RPCs go to.
enum class rpcs { mini, executor };

struct server {
  conveyor::device dev;
  conveyor::protection_domain pd;
  std::unique_ptr<kv::store> st;
  kv::server_config cfg;               // the executor's (rpcs::executor)
  std::unique_ptr<kv::executor> exec;  // rpcs::executor only
  kv::server_loop loop;
  std::unique_ptr<kv::rdma_server> rdma;
  std::thread thread;
  std::atomic<std::uint64_t> handled{0};

  // provider: soft or shm (an ephemeral address in the provider's syntax
  // unless ro.address says otherwise).
  explicit server(const std::string& provider, kv::store_options so = small_store(),
                  kv::rdma_server_options ro = {}, rpcs handler = rpcs::mini) {
    using namespace std::chrono_literals;
    conveyor::device_options dopts;      // MPA CRC requested (the default), as kv serve
    dopts.software.engine_park = false;  // as kv serve: the loop polls, then sleeps in epoll
    dev = must(conveyor::device::open(provider + ":kvs", dopts));
    pd = must(dev.alloc_pd());
    st = must(kv::store::create(pd, so));
    if (handler == rpcs::executor) exec = std::make_unique<kv::executor>(*st, nullptr, cfg);
    loop.every(10ms, [this] { st->reclaim(kv::now_ms()); });
    rdma = must(kv::rdma_server::start(
        dev, pd, *st, loop,
        [this](kv::session& s, std::span<const std::string_view> a, std::string& out) {
          ++handled;
          if (exec)
            exec->execute(s, a, out);
          else
            mini_handler(*st, s, a, out);
        },
        ro));
    start();
  }
  ~server() {
    stop();
    // The RDMA server is destroyed with the loop not running.
    rdma.reset();
  }
  void start() {
    thread = std::thread([this] { loop.run(); });
  }
  void stop() {
    loop.stop();
    if (thread.joinable()) thread.join();
  }
  // Runs fn on the loop thread and waits.
  template <class F>
  void on_loop(F fn) {
    std::promise<void> done;
    loop.post([&] {
      fn();
      done.set_value();
    });
    ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  }
  bool wait_connections(std::uint64_t want) {
    for (int i = 0; i < 500; ++i) {
      if (rdma->stats().connections_current == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

}  // namespace kvtest
