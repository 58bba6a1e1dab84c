// What the `conveyor` tool's suites share (cli_*_test.cpp, perftest_test.cpp,
// ping_test.cpp): the tool run as a separate program, a server of it in the
// background, and a client of the library's own that sends a crafted hello.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <conveyor/conveyor.hpp>

#include "common/env.hpp"
#include "common/process.hpp"
#include "perf_session.hpp"

namespace cvt_cli {

using namespace std::chrono_literals;

inline const std::string tool = CONVEYOR_TOOL_PATH;

// `conveyor <args>`, waited for (scaled timeout); its output and status.
cvt::command_result run(std::vector<std::string> args, std::chrono::milliseconds timeout = 60s);

int exit_code(const cvt::command_result& r);

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

// A valid hello for one QP of one 64-byte slot.
conveyor::tool::perf_hello small_hello();

// An abstract Unix socket name for a shm server, unique in this process.
std::string unique_shm_name();

}  // namespace cvt_cli
