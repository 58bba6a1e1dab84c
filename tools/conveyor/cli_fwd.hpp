// cli_fwd.hpp — CLI11's App, declared only. Headers that merely name
// CLI::App include this instead of <CLI/CLI.hpp>: CLI11 2.1 defines global
// validator objects in its header, and every translation unit that includes
// it compiles them again (about 35 s per file under ASan+UBSan). Only the
// files that build a command line include CLI11 itself.
#pragma once

namespace CLI {
class App;
}  // namespace CLI
