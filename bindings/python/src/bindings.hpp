// bindings/python/src/bindings.hpp — the Python objects shared by the
// binding translation units (module.cpp: errors, device, pd, mr; queue.cpp:
// cq, qp, work requests; srq.cpp: shared receive queues; cm.cpp: listener,
// connect). Only the public API
// (include/conveyor) is used, as any application would.
//
// Ownership: each Python object holds a C++ handle; C++ handles keep their
// parents alive, and the Python objects additionally hold references to the
// Python objects they were made from (a region holds the buffer it registered,
// a QP its CQs), so no destruction order can leave a dangling pointer.
//
// The GIL: only calls that can block or spin release it (cq.wait, connect,
// accept, the read_into/write_from helpers). An object that a GIL-free call is
// using is marked busy; closing it meanwhile raises InvalidState rather than
// pulling the handle out from under the other thread.
//
// close(): Device, ProtectionDomain, CompletionQueue, QueuePair,
// MemoryRegion, SharedReceiveQueue and Listener release their handle at once
// (each is also a context manager); a second close() does nothing, and any
// other use of a closed object raises InvalidState naming it. A parent lives
// on while a child made from it is open (C++ handles keep their parents): a
// device's engine thread ends when the device and everything made from it are
// closed or collected.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "conveyor/conveyor.hpp"

namespace conveyor::python {

namespace py = pybind11;

// Raises the Python exception class for e.code (conveyor.ConveyorError or a
// subclass) carrying code, errno and context. Needs the GIL.
[[noreturn]] void raise_error(const error& e);
[[noreturn]] void raise_error(errc code, std::string context);
// Raises for a non-ok data-path status; `what` names the call.
void check_status(status s, const char* what, std::size_t bad = SIZE_MAX);

// Seconds (float, None = forever) as a C++ duration.
std::chrono::nanoseconds to_timeout(const py::object& seconds);
// bytes-like -> bytes copy (private data, encoded regions).
std::vector<std::byte> to_bytes(const py::object& obj, const char* what);
py::bytes from_bytes(std::span<const std::byte> b);

// Counts the GIL-free calls using an object; close() refuses while any runs.
class use_guard {
 public:
  explicit use_guard(std::atomic<int>& n) : n_(n) { n_.fetch_add(1, std::memory_order_acq_rel); }
  ~use_guard() { n_.fetch_sub(1, std::memory_order_acq_rel); }
  use_guard(const use_guard&) = delete;
  use_guard& operator=(const use_guard&) = delete;

 private:
  std::atomic<int>& n_;
};

// fork(): the child gets copies of every object, and the copies share the
// parent's sockets, shared-memory rings and engine state (but no engine
// thread). Destroying a copy in the child would tear down the parent's
// connection (a disconnect on the shared socket), so objects made before the
// last fork() are inherited: the child never uses them (get() raises
// InvalidState) and never destroys their C++ handles, which stay as they are
// until the child exits or execs (its copies of the descriptors then close
// without a shutdown). fork_epoch() counts the fork()s this process came from
// (a pthread_atfork child handler, installed by init_module).
std::uint32_t fork_epoch() noexcept;
struct fork_owned {
  std::uint32_t epoch = fork_epoch();
  bool inherited() const noexcept { return epoch != fork_epoch(); }
};
// Leaves the handle to the process's end: moved into storage that is never freed.
template <class Handle>
void abandon(Handle& h) noexcept {
  (void)new Handle(std::move(h));
}
[[noreturn]] void raise_inherited(const char* what);

// Raises InvalidState: "<what>: the <noun> was closed".
[[noreturn]] void raise_closed(const char* what);

// Moves the handle out and destroys it with the GIL released (a device joins
// its engine thread, a QP disconnects: bounded, but they may wait); in a
// forked child the handle is the parent's and is abandoned instead.
template <class Handle>
void close_handle(Handle& h, bool inherited) {
  if (inherited) return abandon(h);
  Handle doomed = std::move(h);
  h = Handle{};
  py::gil_scoped_release nogil;
  doomed = Handle{};
}

struct py_device : fork_owned {
  device dev;
  device& get() {
    if (!dev) raise_closed("Device");
    return dev;
  }
  ~py_device() {
    if (inherited()) abandon(dev);
  }
};

struct py_pd : fork_owned {
  protection_domain pd;
  py::object device;  // keeps the Python device alive (the C++ one is kept anyway)
  protection_domain& get() {
    if (!pd) raise_closed("ProtectionDomain");
    return pd;
  }
  ~py_pd() {
    if (inherited()) abandon(pd);
  }
};

// A registration together with the buffer it covers. For a user buffer, view
// is the Py_buffer exported by the object (holding it pins the object and,
// for bytearray, forbids resizing); for allocate_memory, owned is true and the
// memory belongs to the region. exports counts memoryviews handed out by
// `memory`: the region cannot be closed while one exists.
struct py_mr : fork_owned {
  memory_region mr;
  py::object pd;
  py::object obj;  // the registered object (None for allocate_memory)
  Py_buffer view{};
  bool has_view = false;
  bool owned = false;
  int exports = 0;
  ~py_mr();
  void close();  // deregisters and releases the buffer; raises if views are exported
  const memory_region& get() const;
};

struct py_cq : fork_owned {
  completion_queue cq;
  py::object device;
  // Completions that the blocking helpers (read_into, write_from) took from
  // the CQ on behalf of others; poll/wait return them first. GIL-protected.
  std::deque<work_completion> stash;
  std::atomic<int> users{0};  // GIL-free waits under way (wait, the helpers)
  // Raises if closed or inherited through fork().
  completion_queue& get();
  ~py_cq() {
    if (inherited()) abandon(cq);
  }
};

// A shared receive queue; its QPs hold the Python object too.
struct py_srq : fork_owned {
  shared_receive_queue srq;
  py::object pd;
  ~py_srq() {
    if (inherited()) abandon(srq);
  }
};

// A Python-side receive work request: the wr_id and its own SGE list.
struct py_recv_wr {
  std::uint64_t wr_id = 0;
  std::vector<sge> sgl;
};

struct py_qp : fork_owned {
  queue_pair qp;
  py::object pd, send_cq, recv_cq;
  py::object srq;             // the SharedReceiveQueue it draws from, or None
  std::atomic<int> users{0};  // GIL-free calls under way (connect, accept, helpers)
  std::uint64_t next_helper_id = 0;
  queue_pair& get();
  // check_status for a post on this QP; one refused because the QP is not
  // connected yet says to connect first.
  void check_post(status s, const char* what, std::size_t bad = SIZE_MAX);
  ~py_qp() {
    if (inherited()) abandon(qp);
  }
};

// An SGE argument: an Sge, a MemoryRegion (the whole region), or
// (MemoryRegion, offset, length).
sge to_sge(const py::handle& h);

std::unique_ptr<py_qp> create_qp(py::object pd, py::object send_cq, py::object recv_cq,
                                 std::uint32_t max_send_wr, std::uint32_t max_recv_wr,
                                 std::uint32_t max_send_sge, std::uint32_t max_recv_sge,
                                 std::uint32_t max_inline_data, bool sq_sig_all,
                                 std::uint32_t max_rd_atomic, std::uint32_t max_dest_rd_atomic,
                                 py::object srq);
std::unique_ptr<py_srq> create_srq(py::object pd, std::uint32_t max_wr, std::uint32_t max_sge,
                                   std::uint32_t srq_limit);

// pd.register_memory: any buffer-protocol object (or CPU torch tensor).
std::unique_ptr<py_mr> register_buffer(py::object pd, py::object obj, std::uint32_t rights);

void init_module(py::module_& m);
// post_recv for a QP and an SRQ alike: `local` is one receive (Sge,
// MemoryRegion or (mr, offset, length), posted with wr_id) or a list of RecvWr
// posted as one batch.
template <class Queue>
void post_recv_from_python(Queue& q, const py::object& local, std::uint64_t wr_id) {
  if (py::isinstance<py::list>(local) && py::len(local) > 0 &&
      py::isinstance<py_recv_wr>(py::reinterpret_borrow<py::list>(local)[0])) {
    thread_local std::vector<recv_wr> batch;
    batch.clear();
    for (auto h : local) {
      auto& w = h.cast<py_recv_wr&>();
      batch.push_back({w.wr_id, w.sgl});
    }
    std::size_t bad = 0;
    check_status(q.post_recv(batch, &bad), "post_recv", bad);
    return;
  }
  check_status(q.post_recv(to_sge(local), wr_id), "post_recv");
}

void bind_queue(py::module_& m);
void bind_srq(py::module_& m);
void bind_cm(py::module_& m);
void bind_kv(py::module_& m);  // conveyor.kv (kv.cpp)

}  // namespace conveyor::python
