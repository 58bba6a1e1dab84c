// torch_glue.cpp — registers conveyor-gloo with PyTorch's Gloo device registry
// under the key CONVEYOR, so GLOO_DEVICE_TRANSPORT=CONVEYOR with
// backend="gloo" uses it once this library is loaded with RTLD_GLOBAL (the
// Python module conveyor_gloo does that). Built apart from the transport so
// C++ Gloo programs do not need libtorch.
#include <torch/csrc/distributed/c10d/GlooDeviceFactory.hpp>

#include "conveyor_gloo/transport.hpp"

namespace {

// torch calls this with the interface (one name of GLOO_SOCKET_IFNAME's
// comma-separated list per device; torch splits it) or with a host name, as
// it calls Gloo TCP's CreateDevice.
std::shared_ptr<::gloo::transport::Device> make_conveyor_device(const std::string& interface,
                                                                const std::string& hostname) {
  conveyor_gloo::attr a;
  a.iface = interface;
  a.hostname = hostname;
  return conveyor_gloo::CreateDevice(a);
}

}  // namespace

namespace c10d {
C10_REGISTER_CREATOR(GlooDeviceRegistry, CONVEYOR, make_conveyor_device);
}  // namespace c10d
