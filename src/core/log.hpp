// Minimal logging: one line per event to stderr, filtered by level. The level
// comes from CONVEYOR_LOG (error|warn|info|debug; default warn), read once.
// Never used on the data path's hot loop.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace conveyor::detail {

enum class log_level : int { error = 0, warn = 1, info = 2, debug = 3 };

bool log_enabled(log_level l) noexcept;
void log_line(log_level l, std::string_view msg) noexcept;

// A numeric environment override (CONVEYOR_SPIN_US, ...): nullopt when unset
// or empty; a value that is not a whole number in [0, 2^32) is ignored, with
// one warning per variable naming it and the value.
std::optional<std::uint32_t> env_u32(const char* name);

}  // namespace conveyor::detail
