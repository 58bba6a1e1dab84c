// Capabilities the suites branch on, each named once, so a test asks what a
// device or a connection can do instead of which provider it is (STYLE.md:
// "Tests ... skip by capability with a stated reason").
#pragma once

#include <string>

#include <conveyor/conveyor.hpp>

namespace cvt {

// The device's connections run MPA (RFC 5044/6581) in Conveyor itself, so raw
// TCP peers can script the handshake and the connection reports its MPA
// facts (qp_connection_attr::iwarp: revision, CRC, MSS, RTR):
// device_attr::runs_mpa. connection_test checks it against qp.connection().
inline bool runs_mpa(const conveyor::device_attr& a) {
  return a.runs_mpa;
}

// The connection negotiated MPA in Conveyor (its iwarp part is there).
inline bool has_mpa(const conveyor::qp_connection_attr& c) {
  return c.iwarp.has_value();
}

// CRC32c on the wire that the device negotiates and reports (device_options::
// request_crc is honoured and qp.connection()->iwarp->crc says what was chosen).
inline bool has_wire_crc(const conveyor::device_attr& a) {
  return runs_mpa(a);
}

// The peers talk over a network (TCP/IP or an RDMA fabric), with "host:port"
// addresses and a TCP or RDMA path between network namespaces; shared memory
// has none.
inline bool has_wire(const conveyor::device_attr& a) {
  return a.transport_type != conveyor::transport::shm;
}

// A signaled WRITE or SEND completes only once the peer has placed it, so a
// remote refusal completes that very request with an error status. True on
// IB/RoCE (acknowledgements), soft (it confirms placement) and shm; false on
// kernel iWARP (siw completes once sent and reports a Terminate by flushing).
inline bool completion_means_placed(const conveyor::device_attr& a) {
  return a.transport_type != conveyor::transport::iwarp || runs_mpa(a);
}

// The attributes of a fresh device of `provider` (opened and closed once per
// provider and process; empty attributes if it cannot be opened).
const conveyor::device_attr& device_attr_of(const std::string& provider);

}  // namespace cvt
