// Shared by the executor and AOF tests: a real store on the soft device, an
// executor over it, and a helper that runs one command and returns the reply.
#pragma once

#include <gtest/gtest.h>
#include <conveyor/conveyor.hpp>

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aof.hpp"
#include "commands.hpp"
#include "store.hpp"

namespace kvtest {

struct kv_env {
  conveyor::device dev = conveyor::device::open("soft").value();
  conveyor::protection_domain pd = dev.alloc_pd().value();

  std::unique_ptr<conveyor::kv::store> make_store(std::size_t data_bytes = 8u << 20) {
    conveyor::kv::store_options o;
    o.index_buckets = 4096;
    o.data_bytes = data_bytes;
    o.max_value = data_bytes / 4;
    auto s = conveyor::kv::store::create(pd, o);
    EXPECT_TRUE(s.has_value());
    return std::move(*s);
  }
};

inline std::string run(conveyor::kv::executor& ex, conveyor::kv::session& s,
                       std::initializer_list<std::string_view> argv) {
  std::string out;
  std::vector<std::string_view> a(argv);
  ex.execute(s, a, out);
  return out;
}

}  // namespace kvtest
