// The providers built into this library, in the order "best available" tries them.
#include "core/impl.hpp"

namespace conveyor::soft {
std::vector<device_info> list_devices();
result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts);
}  // namespace conveyor::soft

namespace conveyor::shm {
std::vector<device_info> list_devices();
result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts);
}  // namespace conveyor::shm
namespace conveyor::verbs {
std::vector<device_info> list_devices();
result<std::shared_ptr<detail::device_impl>> open_device(std::string_view name,
                                                         const device_options& opts);
}  // namespace conveyor::verbs

namespace conveyor::detail {

std::span<const provider_entry> providers() noexcept {
  static const provider_entry table[] = {
      {"soft", &soft::list_devices, &soft::open_device},
      {"shm", &shm::list_devices, &shm::open_device},
      {"verbs", &verbs::list_devices, &verbs::open_device},
  };
  return table;
}

}  // namespace conveyor::detail
