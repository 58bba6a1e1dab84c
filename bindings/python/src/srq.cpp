// bindings/python/src/srq.cpp — shared receive queues: pd.create_srq (bound in
// module.cpp), SharedReceiveQueue and its attributes.
#include "bindings.hpp"

namespace conveyor::python {

namespace {

shared_receive_queue& get(py_srq& s) {
  if (!s.srq) raise_error(errc::invalid_state, "SharedReceiveQueue: the SRQ was closed");
  if (s.inherited()) raise_inherited("SharedReceiveQueue");
  return s.srq;
}

}  // namespace

std::unique_ptr<py_srq> create_srq(py::object pd, std::uint32_t max_wr, std::uint32_t max_sge,
                                   std::uint32_t srq_limit) {
  auto s = pd.cast<py_pd&>().get().create_srq({max_wr, max_sge, srq_limit});
  if (!s) raise_error(s.error());
  auto p = std::make_unique<py_srq>();
  p->srq = std::move(*s);
  p->pd = std::move(pd);
  return p;
}

void bind_srq(py::module_& m) {
  py::class_<srq_attr>(m, "SrqAttr", "A shared receive queue's size and armed limit.")
      .def_readonly("max_wr", &srq_attr::max_wr)
      .def_readonly("max_sge", &srq_attr::max_sge)
      .def_readonly("srq_limit", &srq_attr::srq_limit, "The armed limit; 0 when disarmed.");

  py::class_<py_srq>(m, "SharedReceiveQueue",
                     "A shared receive queue: QPs created with srq=... draw their receives from "
                     "it (each receive serves one message, on whichever QP it arrives). Posting "
                     "never blocks: a full queue raises Again.")
      .def_property_readonly("srq_num", [](py_srq& s) { return get(s).srq_num(); })
      .def_readonly("pd", &py_srq::pd)
      .def(
          "post_recv",
          [](py_srq& s, const py::object& local, std::uint64_t wr_id) {
            post_recv_from_python(get(s), local, wr_id);
          },
          py::arg("local"), py::arg("wr_id") = 0,
          "Posts one receive (local: Sge, MemoryRegion or (mr, offset, length)) or a list of "
          "RecvWr. Again when max_wr are posted; InvalidArgument for a bad lkey (soft, shm) or "
          "too many SGEs.")
      .def(
          "arm_limit",
          [](py_srq& s, std::uint32_t limit) {
            if (auto r = get(s).arm_limit(limit); !r) raise_error(r.error());
          },
          py::arg("limit"),
          "Arms the limit: one srq_limit_reached device event when a receive taken leaves fewer "
          "than `limit` posted; 0 disarms it.")
      .def(
          "query",
          [](py_srq& s) {
            auto r = get(s).query();
            if (!r) raise_error(r.error());
            return *r;
          },
          "max_wr, max_sge and the armed limit (SrqAttr).")
      .def_property_readonly("closed", [](const py_srq& s) { return !s.srq; })
      .def(
          "close",
          [](py_srq& s) {
            if (s.inherited())
              abandon(s.srq);
            else
              s.srq = shared_receive_queue();
          },
          "Releases the handle (QPs attached to the SRQ keep it until they close).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_srq& s, const py::args&) { s.srq = shared_receive_queue(); });
}

}  // namespace conveyor::python
