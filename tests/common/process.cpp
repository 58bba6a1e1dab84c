#include "common/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace cvt {

namespace {

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "/proc/self/exe";
  buf[n] = '\0';
  return buf;
}

}  // namespace

child_process::child_process(child_process&& o) noexcept
    : pid_(o.pid_),
      report_fd_(o.report_fd_),
      reaped_(o.reaped_),
      status_(o.status_),
      pending_(std::move(o.pending_)) {
  o.pid_ = -1;
  o.report_fd_ = -1;
}

child_process& child_process::operator=(child_process&& o) noexcept {
  if (this != &o) {
    this->~child_process();
    pid_ = o.pid_;
    report_fd_ = o.report_fd_;
    reaped_ = o.reaped_;
    status_ = o.status_;
    pending_ = std::move(o.pending_);
    o.pid_ = -1;
    o.report_fd_ = -1;
  }
  return *this;
}

child_process::~child_process() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  if (report_fd_ >= 0) ::close(report_fd_);
  report_fd_ = -1;
  pid_ = -1;
}

std::expected<child_process, std::string> child_process::spawn(
    const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::unexpected(errno_text("pipe2"));
  const std::string exe = self_exe();
  std::vector<std::string> argv_s;
  argv_s.push_back(exe);
  argv_s.push_back("--conveyor-child");
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    errno = e;
    return std::unexpected(errno_text("fork"));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    if (fds[1] == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else if (::dup2(fds[1], 3) < 0) {
      ::_exit(126);
    }
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  child_process c;
  c.pid_ = pid;
  c.report_fd_ = fds[0];
  return c;
}

std::expected<std::string, std::string> child_process::read_line(
    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto nl = pending_.find('\n'); nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    if (report_fd_ < 0) return std::unexpected(std::string("child report pipe closed"));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return std::unexpected("no report from child " + std::to_string(pid_) + " within " +
                             std::to_string(timeout.count()) + " ms");
    }
    pollfd p{report_fd_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 100)));
    if (r < 0 && errno != EINTR) return std::unexpected(errno_text("poll"));
    if (r <= 0) continue;
    char buf[256];
    ssize_t n = ::read(report_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(report_fd_);
      report_fd_ = -1;
      return std::unexpected("child " + std::to_string(pid_) + " closed its report pipe (exited?)");
    }
    pending_.append(buf, static_cast<std::size_t>(n));
  }
}

std::expected<int, std::string> child_process::wait_exit(std::chrono::milliseconds timeout) {
  if (reaped_) return status_;
  if (pid_ <= 0) return std::unexpected(std::string("no child"));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      status_ = st;
      return st;
    }
    if (r < 0 && errno != EINTR) return std::unexpected(errno_text("waitpid"));
    if (std::chrono::steady_clock::now() >= deadline) {
      return std::unexpected("child " + std::to_string(pid_) + " still running after " +
                             std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void child_process::kill(int sig) noexcept {
  if (running()) ::kill(pid_, sig);
}

std::string child_process::describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "wait status " + std::to_string(status);
}

bool is_child_invocation(int argc, char** argv) {
  return argc >= 2 && std::strcmp(argv[1], "--conveyor-child") == 0;
}

bool command_result::ok() const {
  return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

command_result run_command(const std::vector<std::string>& args,
                           std::chrono::milliseconds timeout) {
  command_result res;
  if (args.empty()) return res;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    res.output = errno_text("pipe2");
    return res;
  }
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& s : copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    res.output = errno_text("fork");
    ::close(fds[0]);
    ::close(fds[1]);
    return res;
  }
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool eof = false;
  while (!eof && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, 50);
    if (r > 0) {
      char buf[512];
      ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n > 0) {
        res.output.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        eof = true;
      }
    }
  }
  ::close(fds[0]);
  int st = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      res.output += "\n(killed after " + std::to_string(timeout.count()) + " ms)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  res.status = st;
  return res;
}

std::string find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path != nullptr ? path : "/usr/sbin:/usr/bin:/sbin:/bin";
  p += ":/usr/sbin:/sbin";
  std::size_t start = 0;
  while (start <= p.size()) {
    auto colon = p.find(':', start);
    std::string dir =
        p.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return {};
}

}  // namespace cvt
