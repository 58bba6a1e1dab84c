// bindings/python/src/queue.cpp — completion queues, work completions, work
// requests and queue pairs (every opcode, batch posting, blocking helpers).
#include <algorithm>
#include <cstdio>

#include "bindings.hpp"

namespace conveyor::python {

namespace {

using clk = std::chrono::steady_clock;

// Reused per thread: poll/wait/post build their arrays here (several threads
// may use one CQ or QP at once, so no per-object scratch).
thread_local std::vector<work_completion> tl_wcs;
thread_local std::vector<send_wr> tl_send;
thread_local std::vector<sge> tl_sges;

// A Python-side send work request: the verbs send_wr plus its own SGE list.
struct py_send_wr {
  send_wr wr;
  std::vector<sge> sgl;
};

std::vector<sge> to_sgl(const py::object& local) {
  std::vector<sge> out;
  if (local.is_none()) return out;
  if (py::isinstance<py::list>(local)) {
    for (auto h : local) out.push_back(to_sge(h));
  } else {
    out.push_back(to_sge(local));
  }
  return out;
}

py::list take_stash(py_cq& c, std::size_t max) {
  py::list out;
  while (!c.stash.empty() && py::len(out) < max) {
    out.append(py::cast(c.stash.front()));
    c.stash.pop_front();
  }
  return out;
}

py::list to_list(std::span<const work_completion> wcs) {
  py::list out(wcs.size());
  for (std::size_t i = 0; i < wcs.size(); ++i) out[i] = py::cast(wcs[i]);
  return out;
}

// Waits with the GIL released, in slices so that Ctrl-C (a pending signal)
// ends the wait with KeyboardInterrupt. Returns the completions (at least
// one) or raises TimedOut / CqOverflow.
std::size_t wait_released(completion_queue& cq, std::vector<work_completion>& out,
                          std::chrono::nanoseconds timeout) {
  const auto deadline = clk::now() + timeout;
  for (;;) {
    auto left =
        std::max<std::chrono::nanoseconds>(deadline - clk::now(), std::chrono::nanoseconds(0));
    auto slice = std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(100));
    std::expected<std::size_t, errc> r;
    {
      py::gil_scoped_release nogil;
      r = cq.wait(out, slice);
    }
    if (r) return *r;
    if (r.error() != errc::timed_out) raise_error(r.error(), "CompletionQueue.wait");
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (clk::now() >= deadline)
      raise_error(errc::timed_out, "CompletionQueue.wait: no completion within the timeout");
  }
}

// Waits for the completion of wr_id on c (the helper's own request).
// *seen is set once it came (then the request is over, whatever its status).
work_completion wait_own(py_qp& q, py_cq& c, std::uint64_t wr_id, std::chrono::nanoseconds timeout,
                         const char* what, bool* seen);

// A helper's request that did not complete in time, whose buffer the helper
// registered itself: the buffer is released when the helper returns, so the
// request must not complete later (a READ would write into freed memory, a
// WRITE send it). The QP goes to ERROR, which flushes the request and waits
// out a copy under way; the flush completion is reaped here (bounded: soft and
// shm flush at once, a NIC soon after).
void abandon_request(py_qp& q, py_cq& c, std::uint64_t wr_id) {
  {
    py::gil_scoped_release nogil;
    (void)q.qp.modify(qp_state::error);
  }
  const auto deadline = clk::now() + std::chrono::seconds(2);
  std::vector<work_completion> wcs(16);
  for (;;) {
    std::expected<std::size_t, errc> r;
    {
      py::gil_scoped_release nogil;
      r = c.cq.wait(wcs, std::chrono::milliseconds(50));
    }
    for (std::size_t i = 0; r && i < *r; ++i) {
      if (wcs[i].wr_id == wr_id && wcs[i].qp_num == q.qp.qp_num()) return;
      c.stash.push_back(wcs[i]);
    }
    if ((!r && r.error() != errc::timed_out) || clk::now() >= deadline) return;
  }
}

// Posts one signaled request and waits for its own completion on the send
// CQ; completions of other requests met meanwhile are kept for poll/wait.
// temp_buffer: the request's buffer goes when this returns (abandon_request).
work_completion post_and_wait(py::object self, send_wr wr, std::chrono::nanoseconds timeout,
                              const char* what, bool temp_buffer) {
  auto& q = self.cast<py_qp&>();
  auto& c = q.send_cq.cast<py_cq&>();
  c.get();
  use_guard in_use(q.users);
  use_guard cq_in_use(c.users);
  wr.wr_id = 0xC0FE'0000'0000'0000ull | (q.next_helper_id++ & 0xFFFF'FFFF'FFFFull);
  wr.flags = wr.flags | send_flags::signaled;
  q.check_post(q.get().post_send(wr), what);
  bool seen = false;
  try {
    return wait_own(q, c, wr.wr_id, timeout, what, &seen);
  } catch (...) {  // TimedOut, KeyboardInterrupt, CqOverflow, CompletionError
    if (temp_buffer && !seen) abandon_request(q, c, wr.wr_id);
    throw;
  }
}

work_completion wait_own(py_qp& q, py_cq& c, std::uint64_t wr_id, std::chrono::nanoseconds timeout,
                         const char* what, bool* seen) {
  const auto deadline = clk::now() + timeout;
  std::vector<work_completion> wcs(16);
  for (;;) {
    auto left =
        std::max<std::chrono::nanoseconds>(deadline - clk::now(), std::chrono::nanoseconds(0));
    std::size_t n = wait_released(c.cq, wcs, left);
    std::optional<work_completion> mine;
    for (std::size_t i = 0; i < n; ++i) {
      if (!mine && wcs[i].wr_id == wr_id && wcs[i].qp_num == q.qp.qp_num())
        mine = wcs[i];
      else
        c.stash.push_back(wcs[i]);
    }
    if (mine) {
      *seen = true;
      if (mine->status != wc_status::success) {
        auto cls = py::module_::import("conveyor._errors").attr("CompletionError");
        py::object exc = cls(std::string(what) + ": the request completed with " +
                             std::string(to_string(mine->status)));
        exc.attr("status") = py::cast(mine->status);
        exc.attr("completion") = py::cast(*mine);
        PyErr_SetObject(cls.ptr(), exc.ptr());
        throw py::error_already_set();
      }
      return *mine;
    }
  }
}

// For the helpers: an SGE for `local`, registering it for the call if it is a
// plain buffer (the temporary region is closed when `tmp` goes).
sge helper_sge(py_qp& q, const py::object& local, bool sink, std::unique_ptr<py_mr>& tmp) {
  if (py::isinstance<sge>(local) || py::isinstance<py_mr>(local) ||
      py::isinstance<py::tuple>(local))
    return to_sge(local);
  std::uint32_t rights = static_cast<std::uint32_t>(access::local_write);
  if (!sink) {
    // A read-only source (bytes) cannot take local_write; remote_read is the
    // other right a source may have (its key is never sent anywhere).
    Py_buffer v;
    bool ro = PyObject_GetBuffer(local.ptr(), &v, PyBUF_SIMPLE) == 0 ? v.readonly : false;
    if (ro)
      PyBuffer_Release(&v);
    else if (!PyErr_Occurred())
      PyBuffer_Release(&v);
    PyErr_Clear();
    if (ro) rights = static_cast<std::uint32_t>(access::remote_read);
  }
  tmp = register_buffer(q.pd, local, rights);
  return tmp->mr.as_sge();
}

std::string repr_wc(const work_completion& wc) {
  char buf[200];
  std::snprintf(
      buf, sizeof buf, "WorkCompletion(wr_id=%llu, status=%.*s, opcode=%.*s, byte_len=%u%s)",
      static_cast<unsigned long long>(wc.wr_id), static_cast<int>(to_string(wc.status).size()),
      to_string(wc.status).data(), static_cast<int>(to_string(wc.opcode).size()),
      to_string(wc.opcode).data(), wc.byte_len, wc.with_imm ? ", with_imm" : "");
  return buf;
}

}  // namespace

queue_pair& py_qp::get() {
  if (!qp) raise_error(errc::invalid_state, "QueuePair: the QP was closed");
  if (inherited()) raise_inherited("QueuePair");
  return qp;
}

void py_qp::check_post(status s, const char* what, std::size_t bad) {
  if (s == errc::invalid_state && qp) {
    const auto st = qp.state();
    if (st == qp_state::reset || st == qp_state::init || st == qp_state::rtr) {
      std::string ctx = std::string(what) + ": the QP is not connected (state " +
                        std::string(to_string(st)) +
                        "): connect first (conveyor.connect(qp, address) or "
                        "ConnectRequest.accept(qp))";
      if (bad != SIZE_MAX) ctx += " (request " + std::to_string(bad) + " and after not posted)";
      raise_error(error{s, 0, std::move(ctx)});
    }
  }
  check_status(s, what, bad);
}

// A CQ's poll and wait drive a manual-progress device's engine (its sockets):
// not from a forked child's copy.
completion_queue& py_cq::get() {
  if (!cq) raise_closed("CompletionQueue");
  if (inherited()) raise_inherited("CompletionQueue");
  return cq;
}

std::unique_ptr<py_qp> create_qp(py::object pd, py::object send_cq, py::object recv_cq,
                                 std::uint32_t max_send_wr, std::uint32_t max_recv_wr,
                                 std::uint32_t max_send_sge, std::uint32_t max_recv_sge,
                                 std::uint32_t max_inline_data, bool sq_sig_all,
                                 std::uint32_t max_rd_atomic, std::uint32_t max_dest_rd_atomic,
                                 py::object srq) {
  if (recv_cq.is_none()) recv_cq = send_cq;
  auto& scq = send_cq.cast<py_cq&>();
  auto& rcq = recv_cq.cast<py_cq&>();
  qp_init_attr a;
  a.send_cq = &scq.get();
  a.recv_cq = &rcq.get();
  a.cap = {max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data};
  a.sq_sig_all = sq_sig_all;
  a.max_rd_atomic = max_rd_atomic;
  a.max_dest_rd_atomic = max_dest_rd_atomic;
  if (!srq.is_none()) {
    auto& s = srq.cast<py_srq&>();
    if (!s.srq) raise_error(errc::invalid_state, "create_qp: the SharedReceiveQueue was closed");
    a.srq = &s.srq;
  }
  auto qp = pd.cast<py_pd&>().get().create_qp(a);
  if (!qp) raise_error(qp.error());
  auto p = std::make_unique<py_qp>();
  p->qp = std::move(*qp);
  p->pd = std::move(pd);
  p->send_cq = std::move(send_cq);
  p->recv_cq = std::move(recv_cq);
  p->srq = std::move(srq);
  return p;
}

void bind_queue(py::module_& m) {
  py::enum_<wc_opcode>(m, "WcOpcode")
      .value("send", wc_opcode::send)
      .value("rdma_write", wc_opcode::rdma_write)
      .value("rdma_read", wc_opcode::rdma_read)
      .value("comp_swap", wc_opcode::comp_swap)
      .value("fetch_add", wc_opcode::fetch_add)
      .value("recv", wc_opcode::recv)
      .value("recv_rdma_with_imm", wc_opcode::recv_rdma_with_imm);

  py::enum_<wr_opcode>(m, "WrOpcode")
      .value("send", wr_opcode::send)
      .value("send_with_imm", wr_opcode::send_with_imm)
      .value("send_with_inv", wr_opcode::send_with_inv)
      .value("rdma_write", wr_opcode::rdma_write)
      .value("rdma_write_with_imm", wr_opcode::rdma_write_with_imm)
      .value("rdma_read", wr_opcode::rdma_read)
      .value("atomic_cmp_and_swp", wr_opcode::atomic_cmp_and_swp)
      .value("atomic_fetch_and_add", wr_opcode::atomic_fetch_and_add);

  py::enum_<qp_state>(m, "QpState")
      .value("reset", qp_state::reset)
      .value("init", qp_state::init)
      .value("rtr", qp_state::rtr)
      .value("rts", qp_state::rts)
      .value("error", qp_state::error);

  py::class_<work_completion>(m, "WorkCompletion", "One completion (conveyor::work_completion).")
      .def_readonly("wr_id", &work_completion::wr_id)
      .def_readonly("status", &work_completion::status)
      .def_readonly("opcode", &work_completion::opcode)
      .def_readonly("with_imm", &work_completion::with_imm)
      .def_readonly("with_inv", &work_completion::with_inv)
      .def_readonly("byte_len", &work_completion::byte_len)
      .def_readonly("imm_data", &work_completion::imm_data)
      .def_readonly("invalidated_rkey", &work_completion::invalidated_rkey)
      .def_readonly("qp_num", &work_completion::qp_num)
      .def_readonly("vendor_err", &work_completion::vendor_err)
      .def_property_readonly(
          "ok", [](const work_completion& wc) { return wc.status == wc_status::success; })
      .def("__repr__", &repr_wc);

  py::class_<py_cq>(m, "CompletionQueue",
                    "A completion queue. poll() never blocks; wait() releases the GIL; fd()/arm() "
                    "integrate with event loops (wait_async()). Thread-safe.")
      .def_property_readonly("depth", [](py_cq& c) { return c.get().depth(); })
      .def(
          "poll",
          [](py_cq& c, std::size_t max_entries) {
            if (!c.stash.empty()) return take_stash(c, max_entries);
            tl_wcs.resize(max_entries);
            auto r = c.get().poll(tl_wcs);
            if (!r) raise_error(r.error(), "CompletionQueue.poll");
            return to_list(std::span(tl_wcs.data(), *r));
          },
          py::arg("max_entries") = 16,
          "Up to max_entries completions, [] when empty (never blocks).")
      .def(
          "wait",
          [](py_cq& c, const py::object& timeout, std::size_t max_entries) {
            if (!c.stash.empty()) return take_stash(c, max_entries);
            auto& cq = c.get();
            use_guard in_use(c.users);
            std::vector<work_completion> wcs(std::max<std::size_t>(max_entries, 1));
            auto n = wait_released(cq, wcs, to_timeout(timeout));
            return to_list(std::span(wcs.data(), n));
          },
          py::arg("timeout") = py::none(), py::arg("max_entries") = 16,
          "Blocks (GIL released) until at least one completion is there, at most `timeout` seconds "
          "(None, the default: no bound); raises TimedOut. Ctrl-C (any signal handler that "
          "raises) ends the wait within 0.1 s. The same arguments as wait_async().")
      .def(
          "fd", [](py_cq& c) { return c.get().fd(); },
          "A descriptor that becomes readable after arm() once a completion arrives.")
      .def(
          "arm", [](py_cq& c) { c.get().arm(); }, "Requests one notification on fd().")
      .def(
          "close",
          [](py_cq& c) {
            if (c.users.load() > 0)
              raise_error(errc::invalid_state,
                          "CompletionQueue.close: another thread is waiting on the CQ");
            c.stash.clear();
            close_handle(c.cq, c.inherited());
          },
          "Releases the CQ now (idempotent). QPs that use it keep it alive until they are closed "
          "too; any other use of a closed CQ raises InvalidState.")
      .def_property_readonly("closed", [](const py_cq& c) { return !c.cq; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](py_cq& c, const py::args&) {
             if (c.users.load() == 0) {
               c.stash.clear();
               close_handle(c.cq, c.inherited());
             }
           })
      .def("__repr__", [](const py_cq& c) {
        if (!c.cq) return std::string("CompletionQueue(closed)");
        return "CompletionQueue(depth=" + std::to_string(c.cq.depth()) + ")";
      });

  py::class_<py_send_wr>(m, "SendWr", "A send work request (any opcode) for QueuePair.post_send().")
      .def(py::init([](wr_opcode opcode, const py::object& local,
                       const std::optional<remote_region>& remote, std::uint64_t wr_id,
                       std::uint32_t flags, std::uint32_t imm_data, std::uint32_t invalidate_rkey,
                       std::uint64_t compare_add, std::uint64_t swap) {
             auto w = std::make_unique<py_send_wr>();
             w->sgl = to_sgl(local);
             w->wr.wr_id = wr_id;
             w->wr.opcode = opcode;
             w->wr.flags = static_cast<send_flags>(flags);
             if (remote) {
               w->wr.remote_addr = remote->addr;
               w->wr.rkey = remote->rkey;
             }
             w->wr.imm_data = imm_data;
             w->wr.invalidate_rkey = invalidate_rkey;
             w->wr.compare_add = compare_add;
             w->wr.swap = swap;
             return w;
           }),
           py::arg("opcode") = wr_opcode::send, py::arg("local") = py::none(),
           py::arg("remote") = py::none(), py::arg("wr_id") = 0, py::arg("flags") = 1u,
           py::arg("imm_data") = 0, py::arg("invalidate_rkey") = 0, py::arg("compare_add") = 0,
           py::arg("swap") = 0,
           "local: an Sge, MemoryRegion, (MemoryRegion, offset, length) or a list of them; "
           "remote: a RemoteRegion (RDMA and atomics); flags: SendFlags (default signaled).")
      .def_property(
          "wr_id", [](const py_send_wr& w) { return w.wr.wr_id; },
          [](py_send_wr& w, std::uint64_t v) { w.wr.wr_id = v; })
      .def_property_readonly("opcode", [](const py_send_wr& w) { return w.wr.opcode; })
      .def_property(
          "flags", [](const py_send_wr& w) { return static_cast<std::uint32_t>(w.wr.flags); },
          [](py_send_wr& w, std::uint32_t v) { w.wr.flags = static_cast<send_flags>(v); })
      .def_property_readonly("sg_list", [](const py_send_wr& w) { return w.sgl; })
      .def_property_readonly("remote_addr", [](const py_send_wr& w) { return w.wr.remote_addr; })
      .def_property_readonly("rkey", [](const py_send_wr& w) { return w.wr.rkey; })
      .def_property_readonly("imm_data", [](const py_send_wr& w) { return w.wr.imm_data; });

  py::class_<py_recv_wr>(m, "RecvWr", "A receive work request for QueuePair.post_recv([...]).")
      .def(py::init([](const py::object& local, std::uint64_t wr_id) {
             auto w = std::make_unique<py_recv_wr>();
             w->sgl = to_sgl(local);
             w->wr_id = wr_id;
             return w;
           }),
           py::arg("local"), py::arg("wr_id") = 0)
      .def_readwrite("wr_id", &py_recv_wr::wr_id)
      .def_property_readonly("sg_list", [](const py_recv_wr& w) { return w.sgl; });

  py::class_<qp_caps>(m, "QpCaps")
      .def_readonly("max_send_wr", &qp_caps::max_send_wr)
      .def_readonly("max_recv_wr", &qp_caps::max_recv_wr)
      .def_readonly("max_send_sge", &qp_caps::max_send_sge)
      .def_readonly("max_recv_sge", &qp_caps::max_recv_sge)
      .def_readonly("max_inline_data", &qp_caps::max_inline_data);

  // A transport's part is None on the providers that do not fill it (qp.hpp).
  py::class_<iwarp_connection_attr>(m, "IwarpConnectionAttr",
                                    "iWARP (MPA over TCP) as negotiated by soft.")
      .def_readonly("mpa_revision", &iwarp_connection_attr::mpa_revision)
      .def_readonly("crc", &iwarp_connection_attr::crc)
      .def_readonly("mss", &iwarp_connection_attr::mss)
      .def_readonly("max_fpdu", &iwarp_connection_attr::max_fpdu)
      .def_readonly("rtr", &iwarp_connection_attr::rtr)
      .def_readonly("large_fpdus", &iwarp_connection_attr::large_fpdus);

  py::class_<shm_connection_attr>(m, "ShmConnectionAttr", "How an shm connection moves data.")
      .def_readonly("data_path", &shm_connection_attr::data_path)
      .def_readonly("direct_mapping", &shm_connection_attr::direct_mapping)
      .def_readonly("slot_payload", &shm_connection_attr::slot_payload);

  py::class_<verbs_connection_attr>(m, "VerbsConnectionAttr", "What rdma-core reports.")
      .def_readonly("path_mtu", &verbs_connection_attr::path_mtu)
      .def_readonly("port_mtu", &verbs_connection_attr::port_mtu);

  py::class_<qp_connection_attr>(m, "ConnectionAttr", "What a connection negotiated.")
      .def_readonly("local_address", &qp_connection_attr::local_address)
      .def_readonly("peer_address", &qp_connection_attr::peer_address)
      .def_readonly("ird", &qp_connection_attr::ird)
      .def_readonly("ord", &qp_connection_attr::ord)
      .def_readonly("extensions", &qp_connection_attr::extensions)
      .def_property_readonly("iwarp", [](const qp_connection_attr& a) { return a.iwarp; })
      .def_property_readonly("shm", [](const qp_connection_attr& a) { return a.shm; })
      .def_property_readonly("verbs", [](const qp_connection_attr& a) { return a.verbs; });

  py::class_<iwarp_qp_counters>(m, "IwarpQpCounters", "Counters of soft's iWARP transport.")
      .def_readonly("tx_fpdus", &iwarp_qp_counters::tx_fpdus)
      .def_readonly("rx_fpdus", &iwarp_qp_counters::rx_fpdus)
      .def_readonly("tx_stream_bytes", &iwarp_qp_counters::tx_stream_bytes)
      .def_readonly("rx_stream_bytes", &iwarp_qp_counters::rx_stream_bytes)
      .def_readonly("tx_syscalls", &iwarp_qp_counters::tx_syscalls)
      .def_readonly("rx_syscalls", &iwarp_qp_counters::rx_syscalls)
      .def_readonly("terminates_sent", &iwarp_qp_counters::terminates_sent)
      .def_readonly("terminates_received", &iwarp_qp_counters::terminates_received)
      .def_readonly("rx_direct_bytes", &iwarp_qp_counters::rx_direct_bytes);

  py::class_<shm_qp_counters>(m, "ShmQpCounters", "Counters of shm's rings.")
      .def_readonly("tx_slots", &shm_qp_counters::tx_slots)
      .def_readonly("rx_slots", &shm_qp_counters::rx_slots)
      .def_readonly("doorbells", &shm_qp_counters::doorbells)
      .def_readonly("direct_ops", &shm_qp_counters::direct_ops)
      .def_readonly("hints", &shm_qp_counters::hints);

  py::class_<qp_counters>(m, "QpCounters")
      .def_readonly("tx_bytes", &qp_counters::tx_bytes)
      .def_readonly("rx_bytes", &qp_counters::rx_bytes)
      .def_readonly("reads_served", &qp_counters::reads_served)
      .def_readonly("writes_placed", &qp_counters::writes_placed)
      .def_readonly("atomics_served", &qp_counters::atomics_served)
      .def_property_readonly("iwarp", [](const qp_counters& c) { return c.iwarp; })
      .def_property_readonly("shm", [](const qp_counters& c) { return c.shm; });

  py::class_<py_qp>(
      m, "QueuePair",
      "A reliable-connected queue pair. Posting never blocks: a full queue raises Again, "
      "a QP in ERROR QpInError. Usable as a context manager (closing on exit).")
      .def_property_readonly("qp_num", [](py_qp& q) { return q.get().qp_num(); })
      .def_property_readonly("state", [](py_qp& q) { return q.get().state(); })
      .def_property_readonly("caps", [](py_qp& q) { return q.get().caps(); })
      .def_readonly("pd", &py_qp::pd)
      .def_readonly("send_cq", &py_qp::send_cq)
      .def_readonly("recv_cq", &py_qp::recv_cq)
      .def_readonly("srq", &py_qp::srq, "The SharedReceiveQueue it draws receives from, or None.")
      .def(
          "post_send",
          [](py_qp& q, const py::object& wrs) {
            auto& qp = q.get();
            if (py::isinstance<py_send_wr>(wrs)) {
              auto& w = wrs.cast<py_send_wr&>();
              w.wr.sg_list = w.sgl;
              q.check_post(qp.post_send(w.wr), "post_send");
              return;
            }
            tl_send.clear();
            for (auto h : wrs) {
              auto& w = h.cast<py_send_wr&>();
              w.wr.sg_list = w.sgl;
              tl_send.push_back(w.wr);
            }
            std::size_t bad = 0;
            auto s = qp.post_send(tl_send, &bad);
            q.check_post(s, "post_send", bad);
          },
          py::arg("wrs"),
          "Posts a SendWr or a sequence of them with one doorbell. On failure the exception's "
          "context names the index of the first request not posted (those before it were posted).")
      .def(
          "post_recv",
          [](py_qp& q, const py::object& local, std::uint64_t wr_id) {
            post_recv_from_python(q.get(), local, wr_id);
          },
          py::arg("local"), py::arg("wr_id") = 0,
          "Posts one receive (local: Sge, MemoryRegion or (mr, offset, length)) or a list of "
          "RecvWr.")
      .def(
          "post_send_msg",
          [](py_qp& q, const py::object& local, std::uint64_t wr_id) {
            q.check_post(q.get().post_send_msg(to_sge(local), wr_id), "post_send_msg");
          },
          py::arg("local"), py::arg("wr_id") = 0, "Posts a signaled SEND of `local`.")
      .def(
          "post_write",
          [](py_qp& q, const py::object& local, const remote_region& remote, std::uint64_t wr_id) {
            q.check_post(q.get().post_write(to_sge(local), remote, wr_id), "post_write");
          },
          py::arg("local"), py::arg("remote"), py::arg("wr_id") = 0, "Posts a signaled RDMA WRITE.")
      .def(
          "post_read",
          [](py_qp& q, const py::object& local, const remote_region& remote, std::uint64_t wr_id) {
            q.check_post(q.get().post_read(to_sge(local), remote, wr_id), "post_read");
          },
          py::arg("local"), py::arg("remote"), py::arg("wr_id") = 0,
          "Posts a signaled RDMA READ into `local`.")
      .def(
          "post_fetch_add",
          [](py_qp& q, const py::object& result8, const remote_region& remote, std::uint64_t add,
             std::uint64_t wr_id) {
            q.check_post(q.get().post_fetch_add(to_sge(result8), remote, add, wr_id),
                         "post_fetch_add");
          },
          py::arg("result"), py::arg("remote"), py::arg("add"), py::arg("wr_id") = 0,
          "Atomic fetch-and-add on 8 aligned remote bytes; the old value lands in `result` (8 "
          "bytes).")
      .def(
          "post_cmp_swap",
          [](py_qp& q, const py::object& result8, const remote_region& remote,
             std::uint64_t compare, std::uint64_t swap, std::uint64_t wr_id) {
            q.check_post(q.get().post_cmp_swap(to_sge(result8), remote, compare, swap, wr_id),
                         "post_cmp_swap");
          },
          py::arg("result"), py::arg("remote"), py::arg("compare"), py::arg("swap"),
          py::arg("wr_id") = 0,
          "Atomic compare-and-swap on 8 aligned remote bytes; the old value lands in `result`.")
      .def(
          "read_into",
          [](py::object self, const py::object& local, const remote_region& remote,
             const py::object& timeout) {
            auto& q = self.cast<py_qp&>();
            std::unique_ptr<py_mr> tmp;
            sge s = helper_sge(q, local, true, tmp);
            send_wr wr;
            wr.opcode = wr_opcode::rdma_read;
            wr.sg_list = std::span(&s, 1);
            wr.remote_addr = remote.addr;
            wr.rkey = remote.rkey;
            return post_and_wait(self, wr, to_timeout(timeout), "read_into", tmp != nullptr);
          },
          py::arg("buffer"), py::arg("remote"), py::arg("timeout") = 5.0,
          "RDMA READ `remote` into `buffer` and wait for it (GIL released). buffer: a region, Sge, "
          "or any writable buffer (registered for the call). Raises CompletionError on a failed "
          "completion.")
      .def(
          "write_from",
          [](py::object self, const py::object& local, const remote_region& remote,
             const py::object& timeout) {
            auto& q = self.cast<py_qp&>();
            std::unique_ptr<py_mr> tmp;
            sge s = helper_sge(q, local, false, tmp);
            send_wr wr;
            wr.opcode = wr_opcode::rdma_write;
            wr.sg_list = std::span(&s, 1);
            wr.remote_addr = remote.addr;
            wr.rkey = remote.rkey;
            return post_and_wait(self, wr, to_timeout(timeout), "write_from", tmp != nullptr);
          },
          py::arg("buffer"), py::arg("remote"), py::arg("timeout") = 5.0,
          "RDMA WRITE `buffer` to `remote` and wait until the peer placed it (GIL released).")
      .def(
          "modify",
          [](py_qp& q, qp_state target) {
            auto r = q.get().modify(target);
            if (!r) raise_error(r.error());
          },
          py::arg("state"),
          "To ERROR (flushing everything), or from ERROR/INIT back to RESET/INIT.")
      .def(
          "connection",
          [](py_qp& q) {
            auto r = q.get().connection();
            if (!r) raise_error(r.error());
            return *r;
          },
          "The negotiated parameters (ConnectionAttr); InvalidState before the connection is up.")
      .def("counters", [](py_qp& q) { return q.get().counters(); })
      .def(
          "disconnect", [](py_qp& q) { q.get().disconnect(); },
          "Orderly close; outstanding requests flush.")
      .def(
          "close",
          [](py_qp& q) {
            if (q.users.load() > 0)
              raise_error(errc::invalid_state,
                          "QueuePair.close: another thread is using the QP (connect/accept/wait)");
            // A forked child's copy is the parent's connection: left alone.
            if (q.inherited()) return abandon(q.qp);
            // Taken out first (other threads see a closed QP), destroyed
            // without the GIL: the disconnect is bounded but may wait.
            queue_pair doomed = std::move(q.qp);
            py::gil_scoped_release nogil;
            doomed = queue_pair{};
          },
          "Disconnects (bounded) and destroys the QP now.")
      .def_property_readonly("closed", [](const py_qp& q) { return !q.qp; })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](py_qp& q, py::args) {
             if (q.inherited())
               abandon(q.qp);
             else if (q.users.load() == 0)
               q.qp = queue_pair{};
           })
      .def("__repr__", [](py_qp& q) {
        if (!q.qp) return std::string("QueuePair(closed)");
        return "QueuePair(qp_num=" + std::to_string(q.qp.qp_num()) +
               ", state=" + std::string(to_string(q.qp.state())) + ")";
      });
}

}  // namespace conveyor::python
