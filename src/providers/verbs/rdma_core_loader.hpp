// rdma-core, loaded at run time. libconveyor.so does not link libibverbs or
// librdmacm, so a program that uses only soft and shm runs where rdma-core is
// not installed. The first verbs device listed or opened dlopen()s
// libibverbs.so.1 and librdmacm.so.1 (once, thread-safe) and resolves every
// exported function the provider calls into one table, rdma_core_api, each at
// the symbol version a link against the headers it was compiled with would
// have bound (dlvsym): the same ABI as linking them. The provider calls them
// through rdma_core(). The data path (ibv_post_send, ibv_post_recv,
// ibv_post_srq_recv, ibv_poll_cq, ibv_req_notify_cq) and rdma_get_local_addr /
// rdma_get_peer_addr are static inline in the headers, dispatching through the
// context's ops or reading the cm_id: they need no symbol and are called as
// usual. Two inline functions do call exported symbols, so the provider calls
// this file's versions of them instead: query_port (ibv_query_port) and
// reg_mr (ibv_reg_mr). A direct call to any other rdma-core function fails to
// link libconveyor.so (--no-undefined). The libraries stay loaded until the
// process ends. Internal to src/providers/verbs.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace conveyor::verbs {

// X(function, symbol version): the libibverbs functions the provider calls.
// The versions are those `nm -D --undefined-only` showed on libconveyor.so when
// it linked rdma-core 44 (tests/unit/rdma_core_loader_test.cpp checks each
// against what a link binds).
#define CONVEYOR_LIBIBVERBS_FUNCTIONS(X)     \
  X(ibv_get_device_list, "IBVERBS_1.1")      \
  X(ibv_free_device_list, "IBVERBS_1.1")     \
  X(ibv_get_device_name, "IBVERBS_1.1")      \
  X(ibv_open_device, "IBVERBS_1.1")          \
  X(ibv_close_device, "IBVERBS_1.1")         \
  X(ibv_query_device, "IBVERBS_1.1")         \
  X(ibv_query_port, "IBVERBS_1.1")           \
  X(ibv_query_gid, "IBVERBS_1.1")            \
  X(ibv_get_async_event, "IBVERBS_1.1")      \
  X(ibv_ack_async_event, "IBVERBS_1.1")      \
  X(ibv_event_type_str, "IBVERBS_1.1")       \
  X(ibv_port_state_str, "IBVERBS_1.1")       \
  X(ibv_alloc_pd, "IBVERBS_1.1")             \
  X(ibv_dealloc_pd, "IBVERBS_1.1")           \
  X(ibv_reg_mr_iova2, "IBVERBS_1.8")         \
  X(ibv_dereg_mr, "IBVERBS_1.1")             \
  X(ibv_create_comp_channel, "IBVERBS_1.0")  \
  X(ibv_destroy_comp_channel, "IBVERBS_1.0") \
  X(ibv_create_cq, "IBVERBS_1.1")            \
  X(ibv_destroy_cq, "IBVERBS_1.1")           \
  X(ibv_get_cq_event, "IBVERBS_1.1")         \
  X(ibv_ack_cq_events, "IBVERBS_1.1")        \
  X(ibv_create_qp, "IBVERBS_1.1")            \
  X(ibv_destroy_qp, "IBVERBS_1.1")           \
  X(ibv_modify_qp, "IBVERBS_1.1")            \
  X(ibv_query_qp, "IBVERBS_1.1")             \
  X(ibv_create_srq, "IBVERBS_1.1")           \
  X(ibv_destroy_srq, "IBVERBS_1.1")          \
  X(ibv_modify_srq, "IBVERBS_1.1")           \
  X(ibv_query_srq, "IBVERBS_1.1")

// X(function, symbol version): the librdmacm functions the provider calls.
#define CONVEYOR_LIBRDMACM_FUNCTIONS(X)       \
  X(rdma_create_event_channel, "RDMACM_1.0")  \
  X(rdma_destroy_event_channel, "RDMACM_1.0") \
  X(rdma_create_id, "RDMACM_1.0")             \
  X(rdma_destroy_id, "RDMACM_1.0")            \
  X(rdma_migrate_id, "RDMACM_1.0")            \
  X(rdma_bind_addr, "RDMACM_1.0")             \
  X(rdma_listen, "RDMACM_1.0")                \
  X(rdma_resolve_addr, "RDMACM_1.0")          \
  X(rdma_resolve_route, "RDMACM_1.0")         \
  X(rdma_connect, "RDMACM_1.0")               \
  X(rdma_accept, "RDMACM_1.0")                \
  X(rdma_reject, "RDMACM_1.0")                \
  X(rdma_establish, "RDMACM_1.2")             \
  X(rdma_disconnect, "RDMACM_1.0")            \
  X(rdma_init_qp_attr, "RDMACM_1.2")          \
  X(rdma_get_cm_event, "RDMACM_1.0")          \
  X(rdma_ack_cm_event, "RDMACM_1.0")          \
  X(rdma_event_str, "RDMACM_1.0")             \
  X(rdma_get_src_port, "RDMACM_1.0")          \
  X(rdma_get_devices, "RDMACM_1.0")           \
  X(rdma_free_devices, "RDMACM_1.0")

// One pointer per function, typed from its declaration in the headers: a call
// through the table is checked like a direct call. ibv_query_port is the
// exported compat function (struct _compat_ibv_port_attr); call query_port().
struct rdma_core_api {
#define CONVEYOR_RDMA_CORE_POINTER(function, version) decltype(&::function) function = nullptr;
  CONVEYOR_LIBIBVERBS_FUNCTIONS(CONVEYOR_RDMA_CORE_POINTER)
  CONVEYOR_LIBRDMACM_FUNCTIONS(CONVEYOR_RDMA_CORE_POINTER)
#undef CONVEYOR_RDMA_CORE_POINTER
};

// The sonames loaded, and what to install when they are missing.
inline constexpr const char* libibverbs_soname = "libibverbs.so.1";
inline constexpr const char* librdmacm_soname = "librdmacm.so.1";
inline constexpr const char* rdma_core_install_hint = "apt install ibverbs-providers librdmacm1";

// Loads rdma-core on the first call, from any thread; every call returns the
// first one's answer. nullptr when it could not be loaded; *why (when given)
// then says why and what to install, e.g. "rdma-core (libibverbs.so.1) is not
// installed: apt install ibverbs-providers librdmacm1 (<dlerror>)".
const rdma_core_api* load_rdma_core(std::string* why = nullptr);

// The loaded table. Every verbs object descends from a device that was listed
// or opened after load_rdma_core() succeeded; calling this without rdma-core
// is a bug in the provider and aborts, naming the reason.
const rdma_core_api& rdma_core() noexcept;

// ibv_query_port as <infiniband/verbs.h> inlines it: the context's query_port
// op where the provider library has one, else the exported compat function
// (which fills the older, shorter struct; the rest is zeroed).
int query_port(ibv_context* ctx, std::uint8_t port, ibv_port_attr* attr);

// ibv_reg_mr as <infiniband/verbs.h> inlines it for access flags that are not
// a compile-time constant: ibv_reg_mr_iova2 with the address as the IOVA.
ibv_mr* reg_mr(ibv_pd* pd, void* addr, std::size_t length, unsigned access);

// What load_rdma_core() does, from the given file names into `api` rather than
// the process's table (for tests: a missing library, one without the symbols).
// Returns the reason it failed, empty on success; on failure what it opened is
// closed again.
std::string load_rdma_core_from(const char* ibverbs, const char* rdmacm, rdma_core_api& api);

}  // namespace conveyor::verbs
