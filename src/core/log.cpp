#include "core/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace conveyor::detail {

namespace {
log_level level_from_env() {
  const char* v = std::getenv("CONVEYOR_LOG");
  if (!v) return log_level::warn;
  if (!std::strcmp(v, "error")) return log_level::error;
  if (!std::strcmp(v, "info")) return log_level::info;
  if (!std::strcmp(v, "debug")) return log_level::debug;
  return log_level::warn;
}
}  // namespace

bool log_enabled(log_level l) noexcept {
  static const log_level current = level_from_env();
  return static_cast<int>(l) <= static_cast<int>(current);
}

void log_line(log_level l, std::string_view msg) noexcept {
  if (!log_enabled(l)) return;
  static std::mutex mu;
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::lock_guard lk(mu);
  std::fprintf(stderr, "conveyor %s: %.*s\n", names[static_cast<int>(l)],
               static_cast<int>(msg.size()), msg.data());
}

}  // namespace conveyor::detail
