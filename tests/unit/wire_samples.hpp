// Sample control messages the wire codec tests share (wire_header_test.cpp
// parses them inside FPDUs, wire_rdmap_test.cpp round-trips their bodies).
#pragma once

#include "byte_helpers.hpp"
#include "providers/soft/wire/wire.hpp"

namespace conveyor::test {

// A Terminate reporting an invalid STag in a tagged WRITE, with its DDP header.
inline conveyor::wire::terminate_msg sample_terminate() {
  using namespace conveyor::wire;
  terminate_msg t;
  t.layer = term_layer::ddp;
  t.etype = term::ddp_tagged;
  t.ecode = term::ddp_t_inv_stag;
  const auto offending = encode_tagged(rdmap_op::write, true, 0x42, 0x10, pattern(6), false);
  t.ddp_header.assign(offending.begin() + 2, offending.begin() + 16);
  t.ddp_segment_length = 20;
  t.has_segment_length = true;
  return t;
}

inline conveyor::wire::read_request sample_read_request() {
  return {0x11223344u, 0x0102030405060708ull, 0x1000u, 0x55667788u, 0x1112131415161718ull};
}

inline conveyor::wire::atomic_request sample_atomic() {
  using namespace conveyor::wire;
  atomic_request a;
  a.kind = atomic_kind::cmp_swap;
  a.request_id = 0x0BADF00Du;
  a.stag = 0x00ABCD01u;
  a.to = 0x00007F0000001000ull;
  a.add_swap = 0x1111111111111111ull;
  a.add_swap_mask = 0xFFFF0000FFFF0000ull;
  a.compare = 0x2222222222222222ull;
  a.compare_mask = 0x00000000FFFFFFFFull;
  return a;
}

}  // namespace conveyor::test
