// bindings/python/src/module.cpp — the _conveyor extension module: errors,
// enums, devices, protection domains, memory regions (buffer protocol) and
// remote regions. Queues live in queue.cpp, the connection manager in cm.cpp.
#include <pybind11/operators.h>

#include <cstdio>
#include <cstring>
#include <optional>

#include <pthread.h>

#include "bindings.hpp"

namespace conveyor::python {

namespace {

// conveyor._errors._BY_CODE: the exception class per errc value. Held for the
// life of the process (a static py::object would be destroyed after the
// interpreter is gone).
py::object& error_classes() {
  static auto* classes = new py::object(py::module_::import("conveyor._errors").attr("_BY_CODE"));
  return *classes;
}

}  // namespace

void raise_error(const error& e) {
  auto classes = error_classes();
  auto idx = static_cast<std::size_t>(e.code);
  py::object cls = idx < py::len(classes) ? classes[py::int_(idx)] : classes[py::int_(0)];
  // An address that could not be parsed is a ValueError (InvalidAddress); one
  // that a system call refused (bind: in use, not ours) an OSError (BindError).
  if (e.code == errc::address_error)
    cls = py::module_::import("conveyor._errors")
              .attr(e.sys_errno != 0 ? "BindError" : "InvalidAddress");
  py::object exc = cls(e.to_string());
  exc.attr("code") = py::cast(e.code);
  exc.attr("errno") = e.sys_errno;
  exc.attr("context") = e.context;
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

void raise_error(errc code, std::string context) {
  raise_error(error{code, 0, std::move(context)});
}

void raise_closed(const char* what) {
  std::string noun = what;
  if (noun == "Device")
    noun = "device";
  else if (noun == "ProtectionDomain")
    noun = "protection domain";
  else if (noun == "CompletionQueue")
    noun = "CQ";
  else if (noun == "Listener")
    noun = "listener";
  raise_error(errc::invalid_state, std::string(what) + ": the " + noun + " was closed");
}

void check_status(status s, const char* what, std::size_t bad) {
  if (s == errc::ok) return;
  std::string ctx = what;
  if (bad != SIZE_MAX) ctx += " (request " + std::to_string(bad) + " and after not posted)";
  raise_error(error{s, 0, std::move(ctx)});
}

std::chrono::nanoseconds to_timeout(const py::object& seconds) {
  if (seconds.is_none()) return std::chrono::hours(24 * 365);
  double s = seconds.cast<double>();
  if (s < 0) s = 0;
  if (s > 1e9) s = 1e9;
  return std::chrono::nanoseconds(static_cast<std::int64_t>(s * 1e9));
}

std::vector<std::byte> to_bytes(const py::object& obj, const char* what) {
  if (obj.is_none()) return {};
  Py_buffer v;
  if (PyObject_GetBuffer(obj.ptr(), &v, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + ": expected a bytes-like object");
  }
  auto* p = static_cast<const std::byte*>(v.buf);
  std::vector<std::byte> out(p, p + v.len);
  PyBuffer_Release(&v);
  return out;
}

py::bytes from_bytes(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// --- memory regions --------------------------------------------------------

// --- fork --------------------------------------------------------------------

namespace {
std::atomic<std::uint32_t> g_fork_epoch{0};
}  // namespace

std::uint32_t fork_epoch() noexcept {
  return g_fork_epoch.load(std::memory_order_relaxed);
}

void raise_inherited(const char* what) {
  raise_error(errc::invalid_state,
              std::string(what) +
                  ": inherited through fork(); it belongs to the parent process (open a device "
                  "in this process instead)");
}

// --- memory regions --------------------------------------------------------

py_mr::~py_mr() {
  // In a forked child the registration is the parent's (shm may share its
  // pages with a peer): only the child's view of the buffer is released.
  if (inherited())
    abandon(mr);
  else
    mr.deregister();
  if (has_view) PyBuffer_Release(&view);
}

void py_mr::close() {
  if (exports > 0)
    throw py::buffer_error("MemoryRegion.close: " + std::to_string(exports) +
                           " memoryview(s) of the region still exist; release them first");
  if (inherited())
    abandon(mr);
  else
    mr.deregister();
  if (has_view) {
    PyBuffer_Release(&view);
    has_view = false;
  }
  obj = py::none();
}

const memory_region& py_mr::get() const {
  if (!mr) raise_error(errc::invalid_state, "MemoryRegion: the region was deregistered");
  return mr;
}

sge to_sge(const py::handle& h) {
  if (py::isinstance<sge>(h)) return h.cast<sge>();
  if (py::isinstance<py_mr>(h)) return h.cast<py_mr&>().get().as_sge();
  if (py::isinstance<py::tuple>(h) && py::len(h) == 3) {
    auto t = py::reinterpret_borrow<py::tuple>(h);
    const auto& m = t[0].cast<py_mr&>().get();
    auto off = t[1].cast<std::size_t>(), len = t[2].cast<std::size_t>();
    if (off > m.size() || len > m.size() - off)
      raise_error(errc::invalid_argument, "sge: [" + std::to_string(off) + ", +" +
                                              std::to_string(len) + ") is outside the region of " +
                                              std::to_string(m.size()) + " bytes");
    return m.slice(off, len);
  }
  throw py::type_error("expected an Sge, a MemoryRegion or (MemoryRegion, offset, length)");
}

namespace {

// The exporter behind MemoryRegion.memory: a tiny type implementing the
// buffer protocol so that every memoryview counts as an export of the region
// (close() refuses while any exists) and holds the region's Python object.
struct region_memory {
  PyObject_HEAD PyObject* owner;
};

int region_memory_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* rm = reinterpret_cast<region_memory*>(self);
  auto* r = py::handle(rm->owner).cast<py_mr*>();
  if (!r->mr) {
    PyErr_SetString(PyExc_BufferError, "MemoryRegion: the region was deregistered");
    return -1;
  }
  int readonly = r->has_view ? r->view.readonly : 0;
  if (PyBuffer_FillInfo(view, self, r->mr.data(), static_cast<Py_ssize_t>(r->mr.size()), readonly,
                        flags) != 0)
    return -1;
  ++r->exports;
  return 0;
}

void region_memory_releasebuffer(PyObject* self, Py_buffer*) {
  auto* rm = reinterpret_cast<region_memory*>(self);
  --py::handle(rm->owner).cast<py_mr*>()->exports;
}

void region_memory_dealloc(PyObject* self) {
  auto* rm = reinterpret_cast<region_memory*>(self);
  Py_XDECREF(rm->owner);
  PyTypeObject* tp = Py_TYPE(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

PyObject* region_memory_type() {
  static PyObject* type = [] {
    static PyType_Slot slots[] = {
        {Py_bf_getbuffer, reinterpret_cast<void*>(&region_memory_getbuffer)},
        {Py_bf_releasebuffer, reinterpret_cast<void*>(&region_memory_releasebuffer)},
        {Py_tp_dealloc, reinterpret_cast<void*>(&region_memory_dealloc)},
        {0, nullptr}};
    static PyType_Spec spec = {"conveyor._conveyor._RegionMemory", sizeof(region_memory), 0,
                               Py_TPFLAGS_DEFAULT, slots};
    PyObject* t = PyType_FromSpec(&spec);
    if (!t) throw py::error_already_set();
    return t;
  }();
  return type;
}

py::memoryview region_memoryview(py::object owner) {
  auto* tp = reinterpret_cast<PyTypeObject*>(region_memory_type());
  PyObject* o = tp->tp_alloc(tp, 0);
  if (!o) throw py::error_already_set();
  auto* rm = reinterpret_cast<region_memory*>(o);
  rm->owner = owner.release().ptr();
  py::object exporter = py::reinterpret_steal<py::object>(o);
  return py::reinterpret_steal<py::memoryview>(PyMemoryView_FromObject(exporter.ptr()));
}

std::string repr_region(const remote_region& rr) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "RemoteRegion(addr=0x%llx, length=%llu, rkey=0x%x)",
                static_cast<unsigned long long>(rr.addr),
                static_cast<unsigned long long>(rr.length), rr.rkey);
  return buf;
}

}  // namespace

// Registers any buffer-protocol object (or a CPU torch tensor, through its
// zero-copy numpy view). The buffer must be C-contiguous; a read-only one is
// refused when the rights let the NIC write into it.
std::unique_ptr<py_mr> register_buffer(py::object pd_obj, py::object obj, std::uint32_t rights) {
  auto& pd = pd_obj.cast<py_pd&>();
  pd.get();
  auto r = std::make_unique<py_mr>();
  py::object target = obj;
  if (!PyObject_CheckBuffer(obj.ptr())) {
    // torch.Tensor has no buffer protocol; its .numpy() shares its storage
    // (and fails for a tensor that is not on the CPU).
    if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "numpy") && py::hasattr(obj, "detach"))
      target = obj.attr("detach")().attr("numpy")();
    else
      throw py::type_error(
          "register_memory: " + std::string(py::str(py::type::handle_of(obj).attr("__name__"))) +
          " does not expose the buffer protocol");
  }
  if (PyObject_GetBuffer(target.ptr(), &r->view, PyBUF_C_CONTIGUOUS) != 0) {
    py::error_already_set e;
    raise_error(
        errc::invalid_argument,
        std::string("register_memory: the buffer is not usable (it must be C-contiguous): ") +
            e.what());
  }
  r->has_view = true;
  const bool writes = (rights & (static_cast<std::uint32_t>(access::local_write) |
                                 static_cast<std::uint32_t>(access::remote_write) |
                                 static_cast<std::uint32_t>(access::remote_atomic))) != 0;
  if (writes && r->view.readonly)
    raise_error(
        errc::invalid_argument,
        "register_memory: the buffer is read-only, but the rights let the NIC write into it "
        "(local_write/remote_write/remote_atomic)");
  auto span =
      std::span(static_cast<std::byte*>(r->view.buf), static_cast<std::size_t>(r->view.len));
  auto mr = pd.get().register_memory(span, static_cast<access>(rights));
  if (!mr) raise_error(mr.error());
  r->mr = std::move(*mr);
  r->pd = std::move(pd_obj);
  r->obj = std::move(obj);
  return r;
}

void init_module(py::module_& m) {
  m.doc() = "Conveyor's C++ API for Python (the conveyor package wraps this module).";
  // Any fork (os.fork, multiprocessing, a C extension's) makes the objects
  // that exist then the parent's (bindings.hpp, fork_owned).
  ::pthread_atfork(nullptr, nullptr, [] { g_fork_epoch.fetch_add(1, std::memory_order_relaxed); });
  m.attr("version") = version_string;

  py::enum_<errc>(m, "ErrorCode", "The library's canonical error codes (conveyor::errc).")
      .value("ok", errc::ok)
      .value("invalid_argument", errc::invalid_argument)
      .value("not_found", errc::not_found)
      .value("unsupported", errc::unsupported)
      .value("again", errc::again)
      .value("timed_out", errc::timed_out)
      .value("connection_refused", errc::connection_refused)
      .value("connection_reset", errc::connection_reset)
      .value("rejected", errc::rejected)
      .value("protocol_error", errc::protocol_error)
      .value("address_error", errc::address_error)
      .value("resource_exhausted", errc::resource_exhausted)
      .value("invalid_state", errc::invalid_state)
      .value("qp_in_error", errc::qp_in_error)
      .value("cq_overflow", errc::cq_overflow)
      .value("io_error", errc::io_error);

  py::enum_<wc_status>(m, "WcStatus", "Work completion status: the verbs statuses.")
      .value("success", wc_status::success)
      .value("loc_len_err", wc_status::loc_len_err)
      .value("loc_qp_op_err", wc_status::loc_qp_op_err)
      .value("loc_prot_err", wc_status::loc_prot_err)
      .value("wr_flush_err", wc_status::wr_flush_err)
      .value("mw_bind_err", wc_status::mw_bind_err)
      .value("bad_resp_err", wc_status::bad_resp_err)
      .value("loc_access_err", wc_status::loc_access_err)
      .value("rem_inv_req_err", wc_status::rem_inv_req_err)
      .value("rem_access_err", wc_status::rem_access_err)
      .value("rem_op_err", wc_status::rem_op_err)
      .value("retry_exc_err", wc_status::retry_exc_err)
      .value("rnr_retry_exc_err", wc_status::rnr_retry_exc_err)
      .value("fatal_err", wc_status::fatal_err)
      .value("resp_timeout_err", wc_status::resp_timeout_err)
      .value("general_err", wc_status::general_err);

  py::enum_<transport>(m, "Transport")
      .value("iwarp", transport::iwarp)
      .value("roce", transport::roce)
      .value("infiniband", transport::infiniband)
      .value("shm", transport::shm);

  py::enum_<progress_mode>(m, "ProgressMode")
      .value("thread", progress_mode::thread)
      .value("manual", progress_mode::manual);

  // --- memory ----------------------------------------------------------------
  py::class_<sge>(m, "Sge",
                  "A scatter/gather element: registered local memory (addr, length, lkey).")
      .def(py::init([](std::uint64_t addr, std::uint32_t length, std::uint32_t lkey) {
             return sge{addr, length, lkey};
           }),
           py::arg("addr"), py::arg("length"), py::arg("lkey"))
      .def_readwrite("addr", &sge::addr)
      .def_readwrite("length", &sge::length)
      .def_readwrite("lkey", &sge::lkey)
      .def("__repr__", [](const sge& s) {
        return "Sge(addr=" + std::to_string(s.addr) + ", length=" + std::to_string(s.length) +
               ", lkey=" + std::to_string(s.lkey) + ")";
      });

  py::class_<remote_region>(m, "RemoteRegion",
                            "What a peer needs to access registered memory: addr, length, rkey. "
                            "encode() gives the stable 28-byte form to send; decode() reads it.")
      .def(py::init([](std::uint64_t addr, std::uint64_t length, std::uint32_t rkey) {
             return remote_region{addr, length, rkey};
           }),
           py::arg("addr"), py::arg("length"), py::arg("rkey"))
      .def_readwrite("addr", &remote_region::addr)
      .def_readwrite("length", &remote_region::length)
      .def_readwrite("rkey", &remote_region::rkey)
      .def("slice", &remote_region::slice, py::arg("offset"), py::arg("length"),
           "The sub-range [offset, offset+length) (not bounds-checked: the target checks).")
      .def("encode", [](const remote_region& rr) { return from_bytes(rr.encode()); })
      .def_static(
          "decode",
          [](const py::object& data) {
            auto r = remote_region::decode(to_bytes(data, "RemoteRegion.decode"));
            if (!r) raise_error(r.error());
            return *r;
          },
          py::arg("data"),
          "Decodes encode()'s bytes; InvalidArgument on a short buffer, bad magic or version.")
      .def_property_readonly_static("encoded_size",
                                    [](py::object) { return remote_region::encoded_size; })
      .def(py::self == py::self)
      .def(
          "__hash__",
          [](const remote_region& r) { return py::hash(py::make_tuple(r.addr, r.length, r.rkey)); })
      .def("__repr__", &repr_region);

  py::class_<py_mr>(
      m, "MemoryRegion",
      "A registration. It holds the registered object (which cannot be freed or resized "
      "meanwhile) until close()/deregister() or until the region itself is collected. "
      "Usable as a context manager (closing on exit).")
      .def_property_readonly("addr", [](const py_mr& r) { return r.get().addr(); })
      .def_property_readonly("length", [](const py_mr& r) { return r.get().size(); })
      .def("__len__", [](const py_mr& r) { return r.get().size(); })
      .def_property_readonly("lkey", [](const py_mr& r) { return r.get().lkey(); })
      .def_property_readonly("rkey", [](const py_mr& r) { return r.get().rkey(); })
      .def_property_readonly(
          "rights", [](const py_mr& r) { return static_cast<std::uint32_t>(r.get().rights()); })
      .def_property_readonly("registered", [](const py_mr& r) { return static_cast<bool>(r.mr); })
      .def_readonly("obj", &py_mr::obj, "The registered object (None for allocate_memory).")
      .def_property_readonly(
          "memory",
          [](py::object self) {
            self.cast<py_mr&>().get();
            return region_memoryview(self);
          },
          "A memoryview of the region's bytes (writable unless the registered buffer is "
          "read-only). "
          "The region cannot be closed while one exists.")
      .def(
          "remote", [](const py_mr& r) { return r.get().remote(); },
          "RemoteRegion for the whole region.")
      .def(
          "sge",
          [](const py_mr& r, std::size_t offset, std::optional<std::size_t> length) {
            return to_sge(
                py::make_tuple(py::cast(&r, py::return_value_policy::reference), offset,
                               length.value_or(r.get().size() - std::min(offset, r.get().size()))));
          },
          py::arg("offset") = 0, py::arg("length") = py::none(),
          "An Sge for [offset, offset+length) of the region (default: to its end); checked.")
      .def("deregister", &py_mr::close, "Revokes the keys now and releases the buffer.")
      .def("close", &py_mr::close, "Same as deregister().")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_mr& r, py::args) { r.close(); })
      .def("__repr__", [](const py_mr& r) {
        if (!r.mr) return std::string("MemoryRegion(deregistered)");
        return "MemoryRegion(addr=" + std::to_string(r.mr.addr()) +
               ", length=" + std::to_string(r.mr.size()) + ", rkey=" + std::to_string(r.mr.rkey()) +
               ")";
      });

  // Bound in an order where every class is registered before a signature
  // names it (otherwise help() shows the C++ type).
  bind_queue(m);
  bind_srq(m);

  py::class_<py_pd>(m, "ProtectionDomain", "A protection domain: registers memory, creates QPs.")
      .def("register_memory", &register_buffer, py::arg("buffer"), py::arg("rights"),
           "Registers any C-contiguous buffer-protocol object (bytearray, memoryview, mmap, numpy "
           "array) or CPU torch tensor without copying. Read-only buffers are refused for rights "
           "that write (InvalidArgument).")
      .def(
          "allocate_memory",
          [](py::object self, std::size_t length, std::uint32_t rights) {
            auto mr =
                self.cast<py_pd&>().get().allocate_memory(length, static_cast<access>(rights));
            if (!mr) raise_error(mr.error());
            auto r = std::make_unique<py_mr>();
            r->mr = std::move(*mr);
            r->pd = std::move(self);
            r->obj = py::none();
            r->owned = true;
            return r;
          },
          py::arg("length"), py::arg("rights"),
          "Allocates zeroed, page-aligned memory owned by the returned region (its .memory is a "
          "writable memoryview). On shm a connected peer may map it directly.")
      .def("create_qp", &create_qp, py::arg("send_cq"), py::arg("recv_cq") = py::none(),
           py::kw_only(), py::arg("max_send_wr") = 256, py::arg("max_recv_wr") = 256,
           py::arg("max_send_sge") = 4, py::arg("max_recv_sge") = 4,
           py::arg("max_inline_data") = 256, py::arg("sq_sig_all") = false,
           py::arg("max_rd_atomic") = 16, py::arg("max_dest_rd_atomic") = 16,
           py::arg("srq") = py::none(),
           "Creates an RC queue pair in state INIT (recv_cq defaults to send_cq). With srq=, it "
           "draws its receives from that SharedReceiveQueue and refuses its own post_recv.")
      .def("create_srq", &create_srq, py::kw_only(), py::arg("max_wr") = 256,
           py::arg("max_sge") = 4, py::arg("srq_limit") = 0,
           "Creates a shared receive queue for QPs of this PD (srq_limit > 0 arms the limit).")
      .def(
          "close", [](py_pd& p) { close_handle(p.pd, p.inherited()); },
          "Releases the PD now (idempotent). Regions and QPs made from it keep it alive until "
          "they are closed too; any other use of a closed PD raises InvalidState.")
      .def_property_readonly("closed", [](const py_pd& p) { return !p.pd; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_pd& p, const py::args&) { close_handle(p.pd, p.inherited()); })
      .def("__repr__", [](const py_pd& p) {
        return std::string(p.pd ? "ProtectionDomain()" : "ProtectionDomain(closed)");
      });

  // --- devices ---------------------------------------------------------------
  py::class_<device_info>(m, "DeviceInfo", "A device that conveyor.devices() found.")
      .def_readonly("name", &device_info::name)
      .def_readonly("provider", &device_info::provider)
      .def_readonly("transport", &device_info::transport_type)
      .def_readonly("available", &device_info::available)
      .def_readonly("reason", &device_info::reason,
                    "Why the device is not available ('' if it is).")
      .def("__repr__", [](const device_info& d) {
        return "DeviceInfo(name='" + d.name + "', provider='" + d.provider +
               "', available=" + (d.available ? "True" : "False") +
               (d.available ? "" : ", reason='" + d.reason + "'") + ")";
      });

  py::class_<port_attr>(m, "PortAttr")
      .def_readonly("num", &port_attr::num)
      .def_readonly("state", &port_attr::state)
      .def_readonly("link_layer", &port_attr::link_layer)
      .def_readonly("mtu", &port_attr::mtu)
      .def_readonly("addresses", &port_attr::addresses);

  py::class_<device_attr>(m, "DeviceAttr", "What a device supports (conveyor::device_attr).")
      .def_readonly("name", &device_attr::name)
      .def_readonly("provider", &device_attr::provider)
      .def_readonly("transport", &device_attr::transport_type)
      .def_readonly("max_qp", &device_attr::max_qp)
      .def_readonly("max_cqe", &device_attr::max_cqe)
      .def_readonly("max_qp_wr", &device_attr::max_qp_wr)
      .def_readonly("max_sge", &device_attr::max_sge)
      .def_readonly("max_sge_rd", &device_attr::max_sge_rd)
      .def_readonly("max_inline_data", &device_attr::max_inline_data)
      .def_readonly("max_mr", &device_attr::max_mr)
      .def_readonly("max_mr_size", &device_attr::max_mr_size)
      .def_readonly("max_msg_size", &device_attr::max_msg_size)
      .def_readonly("max_qp_rd_atom", &device_attr::max_qp_rd_atom)
      .def_readonly("max_srq", &device_attr::max_srq)
      .def_readonly("max_srq_wr", &device_attr::max_srq_wr)
      .def_readonly("max_srq_sge", &device_attr::max_srq_sge)
      .def_readonly("post_recv_checks_lkeys", &device_attr::post_recv_checks_lkeys)
      .def_readonly("inline_checks_lkeys", &device_attr::inline_checks_lkeys)
      .def_readonly("deregister_stops_outstanding", &device_attr::deregister_stops_outstanding)
      .def_readonly("registration_pins_pages", &device_attr::registration_pins_pages)
      .def_readonly("runs_mpa", &device_attr::runs_mpa)
      .def_readonly("atomics", &device_attr::atomics)
      .def_property_readonly(
          "atomic_cap",
          [](const device_attr& a) {
            return a.atomic_cap == conveyor::atomic_scope::global ? "global"
                   : a.atomic_cap == conveyor::atomic_scope::rdma ? "rdma"
                                                                  : "none";
          },
          "what a remote atomic is atomic against: 'global' (the owner's CPU too), 'rdma' "
          "(other RDMA atomics only) or 'none'")
      .def_readonly("immediate_data", &device_attr::immediate_data)
      .def_readonly("send_with_invalidate", &device_attr::send_with_invalidate)
      .def_readonly("ports", &device_attr::ports);

  m.def("devices", &device::list, "Every device of every provider built into the library.");

  py::class_<py_device>(m, "Device", "An open RDMA device (soft, shm or verbs). Thread-compatible.")
      .def_static(
          "open",
          [](const std::string& name, progress_mode progress, bool request_crc,
             std::uint32_t spin_us, std::uint32_t engine_spin_us, bool engine_park,
             std::uint32_t handshake_timeout_ms, std::uint32_t max_pending_handshakes,
             bool large_fpdus) {
            device_options o;
            o.progress = progress;
            o.spin_us = spin_us;
            o.handshake_timeout_ms = handshake_timeout_ms;
            // Python keeps flat keywords; the soft/shm ones fill the software part.
            o.software.request_crc = request_crc;
            o.software.engine_spin_us = engine_spin_us;
            o.software.engine_park = engine_park;
            o.software.max_pending_handshakes = max_pending_handshakes;
            o.software.large_fpdus = large_fpdus;
            auto d = device::open(name, o);
            if (!d) raise_error(d.error());
            auto p = std::make_unique<py_device>();
            p->dev = std::move(*d);
            return p;
          },
          py::arg("name"), py::kw_only(), py::arg("progress") = progress_mode::thread,
          py::arg("request_crc") = true, py::arg("spin_us") = 20, py::arg("engine_spin_us") = 50,
          py::arg("engine_park") = true, py::arg("handshake_timeout_ms") = 5000,
          py::arg("max_pending_handshakes") = 256, py::arg("large_fpdus") = true,
          "Opens a device by name ('soft', 'soft:<label>', 'shm', 'verbs[:name]') or provider. "
          "Raises NotFound naming the devices that exist.")
      .def_property_readonly("name", [](py_device& d) { return std::string(d.get().name()); })
      .def_property_readonly("provider", [](py_device& d) { return d.get().attr().provider; })
      .def_property_readonly(
          "attr", [](py_device& d) { return d.get().attr(); },
          "The device's attributes (DeviceAttr, a copy).")
      .def(
          "alloc_pd",
          [](py::object self) {
            auto pd = self.cast<py_device&>().get().alloc_pd();
            if (!pd) raise_error(pd.error());
            auto p = std::make_unique<py_pd>();
            p->pd = std::move(*pd);
            p->device = std::move(self);
            return p;
          },
          "Allocates a protection domain.")
      .def(
          "create_cq",
          [](py::object self, std::uint32_t depth) {
            auto cq = self.cast<py_device&>().get().create_cq({.depth = depth});
            if (!cq) raise_error(cq.error());
            auto p = std::make_unique<py_cq>();
            p->cq = std::move(*cq);
            p->device = std::move(self);
            return p;
          },
          py::arg("depth") = 1024, "Creates a completion queue holding `depth` completions.")
      .def(
          "close", [](py_device& d) { close_handle(d.dev, d.inherited()); },
          "Releases the device now (idempotent; GIL released). Its engine thread ends once the "
          "objects made from it (PDs, CQs, QPs, regions, listeners) are closed or collected too: "
          "close them first, or open them all in `with` blocks. Any other use of a closed device "
          "raises InvalidState.")
      .def_property_readonly("closed", [](const py_device& d) { return !d.dev; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_device& d, const py::args&) { close_handle(d.dev, d.inherited()); })
      .def("__repr__", [](const py_device& d) {
        if (!d.dev) return std::string("Device(closed)");
        return "Device(name='" + std::string(d.dev.name()) + "', provider='" +
               d.dev.attr().provider + "')";
      });

  bind_cm(m);
  bind_kv(m);
}

}  // namespace conveyor::python

PYBIND11_MODULE(_conveyor, m) {
  conveyor::python::init_module(m);
}
