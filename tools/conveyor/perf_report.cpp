// Statistics, table and JSON of `conveyor perf`.
#include "perf_report.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace conveyor::tool {

latency_stats latency_stats::from_ns(std::vector<std::uint32_t>& ns) {
  latency_stats s;
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ns.size()))) - 1;
    return static_cast<double>(ns[std::min(i, ns.size() - 1)]) / 1000.0;
  };
  s.min = static_cast<double>(ns.front()) / 1000.0;
  s.max = static_cast<double>(ns.back()) / 1000.0;
  s.mean = std::accumulate(ns.begin(), ns.end(), 0.0) / static_cast<double>(ns.size()) / 1000.0;
  s.p50 = at(0.50);
  s.p99 = at(0.99);
  s.p999 = at(0.999);
  double sq = 0;
  for (auto v : ns) {
    const double d = static_cast<double>(v) / 1000.0 - s.mean;
    sq += d * d;
  }
  s.stdev = std::sqrt(sq / static_cast<double>(ns.size()));
  return s;
}

double perf_result::cpu_s_per_gb() const {
  const double gb = static_cast<double>(size) * static_cast<double>(iterations) / 1e9;
  if (gb <= 0) return 0;
  return (user_s + sys_s + peer_user_s + peer_sys_s) / gb;
}

namespace {
std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}
}  // namespace

namespace {
// shm's data path, as the settings line names it.
std::string describe_data_path(const shm_connection_attr& s) {
  std::string bulk =
      s.data_path == "cma"
          ? "cross-memory attach (the peer's engine copies with process_vm_readv/writev)"
      : s.data_path == "staged" ? "staged (copied through the shared rings)"
                                : (s.data_path.empty() ? std::string("unknown") : s.data_path);
  if (s.direct_mapping)
    return "direct mapping (this process reads and writes the server's region itself; SEND: " +
           bulk + ")";
  return bulk;
}
}  // namespace

double perftest_latency_factor(perf_test test) {
  return test == perf_test::write || test == perf_test::send ? 0.5 : 1.0;
}

void print_settings(std::FILE* out, const perf_settings& s) {
  const auto& o = s.opts;
  if (!o.perftest_output.empty()) return;  // --output: the number alone
  const bool half = o.perftest_report && perftest_latency_factor(o.test) != 1.0;
  std::fprintf(out, "conveyor perf: %s %s\n", std::string(to_string(o.test)).c_str(),
               o.mode == perf_mode::bw ? "bandwidth"
               : o.mode == perf_mode::lat
                   ? (half ? "latency (half the round trip, as perftest reports it)"
                           : "latency (round trip)")
                   : "message rate");
  std::fprintf(out, "  provider %s, device %s (%s), progress %s%s\n", s.provider.c_str(),
               s.device.c_str(), s.transport.c_str(), s.progress.c_str(),
               o.cpu >= 0 ? (", pinned to CPU " + std::to_string(o.cpu)).c_str() : "");
  std::fprintf(out, "  connection %s -> %s\n", s.local_address.c_str(), s.peer_address.c_str());
  // What the transport tells: how the bytes move between two processes (shm),
  // MPA's parameters (soft), the MTU (verbs).
  std::string facts;
  if (s.shm) facts += ", data path " + describe_data_path(*s.shm);
  if (s.iwarp)
    facts += ", CRC " + std::string(s.iwarp->crc ? "on" : "off") + ", MSS " +
             std::to_string(s.iwarp->mss) + ", FPDU " + std::to_string(s.iwarp->max_fpdu) + " B" +
             (s.iwarp->large_fpdus ? " (large)" : "") + ", MPA rev " +
             std::to_string(s.iwarp->mpa_revision);
  if (s.verbs)
    facts += s.verbs->path_mtu != 0 ? ", path MTU " + std::to_string(s.verbs->path_mtu) + " B"
                                    : ", port MTU " + std::to_string(s.verbs->port_mtu) + " B";
  std::fprintf(out, "  IRD/ORD %u/%u%s, atomics/immediate %s\n", s.ird, s.ord, facts.c_str(),
               s.extensions ? "yes" : "no");
  std::string amount =
      o.iters != 0 ? std::to_string(o.iters) + " iterations" : format_seconds(o.duration);
  std::fprintf(
      out,
      "  QPs %u, tx depth %u, %s, signal 1 in %u, inline up to %u B, %s per size, warmup %llu%s\n",
      o.qps, o.tx_depth,
      (std::to_string(s.slots) + (s.slots == 1 ? " buffer" : " buffers") + " per QP").c_str(),
      o.batch, o.inline_size, amount.c_str(), static_cast<unsigned long long>(o.warmup),
      o.verify ? ", verifying data" : "");
}

namespace {
// perftest's layout (ib_write_bw, ib_write_lat & co.).
void print_perftest_header(std::FILE* out, const perf_settings& s) {
  if (s.opts.mode == perf_mode::lat) {
    std::fprintf(out, " %-7s %-10s %-7s %-7s %-10s %-7s %-10s %-16s %s\n", "#bytes", "#iterations",
                 "t_min[usec]", "t_max[usec]", "t_typical[usec]", "t_avg[usec]", "t_stdev[usec]",
                 "99% percentile[usec]", "99.9% percentile[usec]");
    return;
  }
  std::fprintf(out, "  BW: %s%s\n",
               s.opts.report_gbits ? "Gb/sec = 10^9 bits/s" : "MB/sec = 2^20 bytes/s, as perftest",
               s.opts.perftest_no_peak
                   ? "; -N: no peak"
                   : "; BW peak is the run's average: no per-completion peak is sampled (-N: 0)");
  std::fprintf(out, " %-10s %-13s %-18s %-20s %s\n", "#bytes", "#iterations",
               s.opts.report_gbits ? "BW peak[Gb/sec]" : "BW peak[MB/sec]",
               s.opts.report_gbits ? "BW average[Gb/sec]" : "BW average[MB/sec]", "MsgRate[Mpps]");
}

double perftest_bw(const perf_settings& s, const perf_result& r) {
  // mb_per_s is 10^6 bytes/s; perftest's MB/sec is 2^20 bytes/s, its Gb/sec 10^9 bits/s.
  return s.opts.report_gbits ? r.mb_per_s * 8e-3 : r.mb_per_s * 1e6 / 1048576.0;
}

void print_perftest_row(std::FILE* out, const perf_settings& s, const perf_result& r) {
  const auto& o = s.opts;
  const double f = perftest_latency_factor(o.test);
  if (!o.perftest_output.empty()) {
    if (o.perftest_output == "latency" && r.lat)
      std::fprintf(out, "%.2f\n", r.lat->p50 * f);
    else if (o.perftest_output == "bandwidth" && !r.lat)
      std::fprintf(out, "%.2f\n", perftest_bw(s, r));
    std::fflush(out);
    return;
  }
  if (o.mode == perf_mode::lat && r.lat) {
    const auto& l = *r.lat;
    std::fprintf(out, " %-7llu %-10llu %-11.2f %-11.2f %-15.2f %-11.2f %-13.2f %-20.2f %.2f\n",
                 static_cast<unsigned long long>(r.size),
                 static_cast<unsigned long long>(r.iterations), l.min * f, l.max * f, l.p50 * f,
                 l.mean * f, l.stdev * f, l.p99 * f, l.p999 * f);
  } else {
    const double bw = perftest_bw(s, r);
    std::fprintf(
        out, " %-10llu %-13llu %-18.2f %-20.2f %.6f\n", static_cast<unsigned long long>(r.size),
        static_cast<unsigned long long>(r.iterations), o.perftest_no_peak ? 0.0 : bw, bw, r.mops);
  }
  std::fflush(out);
}
}  // namespace

void print_table_header(std::FILE* out, const perf_settings& s) {
  if (!s.opts.perftest_output.empty()) return;
  if (s.opts.perftest_report) {
    print_perftest_header(out, s);
    return;
  }
  if (s.opts.mode == perf_mode::lat) {
    std::fprintf(out, "%12s %10s %10s %10s %10s %10s %10s %10s\n", "bytes", "iters", "min[us]",
                 "p50[us]", "p99[us]", "p999[us]", "max[us]", "mean[us]");
  } else {
    std::fprintf(out, "  units: %s, rate[Mops/s] = 10^6 operations/s\n",
                 s.opts.report_gbits ? "BW[Gb/s] = 10^9 bits/s"
                                     : "BW[MB/s] = 10^6 bytes/s (--report_gbits for Gb/s)");
    std::fprintf(out, "%12s %10s %12s %12s %10s %14s\n", "bytes", "ops",
                 s.opts.report_gbits ? "BW[Gb/s]" : "BW[MB/s]", "rate[Mops/s]", "secs",
                 "CPU[s/GB]");
  }
}

void print_table_row(std::FILE* out, const perf_settings& s, const perf_result& r) {
  if (s.opts.perftest_report || !s.opts.perftest_output.empty()) {
    print_perftest_row(out, s, r);
    return;
  }
  std::string mark = r.verified ? (r.verify_errors == 0 ? "  verified" : "  VERIFY FAILED") : "";
  if (s.opts.mode == perf_mode::lat && r.lat) {
    const auto& l = *r.lat;
    std::fprintf(out, "%12llu %10llu %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f%s\n",
                 static_cast<unsigned long long>(r.size),
                 static_cast<unsigned long long>(r.iterations), l.min, l.p50, l.p99, l.p999, l.max,
                 l.mean, mark.c_str());
  } else {
    // MB/s with one decimal; Gb/s (8e-3 of the MB/s figure) with three.
    const bool gbits = s.opts.report_gbits;
    std::fprintf(out, "%12llu %10llu %12.*f %12.3f %10.3f %14.3f%s\n",
                 static_cast<unsigned long long>(r.size),
                 static_cast<unsigned long long>(r.iterations), gbits ? 3 : 1,
                 gbits ? r.mb_per_s * 8e-3 : r.mb_per_s, r.mops, r.seconds, r.cpu_s_per_gb(),
                 mark.c_str());
  }
  std::fflush(out);
}

nlohmann::json to_json(const perf_settings& s, const std::vector<perf_result>& results) {
  using nlohmann::json;
  const auto& o = s.opts;
  json settings = {
      {"provider", s.provider},
      {"device", s.device},
      {"transport", s.transport},
      {"local_address", s.local_address},
      {"peer_address", s.peer_address},
      {"ird", s.ird},
      {"ord", s.ord},
      {"extensions", s.extensions},
      {"progress", s.progress},
      {"iwarp", s.iwarp ? json{{"crc", s.iwarp->crc},
                               {"mss", s.iwarp->mss},
                               {"max_fpdu", s.iwarp->max_fpdu},
                               {"mpa_revision", s.iwarp->mpa_revision},
                               {"rtr", s.iwarp->rtr},
                               {"large_fpdus", s.iwarp->large_fpdus}}
                        : json(nullptr)},
      {"shm", s.shm ? json{{"data_path", s.shm->data_path},
                           {"direct_mapping", s.shm->direct_mapping},
                           {"slot_payload", s.shm->slot_payload}}
                    : json(nullptr)},
      {"verbs", s.verbs ? json{{"path_mtu", s.verbs->path_mtu}, {"port_mtu", s.verbs->port_mtu}}
                        : json(nullptr)},
      {"test", to_string(o.test)},
      {"mode", to_string(o.mode)},
      {"sizes", o.sizes},
      {"iters", o.iters},
      {"duration_s", o.duration},
      {"warmup", o.warmup},
      {"qps", o.qps},
      {"tx_depth", o.tx_depth},
      {"slots", s.slots},
      {"rx_depth", o.rx_depth},
      {"batch", o.batch},
      {"inline", o.inline_size},
      {"cpu", o.cpu},
      {"verify", o.verify},
  };
  json rows = json::array();
  for (const auto& r : results) {
    json row = {
        {"test", to_string(r.test)},
        {"mode", to_string(r.mode)},
        {"size", r.size},
        {"iterations", r.iterations},
        {"seconds", r.seconds},
        {"mb_per_s", r.mb_per_s},
        {"gbit_per_s", r.mb_per_s * 8e-3},
        {"mops", r.mops},
        {"cpu",
         {{"user_s", r.user_s},
          {"sys_s", r.sys_s},
          {"peer_user_s", r.peer_user_s},
          {"peer_sys_s", r.peer_sys_s},
          {"s_per_gb", r.cpu_s_per_gb()}}},
        {"verified", r.verified},
        {"verify_errors", r.verify_errors},
    };
    if (r.lat)
      row["lat_us"] = {{"min", r.lat->min},    {"mean", r.lat->mean}, {"p50", r.lat->p50},
                       {"p99", r.lat->p99},    {"p999", r.lat->p999}, {"max", r.lat->max},
                       {"stdev", r.lat->stdev}};
    else
      row["lat_us"] = nullptr;
    rows.push_back(std::move(row));
  }
  return {{"schema", perf_schema}, {"settings", settings}, {"results", rows}};
}

}  // namespace conveyor::tool
