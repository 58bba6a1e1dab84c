// unbound_buffer.hpp — Gloo's unbound buffer (what torch and the newer
// collectives use): send/recv by rank and slot, completions counted per buffer.
#pragma once

#include <cstddef>
#include <memory>

#include <gloo/transport/unbound_buffer.h>

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

class Context;

std::unique_ptr<::gloo::transport::UnboundBuffer> make_unbound_buffer(std::shared_ptr<Context> ctx,
                                                                      void* ptr, size_t size);

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
