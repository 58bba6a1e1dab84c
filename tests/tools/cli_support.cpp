#include "cli_support.hpp"

namespace cvt_cli {

cvt::command_result run(std::vector<std::string> args, std::chrono::milliseconds timeout) {
  args.insert(args.begin(), tool);
  return cvt::run_command(args, cvt::scaled(timeout));
}

int exit_code(const cvt::command_result& r) {
  return WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1;
}

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

std::string unique_shm_name() {
  static int n = 0;
  return "@cvt-cli-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

}  // namespace cvt_cli
