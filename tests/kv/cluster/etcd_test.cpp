// The coordination client (apps/kv/src/cluster/etcd.*) against a real etcd
// and against a fake one.
//
// The real one is Debian's /usr/bin/etcd (etcd-server, installed by
// scripts/bootstrap), started here as one member on 127.0.0.1 with ports the
// kernel just handed out (tried again on a collision), a temporary data
// directory and fast elections (--heartbeat-interval 50 --election-timeout
// 250), and stopped by its PID (SIGTERM, SIGKILL after 3 s; PR_SET_PDEATHSIG
// if this process dies first). Never the system service. A missing etcd fails
// every case that needs it, with the reason.
//
// The fake one is a loopback listener that answers each request with bytes a
// case chooses (not HTTP, not JSON, wrong types, too large, never), to show
// that every reply is checked and every wait is bounded.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd.hpp"

namespace {

using namespace conveyor::kv::cluster;
using namespace std::chrono_literals;
using conveyor::errc;
using steady = std::chrono::steady_clock;

constexpr const char* etcd_binary = "/usr/bin/etcd";

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

std::string loopback(int port) {
  return "127.0.0.1:" + std::to_string(port);
}

// A loopback port where nothing listens, and nothing can while this holds it
// (bound, never listening): connections to it are refused.
class dead_port {
 public:
  dead_port() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port_ = ntohs(a.sin_port);
  }
  ~dead_port() { ::close(fd_); }
  dead_port(const dead_port&) = delete;
  dead_port& operator=(const dead_port&) = delete;
  std::string endpoint() const { return loopback(port_); }

 private:
  int fd_ = -1, port_ = -1;
};

// ---------------------------------------------------------------- a real etcd

class etcd_process {
 public:
  // Starts etcd and waits until it answers a range; "" or why not.
  std::string start() {
    if (::access(etcd_binary, X_OK) != 0)
      return std::string(etcd_binary) +
             " is not installed: run scripts/bootstrap (Debian package etcd-server)";
    char tmpl[] = "/tmp/cvy-etcd-XXXXXX";
    if (!::mkdtemp(tmpl)) return "mkdtemp failed";
    dir_ = tmpl;
    std::string why;
    for (int attempt = 0; attempt < 3; ++attempt) {
      why = try_start();
      if (why.empty()) return {};
      stop();
    }
    return why;
  }

  ~etcd_process() {
    stop();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  const std::string& endpoint() const { return endpoint_; }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    auto until = steady::now() + 3s;
    while (steady::now() < until) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(20ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  std::string try_start() {
    const int client = free_port(), peer = free_port();
    if (client <= 0 || peer <= 0 || client == peer) return "no free ports";
    endpoint_ = loopback(client);
    const std::string curl = "http://" + loopback(client), purl = "http://" + loopback(peer);
    const std::string data = dir_ + "/data", log = dir_ + "/etcd.log";
    std::filesystem::remove_all(data);
    const std::vector<std::string> args = {etcd_binary,   "--name",
                                           "cvy",         "--data-dir",
                                           data,          "--listen-client-urls",
                                           curl,          "--advertise-client-urls",
                                           curl,          "--listen-peer-urls",
                                           purl,          "--initial-advertise-peer-urls",
                                           purl,          "--initial-cluster",
                                           "cvy=" + purl, "--heartbeat-interval",
                                           "50",          "--election-timeout",
                                           "250",         "--log-outputs",
                                           "stderr"};
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      if (::getppid() != parent) ::_exit(1);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(etcd_binary, argv.data());
      ::_exit(127);
    }
    auto c = etcd_coord::open(
        {.endpoints = {endpoint_}, .connect_timeout = 200ms, .request_timeout = 500ms});
    if (!c) return c.error().to_string();
    auto until = steady::now() + 15s;
    std::string last;
    while (steady::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "etcd exited (status " + std::to_string(status) + "): " + log_tail(log);
      }
      auto r = (*c)->get("/cvy-ready-probe");
      // An answer proves an etcd; its log naming the port proves it is ours (a
      // port probed free can be taken by a test beside this one, and then this
      // etcd exits while the other one answers).
      if (r && read_all(log).find("serving insecure client requests on " + endpoint_) !=
                   std::string::npos)
        return {};
      last = r ? "not in the log yet" : r.error().to_string();
      std::this_thread::sleep_for(50ms);
    }
    return "etcd did not answer within 15 s (" + last + "): " + log_tail(log);
  }

  static std::string read_all(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::string log_tail(const std::string& path) {
    auto s = read_all(path);
    return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
  }

  std::string dir_, endpoint_;
  pid_t pid_ = -1;
};

// One etcd for every case in this process (ctest runs each case in its own).
etcd_process* shared_etcd(std::string& why) {
  static std::unique_ptr<etcd_process> e;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    e = std::make_unique<etcd_process>();
    error = e->start();
    if (!error.empty()) e.reset();
  }
  why = error;
  return e.get();
}

class etcd_test : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    etcd_ = shared_etcd(why);
    ASSERT_NE(etcd_, nullptr) << why;
    auto c = etcd_coord::open({.endpoints = {etcd_->endpoint()}});
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    c_ = std::move(*c);
    // Each case (and each repetition of it) writes under its own prefix, so
    // cases sharing an etcd never meet.
    static int run = 0;
    prefix_ = std::string("/cvy-test/") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/" +
              std::to_string(run++) + "/";
  }
  std::string key(const std::string& k) const { return prefix_ + k; }

  etcd_process* etcd_ = nullptr;
  std::unique_ptr<etcd_coord> c_;
  std::string prefix_;
};

template <class T>
errc code_of(const conveyor::result<T>& r) {
  return r ? errc::ok : r.error().code;
}

// The store's current revision.
std::int64_t revision_now(coord& c) {
  auto r = c.range_prefix("/cvy-test/none/", 1);
  EXPECT_TRUE(r.has_value());
  return r ? r->revision : 0;
}

// ---------------------------------------------------------------- pure helpers

TEST(etcd_codec, base64_round_trips_every_length_and_byte) {
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    auto enc = base64_encode(bytes);
    EXPECT_EQ(enc.size(), (bytes.size() + 2) / 3 * 4);
    auto dec = base64_decode(enc);
    ASSERT_TRUE(dec.has_value()) << enc;
    EXPECT_EQ(*dec, bytes);
    bytes.push_back(static_cast<char>(i * 37));
  }
  EXPECT_EQ(base64_encode("foo"), "Zm9v");  // the gateway docs' examples
  EXPECT_EQ(base64_encode("bar"), "YmFy");
  EXPECT_EQ(base64_encode("1"), "MQ==");
}

TEST(etcd_codec, base64_refuses_what_is_not_base64) {
  for (const char* bad :
       {"Y", "YQ=", "Y===", "====", "Y!==", "YQ==YQ==", "Zm9v\n", "Zm 9", "Zm9v====", "-_-_"})
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
  EXPECT_EQ(base64_decode("").value(), "");
}

// Found by fuzz_etcd_reply: "0canceH=" decoded, to the bytes of "0canceE=",
// though only canonical base64 is accepted (the bits past the last byte are 0).
TEST(etcd_codec, base64_refuses_bits_past_the_last_byte) {
  for (const char* bad : {"0canceH=", "YR==", "YQ=x", "Zm9=", "Zm+=", "QR==", "Qf=="})
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
  for (const char* good : {"0cancQ==", "YQ==", "Zm8=", "Zm+8", "QQ==", "Qg=="}) {
    auto d = base64_decode(good);
    ASSERT_TRUE(d.has_value()) << good;
    EXPECT_EQ(base64_encode(*d), good);
  }
}

TEST(etcd_codec, prefix_end_is_the_first_key_after_the_prefix) {
  EXPECT_EQ(prefix_end("ab"), "ac");
  EXPECT_EQ(prefix_end("a\xff"), "b");
  EXPECT_EQ(prefix_end("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
}

TEST(etcd_codec, open_checks_endpoints) {
  EXPECT_FALSE(etcd_coord::open({}).has_value());
  for (const char* bad : {"127.0.0.1", "ftp://127.0.0.1:1", "127.0.0.1:0", "127.0.0.1:99999",
                          ":2379", "a b:1", "user@host:1", "::1:2379"}) {
    auto c = etcd_coord::open({.endpoints = {bad}});
    ASSERT_FALSE(c.has_value()) << bad;
    EXPECT_EQ(c.error().code, errc::invalid_argument);
  }
  for (const char* ok :
       {"127.0.0.1:2379", "http://127.0.0.1:2379/", "https://etcd.example:2379", "[::1]:2379"})
    EXPECT_TRUE(etcd_coord::open({.endpoints = {ok}}).has_value()) << ok;
}

// ---------------------------------------------------------------- against etcd

TEST_F(etcd_test, binary_keys_and_values_round_trip) {
  std::string value;
  for (int i = 0; i < 256; ++i) value.push_back(static_cast<char>(i));
  const std::string k = key(std::string("bin\0\xff\n/\x80", 8));
  auto rev = c_->put(k, value);
  ASSERT_TRUE(rev.has_value()) << rev.error().to_string();
  auto got = c_->get(k);
  ASSERT_TRUE(got.has_value()) << got.error().to_string();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key, k);
  EXPECT_EQ((*got)->value, value);
  EXPECT_EQ((*got)->mod_revision, *rev);
  EXPECT_EQ((*got)->create_revision, *rev);
  EXPECT_EQ((*got)->version, 1);
  EXPECT_EQ((*got)->lease, 0);

  auto empty = c_->put(k, "");  // an empty value is left out of the reply's JSON
  ASSERT_TRUE(empty.has_value());
  got = c_->get(k);
  ASSERT_TRUE(got.has_value() && got->has_value());
  EXPECT_EQ((*got)->value, "");
  EXPECT_EQ((*got)->version, 2);
  EXPECT_GT((*got)->mod_revision, *rev);

  auto missing = c_->get(key("missing"));
  ASSERT_TRUE(missing.has_value()) << missing.error().to_string();
  EXPECT_FALSE(missing->has_value());

  auto d = c_->del(k);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, 1);
  EXPECT_EQ(c_->del(k).value(), 0);
  EXPECT_FALSE(c_->get(k).value().has_value());
}

TEST_F(etcd_test, range_by_prefix_returns_exactly_the_prefix) {
  for (const std::string& k :
       std::vector<std::string>{"p/a", "p/b", "p/\xff", "p/\xff\xff", "p0", "p", "q/a"})
    ASSERT_TRUE(c_->put(key(k), "v:" + k).has_value());
  auto r = c_->range_prefix(key("p/"));
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  ASSERT_EQ(r->kvs.size(), 4u);
  EXPECT_EQ(r->kvs[0].key, key("p/a"));
  EXPECT_EQ(r->kvs[1].key, key("p/b"));
  EXPECT_EQ(r->kvs[2].key, key("p/\xff"));
  EXPECT_EQ(r->kvs[3].key, key("p/\xff\xff"));
  EXPECT_EQ(r->kvs[3].value, "v:p/\xff\xff");
  EXPECT_FALSE(r->more);
  EXPECT_GT(r->revision, 0);

  auto tail = c_->range_prefix(key("p/\xff"));
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ(tail->kvs.size(), 2u);

  auto limited = c_->range_prefix(key("p/"), 2);
  ASSERT_TRUE(limited.has_value());
  EXPECT_EQ(limited->kvs.size(), 2u);
  EXPECT_TRUE(limited->more);

  auto none = c_->range_prefix(key("nothing/"));
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->kvs.empty());
}

TEST_F(etcd_test, put_if_succeeds_only_with_the_current_mod_revision) {
  const auto k = key("config");
  auto first = c_->put_if(k, "v1", 0);  // create if absent
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  ASSERT_TRUE(first->succeeded);
  EXPECT_FALSE(first->current.has_value());

  auto again = c_->put_if(k, "v1b", 0);  // it exists now
  ASSERT_TRUE(again.has_value());
  EXPECT_FALSE(again->succeeded);
  ASSERT_TRUE(again->current.has_value());
  EXPECT_EQ(again->current->value, "v1");
  EXPECT_EQ(again->current->mod_revision, first->revision);

  auto stale = c_->put_if(k, "v2", first->revision - 1);
  ASSERT_TRUE(stale.has_value());
  EXPECT_FALSE(stale->succeeded);

  auto second = c_->put_if(k, "v2", first->revision);
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(second->succeeded);
  EXPECT_GT(second->revision, first->revision);
  auto now = c_->get(k).value();
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->value, "v2");
  EXPECT_EQ(now->mod_revision, second->revision);

  auto replay = c_->put_if(k, "v3", first->revision);  // the old guard again
  ASSERT_TRUE(replay.has_value());
  EXPECT_FALSE(replay->succeeded);
  EXPECT_EQ(replay->current->value, "v2");
}

TEST_F(etcd_test, of_two_concurrent_put_ifs_exactly_one_wins) {
  const auto k = key("contended");
  for (int round = 0; round < 10; ++round) {
    auto cur = c_->get(k).value();
    const std::int64_t guard = cur ? cur->mod_revision : 0;
    std::latch go(3);
    std::vector<conveyor::result<cas_result>> results(2, conveyor::result<cas_result>{});
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        go.arrive_and_wait();
        results[static_cast<std::size_t>(t)] =
            c_->put_if(k, "round " + std::to_string(round) + " thread " + std::to_string(t), guard);
      });
    go.arrive_and_wait();
    for (auto& th : threads) th.join();
    ASSERT_TRUE(results[0].has_value()) << results[0].error().to_string();
    ASSERT_TRUE(results[1].has_value()) << results[1].error().to_string();
    EXPECT_NE(results[0]->succeeded, results[1]->succeeded) << "round " << round;
    const auto& loser = results[0]->succeeded ? *results[1] : *results[0];
    const auto& winner = results[0]->succeeded ? *results[0] : *results[1];
    ASSERT_TRUE(loser.current.has_value());
    EXPECT_EQ(loser.current->mod_revision, winner.revision);
  }
}

TEST_F(etcd_test, a_lease_reports_the_ttl_etcd_chose_and_keep_alive_renews_it) {
  auto g = c_->grant_lease(2s);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  EXPECT_NE(g->id, 0);
  EXPECT_GE(g->ttl, 2s);
  auto ka = c_->keep_alive(g->id);
  ASSERT_TRUE(ka.has_value()) << ka.error().to_string();
  EXPECT_EQ(*ka, g->ttl);
  ASSERT_TRUE(c_->revoke_lease(g->id).has_value());
  auto gone = c_->keep_alive(g->id);
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code, errc::not_found) << gone.error().to_string();
  auto twice = c_->revoke_lease(g->id);
  ASSERT_FALSE(twice.has_value());
  EXPECT_EQ(twice.error().code, errc::not_found) << twice.error().to_string();
  auto put = c_->put(key("late"), "v", g->id);
  ASSERT_FALSE(put.has_value());
  EXPECT_EQ(put.error().code, errc::not_found) << put.error().to_string();
  EXPECT_FALSE(c_->grant_lease(0s).has_value());
}

TEST_F(etcd_test, a_key_on_a_lease_without_keep_alive_goes_when_it_expires) {
  auto g = c_->grant_lease(1s);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  const auto k = key("ephemeral");
  ASSERT_TRUE(c_->put(k, "here", g->id).has_value());
  auto got = c_->get(k).value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->lease, g->id);
  const auto start = steady::now();
  // etcd checks expiries every 500 ms: TTL + 3 s is a generous bound.
  const auto until = start + g->ttl + 3s;
  bool present = true;
  while (present && steady::now() < until) {
    std::this_thread::sleep_for(100ms);
    present = c_->get(k).value().has_value();
  }
  EXPECT_FALSE(present) << "still there after " << (g->ttl + 3s).count() << " s";
  EXPECT_GE(steady::now() - start, g->ttl - 100ms);  // not before its TTL
  EXPECT_EQ(code_of(c_->keep_alive(g->id)), errc::not_found);
}

TEST_F(etcd_test, keep_alive_keeps_a_key_and_revoke_removes_it_at_once) {
  auto g = c_->grant_lease(1s);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  const auto k = key("held");
  ASSERT_TRUE(c_->put(k, "here", g->id).has_value());
  // Three TTLs (at least 3 s) with a keep-alive every TTL/4.
  const auto until = steady::now() + 3 * g->ttl;
  while (steady::now() < until) {
    auto ka = c_->keep_alive(g->id);
    ASSERT_TRUE(ka.has_value()) << ka.error().to_string();
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::milliseconds>(g->ttl) / 4);
    ASSERT_TRUE(c_->get(k).value().has_value());
  }
  ASSERT_TRUE(c_->revoke_lease(g->id).has_value());
  EXPECT_FALSE(c_->get(k).value().has_value());
}

TEST_F(etcd_test, create_if_absent_on_a_lease_is_a_controller_election) {
  const auto k = key("controller");
  auto a = c_->grant_lease(2s).value(), b = c_->grant_lease(2s).value();
  auto ra = c_->put_if(k, "node-a", 0, a.id).value();
  auto rb = c_->put_if(k, "node-b", 0, b.id).value();
  EXPECT_TRUE(ra.succeeded);
  EXPECT_FALSE(rb.succeeded);
  ASSERT_TRUE(rb.current.has_value());
  EXPECT_EQ(rb.current->value, "node-a");
  EXPECT_EQ(rb.current->lease, a.id);
  ASSERT_TRUE(c_->revoke_lease(a.id).has_value());  // the controller goes
  auto rb2 = c_->put_if(k, "node-b", 0, b.id).value();
  EXPECT_TRUE(rb2.succeeded);
  ASSERT_TRUE(c_->revoke_lease(b.id).has_value());
}

TEST_F(etcd_test, watch_sees_puts_and_deletes_from_a_revision) {
  const auto from = revision_now(*c_) + 1;
  ASSERT_TRUE(c_->put(key("w/a"), "1").has_value());
  ASSERT_TRUE(c_->put(key("other"), "x").has_value());  // outside the prefix
  ASSERT_TRUE(c_->put(key("w/a"), "2").has_value());
  ASSERT_TRUE(c_->del(key("w/a")).has_value());
  std::vector<watch_event> seen;
  std::int64_t next = from;
  const auto until = steady::now() + 5s;
  while (seen.size() < 3 && steady::now() < until) {
    auto w = c_->watch_prefix(key("w/"), next, 1s);
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_EQ(w->compact_revision, 0);
    seen.insert(seen.end(), w->events.begin(), w->events.end());
    EXPECT_GE(w->next_revision, next);
    next = w->next_revision;
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].type, watch_event::kind::put);
  EXPECT_EQ(seen[0].kv.value, "1");
  EXPECT_EQ(seen[1].type, watch_event::kind::put);
  EXPECT_EQ(seen[1].kv.value, "2");
  EXPECT_EQ(seen[2].type, watch_event::kind::del);
  EXPECT_EQ(seen[2].kv.key, key("w/a"));
  EXPECT_LT(seen[1].kv.mod_revision, seen[2].kv.mod_revision);
  EXPECT_EQ(next, seen[2].kv.mod_revision + 1);

  // Nothing more: an empty answer after the timeout, resuming at the same place.
  const auto start = steady::now();
  auto quiet = c_->watch_prefix(key("w/"), next, 300ms);
  ASSERT_TRUE(quiet.has_value()) << quiet.error().to_string();
  EXPECT_TRUE(quiet->events.empty());
  EXPECT_EQ(quiet->next_revision, next);
  EXPECT_GE(steady::now() - start, 250ms);
  EXPECT_LT(steady::now() - start, 2s);
}

TEST_F(etcd_test, a_watch_wakes_when_a_put_happens) {
  const auto from = revision_now(*c_) + 1;
  conveyor::result<watch_result> w{};
  steady::time_point woke;
  std::thread watcher([&] {
    w = c_->watch_prefix(key("live/"), from, 5s);
    woke = steady::now();
  });
  std::this_thread::sleep_for(300ms);
  const auto put_at = steady::now();
  auto rev = c_->put(key("live/x"), "v");
  watcher.join();
  ASSERT_TRUE(rev.has_value());
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  ASSERT_EQ(w->events.size(), 1u);
  EXPECT_EQ(w->events[0].kv.key, key("live/x"));
  EXPECT_EQ(w->events[0].kv.mod_revision, *rev);
  EXPECT_EQ(w->next_revision, *rev + 1);
  EXPECT_LT(woke - put_at, 2s) << "the watch did not return when the put happened";
}

TEST_F(etcd_test, a_quiet_watch_from_now_resumes_after_the_current_revision) {
  const auto now = revision_now(*c_);
  auto w = c_->watch_prefix(key("quiet/"), 0, 300ms);
  ASSERT_TRUE(w.has_value()) << w.error().to_string();
  EXPECT_TRUE(w->events.empty());
  EXPECT_GE(w->next_revision, now + 1);
}

TEST_F(etcd_test, a_dead_first_endpoint_is_skipped) {
  dead_port dead;
  auto c = etcd_coord::open({.endpoints = {dead.endpoint(), etcd_->endpoint()}});
  ASSERT_TRUE(c.has_value());
  for (int i = 0; i < 3; ++i) {
    auto p = (*c)->put(key("failover"), "v" + std::to_string(i));  // a write: nothing was sent
    ASSERT_TRUE(p.has_value()) << p.error().to_string();
    auto g = (*c)->get(key("failover"));
    ASSERT_TRUE(g.has_value()) << g.error().to_string();
    EXPECT_EQ(g->value().value, "v" + std::to_string(i));
  }
}

// ---------------------------------------------------------------- bounded failure

TEST(etcd_failure, no_etcd_is_an_error_within_the_timeout) {
  dead_port a, b;
  auto c = etcd_coord::open({.endpoints = {a.endpoint(), b.endpoint()},
                             .connect_timeout = 200ms,
                             .request_timeout = 300ms});
  ASSERT_TRUE(c.has_value());
  const auto start = steady::now();
  auto r = (*c)->get("k");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::connection_refused) << r.error().to_string();
  EXPECT_NE(r.error().context.find("all 2 etcd endpoints failed"), std::string::npos)
      << r.error().context;
  auto w = (*c)->watch_prefix("k", 0, 300ms);
  ASSERT_FALSE(w.has_value());
  EXPECT_LT(steady::now() - start, 2s);
}

// A loopback listener that answers every request with reply(request), or, if
// reply returns nullopt, reads and never answers. Connections are served one at a time.
class fake_server {
 public:
  using handler = std::function<std::optional<std::string>(const std::string& request)>;
  explicit fake_server(handler h) : handler_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "fake server: no listener";
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_server() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string endpoint() const { return loopback(port_); }
  int requests() const { return requests_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int conn = ::accept(fd_, nullptr, nullptr);
      if (conn < 0) continue;
      std::string req;
      char buf[4096];
      // Read the headers and the body (Content-Length), bounded in time.
      const auto until = steady::now() + 2s;
      while (!stop_ && steady::now() < until) {
        auto hdr_end = req.find("\r\n\r\n");
        if (hdr_end != std::string::npos) {
          auto cl = req.find("Content-Length: ");
          std::size_t want = cl == std::string::npos ? 0 : std::stoul(req.substr(cl + 16));
          if (req.size() >= hdr_end + 4 + want) break;
        }
        pollfd q{conn, POLLIN, 0};
        if (::poll(&q, 1, 20) <= 0) continue;
        auto n = ::read(conn, buf, sizeof buf);
        if (n <= 0) break;
        req.append(buf, static_cast<std::size_t>(n));
      }
      ++requests_;
      auto reply = handler_(req);
      if (reply) {
        for (std::size_t off = 0; off < reply->size();) {
          auto w = ::send(conn, reply->data() + off, reply->size() - off, MSG_NOSIGNAL);
          if (w <= 0) break;
          off += static_cast<std::size_t>(w);
        }
      } else {
        while (!stop_) {  // silent: hold the connection until the client gives up
          pollfd q{conn, POLLIN, 0};
          if (::poll(&q, 1, 20) > 0 && ::read(conn, buf, sizeof buf) <= 0) break;
        }
      }
      ::close(conn);
    }
  }

  handler handler_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

std::string http(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// Everything a fake server answering `reply` makes get() return.
conveyor::error get_error(const std::string& reply, std::size_t cap = std::size_t{1} << 20) {
  fake_server s([&](const std::string&) { return reply; });
  auto c = etcd_coord::open(
      {.endpoints = {s.endpoint()}, .request_timeout = 1s, .max_reply_bytes = cap});
  EXPECT_TRUE(c.has_value());
  auto r = (*c)->get("k");
  EXPECT_FALSE(r.has_value()) << reply.substr(0, 200);
  return r ? conveyor::error{} : r.error();
}

TEST(etcd_failure, a_silent_server_times_out_within_the_bound) {
  fake_server s([](const std::string&) { return std::nullopt; });
  auto c = etcd_coord::open({.endpoints = {s.endpoint()}, .request_timeout = 300ms});
  ASSERT_TRUE(c.has_value());
  auto start = steady::now();
  auto r = (*c)->get("k");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::timed_out) << r.error().to_string();
  EXPECT_LT(steady::now() - start, 1500ms);
  // A write that may have arrived is not sent again elsewhere.
  fake_server other([](const std::string&) { return http(200, R"({"header":{"revision":"9"}})"); });
  auto two =
      etcd_coord::open({.endpoints = {s.endpoint(), other.endpoint()}, .request_timeout = 300ms});
  auto p = (*two)->put("k", "v");
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().code, errc::timed_out);
  EXPECT_EQ(other.requests(), 0);
  // A read is.
  auto g = (*two)->get("k");
  EXPECT_TRUE(g.has_value()) << g.error().to_string();
  EXPECT_EQ(other.requests(), 1);
}

TEST(etcd_failure, replies_that_are_not_http_or_not_json_are_protocol_errors) {
  EXPECT_EQ(get_error("garbage\r\n\r\n").code, errc::protocol_error);
  EXPECT_EQ(get_error(std::string(5000, '\x80')).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, "not json")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, "")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, "[1,2]")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, std::string(100000, '[') + std::string(100000, ']'))).code,
            errc::protocol_error);
  EXPECT_EQ(get_error(http(500, "<html>oops</html>")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(302, "")).code, errc::protocol_error);
  auto e = get_error(http(200, "{\"header\":"));
  EXPECT_NE(e.context.find("etcd http://127.0.0.1:"), std::string::npos)
      << e.context;  // names the endpoint
}

TEST(etcd_failure, fields_of_the_wrong_type_are_protocol_errors) {
  for (
      const char* body : {
          R"({})",                                              // no header
          R"({"header":[]})",                                   // header not an object
          R"({"header":{"revision":true}})",                    // int64 as bool
          R"({"header":{"revision":"12x"}})",                   // int64 with junk
          R"({"header":{"revision":"99999999999999999999"}})",  // int64 overflow
          R"({"header":{"revision":1.5}})",                     // int64 as float
          R"({"header":{"revision":"1"},"kvs":"x"})",           // kvs not an array
          R"({"header":{"revision":"1"},"kvs":[7]})",           // kv not an object
          R"({"header":{"revision":"1"},"kvs":[{"key":"!!","mod_revision":"1"}]})",  // bad base64
          R"({"header":{"revision":"1"},"kvs":[{"key":"aw==","value":5,"mod_revision":"1"}]})",
          R"({"header":{"revision":"1"},"kvs":[{"key":"aw=="}]})",  // no mod_revision
          R"({"header":{"revision":"1"},"kvs":[{"value":"aw==","mod_revision":"1"}]})",  // no key
          R"({"header":{"revision":"1"},"kvs":[{"key":"aw==","mod_revision":"1"},{"key":"aw==","mod_revision":"1"}]})",
      }) {
    auto e = get_error(http(200, body));
    EXPECT_EQ(e.code, errc::protocol_error) << body << ": " << e.to_string();
  }
}

TEST(etcd_failure, etcds_own_errors_keep_their_meaning) {
  auto e = get_error(http(
      404,
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})"));
  EXPECT_EQ(e.code, errc::not_found);
  EXPECT_NE(e.context.find("requested lease not found"), std::string::npos) << e.context;
  EXPECT_EQ(
      get_error(http(400, R"({"error":"x","message":"etcdserver: key is not provided","code":3})"))
          .code,
      errc::invalid_argument);
  EXPECT_EQ(get_error(http(400, R"({"error":"x","message":7,"code":"3"})")).code,
            errc::protocol_error);
}

TEST(etcd_failure, an_oversized_reply_is_cut_off) {
  // Announced as too large, and too large with no length announced.
  auto e = get_error(
      http(200, "{\"header\":{\"revision\":\"1\"},\"x\":\"" + std::string(200000, 'a') + "\"}"),
      64 << 10);
  EXPECT_EQ(e.code, errc::protocol_error);
  std::string unannounced =
      "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + std::string(200000, ' ');
  e = get_error(unannounced, 64 << 10);
  EXPECT_EQ(e.code, errc::protocol_error);
  EXPECT_NE(e.context.find("larger than 65536"), std::string::npos) << e.context;
}

TEST(etcd_failure, replies_to_writes_and_leases_are_checked) {
  auto one = [](const std::string& body) {
    return std::make_unique<fake_server>([body](const std::string&) { return http(200, body); });
  };
  auto open = [](fake_server& s) {
    return etcd_coord::open({.endpoints = {s.endpoint()}, .request_timeout = 1s}).value();
  };
  {
    auto s = one(R"({"header":{"revision":"0"}})");  // a put without a revision
    EXPECT_EQ(code_of(open(*s)->put("k", "v")), errc::protocol_error);
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"succeeded":true})");  // no responses
    EXPECT_EQ(code_of(open(*s)->put_if("k", "v", 3)), errc::protocol_error);
  }
  {
    auto s = one(
        R"({"header":{"revision":"5"},"responses":[{"response_range":{"kvs":[{"key":"b3RoZXI=","mod_revision":"2"}]}}]})");
    EXPECT_EQ(code_of(open(*s)->put_if("k", "v", 3)), errc::protocol_error);  // another key
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"deleted":"7"})");
    EXPECT_EQ(code_of(open(*s)->del("k")), errc::protocol_error);
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"ID":"12"})");  // a grant without TTL
    EXPECT_EQ(code_of(open(*s)->grant_lease(3s)), errc::protocol_error);
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"ID":"12","TTL":"3","error":"no"})");
    EXPECT_EQ(code_of(open(*s)->grant_lease(3s)), errc::protocol_error);
  }
  {
    auto s = one("{\"result\":{\"header\":{\"revision\":\"5\"},\"ID\":\"13\",\"TTL\":\"3\"}}\n");
    EXPECT_EQ(code_of(open(*s)->keep_alive(12)), errc::protocol_error);  // another lease
  }
  {
    auto s = one("{\"result\":{\"header\":{\"revision\":\"5\"},\"ID\":\"12\",\"TTL\":\"3\"}}\n");
    EXPECT_EQ(open(*s)->keep_alive(12).value(), 3s);
  }
  {
    auto s = one("");  // a stream that ends with nothing in it
    EXPECT_EQ(code_of(open(*s)->keep_alive(12)), errc::protocol_error);
  }
}

TEST(etcd_failure, watch_streams_are_checked_line_by_line) {
  auto one = [](const std::string& body) {
    return std::make_unique<fake_server>([body](const std::string&) { return http(200, body); });
  };
  auto watch = [](fake_server& s) {
    auto c = etcd_coord::open({.endpoints = {s.endpoint()}, .max_reply_bytes = 4096}).value();
    return c->watch_prefix("p/", 10, 1s);
  };
  const std::string created = "{\"result\":{\"header\":{\"revision\":\"12\"},\"created\":true}}\n";
  {
    auto s = one(created +
                 "{\"result\":{\"header\":{},\"canceled\":true,\"compact_revision\":\"11\"}}\n");
    auto w = watch(*s);
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    EXPECT_EQ(w->compact_revision, 11);
    EXPECT_TRUE(w->events.empty());
  }
  {
    auto s = one(created +
                 "{\"result\":{\"header\":{\"revision\":\"12\"},\"events\":[{\"type\":\"DELETE\","
                 "\"kv\":{\"key\":\"cC94\",\"mod_revision\":\"12\"}}]}}\n");
    auto w = watch(*s);
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_EQ(w->events.size(), 1u);
    EXPECT_EQ(w->events[0].type, watch_event::kind::del);
    EXPECT_EQ(w->events[0].kv.key, "p/x");
    EXPECT_EQ(w->next_revision, 13);
  }
  for (const std::string& bad : {
           created + "not json\n",
           created + "{\"result\":{\"events\":[{\"type\":\"EXPLODE\",\"kv\":{\"key\":\"cC94\","
                     "\"mod_revision\":\"12\"}}]}}\n",
           created + "{\"result\":{\"events\":[{\"kv\":{\"key\":\"cS94\",\"mod_revision\":\"12\"}}]"
                     "}}\n",  // q/x: outside
           created + "{\"result\":{\"events\":[{\"kv\":{\"key\":\"cC94\",\"mod_revision\":\"3\"}}]}"
                     "}\n",  // before 10
           created + "{\"result\":{\"events\":{}}}\n",
           created + std::string(10000, 'x'),  // a line longer than the bound
           std::string(
               "{\"result\":{\"header\":{\"revision\":\"12\"}}}\n"),  // ends before "created"
       }) {
    auto s = one(bad);
    auto w = watch(*s);
    ASSERT_FALSE(w.has_value()) << bad.substr(0, 160);
    EXPECT_EQ(w.error().code, errc::protocol_error) << w.error().to_string();
  }
  {
    auto s = one(created + "{\"error\":{\"grpc_code\":14,\"message\":\"no leader\"}}\n");
    auto w = watch(*s);
    ASSERT_FALSE(w.has_value());
    EXPECT_EQ(w.error().code, errc::rejected) << w.error().to_string();
  }
}

}  // namespace
