// tests/common/netns.hpp — two network namespaces joined by a veth pair.
//
// Namespace A holds 10.201.0.1/24, namespace B 10.201.0.2/24, on a veth pair
// with MTU 1500 (so TCP's MSS is at most 1460). Names include the pid. The
// destructor deletes both namespaces (and with them the veth pair), also when
// the test failed half-way.
#pragma once

#include <memory>
#include <string>

namespace cvt {

class netns_pair {
 public:
  static constexpr const char* addr_a = "10.201.0.1";
  static constexpr const char* addr_b = "10.201.0.2";

  // A ready pair, or null with `why` set; `environmental` is true when the
  // machine cannot do this at all (not root, no `ip`, namespaces not permitted),
  // so the caller should skip rather than fail.
  static std::unique_ptr<netns_pair> create(std::string& why, bool& environmental);
  ~netns_pair();
  netns_pair(const netns_pair&) = delete;
  netns_pair& operator=(const netns_pair&) = delete;

  const std::string& a() const noexcept { return a_; }
  const std::string& b() const noexcept { return b_; }

 private:
  netns_pair() = default;
  std::string ip_;
  std::string a_, b_;
  bool a_made_ = false, b_made_ = false;
};

}  // namespace cvt
