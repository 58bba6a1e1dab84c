// The `conveyor` tool, run as a separate program: argument handling, errors a
// person can act on, every test x mode against a `perf --server`, and the
// documented JSON schemas (docs/CLI.md).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/caps.hpp"
#include "common/env.hpp"
#include "common/process.hpp"
#include "common/raw_tcp.hpp"
#include "perf_report.hpp"
#include "perf_session.hpp"
#include "perftest.hpp"
#include "providers/soft/wire/wire.hpp"

namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const std::string tool = CONVEYOR_TOOL_PATH;

cvt::command_result run(std::vector<std::string> args, std::chrono::milliseconds timeout = 60s) {
  args.insert(args.begin(), tool);
  return cvt::run_command(args, cvt::scaled(timeout));
}

int exit_code(const cvt::command_result& r) {
  return WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1;
}

// `conveyor perf --server` in the background, listening on `bind` (an
// ephemeral TCP port by default); its stderr is read for the address it
// listens on. The destructor kills it.
class server_process {
 public:
  explicit server_process(std::vector<std::string> extra = {}, std::string bind = "127.0.0.1:0") {
    std::vector<std::string> args{tool, "perf", "--server", bind, "--accept-timeout", "120"};
    args.insert(args.end(), extra.begin(), extra.end());
    start(std::move(args));
  }
  // Any command line (after the tool's path) that prints "listening on ADDRESS ".
  // wait = false: do not wait for that line (a client run in the background).
  struct raw_args {
    std::vector<std::string> args;
    bool wait = true;
  };
  explicit server_process(raw_args raw) {
    raw.args.insert(raw.args.begin(), tool);
    start(std::move(raw.args), raw.wait);
  }
  void start(std::vector<std::string> args, bool wait = true) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(p[1], 2);
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::alarm(300);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(tool.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(p[1]);
    fd_ = p[0];
    if (!wait) return;
    // "conveyor perf server: listening on 127.0.0.1:40123 (...)"
    const auto deadline = std::chrono::steady_clock::now() + cvt::scaled(10s);
    while (std::chrono::steady_clock::now() < deadline) {
      const int got = read_some(100);
      if (got < 0) break;
      if (got == 0) continue;
      const std::string marker = "listening on ";
      if (auto at = log_.find(marker); at != std::string::npos) {
        const auto begin = at + marker.size();
        const auto end = log_.find(' ', begin);
        if (end != std::string::npos) {
          address_ = log_.substr(begin, end - begin);
          return;
        }
      }
    }
  }
  ~server_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // Reads its stderr until `text` appears (true) or the timeout passes.
  bool wait_log(const std::string& text, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (log_.find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= deadline || read_some(50) < 0) return false;
    }
    return true;
  }
  // The rest of its stderr, once it has exited (bounded wait) — for messages.
  std::string drain_log() {
    while (read_some(200) > 0) {
    }
    return log_;
  }
  // Sends `sig` and waits for the exit; its exit code (128 + sig after a
  // clean stop), or -1 if it did not exit in time or was killed by it.
  int interrupt(int sig, std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    return wait_exit(timeout);
  }
  // Waits for the server to exit on its own; its exit code or -1.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  // Appends what its stderr has within poll_ms: 1 read something, 0 nothing
  // yet, -1 closed or failed.
  int read_some(int poll_ms) {
    pollfd pf{fd_, POLLIN, 0};
    if (::poll(&pf, 1, poll_ms) <= 0) return 0;
    char buf[512];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) return -1;
    log_.append(buf, static_cast<std::size_t>(n));
    return 1;
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string log_;
  std::string address_;
};

// ---------------------------------------------------------------- arguments --

struct bad_args_case {
  std::vector<std::string> args;
  std::string message;  // part of what stderr must say
};

void PrintTo(const bad_args_case& c, std::ostream* os) {
  for (const auto& a : c.args) *os << a << ' ';
}

class bad_arguments : public testing::TestWithParam<bad_args_case> {};

TEST_P(bad_arguments, exit_with_status_2_and_say_what_is_wrong) {
  const auto r = run(GetParam().args, 10s);
  EXPECT_EQ(exit_code(r), 2) << r.output;
  EXPECT_NE(r.output.find(GetParam().message), std::string::npos) << "output was:\n" << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    cli, bad_arguments,
    testing::Values(
        bad_args_case{{}, "subcommand"}, bad_args_case{{"frobnicate"}, "subcommand"},
        bad_args_case{{"perf", "127.0.0.1:1", "--test", "teleport"}, "teleport"},
        bad_args_case{{"perf", "127.0.0.1:1", "--mode", "fast"}, "fast"},
        bad_args_case{{"perf", "127.0.0.1:1", "--size", "12parsecs"}, "not a size"},
        bad_args_case{{"perf", "127.0.0.1:1", "--sizes", "8,4K,huge"}, "huge"},
        bad_args_case{{"perf", "127.0.0.1:1", "--size", "8", "--all"}, "choose one"},
        bad_args_case{{"perf", "127.0.0.1:1", "--iters", "5", "--duration", "1"}, "exclude"},
        bad_args_case{{"perf", "127.0.0.1:1", "--iters", "-3"}, "iters"},
        bad_args_case{{"perf", "127.0.0.1:1", "--qps", "0"}, "qps"},
        bad_args_case{{"perf", "127.0.0.1:1", "--crc", "maybe"}, "maybe"},
        bad_args_case{{"perf", "127.0.0.1:1", "--progress", "sometimes"}, "sometimes"},
        bad_args_case{{"perf"}, "address is missing"},
        bad_args_case{{"perf", "127.0.0.1:1", "--test", "fetch-add", "--size", "64"},
                      "exactly 8 bytes"},
        bad_args_case{{"perf", "127.0.0.1:1", "--mode", "lat", "--size", "4"}, "at least 8"},
        bad_args_case{{"perf", "127.0.0.1:1", "--tx-depth", "4", "--batch", "8"},
                      "exceeds --tx-depth"},
        bad_args_case{{"perf", "127.0.0.1:1", "--mode", "lat", "--qps", "2"},
                      "READ and atomics only"},
        bad_args_case{{"perf", "127.0.0.1:1", "--qps", "4097"}, "qps"},
        bad_args_case{{"devices", "--color"}, "color"}));

TEST(cli, help_exits_0_and_lists_the_perf_options) {
  const auto r = run({"perf", "--help"}, 10s);
  EXPECT_EQ(exit_code(r), 0) << r.output;
  for (const char* opt : {"--server", "--test", "--mode", "--size", "--all", "--iters",
                          "--duration", "--qps", "--tx-depth", "--inline", "--batch", "--crc",
                          "--progress", "--provider", "--device", "--cpu", "--verify", "--json"})
    EXPECT_NE(r.output.find(opt), std::string::npos) << opt << " missing from --help";
}

TEST(cli, sizes_accept_units) {
  // Every unit spelling reaches the run as the byte count it names.
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--mode", "lat", "--iters", "20", "--warmup", "0",
                      "--sizes", "8,4K,64KiB,1M", "--json", "--quiet"},
                     60s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  std::vector<std::uint64_t> sizes;
  for (const auto& row : j.at("results")) sizes.push_back(row.at("size").get<std::uint64_t>());
  EXPECT_EQ(sizes, (std::vector<std::uint64_t>{8, 4096, 65536, 1048576}));
}

// ------------------------------------------------------------------- errors --

TEST(cli, nothing_listening_says_to_start_the_server) {
  const std::uint16_t port = cvt::unused_port();  // bound and closed again: nothing listens there
  ASSERT_NE(port, 0);
  const auto r = run({"perf", "127.0.0.1:" + std::to_string(port), "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nothing is listening"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conveyor perf --server"), std::string::npos) << r.output;
}

TEST(cli, malformed_address_is_named) {
  const auto r = run({"perf", "not-an-address", "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("not-an-address"), std::string::npos) << r.output;
}

TEST(cli, unknown_device_points_to_conveyor_devices) {
  const auto r = run({"perf", "127.0.0.1:9", "--device", "nosuchnic0"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nosuchnic0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conveyor devices"), std::string::npos) << r.output;
}

TEST(cli, size_over_the_servers_max_size_is_refused_with_the_reason) {
  server_process srv({"--max-size", "64K"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--size", "1M", "--iters", "10"}, 30s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("--max-size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rejected"), std::string::npos) << r.output;
}

TEST(cli, a_client_of_another_protocol_version_is_refused_with_the_reason) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // A client speaking "version 99": the library's own connect with a crafted hello.
  auto dev = conveyor::device::open("soft");
  ASSERT_TRUE(dev) << dev.error().to_string();
  auto pd = dev->alloc_pd();
  ASSERT_TRUE(pd);
  auto cq = dev->create_cq();
  ASSERT_TRUE(cq);
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
  ASSERT_TRUE(qp);
  std::vector<std::byte> hello{std::byte{'C'}, std::byte{'V'}, std::byte{'P'},
                               std::byte{'F'}, std::byte{99},  std::byte{0}};
  auto info =
      conveyor::connect(*qp, srv.address(), {.private_data = hello, .timeout = cvt::scaled(10s)});
  ASSERT_FALSE(info);
  EXPECT_EQ(cvt::name(info.error().code), cvt::name(conveyor::errc::rejected));
  EXPECT_NE(info.error().context.find("version mismatch"), std::string::npos)
      << info.error().to_string();
}

// The hello travels in a connect's private data: on InfiniBand and RoCE that is
// at most 55 bytes (rdma_cm's header takes the rest of the CM REQ), so a larger
// hello made every verbs run on rxe fail before it started.
TEST(cli, hello_fits_an_ib_roce_connect_and_round_trips) {
  conveyor::tool::perf_hello h;
  h.qps = 64;
  h.index = 63;
  h.tx_depth = 0xfffffff0u;
  h.rx_depth = 4096;
  h.slots = 4096;
  h.max_size = 64ull << 20;
  h.data = {0x7f00'1234'5678'9000ull, 1, 0xa1b2c3d4u};
  h.ctl = {0x7f00'8765'4321'0000ull, 8192, 0x01020304u};
  const auto b = h.encode();
  EXPECT_LE(b.size(), conveyor::tool::perf_hello::max_encoded);
  std::string why;
  auto d = conveyor::tool::perf_hello::decode(b, why);
  ASSERT_TRUE(d.has_value()) << why;
  EXPECT_EQ(d->qps, 64);
  EXPECT_EQ(d->index, 63);
  EXPECT_EQ(d->tx_depth, 0xfffffff0u);
  EXPECT_EQ(d->rx_depth, 4096u);
  EXPECT_EQ(d->slots, 4096u);
  EXPECT_EQ(d->max_size, 64ull << 20);
  // The server sizes the client's data region from the hello: 4096 slots of
  // 64 MiB for 64 QPs, plus the spare slot.
  EXPECT_EQ(d->data.length, (64ull << 20) * (4096ull * 64 + 1));
  EXPECT_EQ(d->data.addr, h.data.addr);
  EXPECT_EQ(d->data.rkey, h.data.rkey);
  EXPECT_EQ(d->ctl.addr, h.ctl.addr);
  EXPECT_EQ(d->ctl.rkey, h.ctl.rkey);
  EXPECT_EQ(d->ctl.length, conveyor::tool::ctl_layout::bytes);
  auto short_one = std::span(b).first(b.size() - 1);
  EXPECT_FALSE(conveyor::tool::perf_hello::decode(short_one, why).has_value());
}

TEST(cli, a_peer_that_is_not_a_perf_client_is_refused) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  auto dev = conveyor::device::open("soft");
  ASSERT_TRUE(dev);
  auto pd = dev->alloc_pd();
  auto cq = dev->create_cq();
  auto qp = pd->create_qp({.send_cq = &*cq, .recv_cq = &*cq});
  ASSERT_TRUE(qp);
  auto info = conveyor::connect(*qp, srv.address(), {.timeout = cvt::scaled(10s)});
  ASSERT_FALSE(info);
  EXPECT_NE(info.error().context.find("not a conveyor perf client"), std::string::npos)
      << info.error().to_string();
}

// ------------------------------------------------ a server among hostile peers --
// (issue 11, finding 10)

// A client of the library's own: a connect whose private data is `hello`.
struct raw_client {
  conveyor::device dev = conveyor::device::open("soft").value();
  conveyor::protection_domain pd = dev.alloc_pd().value();
  conveyor::completion_queue cq = dev.create_cq().value();
  conveyor::queue_pair qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
  conveyor::result<conveyor::connection_info> connect(const std::string& address,
                                                      const conveyor::tool::perf_hello& h) {
    const auto b = h.encode();
    return conveyor::connect(qp, address, {.private_data = b, .timeout = cvt::scaled(10s)});
  }
};

conveyor::tool::perf_hello small_hello() {
  conveyor::tool::perf_hello h;
  h.qps = 1;
  h.index = 0;
  h.tx_depth = 1;
  h.rx_depth = 1;
  h.max_size = 64;
  h.data = {0x10000, 0, 0x1234};
  h.ctl = {0x20000, 0, 0x5678};
  return h;
}

TEST(cli, a_hello_asking_for_gigabytes_is_refused_with_the_reason) {
  // 64 QPs x 64 MiB: 4 GiB the server would allocate (and zero) for one hello.
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  auto h = small_hello();
  h.qps = 64;
  h.max_size = 64ull << 20;
  h.tx_depth = 64;
  raw_client c;
  const auto t0 = std::chrono::steady_clock::now();
  auto info = c.connect(srv.address(), h);
  ASSERT_FALSE(info) << "the server accepted a 4 GiB run";
  EXPECT_EQ(cvt::name(info.error().code), cvt::name(conveyor::errc::rejected))
      << info.error().to_string();
  EXPECT_NE(info.error().context.find("--max-memory"), std::string::npos)
      << info.error().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, cvt::scaled(5s))
      << "refused only after allocating";
}

TEST(cli, max_memory_bounds_what_a_real_client_may_ask_for) {
  server_process srv({"--max-memory", "1M"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // 64 KiB x 128 outstanding: 8 MiB of server memory.
  const auto r =
      run({"perf", srv.address(), "--size", "64K", "--tx-depth", "128", "--iters", "10", "--quiet"},
          30s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("--max-memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rejected"), std::string::npos) << r.output;
}

TEST(cli, a_client_that_stalls_after_its_hello_makes_the_next_one_hear_busy_not_out_of_order) {
  server_process srv({"--timeout", "2"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // A: a control connection whose data connection never comes.
  raw_client a;
  auto ai = a.connect(srv.address(), small_hello());
  ASSERT_TRUE(ai) << ai.error().to_string();
  // B, a real client, meanwhile: told the server is busy.
  const auto b = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 30s);
  EXPECT_EQ(exit_code(b), 1) << b.output;
  EXPECT_NE(b.output.find("server busy"), std::string::npos) << b.output;
  EXPECT_EQ(b.output.find("expected data connection"), std::string::npos) << b.output;
  // The server drops A after --timeout and serves C, then exits 0 (not persistent).
  EXPECT_EQ(srv.wait_exit(200ms), -1) << "the server gave up: " << srv.drain_log();
  std::this_thread::sleep_for(cvt::scaled(2500ms));
  const auto c = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 60s);
  EXPECT_EQ(exit_code(c), 0) << c.output;
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
}

TEST(cli, a_server_keeps_waiting_for_a_real_client_past_junk_and_refused_peers) {
  server_process srv;  // not persistent: it serves one client, then exits
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto port =
      static_cast<std::uint16_t>(std::stoi(srv.address().substr(srv.address().rfind(':') + 1)));
  std::string why;
  const int fd = cvt::raw_connect(port, why);  // bytes that are not MPA at all
  ASSERT_GE(fd, 0) << why;
  ASSERT_TRUE(cvt::raw_send_all(fd, cvt::garbage_bytes(64)));
  ::close(fd);
  raw_client x;  // an MPA peer with no hello
  auto xi = conveyor::connect(x.qp, srv.address(), {.timeout = cvt::scaled(10s)});
  ASSERT_FALSE(xi);
  EXPECT_EQ(srv.wait_exit(500ms), -1)
      << "the server left without serving a client: " << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 60s);
  EXPECT_EQ(exit_code(r), 0) << r.output;
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
}

// -------------------------------------------------------------- runs + JSON --

void expect_perf_schema(const json& j, const std::string& test, const std::string& mode,
                        const std::vector<std::uint64_t>& sizes,
                        const std::string& provider = "soft") {
  ASSERT_EQ(j.at("schema"), "conveyor-perf/2");
  const auto& s = j.at("settings");
  for (const char* k : {"provider", "device", "transport", "local_address", "peer_address",
                        "progress", "test", "mode"})
    EXPECT_TRUE(s.at(k).is_string()) << k;
  for (const char* k :
       {"ird", "ord", "iters", "warmup", "qps", "tx_depth", "slots", "rx_depth", "batch", "inline"})
    EXPECT_TRUE(s.at(k).is_number_unsigned()) << k;
  for (const char* k : {"extensions", "verify"}) EXPECT_TRUE(s.at(k).is_boolean()) << k;
  // The transport's own facts: an object where the provider has them, else null.
  for (const char* k : {"iwarp", "shm", "verbs"})
    EXPECT_TRUE(s.at(k).is_object() || s.at(k).is_null()) << k;
  if (s.at("iwarp").is_object()) {
    const auto& w = s.at("iwarp");
    for (const char* k : {"mss", "max_fpdu", "mpa_revision"})
      EXPECT_TRUE(w.at(k).is_number_unsigned()) << k;
    EXPECT_TRUE(w.at("crc").is_boolean());
    EXPECT_TRUE(w.at("rtr").is_string());
  }
  if (s.at("shm").is_object()) {
    const auto& m = s.at("shm");
    EXPECT_TRUE(m.at("data_path") == "cma" || m.at("data_path") == "staged") << m.dump();
    EXPECT_TRUE(m.at("direct_mapping").is_boolean());
    EXPECT_TRUE(m.at("slot_payload").is_number_unsigned());
  }
  if (s.at("verbs").is_object()) {
    for (const char* k : {"path_mtu", "port_mtu"})
      EXPECT_TRUE(s.at("verbs").at(k).is_number_unsigned()) << k;
  }
  // Exactly one part: MPA's where Conveyor runs MPA, shm's without a wire.
  EXPECT_EQ(int{s.at("iwarp").is_object()} + int{s.at("shm").is_object()} +
                int{s.at("verbs").is_object()},
            1)
      << s.dump();
  const auto& da = cvt::device_attr_of(provider);
  EXPECT_EQ(s.at("iwarp").is_object(), cvt::runs_mpa(da)) << s.dump();
  EXPECT_EQ(s.at("shm").is_object(), !cvt::has_wire(da)) << s.dump();
  EXPECT_TRUE(s.at("duration_s").is_number());
  EXPECT_TRUE(s.at("cpu").is_number_integer());
  EXPECT_EQ(s.at("test"), test);
  EXPECT_EQ(s.at("mode"), mode);
  EXPECT_EQ(s.at("provider"), provider);
  EXPECT_GT(s.at("ord").get<unsigned>(), 0u);
  const auto& rows = j.at("results");
  ASSERT_EQ(rows.size(), sizes.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    EXPECT_EQ(r.at("test"), test);
    EXPECT_EQ(r.at("mode"), mode);
    EXPECT_EQ(r.at("size").get<std::uint64_t>(), sizes[i]);
    // Every run asks for --iters 300: exactly that many are timed and
    // reported, --warmup's untimed requests not among them.
    EXPECT_EQ(r.at("iterations").get<std::uint64_t>(), 300u);
    EXPECT_GT(r.at("seconds").get<double>(), 0.0);
    EXPECT_GE(r.at("mb_per_s").get<double>(), 0.0);
    EXPECT_GT(r.at("mops").get<double>(), 0.0);
    const auto& c = r.at("cpu");
    for (const char* k : {"user_s", "sys_s", "peer_user_s", "peer_sys_s", "s_per_gb"})
      EXPECT_GE(c.at(k).get<double>(), 0.0) << k;
    EXPECT_TRUE(r.at("verified").get<bool>());
    EXPECT_EQ(r.at("verify_errors").get<std::uint64_t>(), 0u) << "bytes moved did not match";
    if (mode == "lat") {
      const auto& l = r.at("lat_us");
      for (const char* k : {"min", "mean", "p50", "p99", "p999", "max"})
        EXPECT_GT(l.at(k).get<double>(), 0.0) << k;
      EXPECT_LE(l.at("min").get<double>(), l.at("p50").get<double>());
      EXPECT_LE(l.at("p50").get<double>(), l.at("p99").get<double>());
      EXPECT_LE(l.at("p99").get<double>(), l.at("p999").get<double>());
      EXPECT_LE(l.at("p999").get<double>(), l.at("max").get<double>());
    } else {
      EXPECT_TRUE(r.at("lat_us").is_null());
      if (sizes[i] > 0) {
        EXPECT_GT(r.at("mb_per_s").get<double>(), 0.0);
      }
    }
  }
}

struct run_case {
  std::string test, mode;
  std::vector<std::string> extra;
};

void PrintTo(const run_case& c, std::ostream* os) {
  *os << c.test << ' ' << c.mode;
  for (const auto& a : c.extra) *os << ' ' << a;
}

class perf_run : public testing::TestWithParam<run_case> {};

TEST_P(perf_run, verifies_its_data_and_prints_the_documented_json) {
  const auto& c = GetParam();
  server_process srv(c.extra);
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const bool atomic = c.test == "fetch-add" || c.test == "compare-swap";
  const std::vector<std::uint64_t> sizes =
      atomic ? std::vector<std::uint64_t>{8} : std::vector<std::uint64_t>{8, 4096, 65536};
  std::vector<std::string> args{"perf",    srv.address(), "--test",   c.test,   "--mode", c.mode,
                                "--iters", "300",         "--verify", "--json", "--quiet"};
  if (!atomic) args.insert(args.end(), {"--sizes", "8,4K,64K"});
  args.insert(args.end(), c.extra.begin(), c.extra.end());
  const auto r = run(args, 120s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  expect_perf_schema(j, c.test, c.mode, sizes);
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0)
      << "the server must end cleanly after the client's goodbye\n"
      << srv.drain_log();
}

std::vector<run_case> run_cases() {
  std::vector<run_case> out;
  for (const char* t : {"write", "read", "send", "fetch-add", "compare-swap", "write-imm"})
    for (const char* m : {"bw", "lat", "rate"}) out.push_back({t, m, {}});
  out.push_back({"write", "bw", {"--qps", "3", "--progress", "manual"}});
  out.push_back({"send", "bw", {"--qps", "2", "--rx-depth", "8", "--tx-depth", "32"}});
  // Past the 128 QPs whose credit words fit before protocol 3: every QP's
  // receives are credited at its own word.
  out.push_back({"send", "bw", {"--qps", "200", "--rx-depth", "2", "--tx-depth", "2"}});
  // One-sided latency over several QPs: each round trip takes the next one;
  // the atomics' returned values and the server's sum of the QPs' words check
  // that every request went where it was aimed.
  out.push_back({"read", "lat", {"--qps", "5"}});
  out.push_back({"fetch-add", "lat", {"--qps", "3"}});
  out.push_back({"compare-swap", "lat", {"--qps", "3"}});
  out.push_back({"read", "lat", {"--progress", "manual", "--crc", "off"}});
  out.push_back({"write", "rate", {"--batch", "4", "--tx-depth", "8", "--inline", "0"}});
  // Untimed requests first: the server's count of the phase includes them.
  out.push_back({"send", "bw", {"--warmup", "100", "--qps", "2"}});
  out.push_back({"fetch-add", "bw", {"--warmup", "50"}});
  // Every request through the same buffer (--slots 1), as bench/compare's
  // bandwidth rows run: the bytes of each still check.
  out.push_back({"read", "bw", {"--slots", "1", "--tx-depth", "32"}});
  out.push_back({"send", "bw", {"--slots", "1"}});
  return out;
}

std::string run_case_name(const testing::TestParamInfo<run_case>& info) {
  std::string n = info.param.test + "_" + info.param.mode +
                  (info.param.extra.empty() ? "" : "_" + std::to_string(info.index));
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(cli, perf_run, testing::ValuesIn(run_cases()), run_case_name);

// --slots reaches the server in the hello: the same 8 MiB of requests in
// flight fit its 1 MiB bound when they share one 64 KiB buffer, and every
// request's bytes still check.
TEST(cli, slots_bound_the_buffers_requests_rotate_through_on_both_sides) {
  server_process srv({"--max-memory", "1M"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--size", "64K", "--tx-depth", "128", "--slots", "1",
                      "--iters", "300", "--verify", "--json", "--quiet"},
                     60s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  EXPECT_EQ(j.at("settings").at("slots").get<unsigned>(), 1u);
  expect_perf_schema(j, "write", "bw", {65536});
}

// Without --slots every outstanding request gets its own buffer, and the report
// says how many were laid out; a latency run uses one each way.
TEST(cli, the_report_gives_the_buffers_per_qp_as_laid_out) {
  server_process srv({"--persistent"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  for (const auto& [mode, want] : {std::pair{"bw", 8u}, std::pair{"lat", 1u}}) {
    const auto r =
        run({"perf", srv.address(), "--mode", mode, "--size", "4K", "--tx-depth",
             std::string(mode) == "bw" ? "8" : "1", "--iters", "100", "--json", "--quiet"},
            60s);
    ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
    json j;
    ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
    EXPECT_EQ(j.at("settings").at("slots").get<unsigned>(), want) << mode;
  }
}

TEST(cli, slots_are_for_bandwidth_and_rate_runs) {
  const auto r = run({"perf", "127.0.0.1:1", "--mode", "lat", "--slots", "1"}, 10s);
  EXPECT_EQ(exit_code(r), 2) << r.output;
  EXPECT_NE(r.output.find("--slots"), std::string::npos) << r.output;
}

// The same runs over the shm provider: the server listens on an abstract Unix
// socket name. Sizes 8 B and 4 KiB go through the shared rings, 64 KiB by
// cross-memory attach where the kernel allows it (staged otherwise): --verify
// checks the bytes on both sides either way.
std::string unique_shm_name() {
  static int n = 0;
  return "@cvt-cli-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

class perf_run_shm : public testing::TestWithParam<run_case> {};

TEST_P(perf_run_shm, verifies_its_data_and_prints_the_documented_json) {
  const auto& c = GetParam();
  std::vector<std::string> srv_extra{"--provider", "shm"};
  srv_extra.insert(srv_extra.end(), c.extra.begin(), c.extra.end());
  server_process srv(srv_extra, unique_shm_name());
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  ASSERT_EQ(srv.address().front(), '@') << srv.drain_log();
  const bool atomic = c.test == "fetch-add" || c.test == "compare-swap";
  const std::vector<std::uint64_t> sizes =
      atomic ? std::vector<std::uint64_t>{8} : std::vector<std::uint64_t>{8, 4096, 65536};
  std::vector<std::string> args{"perf",     srv.address(), "--provider", "shm",     "--test",
                                c.test,     "--mode",      c.mode,       "--iters", "300",
                                "--verify", "--json",      "--quiet"};
  if (!atomic) args.insert(args.end(), {"--sizes", "8,4K,64K"});
  args.insert(args.end(), c.extra.begin(), c.extra.end());
  const auto r = run(args, 120s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  expect_perf_schema(j, c.test, c.mode, sizes, "shm");
  EXPECT_EQ(j.at("settings").at("transport"), "shared memory");
  EXPECT_EQ(j.at("settings").at("peer_address"), srv.address());
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0)
      << "the server must end cleanly after the client's goodbye\n"
      << srv.drain_log();
}

std::vector<run_case> shm_run_cases() {
  std::vector<run_case> out;
  for (const char* t : {"write", "read", "send", "fetch-add", "compare-swap", "write-imm"})
    for (const char* m : {"lat", "bw"}) out.push_back({t, m, {}});
  out.push_back({"read", "lat", {"--progress", "manual"}});
  out.push_back({"write", "bw", {"--qps", "2", "--progress", "manual"}});
  out.push_back({"send", "bw", {"--qps", "200", "--rx-depth", "2", "--tx-depth", "2"}});
  out.push_back({"compare-swap", "lat", {"--qps", "3"}});
  return out;
}

INSTANTIATE_TEST_SUITE_P(cli, perf_run_shm, testing::ValuesIn(shm_run_cases()), run_case_name);

TEST(cli, table_output_names_units_and_the_resolved_settings) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r =
      run({"perf", srv.address(), "--mode", "lat", "--size", "8", "--iters", "100"}, 60s);
  ASSERT_EQ(exit_code(r), 0) << r.output;
  for (const char* s : {"provider soft", "IRD/ORD", "CRC on", "MSS", "bytes", "p50[us]", "p99[us]",
                        "p999[us]", "max[us]"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << " missing:\n" << r.output;
}

TEST(cli, devices_json_lists_the_soft_device_with_its_capabilities) {
  const auto r = run({"devices", "--json"}, 20s);
  ASSERT_EQ(exit_code(r), 0) << r.output;
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  ASSERT_EQ(j.at("schema"), "conveyor-devices/1");
  bool soft = false;
  for (const auto& d : j.at("devices")) {
    EXPECT_TRUE(d.at("name").is_string());
    EXPECT_TRUE(d.at("provider").is_string());
    EXPECT_TRUE(d.at("transport").is_string());
    EXPECT_TRUE(d.at("available").is_boolean());
    if (!d.at("available").get<bool>()) {
      EXPECT_FALSE(d.at("reason").get<std::string>().empty())
          << "an unavailable device must say why";
      continue;
    }
    const auto& a = d.at("attributes");
    EXPECT_GT(a.at("max_qp").get<unsigned>(), 0u);
    EXPECT_GT(a.at("max_qp_rd_atom").get<unsigned>(), 0u);
    EXPECT_TRUE(a.at("atomics").is_boolean());
    EXPECT_FALSE(a.at("ports").empty());
    if (d.at("provider") == "soft") {
      soft = true;
      EXPECT_EQ(d.at("transport"), "iWARP");
      const auto& addrs = a.at("ports")[0].at("addresses");
      EXPECT_NE(std::find(addrs.begin(), addrs.end(), "127.0.0.1"), addrs.end()) << addrs.dump();
    }
  }
  EXPECT_TRUE(soft);
}

TEST(cli, devices_with_an_unknown_provider_fails) {
  const auto r = run({"devices", "--provider", "warp-drive"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("warp-drive"), std::string::npos) << r.output;
}

}  // namespace

// ------------------------------------------------- perftest habits (issue 17) --

namespace {

// Parses `conveyor <args>` with the tool's own perftest commands, in process.
struct parsed_perftest {
  std::string error;  // CLI11's or perftest_to_perf's
  conveyor::tool::perf_options o;
};
parsed_perftest parse_perftest(std::vector<std::string> args) {
  CLI::App app{"conveyor"};
  conveyor::tool::perftest_args a;
  const auto cmds = conveyor::tool::add_perftest_commands(app, a);
  parsed_perftest out;
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    out.error = e.what();
    return out;
  }
  for (const auto& c : cmds)
    if (*c.app) {
      out.error = conveyor::tool::perftest_to_perf(a, c.test, c.mode, out.o);
      if (out.error.empty()) out.error = conveyor::tool::validate_perf_options(out.o);
    }
  return out;
}

}  // namespace

TEST(perftest, flags_have_perftests_meanings) {
  using conveyor::tool::perf_mode;
  using conveyor::tool::perf_test;
  auto p = parse_perftest({"write_bw", "-s", "4096", "-n", "500", "-q", "4", "-t", "64", "-I", "0",
                           "-p", "7000", "-l", "8", "-F", "-R", "--report_gbits", "10.0.0.2"});
  ASSERT_EQ(p.error, "");
  EXPECT_FALSE(p.o.server);
  EXPECT_EQ(p.o.test, perf_test::write);
  EXPECT_EQ(p.o.mode, perf_mode::bw);
  EXPECT_EQ(p.o.sizes, (std::vector<std::uint64_t>{4096}));
  EXPECT_EQ(p.o.iters, 500u);
  EXPECT_EQ(p.o.qps, 4u);
  EXPECT_EQ(p.o.tx_depth, 64u);
  EXPECT_EQ(p.o.inline_size, 0u);
  EXPECT_EQ(p.o.batch, 8u);
  EXPECT_TRUE(p.o.report_gbits);
  EXPECT_EQ(p.o.address, "10.0.0.2");
  EXPECT_EQ(p.o.default_port, 7000);
  std::string why;
  EXPECT_EQ(conveyor::tool::resolve_address(p.o, p.o.address, why), "10.0.0.2:7000") << why;

  p = parse_perftest({"read_lat", "-a", "-D", "2", "-d", "soft"});
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.o.server) << "no host: the server, as perftest";
  EXPECT_EQ(p.o.address, "0.0.0.0:18515");
  EXPECT_EQ(p.o.test, perf_test::read);
  EXPECT_EQ(p.o.mode, perf_mode::lat);
  EXPECT_EQ(p.o.sizes.size(), 23u) << "-a: 2 B .. 8 MiB";
  EXPECT_EQ(p.o.duration, 2.0);
  EXPECT_EQ(p.o.device, "soft");

  p = parse_perftest({"write_lat", "-a", "h"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.sizes.front(), 8u) << "write_lat -a starts at the ping-pong's 8 bytes";
  EXPECT_EQ(p.o.sizes.back(), 8u << 20);

  p = parse_perftest({"send_bw", "-d", "mlx5_0", "-r", "128", "host7"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.device, "verbs:mlx5_0") << "an rdma-core name is the verbs provider's device";
  EXPECT_EQ(p.o.provider, "verbs");
  EXPECT_EQ(p.o.rx_depth, 128u);
  EXPECT_EQ(p.o.test, perf_test::send);

  p = parse_perftest({"atomic_lat", "-A", "CMP_AND_SWAP", "-d", "shm", "localhost"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.test, perf_test::compare_swap);
  EXPECT_EQ(p.o.address, "@conveyor-perf-18515") << "shm: the port names the socket";
  p = parse_perftest({"atomic_bw", "127.0.0.1"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.test, perf_test::fetch_add);
}

TEST(perftest, flags_that_do_not_apply_say_why) {
  EXPECT_NE(parse_perftest({"write_bw", "-c", "UD", "h"}).error.find("reliable connected"),
            std::string::npos);
  EXPECT_NE(parse_perftest({"write_bw", "-m", "4096", "h"}).error.find("MTU"), std::string::npos);
  EXPECT_NE(parse_perftest({"write_bw", "-b", "h"}).error.find("bidirectional"), std::string::npos);
  EXPECT_NE(parse_perftest({"write_bw", "-s", "lots", "h"}).error.find("not a size"),
            std::string::npos);
  EXPECT_NE(parse_perftest({"write_lat", "-s", "4", "h"}).error.find("at least 8"),
            std::string::npos);
  // perftest flags Conveyor does not offer are refused naming the flag and what to do.
  auto e = parse_perftest({"write_bw", "-e", "h"}).error;
  EXPECT_EQ(e.rfind("-e:", 0), 0u) << e;
  EXPECT_NE(e.find("polls"), std::string::npos) << e;
  e = parse_perftest({"write_bw", "--run_infinitely", "h"}).error;
  EXPECT_EQ(e.rfind("--run_infinitely:", 0), 0u) << e;
  EXPECT_NE(e.find("-D"), std::string::npos) << e;
  e = parse_perftest({"write_lat", "--output", "bandwidth", "h"}).error;
  EXPECT_NE(e.find("--output latency"), std::string::npos) << e;
}

TEST(perftest, port_peak_and_output_flags_are_taken) {
  auto p = parse_perftest({"write_bw", "-i", "1", "-N", "--output=bandwidth", "h"});
  ASSERT_EQ(p.error, "");
  EXPECT_TRUE(p.o.perftest_report);
  EXPECT_TRUE(p.o.perftest_no_peak);
  EXPECT_EQ(p.o.perftest_output, "bandwidth");
  p = parse_perftest({"send_lat", "--output", "latency", "h"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.o.perftest_output, "latency");
}

namespace {
// What print_table_header + print_table_row write for one result.
std::string perftest_report(conveyor::tool::perf_options o, const conveyor::tool::perf_result& r) {
  conveyor::tool::perf_settings s;
  s.opts = std::move(o);
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = ::open_memstream(&buf, &len);
  conveyor::tool::print_table_header(f, s);
  conveyor::tool::print_table_row(f, s, r);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  // Scripts split perftest's output on white space: compare it that way.
  std::string words;
  for (char c : out)
    if (c != ' ' || (!words.empty() && words.back() != ' ' && words.back() != '\n')) words += c;
  for (std::size_t i; (i = words.find(" \n")) != std::string::npos;) words.erase(i, 1);
  return words;
}
}  // namespace

TEST(perftest, reports_in_perftests_columns_and_units) {
  using conveyor::tool::perf_mode;
  using conveyor::tool::perf_test;
  // A latency run whose round trips are 10 us (min 8, max 30, p99 20, p99.9 30).
  conveyor::tool::perf_result r;
  r.mode = perf_mode::lat;
  r.size = 8;
  r.iterations = 1000;
  r.lat = conveyor::tool::latency_stats{
      .min = 8, .mean = 11, .p50 = 10, .p99 = 20, .p999 = 30, .max = 30, .stdev = 2};
  conveyor::tool::perf_options o;
  o.perftest_report = true;
  o.mode = perf_mode::lat;
  for (auto t : {perf_test::write, perf_test::send}) {
    o.test = r.test = t;
    const auto out = perftest_report(o, r);
    EXPECT_NE(out.find("#bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec] "
                       "t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]"),
              std::string::npos)
        << out;
    // ib_write_lat / ib_send_lat: half the round trip.
    EXPECT_NE(out.find("\n8 1000 4.00 15.00 5.00 5.50 1.00 10.00 15.00\n"), std::string::npos)
        << out;
  }
  o.test = r.test = perf_test::read;
  auto out = perftest_report(o, r);
  EXPECT_NE(out.find("\n8 1000 8.00 30.00 10.00 11.00 2.00 20.00 30.00\n"), std::string::npos)
      << "ib_read_lat: the round trip\n"
      << out;
  o.test = r.test = perf_test::write;
  o.perftest_output = "latency";
  EXPECT_EQ(perftest_report(o, r), "5.00\n");

  // Bandwidth: MB/sec = 2^20 bytes/s; 1048.576 MB/s (10^6) is 1000 perftest MB/sec.
  conveyor::tool::perf_result b;
  b.test = perf_test::write;
  b.mode = perf_mode::bw;
  b.size = 65536;
  b.iterations = 5000;
  b.mb_per_s = 1048.576;
  b.mops = 0.016;
  o = {};
  o.perftest_report = true;
  out = perftest_report(o, b);
  EXPECT_NE(out.find("#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\n65536 5000 1000.00 1000.00 0.016000\n"), std::string::npos) << out;
  o.perftest_no_peak = true;
  out = perftest_report(o, b);
  EXPECT_NE(out.find("\n65536 5000 0.00 1000.00 0.016000\n"), std::string::npos) << out;
  o.perftest_output = "bandwidth";
  EXPECT_EQ(perftest_report(o, b), "1000.00\n");
}

TEST(perftest, write_bw_server_without_host_and_client_with_bare_host) {
  const std::uint16_t port = cvt::unused_port();
  ASSERT_NE(port, 0);
  server_process srv(
      server_process::raw_args{{"write_bw", "-p", std::to_string(port), "--verify"}});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  EXPECT_EQ(srv.address(), "0.0.0.0:" + std::to_string(port));
  const auto r = run({"write_bw", "-p", std::to_string(port), "-s", "4096", "-n", "200",
                      "--report_gbits", "-F", "--verify", "localhost"},
                     60s);
  ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  EXPECT_NE(r.output.find("BW average[Gb/sec]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("10^9 bits/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << "localhost, a bare host, is port " << port << ":\n"
      << r.output;
  EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
}

TEST(perftest, conveyor_perf_points_perftest_letters_to_the_right_flag) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"perf", "-s", "65536", "10.0.0.2"},
                                             {"perf", "-t", "128", "10.0.0.2"},
                                             {"perf", "-s", "4096"},
                                             {"perf", "-p", "18515", "10.0.0.2"}}) {
    const auto r = run(args, 10s);
    EXPECT_EQ(exit_code(r), 2) << r.output;
    EXPECT_NE(r.output.find("conveyor write_bw"), std::string::npos) << r.output;
  }
  const auto r = run({"perf", "-s", "65536", "10.0.0.2"}, 10s);
  EXPECT_NE(r.output.find("-S/--size"), std::string::npos) << r.output;
}

// ------------------------------------------------------ frictions (issue 17) --

TEST(cli, negative_counts_and_durations_are_refused_naming_the_bound_only) {
  auto r = run({"perf", "127.0.0.1:1", "--warmup", "-1"}, 10s);
  EXPECT_EQ(exit_code(r), 2) << "--warmup -1 must not wrap to 2^64 - 1:\n" << r.output;
  EXPECT_NE(r.output.find("--warmup"), std::string::npos) << r.output;
  for (const char* opt : {"--duration", "--timeout", "--accept-timeout"}) {
    r = run({"perf", "127.0.0.1:1", opt, "-1"}, 10s);
    EXPECT_EQ(exit_code(r), 2) << r.output;
    EXPECT_NE(r.output.find(opt), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("17976931348623157"), std::string::npos) << "DBL_MAX printed:\n"
                                                                     << r.output;
    EXPECT_LT(r.output.size(), 400u) << r.output;
  }
}

TEST(cli, bare_hosts_and_ipv6_without_brackets_reach_the_default_port) {
  // Nothing listens: the message names the resolved address with port 18515.
  // (Whether something listens on 18515 on this machine does not matter.)
  for (const std::string host : {"::1", "localhost", "127.0.0.1"}) {
    const auto r = run(
        {"perf", host, "--timeout", "3", "--mode", "lat", "--iters", "1", "--warmup", "0"}, 20s);
    EXPECT_NE(r.output.find(":18515"), std::string::npos) << host << ":\n" << r.output;
    EXPECT_EQ(r.output.find("not a numeric"), std::string::npos) << host << ":\n" << r.output;
    EXPECT_EQ(r.output.find("missing port"), std::string::npos) << host << ":\n" << r.output;
  }
  conveyor::tool::perf_options o;
  std::string why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "::1", why), "[::1]:18515") << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "[::1]", why), "[::1]:18515") << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "localhost:7000", why), "127.0.0.1:7000")
      << "a name resolves to IPv4 first (the server's default is 0.0.0.0) " << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "10.1.2.3", why), "10.1.2.3:18515") << why;
  EXPECT_EQ(conveyor::tool::resolve_address(o, "no-such-host.invalid", why), "");
  EXPECT_NE(why.find("no-such-host.invalid"), std::string::npos) << why;
  o.provider = "shm";
  EXPECT_EQ(conveyor::tool::resolve_address(o, "@name", why), "@name");
  // A server on a bare IPv6 address ("::1" -> [::1]:PORT) listens where it says.
  server_process srv({}, "[::1]:0");
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  EXPECT_EQ(srv.address().rfind("[::1]:", 0), 0u) << srv.address();
}

TEST(cli, version_prints_the_build_facts) {
  for (const char* arg : {"--version", "version"}) {
    const auto r = run({arg}, 10s);
    EXPECT_EQ(exit_code(r), 0) << r.output;
    for (const char* s : {"conveyor 0.", "commit ", "compiler ", "providers  soft shm", "ISA-L "})
      EXPECT_NE(r.output.find(s), std::string::npos) << s << " missing:\n" << r.output;
  }
}

TEST(cli, a_second_client_of_a_busy_server_hears_busy_at_once) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  cvt::command_result first;
  // The first client's run and the wait before the second both scale with the
  // build (a sanitizer build is slower): the second must arrive mid-run, not
  // after the one-client server has gone (tsan failed it so).
  const std::string first_s = std::to_string(cvt::scaled(4000ms).count() / 1000.0);
  std::thread t([&] {
    first = run({"perf", srv.address(), "--duration", first_s, "--quiet"}, 60s);
  });
  std::this_thread::sleep_for(cvt::scaled(1500ms));  // the first is running its test
  const auto t0 = std::chrono::steady_clock::now();
  const auto second = run({"perf", srv.address(), "--duration", "0.2", "--quiet"}, 30s);
  const auto took = std::chrono::steady_clock::now() - t0;
  t.join();
  EXPECT_EQ(exit_code(first), 0) << first.output;
  EXPECT_EQ(exit_code(second), 1) << second.output;
  EXPECT_NE(second.output.find("server busy"), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("timed out"), std::string::npos) << second.output;
  EXPECT_LT(took, cvt::scaled(3s)) << "the refusal must not wait for a handshake timeout";
}

// A script (bench/compare, bench/ab) starts the next client the moment the
// last one exits. Its request can reach the server while the server still
// turns clients away for the run that just said goodbye; that request must be
// served, not told "server busy".
TEST(cli, a_client_started_as_the_last_one_exits_is_served_not_told_busy) {
  server_process srv({"--persistent"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  for (int i = 0; i < 8; ++i) {
    const auto r =
        run({"perf", srv.address(), "--duration", "0.05", "--size", "64", "--quiet"}, 60s);
    ASSERT_EQ(exit_code(r), 0) << "client " << i << ":\n" << r.output << srv.drain_log();
  }
}

// A client that opens its control and data connections with a valid hello
// and then says nothing held a --persistent server for a day (every other
// client heard "server busy"): between phases the server waits --timeout at
// most, says so, and serves the next client.
TEST(cli, a_silent_client_between_phases_is_dropped_after_timeout_and_the_next_is_served) {
  server_process srv({"--persistent", "--timeout", "2"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto h = small_hello();
  raw_client ctl;
  auto ci = ctl.connect(srv.address(), h);
  ASSERT_TRUE(ci) << ci.error().to_string();
  auto dh = h;
  dh.index = 1;
  raw_client data;
  auto di = data.connect(srv.address(), dh);
  ASSERT_TRUE(di) << di.error().to_string();
  ASSERT_TRUE(srv.wait_log("connected (1 data QPs)", cvt::scaled(5s))) << srv.drain_log();
  // Silent from here on. After --timeout the server drops it and logs why.
  ASSERT_TRUE(srv.wait_log("sent nothing for --timeout 2 s between phases", cvt::scaled(8s)))
      << "the silent client still holds the server:\n"
      << srv.drain_log();
  const auto r = run({"perf", srv.address(), "--iters", "10", "--quiet"}, 60s);
  EXPECT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  EXPECT_EQ(srv.wait_exit(100ms), -1) << "a --persistent server exited: " << srv.drain_log();
}

// CPU time (user + system) a process has used so far, in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string st;
  std::getline(in, st);
  const auto close = st.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> f;
  std::size_t at = close + 2;
  while (at < st.size()) {
    const auto sp = st.find(' ', at);
    f.push_back(st.substr(at, sp - at));
    if (sp == std::string::npos) break;
    at = sp + 1;
  }
  if (f.size() < 13) return -1;
  return static_cast<double>(std::stoull(f[11]) + std::stoull(f[12])) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A bandwidth client whose target stops answering must give the CPU away: on
// a core it shares with the target, a client that only yields kept the
// target's engine off the CPU for 0.3 to 4 s at a time (bench/ab's shared-core
// rows, each process in its own session). With the target stopped for a
// second, the client waits on its CQ instead of spinning.
TEST(cli, a_bandwidth_client_sleeps_while_its_target_is_stopped) {
  server_process srv({"--persistent"});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  server_process client(
      server_process::raw_args{{"perf", srv.address(), "--test", "read", "--mode", "bw", "--size",
                                "64K", "--duration", "120", "--timeout", "120", "--quiet"},
                               false});
  ASSERT_TRUE(srv.wait_log("connected", cvt::scaled(20s))) << srv.drain_log();
  std::this_thread::sleep_for(cvt::scaled(500ms));  // the client is in its loop, READs out
  ASSERT_EQ(::kill(srv.pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(200ms);  // what was in flight has arrived
  const double before = cpu_seconds(client.pid());
  std::this_thread::sleep_for(1s);
  const double after = cpu_seconds(client.pid());
  ::kill(srv.pid(), SIGCONT);
  ASSERT_GE(before, 0) << client.drain_log();
  EXPECT_LT(after - before, 0.4)
      << "the client used " << after - before
      << " s of CPU in the second its target was stopped: it spins instead of sleeping";
}

TEST(cli, sigint_removes_the_shm_socket_path_and_a_restart_binds_it) {
  const std::string path = "/tmp/cvt-cli-" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  for (int sig : {SIGINT, SIGTERM}) {
    server_process srv({"--provider", "shm"}, path);
    ASSERT_FALSE(srv.address().empty()) << "bind after a " << sig << " stop failed:\n"
                                        << srv.drain_log();
    ASSERT_EQ(::access(path.c_str(), F_OK), 0) << "the server listens on the path";
    EXPECT_EQ(srv.interrupt(sig, cvt::scaled(10s)), 128 + sig) << srv.drain_log();
    EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the socket path was left behind";
    EXPECT_NE(srv.drain_log().find("interrupted by"), std::string::npos) << srv.drain_log();
  }
  ::unlink(path.c_str());
}

TEST(cli, sigint_on_a_client_prints_what_was_measured) {
  server_process srv;
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  // Each size's run scales with the build like the wait does, so SIGINT lands
  // after a size or two of the four, not after all of them (tsan failed it so).
  const std::string per_size = std::to_string(cvt::scaled(1500ms).count() / 1000.0);
  server_process client(server_process::raw_args{
      {"perf", srv.address(), "--sizes", "8,16,32,64", "--duration", per_size, "--json", "--quiet"},
      false});
  // The client in the background: give it time for a size or two of the four.
  std::this_thread::sleep_for(cvt::scaled(2500ms));
  EXPECT_EQ(client.interrupt(SIGINT, cvt::scaled(10s)), 128 + SIGINT) << client.drain_log();
  const std::string err = client.drain_log();
  EXPECT_NE(err.find("interrupted by SIGINT after "), std::string::npos) << err;
  EXPECT_NE(err.find(" of 4 sizes"), std::string::npos) << err;
}

TEST(cli, shm_settings_name_the_data_path) {
  server_process srv({"--provider", "shm"}, unique_shm_name());
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto r =
      run({"perf", srv.address(), "--provider", "shm", "--size", "64K", "--iters", "50"}, 60s);
  ASSERT_EQ(exit_code(r), 0) << r.output;
  EXPECT_NE(r.output.find("data path "), std::string::npos) << r.output;
  const bool named = r.output.find("direct mapping") != std::string::npos ||
                     r.output.find("cross-memory attach") != std::string::npos ||
                     r.output.find("staged") != std::string::npos;
  EXPECT_TRUE(named) << r.output;
  EXPECT_EQ(r.output.find("MPA rev"), std::string::npos) << "shm has no MPA:\n" << r.output;
}

TEST(cli, a_log_level_that_is_not_one_is_named_in_a_warning) {
  const auto r =
      cvt::run_command({"/usr/bin/env", "CONVEYOR_LOG=verbose", tool, "devices"}, cvt::scaled(20s));
  EXPECT_EQ(exit_code(r), 0) << r.output;
  EXPECT_NE(r.output.find("CONVEYOR_LOG=verbose is not a log level"), std::string::npos)
      << r.output;
}

TEST(cli, env_lists_every_variable_with_its_value_and_default) {
  const auto r =
      cvt::run_command({"/usr/bin/env", "CONVEYOR_SPIN_US=7", tool, "env"}, cvt::scaled(10s));
  EXPECT_EQ(exit_code(r), 0) << r.output;
  for (const char* v : {"CONVEYOR_LOG", "CONVEYOR_SPIN_US", "CONVEYOR_ENGINE_SPIN_US",
                        "CONVEYOR_ENGINE_PARK", "CONVEYOR_SHM_CMA", "CONVEYOR_SHM_DIRECT",
                        "CONVEYOR_VERBS_GID_INDEX", "CONVEYOR_GLOO_DEVICE"})
    EXPECT_NE(r.output.find(v), std::string::npos) << v << " missing:\n" << r.output;
  const auto line = r.output.substr(r.output.find("CONVEYOR_SPIN_US"));
  EXPECT_LT(line.find(" 7 "), line.find('\n')) << "the current value is shown:\n" << r.output;
}

// ------------------------------------------------------------ conveyor ping --

TEST(ping, verifies_send_write_and_read_and_prints_what_was_negotiated) {
  for (const std::string provider : {"soft", "shm"}) {
    // Name check: address syntax (shm listens on "@name").
    const std::string bind = provider == "shm" ? unique_shm_name() : "127.0.0.1:0";
    server_process srv(
        server_process::raw_args{{"ping", "--server", bind, "-p", provider, "--once"}});
    ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
    const auto r = run({"ping", srv.address(), "-p", provider, "--size", "64K"}, 30s);
    ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
    for (const char* s : {"connected", "IRD/ORD", "SEND 65536 B, echoed and verified: round trip",
                          "RDMA READ of it, verified", "conveyor ping: OK"})
      EXPECT_NE(r.output.find(s), std::string::npos) << provider << ": " << s << " missing:\n"
                                                     << r.output;
    // What the connection negotiated: MPA's facts where Conveyor runs MPA, the
    // data path without a wire.
    const auto& da = cvt::device_attr_of(provider);
    if (cvt::runs_mpa(da)) {
      EXPECT_NE(r.output.find("MPA rev 2"), std::string::npos) << r.output;
    }
    if (!cvt::has_wire(da)) {
      EXPECT_NE(r.output.find("data path"), std::string::npos) << r.output;
    }
    EXPECT_TRUE(cvt::runs_mpa(da) || !cvt::has_wire(da)) << provider << ": nothing to look for";
    EXPECT_EQ(srv.wait_exit(cvt::scaled(10s)), 0) << srv.drain_log();
  }
}

// -C N runs each step N times and prints one row per step with its min,
// median and max (rping -C, ibv_rc_pingpong -n); -n is the same option.
TEST(ping, count_repeats_each_step_and_prints_min_median_max_per_step) {
  for (const std::string provider : {"soft", "shm"}) {
    const std::string bind = provider == "shm" ? unique_shm_name() : "127.0.0.1:0";
    server_process srv(server_process::raw_args{{"ping", "--server", bind, "-p", provider}});
    ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
    for (const char* flag : {"-C", "-n"}) {
      const auto r = run({"ping", srv.address(), "-p", provider, flag, "5"}, 30s);
      ASSERT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
      EXPECT_NE(r.output.find("5 times each"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("min us"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("median us"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("max us"), std::string::npos) << r.output;
      for (const char* step : {"SEND, echoed", "RDMA WRITE", "RDMA READ of it"}) {
        const auto at = r.output.find(std::string("  ") + step);
        ASSERT_NE(at, std::string::npos) << step << " row missing:\n" << r.output;
        // The row: the step, then min <= median <= max, in microseconds.
        const auto line = r.output.substr(at, r.output.find('\n', at) - at);
        double mn = -1, med = -1, mx = -1;
        const auto nums =
            line.find_first_of("0123456789", line.find_last_of("abcdefghijklmnopqrstuvwxyz)") + 1);
        ASSERT_NE(nums, std::string::npos) << line;
        ASSERT_EQ(std::sscanf(line.c_str() + nums, "%lf %lf %lf", &mn, &med, &mx), 3) << line;
        EXPECT_GT(mn, 0) << line;
        EXPECT_LE(mn, med) << line;
        EXPECT_LE(med, mx) << line;
      }
      EXPECT_NE(r.output.find("every echo and every READ verified"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("conveyor ping: OK"), std::string::npos) << r.output;
    }
  }
}

TEST(ping, failures_are_one_line_that_says_what_is_wrong) {
  const std::uint16_t port = cvt::unused_port();
  ASSERT_NE(port, 0);
  auto r = run({"ping", "127.0.0.1:" + std::to_string(port), "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nothing is listening"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("conveyor ping --server"), std::string::npos) << r.output;

  server_process perf_srv;  // a perf server refuses a ping client with its reason
  ASSERT_FALSE(perf_srv.address().empty()) << perf_srv.drain_log();
  r = run({"ping", perf_srv.address(), "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("rejected the connection"), std::string::npos) << r.output;

  r = run({"ping", "@cvt-no-such-ping-server", "-p", "shm", "--timeout", "3"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("nothing is listening"), std::string::npos) << r.output;

  r = run({"ping"}, 10s);
  EXPECT_EQ(exit_code(r), 2) << r.output;
  EXPECT_NE(r.output.find("address is missing"), std::string::npos) << r.output;
}

// Peers that send a valid ping request (MPA, "CVPG" hello) and never their
// MPA RTR: the server's accept returns at once and each client is served on
// its own thread, so a real ping behind three of them completes in a fraction
// of the handshake timeout (5 s) instead of one timeout per silent peer.
TEST(ping, peers_that_never_send_their_rtr_do_not_hold_the_server) {
  server_process srv(server_process::raw_args{{"ping", "--server", "127.0.0.1:0"}});
  ASSERT_FALSE(srv.address().empty()) << srv.drain_log();
  const auto port =
      static_cast<std::uint16_t>(std::stoi(srv.address().substr(srv.address().rfind(':') + 1)));
  conveyor::wire::mpa_frame f;
  f.revision = 2;
  f.v2 = conveyor::wire::mpa_v2_words{4, 4, true, false, true, false};
  f.private_data = {std::byte{'C'}, std::byte{'V'}, std::byte{'P'}, std::byte{'G'},
                    std::byte{0},   std::byte{0},   std::byte{0},   std::byte{64}};
  const auto request = conveyor::wire::encode_mpa(f);
  std::vector<int> silent;
  for (int i = 0; i < 3; ++i) {
    std::string why;
    const int fd = cvt::raw_connect(port, why);
    ASSERT_GE(fd, 0) << why;
    silent.push_back(fd);
    ASSERT_TRUE(cvt::raw_send_all(fd, request));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run({"ping", srv.address(), "--timeout", "10"}, 30s);
  const auto took = std::chrono::steady_clock::now() - t0;
  for (int fd : silent) ::close(fd);
  EXPECT_EQ(exit_code(r), 0) << r.output << "\nserver:\n" << srv.drain_log();
  EXPECT_NE(r.output.find("conveyor ping: OK"), std::string::npos) << r.output;
  EXPECT_LT(took, cvt::scaled(2500ms)) << "the ping waited behind peers without RTR:\n"
                                       << srv.drain_log();
}

// Begin and ready carry where each side runs; a latency loop whose peer is
// pinned to its own CPU yields at once instead of spinning the peer off the
// core (one shared CPU: the WRITE ping-pong spun 2 x 5 us per round trip).
TEST(cli, the_phase_messages_carry_the_placement_and_a_shared_cpu_skips_the_spin) {
  using conveyor::tool::ctl_msg;
  using conveyor::tool::placement;
  ctl_msg m{.kind = conveyor::tool::ctl_kind::ready,
            .size = 4096,
            .host = 0x1122334455667788ull,
            .cpu = 3};
  std::array<std::byte, ctl_msg::wire_size> wire{};
  m.encode(wire);
  const ctl_msg d = ctl_msg::decode(wire);
  EXPECT_EQ(d.kind, conveyor::tool::ctl_kind::ready);
  EXPECT_EQ(d.size, 4096u);
  EXPECT_EQ(d.host, 0x1122334455667788ull);
  EXPECT_EQ(d.cpu, 3u);

  conveyor::tool::perf_options o;
  o.cpu = 2;
  const placement a = placement::here(o);
  EXPECT_NE(a.host, 0u) << "no boot id read";
  EXPECT_EQ(a.cpu, 3u);
  EXPECT_TRUE(a.shares_cpu_with(placement::here(o)));
  EXPECT_FALSE(a.shares_cpu_with({a.host, 4}));          // another CPU
  EXPECT_FALSE(a.shares_cpu_with({a.host + 1, a.cpu}));  // another machine
  EXPECT_FALSE(a.shares_cpu_with({0, 0}));               // a peer that does not say
  o.cpu = -1;
  EXPECT_FALSE(placement::here(o).shares_cpu_with(placement::here(o))) << "unpinned";

  EXPECT_TRUE(conveyor::tool::latency_spin(false).spins_first());
  EXPECT_FALSE(conveyor::tool::latency_spin(false, true).spins_first());
}
