// conveyor::build_info(): the facts CMake knew when it built the library; the
// commit comes from a header regenerated on every build (cmake/build_commit.cmake).
#include "conveyor/version.hpp"

#include "conveyor_build_commit.hpp"

namespace conveyor {

const build_facts& build_info() noexcept {
  static constexpr build_facts facts{
      .version = CONVEYOR_VERSION_STRING,
      .commit = CONVEYOR_BUILD_COMMIT,
      .compiler = CONVEYOR_COMPILER,
      .build_type = CONVEYOR_BUILD_TYPE,
      .providers = CONVEYOR_PROVIDERS,
      .isal = CONVEYOR_ISAL_VERSION,
  };
  return facts;
}

}  // namespace conveyor
