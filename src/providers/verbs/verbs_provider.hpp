// The verbs provider's entry points: real RDMA devices through rdma-core
// (libibverbs + librdmacm). Built as the real provider when the rdma-core
// development files were found at configure time (CONVEYOR_HAVE_VERBS), else as
// an entry that lists one unavailable "verbs" device and says why.
#pragma once

#include "core/impl.hpp"

#include <string_view>
#include <vector>

namespace conveyor::verbs {

std::vector<device_info> list_devices();
result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts);

}  // namespace conveyor::verbs
