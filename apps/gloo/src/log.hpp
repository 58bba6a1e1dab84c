// log.hpp — conveyor-gloo's diagnostics on stderr, one line each.
//
// CONVEYOR_GLOO_DEBUG=INFO (as NCCL_DEBUG=INFO): one line per rank when its
// context is created (transport, provider, devices, the address advertised)
// and one per pair connected (provider, addresses, negotiated parameters).
// Errors (a pair that cannot connect) and warnings (refused connections) are
// printed whatever the level. CONVEYOR_GLOO_DEBUG=TRACE, or
// CONVEYOR_GLOO_TRACE, adds every message a pair sends and receives.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "wire.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

enum class log_level : int { error = 0, warn = 1, info = 2, trace = 3 };

// CONVEYOR_GLOO_DEBUG, read once: WARN (default), INFO or TRACE, any case; an
// unknown value is reported once and taken as WARN.
log_level debug_level();
inline bool log_enabled(log_level l) {
  return int(l) <= int(debug_level());
}
// "conveyor-gloo <level> <host>:<pid>: <msg>" when `l` is enabled.
void log_line(log_level l, const std::string& msg);

inline const bool g_trace =
    std::getenv("CONVEYOR_GLOO_TRACE") != nullptr || debug_level() == log_level::trace;
inline void trace(const char* dir, int self, int peer, const wire::header& h) {
  if (!g_trace) return;
  std::fprintf(stderr,
               "[cvgloo %d %s %d] type %d flags %d slot %llx token %llu nbytes %llu credits %u\n",
               self, dir, peer, int(h.type), int(h.flags), (unsigned long long)h.slot,
               (unsigned long long)h.token, (unsigned long long)h.nbytes, h.credits);
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
