// rdma-core loaded with dlopen on first use (rdma_core_loader.hpp says why).
#include "providers/verbs/rdma_core_loader.hpp"

#include "core/log.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace conveyor::verbs {

namespace {

std::string dl_error() {
  const char* e = ::dlerror();
  return e != nullptr ? std::string(e) : std::string("unknown error");
}

// Where the loader found it (the link map's name), for the log and the errors.
std::string loaded_path(void* handle, const char* soname) {
  link_map* lm = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr &&
      lm->l_name[0] != '\0')
    return lm->l_name;
  return soname;
}

template <class Fn>
bool resolve(void* handle, const char* lib, const char* name, const char* version, Fn& out,
             std::string& why) {
  void* sym = ::dlvsym(handle, name, version);
  if (sym == nullptr) {
    why = "rdma-core's " + loaded_path(handle, lib) + " has no " + name + "@" + version +
          ": it is older than the rdma-core Conveyor was built with; upgrade rdma-core (" +
          rdma_core_install_hint + ")";
    return false;
  }
  out = reinterpret_cast<Fn>(sym);
  return true;
}

void* open_library(const char* file, std::string& why) {
  void* h = ::dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr)
    why = std::string("rdma-core (") + file + ") is not installed: " + rdma_core_install_hint +
          " (" + dl_error() + ")";
  return h;
}

// The process's table, filled once (load_rdma_core).
struct process_rdma_core {
  rdma_core_api api;
  std::string why;  // empty when loaded
  process_rdma_core() : why(load_rdma_core_from(libibverbs_soname, librdmacm_soname, api)) {}
};

}  // namespace

std::string load_rdma_core_from(const char* ibverbs, const char* rdmacm, rdma_core_api& api) {
  std::string why;
  void* v = open_library(ibverbs, why);
  if (v == nullptr) return why;
  // librdmacm needs libibverbs (its own DT_NEEDED): opened second, it finds
  // the one above.
  void* cm = open_library(rdmacm, why);
  bool ok = cm != nullptr;
#define CONVEYOR_RDMA_CORE_RESOLVE(handle, lib, function, version) \
  ok = ok && resolve(handle, lib, #function, version, api.function, why);
#define CONVEYOR_RDMA_CORE_RESOLVE_IBVERBS(function, version) \
  CONVEYOR_RDMA_CORE_RESOLVE(v, ibverbs, function, version)
#define CONVEYOR_RDMA_CORE_RESOLVE_RDMACM(function, version) \
  CONVEYOR_RDMA_CORE_RESOLVE(cm, rdmacm, function, version)
  CONVEYOR_LIBIBVERBS_FUNCTIONS(CONVEYOR_RDMA_CORE_RESOLVE_IBVERBS)
  CONVEYOR_LIBRDMACM_FUNCTIONS(CONVEYOR_RDMA_CORE_RESOLVE_RDMACM)
#undef CONVEYOR_RDMA_CORE_RESOLVE_RDMACM
#undef CONVEYOR_RDMA_CORE_RESOLVE_IBVERBS
#undef CONVEYOR_RDMA_CORE_RESOLVE
  if (ok) {
    if (detail::log_enabled(detail::log_level::info))
      detail::log_line(detail::log_level::info, "rdma-core loaded: " + loaded_path(v, ibverbs) +
                                                    ", " + loaded_path(cm, rdmacm));
    return {};
  }
  api = rdma_core_api{};
  if (cm != nullptr) ::dlclose(cm);
  ::dlclose(v);
  return why;
}

const rdma_core_api* load_rdma_core(std::string* why) {
  // A function-local static: initialized once, the other threads waiting for
  // it, as std::call_once would (whose thread-local state would make
  // libconveyor.so need ld.so's __tls_get_addr).
  static const process_rdma_core loaded;
  if (loaded.why.empty()) return &loaded.api;
  if (why != nullptr) *why = loaded.why;
  return nullptr;
}

const rdma_core_api& rdma_core() noexcept {
  std::string why;
  if (const rdma_core_api* api = load_rdma_core(&why)) return *api;
  std::fprintf(stderr, "conveyor: the verbs provider was used without rdma-core: %s\n",
               why.c_str());
  std::abort();
}

int query_port(ibv_context* ctx, std::uint8_t port, ibv_port_attr* attr) {
  // verbs_get_ctx_op(ctx, query_port), spelled out: the macro is a GNU
  // statement expression, which clang's -Wpedantic refuses outside the header.
  verbs_context* vctx = verbs_get_ctx(ctx);
  if (vctx != nullptr && vctx->sz >= sizeof(*vctx) - offsetof(verbs_context, query_port) &&
      vctx->query_port != nullptr)
    return vctx->query_port(ctx, port, attr, sizeof(*attr));
  std::memset(attr, 0, sizeof(*attr));
  // (Parenthesized: ibv_query_port is also a function-like macro.)
  return (rdma_core().ibv_query_port)(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

ibv_mr* reg_mr(ibv_pd* pd, void* addr, std::size_t length, unsigned access) {
  return rdma_core().ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr),
                                      access);
}

}  // namespace conveyor::verbs
