// The checks a receiver applies to shm's shared layout (segment.hpp).
#include "providers/shm/wire/segment.hpp"

#include <conveyor/cm.hpp>

namespace conveyor::shm {

bool handshake_valid(const hs_msg& m) noexcept {
  return m.magic == hs_magic && m.version == seg_version && m.pd_len <= max_private_data;
}

bool segment_header_valid(const seg_header& h) noexcept {
  return h.magic == seg_magic && h.version == seg_version && h.slots == ring_slots &&
         h.slot_bytes == slot_size;
}

}  // namespace conveyor::shm
