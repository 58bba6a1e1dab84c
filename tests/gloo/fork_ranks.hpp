// fork_ranks.hpp — the gloo test programs' ranks: one process each, forked
// from the test, sharing a fresh temporary folder for Gloo's FileStore.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace conveyor_gloo_test {

// A new folder under /tmp named `prefix`-XXXXXX (empty: it could not be made).
inline std::string make_rank_dir(const char* prefix) {
  std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
  return ::mkdtemp(tmpl.data()) ? tmpl : std::string();
}

// Forks `ranks` processes; process r runs body(r) and exits with what it
// returns (an exception is printed as the rank's failure: exit 1). The parent
// gets the pids, in rank order.
inline std::vector<pid_t> fork_ranks(int ranks, const std::function<int(int)>& body) {
  std::vector<pid_t> kids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t p = ::fork();
    if (p == 0) {
      int rc = 1;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: FAILED exception: %s\n", r, e.what());
      }
      std::fflush(stderr);
      ::_exit(rc);
    }
    kids.push_back(p);
  }
  return kids;
}

}  // namespace conveyor_gloo_test
