// A cluster node's fence (node_fence.hpp).
#include "node_fence.hpp"

#include <algorithm>

#include "store.hpp"
#include "store_layout.hpp"

namespace conveyor::kv {

std::int64_t realtime_ms_at(std::chrono::steady_clock::time_point until) {
  using namespace std::chrono;
  if (until == steady_clock::time_point::min()) return 0;
  const auto left = duration_cast<milliseconds>(until - steady_clock::now()).count();
  return std::max<std::int64_t>(layout::now_ms() + left, 0);
}

void node_fence::lease(time_point until) {
  lease_ = until;
  apply();
}

void node_fence::begin_handover(std::string to, time_point deadline) {
  handing_over_ = true;
  cas_asked_ = false;
  to_ = std::move(to);
  deadline_ = deadline;
  apply();
}

void node_fence::end_handover() {
  handing_over_ = false;
  cas_asked_ = false;
  to_.clear();
  apply();
}

void node_fence::apply() {
  const time_point until = handing_over_ ? time_point::min() : lease_;
  exec_.set_fence(until);
  if (rdma_) rdma_->set_fence(until);
  exec_.data().set_valid_until(realtime_ms_at(until));
}

}  // namespace conveyor::kv
