// log.cpp — CONVEYOR_GLOO_DEBUG and the line format (log.hpp).
#include "log.hpp"

#include <strings.h>
#include <unistd.h>

#include <mutex>

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

log_level debug_level() {
  static const log_level level = [] {
    const char* v = std::getenv("CONVEYOR_GLOO_DEBUG");
    if (v == nullptr || *v == '\0' || ::strcasecmp(v, "WARN") == 0) return log_level::warn;
    if (::strcasecmp(v, "INFO") == 0) return log_level::info;
    if (::strcasecmp(v, "TRACE") == 0) return log_level::trace;
    std::fprintf(stderr,
                 "conveyor-gloo warn: CONVEYOR_GLOO_DEBUG=%s is not a level (WARN, INFO, TRACE); "
                 "using WARN\n",
                 v);
    return log_level::warn;
  }();
  return level;
}

void log_line(log_level l, const std::string& msg) {
  if (!log_enabled(l)) return;
  static const char* names[] = {"error", "warn", "info", "trace"};
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  static std::mutex mu;  // whole lines from the pairs' threads
  std::lock_guard g(mu);
  std::fprintf(stderr, "conveyor-gloo %s %s:%d: %s\n", names[int(l)], host, int(::getpid()),
               msg.c_str());
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
