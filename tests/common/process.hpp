// tests/common/process.hpp — child processes for the two-process tests.
//
// spawn() forks and re-executes this test binary (/proc/self/exe) with
// "--conveyor-child <role> --key=value ...": the child starts clean (no
// threads or devices inherited from the gtest process), opens its own device
// and reports lines (e.g. "port 40123") through a pipe on its fd 3. The
// destructor SIGKILLs and reaps a child that is still running, so a failing
// test never leaves one behind; children also arm alarm() for a hard lifetime.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <expected>
#include <map>
#include <string>
#include <vector>

namespace cvt {

class child_process {
 public:
  child_process() = default;
  child_process(child_process&& o) noexcept;
  child_process& operator=(child_process&& o) noexcept;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process();

  // args: role first, then "--key=value" options.
  static std::expected<child_process, std::string> spawn(const std::vector<std::string>& args);

  pid_t pid() const noexcept { return pid_; }
  bool running() const noexcept { return pid_ > 0 && !reaped_; }
  // Next line the child wrote to its fd 3, bounded. Fails on timeout or EOF.
  std::expected<std::string, std::string> read_line(std::chrono::milliseconds timeout);
  // Waits for exit, bounded; the raw wait status.
  std::expected<int, std::string> wait_exit(std::chrono::milliseconds timeout);
  void kill(int sig) noexcept;

  static std::string describe_status(int status);

 private:
  pid_t pid_ = -1;
  int report_fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string pending_;
};

// Child entry point: "--conveyor-child" as argv[1].
bool is_child_invocation(int argc, char** argv);
int child_main(int argc, char** argv);

using child_args = std::map<std::string, std::string>;

// Runs `argv` (argv[0] an absolute path, see find_program), bounded; exit status and merged output.
struct command_result {
  int status = -1;  // raw wait status, -1 if it could not run
  std::string output;
  bool ok() const;
};
command_result run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);
// Absolute path of an executable found in PATH (plus /usr/sbin, /sbin), or "".
std::string find_program(const std::string& name);

}  // namespace cvt
