// The signal thread of perf_signals.hpp.
#include "perf_signals.hpp"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace conveyor::tool {

namespace {
std::mutex action_mu;
std::function<void(int)> action;  // guarded by action_mu
std::once_flag started;
}  // namespace

void on_interrupt(std::function<void(int sig)> a) {
  std::lock_guard lk(action_mu);
  action = std::move(a);
}

void take_interrupts() {
  std::call_once(started, [] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      int sig = 0;
      while (::sigwait(&set, &sig) != 0) {
      }
      {
        std::lock_guard lk(action_mu);
        if (action) action(sig);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(128 + sig);
    }).detach();
  });
}

}  // namespace conveyor::tool
