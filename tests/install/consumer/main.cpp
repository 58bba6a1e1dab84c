// Uses an installed Conveyor: lists the devices, opens "soft", prints its
// attributes; the library it runs with must be the version its headers name.
#include <conveyor/conveyor.hpp>

#include <cstdio>
#include <string>

int main() {
  const auto& built = conveyor::build_info();
  std::printf("conveyor %s (library %.*s, commit %.*s, providers %.*s)\n", conveyor::version_string,
              static_cast<int>(built.version.size()), built.version.data(),
              static_cast<int>(built.commit.size()), built.commit.data(),
              static_cast<int>(built.providers.size()), built.providers.data());
  if (built.version != conveyor::version_string) return 1;
  for (const auto& d : conveyor::device::list())
    std::printf("device %s (provider %s)%s%s\n", d.name.c_str(), d.provider.c_str(),
                d.available ? "" : ": unavailable, ", d.available ? "" : d.reason.c_str());
  auto dev = conveyor::device::open("soft");
  if (!dev) {
    std::fprintf(stderr, "open soft: %s\n", dev.error().to_string().c_str());
    return 1;
  }
  const auto& a = dev->attr();
  const std::string transport(conveyor::to_string(a.transport_type));
  std::printf("opened %s: provider %s, transport %s\n", a.name.c_str(), a.provider.c_str(),
              transport.c_str());
  std::printf("  max_qp %u, max_cqe %u, max_qp_wr %u, max_sge %u, max_inline_data %u\n", a.max_qp,
              a.max_cqe, a.max_qp_wr, a.max_sge, a.max_inline_data);
  std::printf("  max_mr %u, max_mr_size %llu, max_msg_size %u, max_qp_rd_atom %u\n", a.max_mr,
              static_cast<unsigned long long>(a.max_mr_size), a.max_msg_size, a.max_qp_rd_atom);
  std::printf("  atomics %s, immediate_data %s, send_with_invalidate %s\n",
              a.atomics ? "yes" : "no", a.immediate_data ? "yes" : "no",
              a.send_with_invalidate ? "yes" : "no");
  return a.provider == "soft" ? 0 : 1;  // name check: device::open("soft") must be soft
}
