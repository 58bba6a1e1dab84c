#include "core/log.hpp"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace conveyor::detail {

namespace {
log_level level_from_env() {
  const char* v = std::getenv("CONVEYOR_LOG");
  if (!v) return log_level::warn;
  if (!std::strcmp(v, "error")) return log_level::error;
  if (!std::strcmp(v, "info")) return log_level::info;
  if (!std::strcmp(v, "debug")) return log_level::debug;
  if (*v != '\0' && std::strcmp(v, "warn") != 0)
    std::fprintf(stderr,
                 "conveyor warn: CONVEYOR_LOG=%s is not a log level (error, warn, info, debug); "
                 "using warn\n",
                 v);
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

std::optional<std::uint32_t> env_u32(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  std::uint32_t out = 0;
  const char* end = v + std::strlen(v);
  auto [p, ec] = std::from_chars(v, end, out);
  if (ec == std::errc() && p == end) return out;
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard lk(mu);
  if (warned.insert(name).second)
    std::fprintf(stderr, "conveyor warn: %s=%s is not a whole number in 0..4294967295; ignored\n",
                 name, v);
  return std::nullopt;
}

}  // namespace conveyor::detail
