#include "providers/verbs/verbs_events.hpp"

#include "providers/verbs/rdma_core_loader.hpp"

namespace conveyor::verbs {

async_translation translate_async_event(const async_event_fields& f) {
  const std::string name = rdma_core().ibv_event_type_str(f.type);
  const std::string dev = "device " + std::string(f.ibdev);
  const std::string dev_port = dev + " port " + std::to_string(f.device_port);
  async_translation t;
  auto& e = t.event;
  switch (f.type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
      e.type = device_event_type::qp_error;
      e.port = f.device_port;
      e.qp_num = f.qp_num;
      e.description =
          f.qp_where.empty()
              ? dev_port + " QP " + std::to_string(f.qp_num) + ": async event " + name
              : std::string(f.qp_where) + ": async event " + name + " (QP moved to ERROR)";
      t.level = detail::log_level::warn;
      t.effect = f.qp_where.empty() ? async_effect::none : async_effect::fail_qp;
      break;
    case IBV_EVENT_CQ_ERR:
      e.type = device_event_type::cq_error;
      e.port = f.device_port;
      e.description =
          dev_port + ": async event " + name + " (CQ overflow; polls report cq_overflow)";
      t.level = detail::log_level::warn;
      t.effect = async_effect::fail_cq;
      break;
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_GID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
      e.type = f.type == IBV_EVENT_PORT_ERR      ? device_event_type::port_down
               : f.type == IBV_EVENT_PORT_ACTIVE ? device_event_type::port_active
                                                 : device_event_type::other;
      e.port = f.event_port;
      e.description = dev + " port " + std::to_string(f.event_port) + ": async event " + name;
      t.level = f.type == IBV_EVENT_PORT_ERR ? detail::log_level::warn : detail::log_level::info;
      t.effect = f.type == IBV_EVENT_PORT_ERR ? async_effect::port_down : async_effect::none;
      break;
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      // The device disarmed the limit; the provider recorded that already.
      e.type = device_event_type::srq_limit_reached;
      e.srq_num = f.srq_num;
      e.description =
          dev + " SRQ " + std::to_string(f.srq_num) + ": async event " + name + " (" +
          (f.srq_limit != 0 ? "limit " + std::to_string(f.srq_limit) + " reached; " : "") +
          "the limit is disarmed)";
      t.level = detail::log_level::info;
      break;
    case IBV_EVENT_SRQ_ERR:
      e.type = device_event_type::srq_error;
      e.srq_num = f.srq_num;
      e.description = dev + " SRQ " + std::to_string(f.srq_num) + ": async event " + name +
                      " (the device moves the QPs attached to it to ERROR)";
      t.level = detail::log_level::warn;
      break;
    case IBV_EVENT_DEVICE_FATAL:
      e.type = device_event_type::device_fatal;
      e.description = dev + ": async event " + name + " (every QP moved to ERROR)";
      t.level = detail::log_level::error;
      t.effect = async_effect::device_fatal;
      break;
    default:
      e.type = device_event_type::other;
      e.qp_num = f.qp_num;
      e.description = dev + ": async event " + name;
      t.level = detail::log_level::debug;
      break;
  }
  return t;
}

device_event qp_failed_event(std::string_view qp_where, std::uint8_t port, std::uint32_t qp_num,
                             std::string_view cause, bool already_in_error) {
  return device_event{
      .type = device_event_type::qp_error,
      .port = port,
      .qp_num = qp_num,
      .description =
          std::string(qp_where) + ": " + std::string(cause) +
          (already_in_error ? " (the QP was already in ERROR: its requests complete with errors)"
                            : " (QP moved to ERROR; outstanding requests flush)")};
}

device_event device_removed_event(std::string_view ibdev) {
  return device_event{
      .type = device_event_type::device_fatal,
      .port = 0,
      .qp_num = 0,
      .description = "device " + std::string(ibdev) +
                     ": removed (every QP moved to ERROR; the kernel completes the removal "
                     "once every object of the device is closed)"};
}

bool deliver_event(const std::function<void(const device_event&)>& cb,
                   const device_event& e) noexcept {
  if (!cb) return true;
  try {
    cb(e);
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace conveyor::verbs
