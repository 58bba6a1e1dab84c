// The target side of the shm hostile-peer tests (shm_hostile_test.cpp,
// shm_ptrace_test.cpp): a forked child that serves connections over a shm
// device with one registered region between guard bytes, and reports each
// completion, its QP's end state and the guards on a pipe.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <conveyor/conveyor.hpp>

namespace cvt_shm_hostile {

using namespace std::chrono_literals;
using conveyor::access;
using conveyor::errc;
using conveyor::qp_state;
using conveyor::wc_status;
using clk = std::chrono::steady_clock;

constexpr std::size_t MiB = 1 << 20;
constexpr std::size_t guard_len = 4 * MiB;  // larger than a READ's progress past a full ring
constexpr std::size_t region_len = 4 * MiB;
constexpr std::size_t recv_len = 4096;
constexpr std::byte guard_byte{0xC5};

inline std::byte region_byte(std::size_t i) {
  return static_cast<std::byte>((i * 131 + 7) % 251);
}

// ------------------------------------------------------------------ target ----
// Serves `conns` connections one after another (a refused handshake counts),
// reporting each completion and the QP's end state; exits 0 unless the setup
// fails. A crash anywhere shows as a signal in the exit status.
int serve(int rep, const std::string& addr, int conns);

class target_child {
 public:
  explicit target_child(int conns) {
    addr_ = "@cvt-hostile-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++);
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(p[0]);
      ::_exit(serve(p[1], addr_, conns));
    }
    ::close(p[1]);
    fd_ = p[0];
  }
  ~target_child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  const std::string& address() const { return addr_; }
  pid_t pid() const { return pid_; }

  // The next report line; nullopt on timeout or when the child is gone.
  std::optional<std::string> line(std::chrono::milliseconds t = 15s) {
    const auto end = clk::now() + t;
    for (;;) {
      if (auto n = buf_.find('\n'); n != std::string::npos) {
        std::string l = buf_.substr(0, n);
        buf_.erase(0, n + 1);
        return l;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clk::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[512];
      const ssize_t r = ::read(fd_, b, sizeof b);
      if (r <= 0) return std::nullopt;
      buf_.append(b, static_cast<std::size_t>(r));
    }
  }
  // Lines up to and including the first that starts with `prefix`.
  std::vector<std::string> until(const std::string& prefix) {
    std::vector<std::string> out;
    while (auto l = line()) {
      out.push_back(*l);
      if (l->rfind(prefix, 0) == 0) break;
    }
    return out;
  }
  // The exit status text: "exit 0" is alive and well.
  std::string finish() {
    const auto end = clk::now() + 30s;
    int st = 0;
    while (clk::now() < end) {
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        if (WIFSIGNALED(st)) return "killed by signal " + std::to_string(WTERMSIG(st));
        return "exit " + std::to_string(WEXITSTATUS(st));
      }
      std::this_thread::sleep_for(10ms);
    }
    return "still running";
  }

 private:
  static inline int counter_ = 0;
  std::string addr_;
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string buf_;
};

struct ready_info {
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
};

// The child's first line, "ready ADDR RKEY": its region.
std::optional<ready_info> parse_ready(const std::optional<std::string>& l);

bool contains(const std::vector<std::string>& lines, const std::string& s);
std::string joined(const std::vector<std::string>& lines);

}  // namespace cvt_shm_hostile
