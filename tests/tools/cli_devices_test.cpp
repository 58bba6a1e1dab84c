// `conveyor devices`: the documented JSON schema, and an unknown provider.
#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"

namespace {

using namespace std::chrono_literals;
using namespace cvt_cli;
using nlohmann::json;

TEST(cli, devices_json_lists_the_soft_device_with_its_capabilities) {
  const auto r = run({"devices", "--json"}, 20s);
  ASSERT_EQ(exit_code(r), 0) << r.output;
  json j;
  ASSERT_NO_THROW(j = json::parse(r.output)) << r.output;
  ASSERT_EQ(j.at("schema"), "conveyor-devices/1");
  bool soft = false;
  for (const auto& d : j.at("devices")) {
    EXPECT_TRUE(d.at("name").is_string());
    EXPECT_TRUE(d.at("provider").is_string());
    EXPECT_TRUE(d.at("transport").is_string());
    EXPECT_TRUE(d.at("available").is_boolean());
    if (!d.at("available").get<bool>()) {
      EXPECT_FALSE(d.at("reason").get<std::string>().empty())
          << "an unavailable device must say why";
      continue;
    }
    const auto& a = d.at("attributes");
    EXPECT_GT(a.at("max_qp").get<unsigned>(), 0u);
    EXPECT_GT(a.at("max_qp_rd_atom").get<unsigned>(), 0u);
    EXPECT_TRUE(a.at("atomics").is_boolean());
    for (const char* fact : {"post_recv_checks_lkeys", "inline_checks_lkeys",
                             "deregister_stops_outstanding", "registration_pins_pages", "runs_mpa"})
      EXPECT_TRUE(a.at(fact).is_boolean()) << fact;
    EXPECT_FALSE(a.at("ports").empty());
    if (d.at("provider") == "soft") {
      soft = true;
      EXPECT_EQ(d.at("transport"), "iWARP");
      const auto& addrs = a.at("ports")[0].at("addresses");
      EXPECT_NE(std::find(addrs.begin(), addrs.end(), "127.0.0.1"), addrs.end()) << addrs.dump();
    }
  }
  EXPECT_TRUE(soft);
}

TEST(cli, devices_with_an_unknown_provider_fails) {
  const auto r = run({"devices", "--provider", "warp-drive"}, 20s);
  EXPECT_EQ(exit_code(r), 1) << r.output;
  EXPECT_NE(r.output.find("warp-drive"), std::string::npos) << r.output;
}

}  // namespace
