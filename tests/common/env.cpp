#include "common/env.hpp"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>

namespace cvt {

void PrintTo(const provider_param& p, std::ostream* os) {
  *os << p.provider << '/' << progress_name(p.progress);
}

std::vector<std::string> test_providers() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("CONVEYOR_TEST_PROVIDERS"); env != nullptr && *env != '\0') {
    std::string_view s(env);
    while (!s.empty()) {
      auto comma = s.find(',');
      auto item = s.substr(0, comma);
      if (!item.empty()) out.emplace_back(item);
      if (comma == std::string_view::npos) break;
      s.remove_prefix(comma + 1);
    }
  }
  if (out.empty()) out = {"soft", "shm"};
  return out;
}

std::vector<provider_param> all_params() {
  std::vector<provider_param> out;
  for (const auto& p : test_providers()) {
    out.push_back({p, conveyor::progress_mode::thread});
    out.push_back({p, conveyor::progress_mode::manual});
  }
  return out;
}

std::string param_name(const testing::TestParamInfo<provider_param>& info) {
  std::string n = info.param.provider + "_" + std::string(progress_name(info.param.progress));
  for (auto& c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

std::string_view progress_name(conveyor::progress_mode m) {
  return m == conveyor::progress_mode::manual ? "manual" : "thread";
}

bool parse_progress(std::string_view s, conveyor::progress_mode& out) {
  if (s == "thread") {
    out = conveyor::progress_mode::thread;
    return true;
  }
  if (s == "manual") {
    out = conveyor::progress_mode::manual;
    return true;
  }
  return false;
}

double timeout_scale() {
  static const double scale = [] {
    if (const char* e = std::getenv("CONVEYOR_TEST_TIMEOUT_SCALE"); e != nullptr) {
      double v = std::strtod(e, nullptr);
      if (v > 0) return v;
    }
#if defined(__SANITIZE_THREAD__)
    return 4.0;
#elif defined(__SANITIZE_ADDRESS__)
    return 2.0;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
    return 4.0;
#elif __has_feature(address_sanitizer)
    return 2.0;
#else
    return 1.0;
#endif
#else
    return 1.0;
#endif
  }();
  return scale;
}

milliseconds scaled(milliseconds base) {
  return milliseconds(
      static_cast<std::int64_t>(static_cast<double>(base.count()) * timeout_scale()));
}

std::string device_name(const std::string& provider, const std::string& role) {
  static std::atomic<unsigned> counter{0};
  // device::open's name syntax: Conveyor's own providers open a fresh instance
  // per "<provider>:<label>"; "verbs:<x>" names an rdma-core device.
  if (conveyor_peer(provider)) {
    return provider + ":" + role + "-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter.fetch_add(1));
  }
  return provider;
}

conveyor::device_options make_options(conveyor::progress_mode mode, bool request_crc,
                                      std::uint32_t max_sge_rd) {
  conveyor::device_options o;
  o.progress = mode;
  o.software.request_crc = request_crc;
  o.software.max_sge_rd = max_sge_rd;
  return o;
}

bool conveyor_peer(const std::string& provider) {
  // Name check: Conveyor's own providers, for a promise of theirs (RFC 7306
  // between two of them; a device fact here would make the tests check
  // themselves) and their name syntax (device_name).
  return provider == "soft" || provider == "shm";
}

std::string name(conveyor::wc_status s) {
  return std::string(conveyor::to_string(s));
}
std::string name(conveyor::wc_opcode o) {
  return std::string(conveyor::to_string(o));
}
std::string name(conveyor::errc e) {
  return std::string(conveyor::to_string(e));
}
std::string name(conveyor::qp_state s) {
  return std::string(conveyor::to_string(s));
}

std::vector<std::byte> as_bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<std::byte>(s[i]);
  return out;
}

}  // namespace cvt
