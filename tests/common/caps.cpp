#include "common/caps.hpp"

#include <map>
#include <mutex>

#include <gtest/gtest.h>

#include "common/env.hpp"

namespace cvt {

const conveyor::device_attr& device_attr_of(const std::string& provider) {
  static std::mutex mu;
  static std::map<std::string, conveyor::device_attr> cache;
  std::lock_guard lk(mu);
  auto it = cache.find(provider);
  if (it == cache.end()) {
    conveyor::device_attr a;
    if (auto d = conveyor::device::open(device_name(provider, "caps")))
      a = d->attr();
    else
      ADD_FAILURE() << "open " << provider
                    << " to read its capabilities: " << d.error().to_string();
    a.provider = provider;
    it = cache.emplace(provider, std::move(a)).first;
  }
  return it->second;
}

}  // namespace cvt
