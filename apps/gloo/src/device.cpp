// device.cpp — opening the providers a device may use (or the one
// CONVEYOR_GLOO_DEVICE forces), with the engine options conveyor-gloo runs
// them with; CreateDevice, the library's entry point.
#include "device.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <gloo/common/error.h>

#include "address.hpp"
#include "context.hpp"
#include "log.hpp"

#pragma GCC visibility push(hidden)
namespace conveyor_gloo::detail {
namespace {

// Half-open connection requests the device holds at most (each listener's
// complete ones are bounded by listen_backlog, handshake.cpp).
constexpr std::uint32_t max_half_open = 64;

std::string forced_from_env(const std::string& given) {
  if (!given.empty()) return given;
  const char* e = std::getenv("CONVEYOR_GLOO_DEVICE");
  return e ? std::string(e) : std::string();
}

}  // namespace

Device::Device(const attr& a) : forced_(forced_from_env(a.device)) {
  read_host_id(host_id_);
  std::string base = forced_.substr(0, forced_.find(':'));
  if (!forced_.empty() && base != "soft" && base != "shm" && base != "verbs")
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: CONVEYOR_GLOO_DEVICE='", forced_,
                                           "': expected soft, shm or verbs[:name]");
  forced_base_ = base;
  if (base.empty() || base == "soft" || base == "verbs") {
    // torch passes the interface (GLOO_SOCKET_IFNAME, split at commas by
    // torch itself) or a host name; C++ programs that give neither get
    // GLOO_SOCKET_IFNAME's choice too.
    std::string iface = a.iface;
    const char* env = std::getenv("GLOO_SOCKET_IFNAME");
    if (iface.empty() && a.hostname.empty() && env != nullptr) iface = env;
    ip_ = choose_ipv4(iface, a.hostname);
    ip_from_ = !iface.empty()        ? "interface " + iface
               : !a.hostname.empty() ? "host name " + a.hostname
                                     : "this host's name";
  }
  conveyor::device_options opts;
  opts.handshake_timeout_ms = 30000;
  opts.software.max_pending_handshakes = max_half_open;
  // The context's progress thread sleeps in cq.wait between bursts; a parked
  // engine thread would then resume only after its 1 ms grace period, which
  // put a millisecond on every small message.
  opts.software.engine_park = false;
  // cq.wait busy-polls this long before sleeping (CONVEYOR_GLOO_SPIN_US).
  if (const char* sp = std::getenv("CONVEYOR_GLOO_SPIN_US"))
    opts.spin_us = std::uint32_t(std::atoi(sp));
  // A waiting application thread looks for its completion this long before
  // sleeping (CONVEYOR_GLOO_WAIT_SPIN_US, default 50, at most 1 s): torch
  // all_reduce of 4 KiB over shm, 4 ranks on 2 cores, 1.56 ms -> 0.60 ms, and
  // thread wake-ups per segment 4.4 -> 0.65 at 2 ranks
  // (docs/performance/2026-12-07-gloo-progress.md).
  if (const char* ws = std::getenv("CONVEYOR_GLOO_WAIT_SPIN_US"))
    wait_spin_ = std::chrono::microseconds(std::clamp(std::atol(ws), 0L, 1000000L));
  // Meanwhile it takes completions from the context's queue itself while the
  // progress thread is not taking them, unless the host is oversubscribed by
  // the context's own ranks: then the waiters of ranks that are not running
  // hold the queue, and 4 ranks on 2 cores took 1.4 ms instead of 0.8
  // (docs/performance/2026-12-07-gloo-4k-latency.md). CONVEYOR_GLOO_WAIT_POLL=1
  // polls always, 0 never (it only looks, as before).
  if (const char* wp = std::getenv("CONVEYOR_GLOO_WAIT_POLL"); wp && *wp)
    wait_poll_ = std::string(wp) != "0";
  cpu_set_t set;
  CPU_ZERO(&set);
  cpus_ = ::sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
  // The contexts' progress threads drive the engine themselves (manual
  // progress): one thread hand-off less per message each side (4 KiB
  // all_reduce over soft, 2 ranks: 1.5 ms -> 0.27 ms on the 2-core build
  // machine). CONVEYOR_GLOO_PROGRESS=thread keeps the device's engine thread.
  const char* pm = std::getenv("CONVEYOR_GLOO_PROGRESS");
  opts.progress = pm && std::string(pm) == "thread" ? conveyor::progress_mode::thread
                                                    : conveyor::progress_mode::manual;
  // soft: MPA CRC32c on top of TCP's checksum, as Gloo's TCP transport has
  // none; CONVEYOR_GLOO_CRC=1 asks for it.
  const char* crc = std::getenv("CONVEYOR_GLOO_CRC");
  opts.software.request_crc = crc != nullptr && std::string(crc) == "1";
  auto open = [&](const std::string& kind, const std::string& name, bool required) {
    auto d = conveyor::device::open(name, opts);
    if (!d) {
      if (required)
        GLOO_THROW_IO_EXCEPTION("conveyor-gloo: opening ", name, ": ", d.error().to_string());
      return;
    }
    auto pd = d->alloc_pd();
    if (!pd) {
      if (required) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: ", name, ": ", pd.error().to_string());
      return;
    }
    providers_.push_back({kind, std::move(*d), std::move(*pd)});
  };
  if (base.empty() || base == "soft") open("soft", "soft", true);
  if (base.empty() || base == "shm") open("shm", "shm", !base.empty());
  // "verbs" or "verbs:<device>", as device::open takes it (the first version
  // passed the bare device name, which no provider answers to).
  if (base == "verbs") open("verbs", forced_, true);
  std::ostringstream o;
  o << "conveyor-gloo(";
  for (std::size_t i = 0; i < providers_.size(); ++i) o << (i ? "," : "") << providers_[i].kind;
  o << (forced_.empty() ? "" : "; forced " + forced_) << ")";
  str_ = o.str();
}

// The device does not know its rank: the line comes when torch (or a C++
// program) makes the rank's context, right after the device.
std::shared_ptr<::gloo::transport::Context> Device::createContext(int rank, int size) {
  if (log_enabled(log_level::info)) {
    std::string devs;
    for (auto& p : providers_) devs += (devs.empty() ? "" : ",") + std::string(p.dev.name());
    log_line(log_level::info, "rank " + std::to_string(rank) + "/" + std::to_string(size) +
                                  ": transport conveyor, provider " +
                                  (forced_.empty() ? "auto (per pair: shm on one host, else soft)"
                                                   : forced_ + " (CONVEYOR_GLOO_DEVICE)") +
                                  ", devices " + devs + ", address " +
                                  (ip_.empty() ? "none (shm only)" : ip_ + " (" + ip_from_ + ")"));
  }
  return std::make_shared<Context>(shared_from_this(), rank, size);
}

}  // namespace conveyor_gloo::detail
#pragma GCC visibility pop

namespace conveyor_gloo {

std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& a) {
  return std::make_shared<detail::Device>(a);
}

}  // namespace conveyor_gloo
