// bindings/python/src/cm.cpp — the connection manager: listener, connection
// requests, connect. Every call here can block, so each releases the GIL.
#include "bindings.hpp"

namespace conveyor::python {

namespace {

// A listener is thread-compatible in C++; Python threads may share one, so
// accept() takes this mutex (with the GIL released) before calling in.
struct py_listener : fork_owned {
  listener lis;
  py::object device;
  std::mutex mu;
  bool closed = false;
  std::atomic<int> users{0};  // accept()s under way (GIL released)
  listener& get() {
    if (closed) raise_closed("Listener");
    return lis;
  }
  void close() {
    if (closed) return;
    if (users.load() > 0)
      raise_error(errc::invalid_state,
                  "Listener.close: another thread is in accept() on this listener");
    closed = true;
    close_handle(lis, inherited());
  }
  ~py_listener() {
    if (inherited()) abandon(lis);
  }
};

struct py_conn_request : fork_owned {
  connect_request req;
  py::object device;
  std::mutex mu;
  bool answered = false;
  ~py_conn_request() {
    if (inherited()) abandon(req);
  }
};

struct py_connection_info {
  py::bytes private_data;
  qp_connection_attr attr;
};

py_connection_info to_info(const connection_info& ci) {
  return {from_bytes(ci.private_data), ci.attr};
}

}  // namespace

void bind_cm(py::module_& m) {
  m.attr("max_private_data") = max_private_data;

  py::class_<py_connection_info>(m, "ConnectionInfo", "What connect()/accept() learned.")
      .def_readonly("private_data", &py_connection_info::private_data,
                    "The peer's private data (bytes).")
      .def_readonly("attr", &py_connection_info::attr, "The negotiated ConnectionAttr.");

  py::class_<py_conn_request>(m, "ConnectRequest",
                              "A peer's connection request, from Listener.accept().")
      .def_property_readonly(
          "private_data", [](const py_conn_request& r) { return from_bytes(r.req.private_data()); })
      .def_property_readonly("peer_address",
                             [](const py_conn_request& r) { return r.req.peer_address(); })
      .def(
          "accept",
          [](py_conn_request& r, py_qp& q, const py::object& private_data) {
            auto pd = to_bytes(private_data, "ConnectRequest.accept");
            if (r.inherited()) raise_inherited("ConnectRequest");
            auto& qp = q.get();
            use_guard in_use(q.users);
            result<connection_info> res;
            {
              py::gil_scoped_release nogil;
              std::lock_guard lk(r.mu);
              res = r.req.accept(qp, pd);
            }
            if (!res) raise_error(res.error());
            return to_info(*res);
          },
          py::arg("qp"), py::arg("private_data") = py::none(),
          "Completes the handshake on `qp` (state INIT, same device); the QP is then RTS. "
          "GIL released.")
      .def(
          "reject",
          [](py_conn_request& r, const py::object& reason) {
            std::vector<std::byte> why;
            if (py::isinstance<py::str>(reason)) {
              auto s = reason.cast<std::string>();
              why.assign(reinterpret_cast<const std::byte*>(s.data()),
                         reinterpret_cast<const std::byte*>(s.data()) + s.size());
            } else {
              why = to_bytes(reason, "ConnectRequest.reject");
            }
            if (r.inherited()) raise_inherited("ConnectRequest");
            result<void> res;
            {
              py::gil_scoped_release nogil;
              std::lock_guard lk(r.mu);
              res = r.req.reject(why);
            }
            if (!res) raise_error(res.error());
          },
          py::arg("reason") = py::none(),
          "Refuses the peer; it sees Rejected with this reason (str or bytes).");

  py::class_<py_listener>(m, "Listener",
                          "Listens for connection requests (soft: 'ip:port'; shm: '@name').")
      .def_static(
          "bind",
          [](py::object device, const py::object& address, int backlog) {
            auto& d = device.cast<py_device&>();
            auto l = address.is_none()
                         ? listener::bind(d.get(), backlog)
                         : listener::bind(d.get(), address.cast<std::string>(), backlog);
            if (!l) raise_error(l.error());
            auto p = std::make_unique<py_listener>();
            p->lis = std::move(*l);
            p->device = std::move(device);
            return p;
          },
          py::arg("device"), py::arg("address") = py::none(), py::arg("backlog") = 64,
          "Binds a listener at an address in the provider's syntax (port 0 picks a free "
          "port), or, with none, at an ephemeral one the provider picks (soft: 127.0.0.1 and "
          "a free port; shm: a fresh abstract name); see address.")
      .def_property_readonly("address", [](py_listener& l) { return l.get().address(); })
      .def_property_readonly("port", [](py_listener& l) { return l.get().port(); })
      .def(
          "accept",
          [](py_listener& l, const py::object& timeout) {
            auto t = std::chrono::duration_cast<std::chrono::milliseconds>(to_timeout(timeout));
            if (l.inherited()) raise_inherited("Listener");
            auto& lis = l.get();
            use_guard in_use(l.users);
            result<connect_request> r;
            {
              py::gil_scoped_release nogil;
              std::lock_guard lk(l.mu);
              r = lis.accept(t);
            }
            if (!r) raise_error(r.error());
            auto p = std::make_unique<py_conn_request>();
            p->req = std::move(*r);
            p->device = l.device;
            return p;
          },
          py::arg("timeout") = 5.0,
          "Waits (GIL released) for a peer's request, at most `timeout` seconds; raises TimedOut.")
      .def("close", &py_listener::close,
           "Stops listening now (idempotent); requests not yet accepted are refused. Any other "
           "use of a closed listener raises InvalidState.")
      .def_property_readonly("closed", [](const py_listener& l) { return l.closed; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_listener& l, const py::args&) { l.close(); })
      .def("__repr__", [](const py_listener& l) {
        if (l.closed) return std::string("Listener(closed)");
        return "Listener(address='" + l.lis.address() + "')";
      });

  m.def(
      "connect",
      [](py_qp& q, const std::string& address, const py::object& private_data,
         const py::object& timeout) {
        auto pd = to_bytes(private_data, "connect");
        auto& qp = q.get();
        use_guard in_use(q.users);
        connect_options o;
        o.private_data = pd;
        o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(to_timeout(timeout));
        result<connection_info> res;
        {
          py::gil_scoped_release nogil;
          res = conveyor::connect(qp, address, o);
        }
        if (!res) raise_error(res.error());
        return to_info(*res);
      },
      py::arg("qp"), py::arg("address"), py::arg("private_data") = py::none(),
      py::arg("timeout") = 5.0,
      "Connects `qp` (state INIT) to a listener; the QP is then RTS. GIL released. Private data: "
      "at most max_private_data bytes each way.");
}

}  // namespace conveyor::python
