// The verbs provider when the library was built without rdma-core: one
// unavailable device that says why, and open() failing with that reason.
#include "providers/verbs/verbs_provider.hpp"

namespace conveyor::verbs {

namespace {
constexpr std::string_view reason =
    "built without rdma-core (libibverbs/librdmacm development files were not found at "
    "configure time; install libibverbs-dev and librdmacm-dev and rebuild)";
}

std::vector<device_info> list_devices() {
  return {device_info{"verbs", "verbs", transport::infiniband, false, std::string(reason)}};
}

result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options&) {
  return make_error(errc::unsupported, "open " + std::string(name) + ": " + std::string(reason));
}

}  // namespace conveyor::verbs
