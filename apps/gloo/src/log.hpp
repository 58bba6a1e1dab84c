// log.hpp — conveyor-gloo's diagnostics on stderr: CONVEYOR_GLOO_TRACE (every
// message a pair sends and receives).
#pragma once

#include <cstdio>
#include <cstdlib>

#include "wire.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

inline const bool g_trace = std::getenv("CONVEYOR_GLOO_TRACE") != nullptr;
inline void trace(const char* dir, int self, int peer, const wire::header& h) {
  if (!g_trace) return;
  std::fprintf(stderr,
               "[cvgloo %d %s %d] type %d flags %d slot %llx token %llu nbytes %llu credits %u\n",
               self, dir, peer, int(h.type), int(h.flags), (unsigned long long)h.slot,
               (unsigned long long)h.token, (unsigned long long)h.nbytes, h.credits);
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
