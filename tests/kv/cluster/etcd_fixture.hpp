// What the coordination client's two test files share (etcd_test.cpp against a
// real etcd, etcd_failure_test.cpp against none and against a fake one).
//
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
#pragma once

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
#include "free_port.hpp"

namespace {

using namespace conveyor::kv::cluster;
using namespace std::chrono_literals;
using conveyor::errc;
using steady = std::chrono::steady_clock;

constexpr const char* etcd_binary = "/usr/bin/etcd";

using kvtest::free_loopback_port;

inline std::string loopback(int port) {
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
    const int client = free_loopback_port(), peer = free_loopback_port();
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
inline etcd_process* shared_etcd(std::string& why) {
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
inline std::int64_t revision_now(coord& c) {
  auto r = c.range_prefix("/cvy-test/none/", 1);
  EXPECT_TRUE(r.has_value());
  return r ? r->revision : 0;
}

}  // namespace
