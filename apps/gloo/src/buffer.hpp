// buffer.hpp — Gloo's bound buffers (the older algorithms: AllreduceRing,
// AllreduceHalvingDoubling, ...): one pair, one slot, for the buffer's life.
#pragma once

#include <cstddef>
#include <memory>

#include <gloo/transport/buffer.h>

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {

class Context;
class Pair;

std::unique_ptr<::gloo::transport::Buffer> make_send_buffer(Context& ctx, Pair& pair, int slot,
                                                            void* ptr, size_t size);
std::unique_ptr<::gloo::transport::Buffer> make_recv_buffer(Context& ctx, Pair& pair, int slot,
                                                            void* ptr, size_t size);

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop
