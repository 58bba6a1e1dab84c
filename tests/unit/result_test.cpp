// result<T>::value() on an error: the exception carries Conveyor's error text.
#include <gtest/gtest.h>
#include <conveyor/conveyor.hpp>

#include <exception>
#include <string>

namespace cvy = conveyor;

namespace {

cvy::result<int> failing() {
  return cvy::make_error(cvy::errc::not_found, "open device \"nope\": no such device");
}

}  // namespace

TEST(result, value_on_error_throws_with_the_error_text_in_what) {
  try {
    (void)failing().value();
    FAIL() << "value() did not throw";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("open device \"nope\": no such device"), std::string::npos) << what;
    EXPECT_NE(what.find("(not found)"), std::string::npos) << what;
  }
}

TEST(result, value_on_error_is_still_bad_expected_access_with_the_error) {
  auto r = failing();
  try {
    (void)r.value();
    FAIL() << "value() did not throw";
  } catch (const std::bad_expected_access<cvy::error>& e) {
    EXPECT_EQ(e.error().code, cvy::errc::not_found);
    EXPECT_EQ(std::string(e.what()), e.error().to_string());
  }
  try {
    (void)std::move(r).value();
    FAIL() << "value() && did not throw";
  } catch (const std::bad_expected_access<void>& e) {
    EXPECT_NE(std::string(e.what()).find("no such device"), std::string::npos);
  }
}

TEST(result, void_result_value_throws_with_the_text) {
  cvy::result<void> r = cvy::make_error(cvy::errc::timed_out, "accept: nobody came");
  try {
    r.value();
    FAIL() << "value() did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("accept: nobody came"), std::string::npos) << e.what();
  }
}
