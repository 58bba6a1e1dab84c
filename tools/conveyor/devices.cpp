// `conveyor devices`: every device of every provider, like ibv_devinfo and
// fi_info together.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include <conveyor/conveyor.hpp>

#include "perf.hpp"

namespace conveyor::tool {

namespace {

nlohmann::json attr_json(const device_attr& a) {
  nlohmann::json ports = nlohmann::json::array();
  for (const auto& p : a.ports)
    ports.push_back({{"port", p.num},
                     {"state", p.state},
                     {"link_layer", p.link_layer},
                     {"mtu", p.mtu},
                     {"addresses", p.addresses}});
  return {{"max_qp", a.max_qp},
          {"max_cqe", a.max_cqe},
          {"max_qp_wr", a.max_qp_wr},
          {"max_sge", a.max_sge},
          {"max_sge_rd", a.max_sge_rd},
          {"max_inline_data", a.max_inline_data},
          {"max_mr", a.max_mr},
          {"max_mr_size", a.max_mr_size},
          {"max_msg_size", a.max_msg_size},
          {"max_qp_rd_atom", a.max_qp_rd_atom},
          {"atomics", a.atomics},
          {"atomic_cap", a.atomic_cap == conveyor::atomic_scope::global ? "global"
                         : a.atomic_cap == conveyor::atomic_scope::rdma ? "rdma"
                                                                        : "none"},
          {"immediate_data", a.immediate_data},
          {"send_with_invalidate", a.send_with_invalidate},
          {"post_recv_checks_lkeys", a.post_recv_checks_lkeys},
          {"inline_checks_lkeys", a.inline_checks_lkeys},
          {"deregister_stops_outstanding", a.deregister_stops_outstanding},
          {"registration_pins_pages", a.registration_pins_pages},
          {"runs_mpa", a.runs_mpa},
          {"ports", ports}};
}

}  // namespace

int run_devices(const devices_options& o) {
  nlohmann::json out = nlohmann::json::array();
  bool any = false;
  for (const auto& info : device::list()) {
    if (!o.provider.empty() && info.provider != o.provider) continue;
    any = true;
    nlohmann::json d = {{"name", info.name},
                        {"provider", info.provider},
                        {"transport", std::string(to_string(info.transport_type))},
                        {"available", info.available}};
    std::optional<device_attr> attr;
    std::string why = info.reason;
    if (info.available) {
      device_options opts;
      opts.progress = progress_mode::manual;  // no engine thread just to look
      auto dev = device::open(info.name, opts);
      if (dev)
        attr = dev->attr();
      else
        why = dev.error().to_string();
    }
    if (!why.empty()) d["reason"] = why;
    if (attr) d["attributes"] = attr_json(*attr);
    if (o.json) {
      out.push_back(std::move(d));
      continue;
    }
    std::printf("%s\n", info.name.c_str());
    std::printf("    provider:          %s\n", info.provider.c_str());
    std::printf("    transport:         %s\n", std::string(to_string(info.transport_type)).c_str());
    std::printf("    available:         %s%s%s\n", info.available ? "yes" : "no",
                why.empty() ? "" : ": ", why.c_str());
    if (!attr) continue;
    const auto& a = *attr;
    for (const auto& p : a.ports) {
      std::printf("    port %u:            %s, link layer %s", p.num, p.state.c_str(),
                  p.link_layer.c_str());
      if (p.mtu != 0) std::printf(", MTU %u", p.mtu);
      std::printf("\n");
      for (const auto& addr : p.addresses) std::printf("        address:       %s\n", addr.c_str());
    }
    std::printf("    max_qp:            %u\n", a.max_qp);
    std::printf("    max_cqe:           %u\n", a.max_cqe);
    std::printf("    max_qp_wr:         %u\n", a.max_qp_wr);
    std::printf("    max_sge:           %u\n", a.max_sge);
    std::printf("    max_sge_rd:        %u\n", a.max_sge_rd);
    std::printf("    max_inline_data:   %u\n", a.max_inline_data);
    std::printf("    max_mr:            %u\n", a.max_mr);
    std::printf("    max_mr_size:       %llu\n", static_cast<unsigned long long>(a.max_mr_size));
    std::printf("    max_msg_size:      %u\n", a.max_msg_size);
    std::printf("    max_qp_rd_atom:    %u (IRD/ORD limit)\n", a.max_qp_rd_atom);
    std::printf("    atomics:           %s\n", a.atomic_cap == conveyor::atomic_scope::global
                                                   ? "yes, atomic against the CPU too (global)"
                                               : a.atomic_cap == conveyor::atomic_scope::rdma
                                                   ? "yes, among RDMA atomics only (rdma)"
                                               : a.atomics ? "yes"
                                                           : "no");
    std::printf("    immediate data:    %s\n", a.immediate_data ? "yes" : "no");
    std::printf("    send with inval.:  %s\n", a.send_with_invalidate ? "yes" : "no");
    // What the device does (device_attr's facts; docs/CONFIGURATION.md).
    auto yn = [](bool b) { return b ? "yes" : "no"; };
    std::printf("    checks lkeys:      post_recv %s, inline data %s\n",
                yn(a.post_recv_checks_lkeys), yn(a.inline_checks_lkeys));
    std::printf("    dereg in use:      %s\n", a.deregister_stops_outstanding
                                                   ? "stops the requests that use it"
                                                   : "the application's error");
    std::printf("    registration:      %s\n", a.registration_pins_pages
                                                   ? "pins the pages"
                                                   : "reaches memory through the mapping");
    std::printf("    runs MPA:          %s\n", yn(a.runs_mpa));
  }
  if (o.json)
    std::cout << nlohmann::json{{"schema", "conveyor-devices/1"}, {"devices", out}}.dump(2)
              << std::endl;
  if (!any && !o.provider.empty()) {
    std::fprintf(stderr, "conveyor devices: no provider named '%s' is built into this library\n",
                 o.provider.c_str());
    return 1;
  }
  return 0;
}

}  // namespace conveyor::tool
