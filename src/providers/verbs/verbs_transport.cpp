// The verbs provider's transport policy (verbs_transport.hpp).
#include "providers/verbs/verbs_transport.hpp"

#include <algorithm>

namespace conveyor::verbs {

std::string check_transport_params(const verbs_transport_params& p) {
  if (p.retry_count > 7) return "retry_count " + std::to_string(p.retry_count) + " must be 0..7";
  if (p.rnr_retry > 7)
    return "rnr_retry " + std::to_string(p.rnr_retry) + " must be 0..7 (7: for ever)";
  if (p.min_rnr_timer && *p.min_rnr_timer > 31)
    return "min_rnr_timer " + std::to_string(*p.min_rnr_timer) + " must be 0..31";
  if (p.timeout && *p.timeout > 31)
    return "timeout " + std::to_string(*p.timeout) + " must be 0..31";
  switch (p.path_mtu) {
    case 0:
    case 256:
    case 512:
    case 1024:
    case 2048:
    case 4096:
      break;
    default:
      return "path_mtu " + std::to_string(p.path_mtu) + " must be 256, 512, 1024, 2048, 4096 or 0";
  }
  return {};
}

rc_attrs apply_transport_params(const rc_attrs& cm, const verbs_transport_params& p) {
  rc_attrs out = cm;
  out.retry_cnt = p.retry_count;
  out.rnr_retry = p.rnr_retry;
  if (p.min_rnr_timer) out.min_rnr_timer = *p.min_rnr_timer;
  if (p.timeout) out.timeout = *p.timeout;
  if (p.path_mtu != 0 && (cm.path_mtu_bytes == 0 || p.path_mtu < cm.path_mtu_bytes))
    out.path_mtu_bytes = p.path_mtu;
  return out;
}

std::optional<std::chrono::milliseconds> retry_span(std::uint8_t timeout, std::uint8_t retry_cnt) {
  if (timeout == 0) return std::nullopt;
  // 4.096 us x 2^31 x 8 fits in 64 bits of nanoseconds many times over.
  const std::uint64_t ns =
      (4096ull << std::min<std::uint8_t>(timeout, 31)) * (std::uint64_t{retry_cnt} + 1);
  return std::chrono::milliseconds((ns + 999'999) / 1'000'000);
}

std::chrono::milliseconds port_down_grace(const std::optional<std::chrono::milliseconds>& option,
                                          bool timed, std::uint8_t timeout,
                                          std::uint8_t retry_cnt) {
  if (option) return std::max(*option, std::chrono::milliseconds(0));
  if (!timed) return untimed_port_down_grace;
  const auto span = retry_span(timeout, retry_cnt);
  if (!span) return untimed_port_down_grace;
  return std::min(*span, max_port_down_grace);
}

void port_down_clock::down(std::uint8_t port, time_point now) {
  if (since_.size() <= port) since_.resize(std::size_t{port} + 1);
  if (!since_[port]) since_[port] = now;
}

std::optional<std::chrono::milliseconds> port_down_clock::up(std::uint8_t port, time_point now) {
  if (since_.size() <= port || !since_[port]) return std::nullopt;
  const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(now - *since_[port]);
  since_[port].reset();
  return d;
}

std::optional<port_down_clock::time_point> port_down_clock::down_since(std::uint8_t port) const {
  if (since_.size() <= port) return std::nullopt;
  return since_[port];
}

bool port_down_clock::expired(std::uint8_t port, std::chrono::milliseconds grace,
                              time_point now) const {
  const auto s = down_since(port);
  return s && now - *s >= grace;
}

bool port_down_clock::any_down() const noexcept {
  return std::any_of(since_.begin(), since_.end(), [](const auto& s) { return s.has_value(); });
}

}  // namespace conveyor::verbs
