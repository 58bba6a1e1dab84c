// Numeric environment overrides: a malformed value is ignored with one warning
// that names the variable; devices opened with one still work.
#include <gtest/gtest.h>
#include <conveyor/conveyor.hpp>

#include <cstdlib>
#include <string>

#include "core/log.hpp"

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(env, well_formed_numbers_are_read) {
  ::setenv("CONVEYOR_TEST_ENV_OK", "250", 1);
  EXPECT_EQ(conveyor::detail::env_u32("CONVEYOR_TEST_ENV_OK"), 250u);
  ::setenv("CONVEYOR_TEST_ENV_OK", "", 1);
  EXPECT_EQ(conveyor::detail::env_u32("CONVEYOR_TEST_ENV_OK"), std::nullopt);
  ::unsetenv("CONVEYOR_TEST_ENV_OK");
  EXPECT_EQ(conveyor::detail::env_u32("CONVEYOR_TEST_ENV_OK"), std::nullopt);
}

TEST(env, malformed_numbers_are_ignored_with_one_warning_naming_the_variable) {
  for (const char* bad : {"12abc", "-1", "fast", "99999999999"}) {
    const std::string name =
        std::string("CONVEYOR_TEST_ENV_BAD_") + std::to_string(bad[0] == '-' ? 0 : bad[0]);
    ::setenv(name.c_str(), bad, 1);
    testing::internal::CaptureStderr();
    EXPECT_EQ(conveyor::detail::env_u32(name.c_str()), std::nullopt) << bad;
    EXPECT_EQ(conveyor::detail::env_u32(name.c_str()), std::nullopt) << bad;
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(count(err, name + "=" + bad), 1u) << err;
    ::unsetenv(name.c_str());
  }
}

TEST(env, a_device_opened_with_a_malformed_spin_override_warns_once_and_works) {
  ::setenv("CONVEYOR_ENGINE_SPIN_US", "50us", 1);
  testing::internal::CaptureStderr();
  for (const char* provider : {"soft", "shm", "soft"}) {
    auto dev = conveyor::device::open(provider);
    ASSERT_TRUE(dev) << dev.error().to_string();
    EXPECT_EQ(dev->options().software.engine_spin_us,
              conveyor::device_options{}.software.engine_spin_us);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  ::unsetenv("CONVEYOR_ENGINE_SPIN_US");
  EXPECT_EQ(count(err, "CONVEYOR_ENGINE_SPIN_US=50us"), 1u) << err;
}
