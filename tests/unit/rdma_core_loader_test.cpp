// The verbs provider's run-time loading of rdma-core
// (providers/verbs/rdma_core_loader.hpp): every function resolves to the one a
// link against the same headers binds (the right symbol version), and a
// missing library or symbol is a sentence saying what to install, not a crash.
// This executable links libibverbs and librdmacm itself, to have the linker's
// answer to compare with. Built only when rdma-core's headers are present.
#include "providers/verbs/rdma_core_loader.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace cvy = conveyor;
using cvy::verbs::load_rdma_core;
using cvy::verbs::load_rdma_core_from;
using cvy::verbs::rdma_core_api;

TEST(rdma_core_loader, every_function_is_the_one_a_link_binds) {
  std::string why;
  const rdma_core_api* api = load_rdma_core(&why);
  ASSERT_NE(api, nullptr) << why;
  // A PIE takes a function's address from the GOT: the definition the
  // dynamic linker bound, at the version the headers asked for.
#define CONVEYOR_EXPECT_BOUND(function, version)                                      \
  EXPECT_EQ(reinterpret_cast<void*>(api->function),                                   \
            reinterpret_cast<void*>(static_cast<decltype(&::function)>(&::function))) \
      << #function "@" version " is not the function a link binds";
  CONVEYOR_LIBIBVERBS_FUNCTIONS(CONVEYOR_EXPECT_BOUND)
  CONVEYOR_LIBRDMACM_FUNCTIONS(CONVEYOR_EXPECT_BOUND)
#undef CONVEYOR_EXPECT_BOUND
}

TEST(rdma_core_loader, loads_once_for_every_thread) {
  std::vector<const rdma_core_api*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (auto& s : seen) threads.emplace_back([&s] { s = load_rdma_core(); });
  for (auto& t : threads) t.join();
  for (const auto* s : seen) EXPECT_EQ(s, load_rdma_core());
  EXPECT_EQ(&cvy::verbs::rdma_core(), load_rdma_core());
}

TEST(rdma_core_loader, a_missing_libibverbs_says_what_to_install) {
  rdma_core_api api;
  const std::string why =
      load_rdma_core_from("libconveyor-test-no-such-ibverbs.so.1", "librdmacm.so.1", api);
  EXPECT_TRUE(
      why.contains("rdma-core (libconveyor-test-no-such-ibverbs.so.1) is not installed: "
                   "apt install ibverbs-providers librdmacm1"))
      << why;
  EXPECT_TRUE(why.contains("cannot open shared object file")) << why;  // dlerror's own words
  EXPECT_EQ(api.ibv_open_device, nullptr);
}

TEST(rdma_core_loader, a_missing_librdmacm_says_what_to_install_and_leaves_nothing_resolved) {
  rdma_core_api api;
  const std::string why =
      load_rdma_core_from("libibverbs.so.1", "libconveyor-test-no-such-rdmacm.so.1", api);
  EXPECT_TRUE(
      why.contains("rdma-core (libconveyor-test-no-such-rdmacm.so.1) is not installed: "
                   "apt install ibverbs-providers librdmacm1"))
      << why;
  EXPECT_EQ(api.ibv_open_device, nullptr);
  EXPECT_EQ(api.rdma_create_id, nullptr);
}

TEST(rdma_core_loader, a_library_without_the_functions_names_the_first_missing_one) {
  rdma_core_api api;
  const std::string why = load_rdma_core_from("libc.so.6", "libc.so.6", api);
  EXPECT_TRUE(why.contains("has no ibv_get_device_list@IBVERBS_1.1")) << why;
  EXPECT_TRUE(why.contains("upgrade rdma-core")) << why;
  EXPECT_EQ(api.ibv_get_device_list, nullptr);
}
