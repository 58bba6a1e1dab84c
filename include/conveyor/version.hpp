// conveyor/version.hpp — the library version and the facts of its build.
#pragma once

#include <string_view>

#include "conveyor/export.hpp"

namespace conveyor {
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
inline constexpr const char* version_string = "0.1.0";

// What the library that is linked (not the headers compiled against) was
// built from: `conveyor --version` prints it. Static strings.
struct build_facts {
  std::string_view version;     // "0.1.0"
  std::string_view commit;      // git describe of the source tree at build time, or "unknown"
  std::string_view compiler;    // e.g. "GNU 12.2.0"
  std::string_view build_type;  // CMAKE_BUILD_TYPE: "RelWithDebInfo", "Debug", ...
  std::string_view providers;   // providers built in, e.g. "soft shm verbs"
  std::string_view isal;        // the ISA-L version it was built against
};
CONVEYOR_API const build_facts& build_info() noexcept;
}  // namespace conveyor
