// tools/conveyor/perf_signals.hpp — Ctrl-C and SIGTERM during `conveyor perf`:
// the run stops cleanly instead of dying mid-line. The signals are taken by a
// thread of their own (sigwait), which runs the action the run registered
// (print what was measured so far, remove the server's shm socket path) and
// exits with 128 + the signal number, as a shell reports a signal death.
#pragma once

#include <functional>

namespace conveyor::tool {

// Blocks SIGINT and SIGTERM in the calling thread, so in every thread it
// creates afterwards (call it before opening a device), and starts the thread
// that waits for them. Idempotent.
void take_interrupts();
// What to do on SIGINT/SIGTERM before exiting (replaces the previous action;
// an empty function: just exit). Runs on the signal thread.
void on_interrupt(std::function<void(int sig)> action);

}  // namespace conveyor::tool
