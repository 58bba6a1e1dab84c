// tests/common/env.hpp — test parameters (provider x progress mode), timeouts, naming.
//
// Every integration suite is instantiated over test_providers() (default
// {"soft", "shm"}; override with e.g. CONVEYOR_TEST_PROVIDERS=soft) and both
// progress modes.
// Timeouts go through scaled() so sanitizer builds get more time
// (CONVEYOR_TEST_TIMEOUT_SCALE overrides the factor).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <conveyor/conveyor.hpp>

namespace cvt {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

inline constexpr std::size_t KiB = 1024;
inline constexpr std::size_t MiB = 1024 * 1024;

struct provider_param {
  std::string provider;
  conveyor::progress_mode progress = conveyor::progress_mode::thread;
};
void PrintTo(const provider_param& p, std::ostream* os);

// Providers under test: {"soft", "shm"} or the comma-separated CONVEYOR_TEST_PROVIDERS.
std::vector<std::string> test_providers();
// Every provider with both progress modes.
std::vector<provider_param> all_params();
// "soft_thread", "soft_manual".
std::string param_name(const testing::TestParamInfo<provider_param>& info);

std::string_view progress_name(conveyor::progress_mode m);
bool parse_progress(std::string_view s, conveyor::progress_mode& out);

// 1 normally, more under sanitizers (or CONVEYOR_TEST_TIMEOUT_SCALE).
double timeout_scale();
milliseconds scaled(milliseconds base);

// A device name that opens a separate instance where the provider supports
// labels ("soft:<role>-<pid>-<n>"), else the provider name.
std::string device_name(const std::string& provider, const std::string& role);
conveyor::device_options make_options(conveyor::progress_mode mode, bool request_crc = true,
                                      std::uint32_t max_sge_rd = 0);

// Both ends are Conveyor's own providers: RFC 7306 extensions must be negotiated.
bool conveyor_peer(const std::string& provider);

// Names of enum values (so gtest failure messages show "rem_access_err", not 9).
std::string name(conveyor::wc_status s);
std::string name(conveyor::wc_opcode o);
std::string name(conveyor::errc e);
std::string name(conveyor::qp_state s);

std::vector<std::byte> as_bytes(std::string_view s);

}  // namespace cvt

// Status comparisons that print names.
#define CVT_EXPECT_WC_STATUS(wc, expected) \
  EXPECT_EQ(::cvt::name((wc).status), ::cvt::name(expected)) << ::cvt::describe(wc)
#define CVT_ASSERT_WC_STATUS(wc, expected) \
  ASSERT_EQ(::cvt::name((wc).status), ::cvt::name(expected)) << ::cvt::describe(wc)
#define CVT_EXPECT_POST_OK(expr) EXPECT_EQ(::cvt::name(expr), ::cvt::name(::conveyor::errc::ok))
#define CVT_ASSERT_POST_OK(expr) ASSERT_EQ(::cvt::name(expr), ::cvt::name(::conveyor::errc::ok))
// A result<T> that must hold a value; prints the error's to_string().
#define CVT_ASSERT_OK(res) ASSERT_TRUE((res).has_value()) << (res).error().to_string()
// A result<T> that must hold this error code.
#define CVT_EXPECT_ERRC(res, want_code)                                                \
  do {                                                                                 \
    const auto& cvt_res_ = (res);                                                      \
    if (cvt_res_.has_value()) {                                                        \
      ADD_FAILURE() << "expected error " << ::cvt::name(want_code) << ", got success"; \
    } else {                                                                           \
      EXPECT_EQ(::cvt::name(cvt_res_.error().code), ::cvt::name(want_code))            \
          << cvt_res_.error().to_string();                                             \
    }                                                                                  \
  } while (0)
