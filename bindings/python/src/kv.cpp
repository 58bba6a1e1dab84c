// bindings/python/src/kv.cpp — conveyor.kv: conveyor-kv's client
// (apps/kv/include/conveyor_kv/client.hpp) from Python. GET, MGET and the hash
// reads are one-sided READs (one READ of a remembered item; docs/KV.md), writes
// are RPCs. Keys, fields and values are bytes or str (UTF-8); values come back
// as bytes. The GIL is released while a call waits; one client serves one call
// at a time (a second thread's call waits for the first).
#include <mutex>

#include "bindings.hpp"
#include "conveyor_kv/client.hpp"

namespace conveyor::python {

namespace {

struct kv_client {
  std::unique_ptr<kv::client> c;  // null once closed
  std::mutex mu;                  // kv::client is thread-compatible: one call at a time
};

// bytes or str (UTF-8) as the bytes it names; anything else is a TypeError.
std::string to_key(const py::handle& o, const char* what) {
  if (py::isinstance<py::bytes>(o)) return o.cast<std::string>();
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  if (py::isinstance<py::bytearray>(o) || py::isinstance<py::memoryview>(o))
    return py::bytes(py::reinterpret_borrow<py::object>(o)).cast<std::string>();
  throw py::type_error(std::string(what) + " must be bytes or str");
}

template <class T>
T take(result<T> r) {
  if (!r) raise_error(r.error());
  return std::move(*r);
}

py::object optional_bytes(const std::optional<std::string>& v) {
  return v ? py::object(py::bytes(*v)) : py::object(py::none());
}

// Runs fn on the client with the GIL released, holding the client's lock
// (a close() from another thread waits for it, or comes first: InvalidState).
template <class Fn>
auto call(kv_client& self, Fn&& fn) -> decltype(fn(std::declval<kv::client&>())) {
  py::gil_scoped_release nogil;
  std::lock_guard lk(self.mu);
  if (!self.c) return make_error(errc::invalid_state, "conveyor.kv.Client: closed");
  return fn(*self.c);
}

void close(kv_client& self) {
  py::gil_scoped_release nogil;  // the disconnect is bounded but may wait
  std::lock_guard lk(self.mu);
  self.c.reset();
}

// conveyor.kv.ClusterClient: kv::cluster_client the same way.
struct kv_cluster_client {
  std::unique_ptr<kv::cluster_client> c;
  std::mutex mu;
};

template <class Fn>
auto call(kv_cluster_client& self, Fn&& fn) -> decltype(fn(std::declval<kv::cluster_client&>())) {
  py::gil_scoped_release nogil;
  std::lock_guard lk(self.mu);
  if (!self.c) return make_error(errc::invalid_state, "conveyor.kv.ClusterClient: closed");
  return fn(*self.c);
}

void close_cluster(kv_cluster_client& self) {
  py::gil_scoped_release nogil;
  std::lock_guard lk(self.mu);
  self.c.reset();
}

kv::client_options client_options_of(const std::string& password, std::uint32_t depth,
                                     double timeout, double max_clock_skew) {
  kv::client_options o;
  o.password = password;
  o.depth = depth;
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000));
  o.max_clock_skew = std::chrono::milliseconds(static_cast<std::int64_t>(max_clock_skew * 1000));
  return o;
}

void bind_cluster_client(py::module_& m) {
  py::class_<kv_cluster_client>(m, "ClusterClient")
      .def_static(
          "connect",
          [](const std::string& address, const std::string& provider, const std::string& password,
             std::uint32_t depth, double timeout, double max_clock_skew, bool replica_reads) {
            auto o = client_options_of(password, depth, timeout, max_clock_skew);
            o.replica_reads = replica_reads;
            auto r = [&] {
              py::gil_scoped_release nogil;
              return kv::cluster_client::connect(provider, address, o);
            }();
            auto k = std::make_unique<kv_cluster_client>();
            k->c = take(std::move(r));
            return k;
          },
          py::arg("address"), py::arg("provider") = "soft", py::arg("password") = "",
          py::arg("depth") = 16, py::arg("timeout") = 5.0, py::arg("max_clock_skew") = 0.1,
          py::arg("replica_reads") = false,
          "Learns a conveyor-kv cluster from any node's RDMA address (kv serve --cluster "
          "--rdma-listen) and sends each key to its slot's primary, its reads to the slot's "
          "replicas with replica_reads=True (READONLY's semantics; docs/KV-CLUSTER.md, "
          "\"One-sided clients in a cluster\").")
      .def(
          "get",
          [](kv_cluster_client& self, const py::object& key) {
            const auto k = to_key(key, "key");
            auto r = call(self, [&](kv::cluster_client& c) { return c.get(k); });
            return optional_bytes(take(std::move(r)));
          },
          py::arg("key"), "One-sided GET at the slot's primary: the value as bytes, or None.")
      .def(
          "mget",
          [](kv_cluster_client& self, const py::iterable& keys) {
            std::vector<std::string> ks;
            for (auto k : keys) ks.push_back(to_key(k, "key"));
            std::vector<std::string_view> views(ks.begin(), ks.end());
            auto r = call(self, [&](kv::cluster_client& c) { return c.mget(views); });
            py::list out;
            if (!r) raise_error(r.error());
            for (auto& v : *r) out.append(optional_bytes(v));
            return out;
          },
          py::arg("keys"), "One-sided GETs, split by node.")
      .def(
          "set",
          [](kv_cluster_client& self, const py::object& key, const py::object& value) {
            const auto k = to_key(key, "key"), v = to_key(value, "value");
            auto r = call(self, [&](kv::cluster_client& c) { return c.set(k, v); });
            if (!r) raise_error(r.error());
          },
          py::arg("key"), py::arg("value"))
      .def(
          "delete",
          [](kv_cluster_client& self, const py::object& key) {
            const auto k = to_key(key, "key");
            auto r = call(self, [&](kv::cluster_client& c) { return c.del(k); });
            return take(std::move(r));
          },
          py::arg("key"), "DEL: whether the key existed.")
      .def(
          "incr",
          [](kv_cluster_client& self, const py::object& key, std::int64_t by) {
            const auto k = to_key(key, "key");
            auto r = call(self, [&](kv::cluster_client& c) { return c.incr(k, by); });
            return take(std::move(r));
          },
          py::arg("key"), py::arg("by") = 1)
      .def(
          "command",
          [](kv_cluster_client& self, const py::object& key, const py::args& args) {
            const auto k = to_key(key, "key");
            std::vector<std::string> a;
            for (auto x : args) a.push_back(to_key(x, "argument"));
            std::vector<std::string_view> views(a.begin(), a.end());
            auto r = call(self, [&](kv::cluster_client& c) { return c.command(k, views); });
            return py::bytes(take(std::move(r)));
          },
          py::arg("key"), "Any command, sent to the primary of `key`'s slot; the raw reply.")
      .def("stats",
           [](kv_cluster_client& self) {
             auto r = call(self, [](kv::cluster_client& c) -> result<kv::cluster_client_stats> {
               return c.stats();
             });
             const auto s = take(std::move(r));
             py::dict d;
             d["epoch"] = s.epoch;
             d["map_reads"] = s.map_reads;
             d["stale_epochs"] = s.stale_epochs;
             d["moved"] = s.moved;
             d["retries"] = s.retries;
             d["nodes_connected"] = s.nodes_connected;
             d["replica_reads"] = s.replica_reads;
             return d;
           })
      .def("close", &close_cluster, "Disconnects from every node. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](kv_cluster_client& self, const py::args&) { close_cluster(self); });
}

}  // namespace

void bind_kv(py::module_& top) {
  auto m = top.def_submodule("kv", "conveyor-kv's client (conveyor.kv)");
  py::class_<kv_client>(m, "Client")
      .def_static(
          "connect",
          [](const std::string& address, std::optional<std::string> provider,
             const std::string& password, std::uint32_t depth, double timeout,
             std::size_t location_cache, double max_clock_skew) {
            auto o = client_options_of(password, depth, timeout, max_clock_skew);
            o.location_cache = location_cache;
            const std::string dev =
                provider ? *provider : std::string(kv::provider_for_address(address));
            auto r = [&] {
              py::gil_scoped_release nogil;
              return kv::client::connect(dev, address, o);
            }();
            auto k = std::make_unique<kv_client>();
            k->c = take(std::move(r));
            return k;
          },
          py::arg("address"), py::arg("provider") = py::none(), py::arg("password") = "",
          py::arg("depth") = 16, py::arg("timeout") = 5.0,
          py::arg("location_cache") = std::size_t{1} << 20, py::arg("max_clock_skew") = 0.1,
          "Connects to `kv serve --rdma-listen ADDRESS` (host:port over soft, @name "
          "over shm; provider names another, e.g. verbs). max_clock_skew (seconds): against "
          "a cluster node, how far this host's clock may be from the node's.")
      .def(
          "get",
          [](kv_client& self, const py::object& key) {
            const auto k = to_key(key, "key");
            auto r = call(self, [&](kv::client& c) { return c.get(k); });
            return optional_bytes(take(std::move(r)));
          },
          py::arg("key"), "One-sided GET: the value as bytes, or None.")
      .def(
          "mget",
          [](kv_client& self, const py::iterable& keys) {
            std::vector<std::string> ks;
            for (auto k : keys) ks.push_back(to_key(k, "key"));
            std::vector<std::string_view> views(ks.begin(), ks.end());
            auto r = call(self, [&](kv::client& c) { return c.mget(views); });
            py::list out;
            if (!r) raise_error(r.error());
            for (auto& v : *r) out.append(optional_bytes(v));
            return out;
          },
          py::arg("keys"), "One-sided GETs of many keys, READs in flight together.")
      .def(
          "hget",
          [](kv_client& self, const py::object& key, const py::object& field) {
            const auto k = to_key(key, "key"), f = to_key(field, "field");
            auto r = call(self, [&](kv::client& c) { return c.hget(k, f); });
            return optional_bytes(take(std::move(r)));
          },
          py::arg("key"), py::arg("field"))
      .def(
          "hmget",
          [](kv_client& self, const py::object& key, const py::iterable& fields) {
            const auto k = to_key(key, "key");
            std::vector<std::string> fs;
            for (auto f : fields) fs.push_back(to_key(f, "field"));
            std::vector<std::string_view> views(fs.begin(), fs.end());
            auto r = call(self, [&](kv::client& c) { return c.hmget(k, views); });
            py::list out;
            if (!r) raise_error(r.error());
            for (auto& v : *r) out.append(optional_bytes(v));
            return out;
          },
          py::arg("key"), py::arg("fields"))
      .def(
          "hgetall",
          [](kv_client& self, const py::object& key) {
            const auto k = to_key(key, "key");
            auto r = call(self, [&](kv::client& c) { return c.hgetall(k); });
            py::dict out;
            if (!r) raise_error(r.error());
            for (auto& [f, v] : *r) out[py::bytes(f)] = py::bytes(v);
            return out;
          },
          py::arg("key"), "The hash's fields and values ({} for no key).")
      .def(
          "set",
          [](kv_client& self, const py::object& key, const py::object& value) {
            const auto k = to_key(key, "key"), v = to_key(value, "value");
            auto r = call(self, [&](kv::client& c) { return c.set(k, v); });
            if (!r) raise_error(r.error());
          },
          py::arg("key"), py::arg("value"))
      .def(
          "delete",
          [](kv_client& self, const py::object& key) {
            const auto k = to_key(key, "key");
            auto r = call(self, [&](kv::client& c) { return c.del(k); });
            return take(std::move(r));
          },
          py::arg("key"), "DEL: whether the key existed.")
      .def(
          "incr",
          [](kv_client& self, const py::object& key, std::int64_t by) {
            const auto k = to_key(key, "key");
            auto r = call(self, [&](kv::client& c) { return c.incr(k, by); });
            return take(std::move(r));
          },
          py::arg("key"), py::arg("by") = 1)
      .def(
          "expire",
          [](kv_client& self, const py::object& key, double seconds) {
            const auto k = to_key(key, "key");
            const auto ms = std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
            auto r = call(self, [&](kv::client& c) { return c.expire(k, ms); });
            return take(std::move(r));
          },
          py::arg("key"), py::arg("seconds"))
      .def(
          "command",
          [](kv_client& self, const py::args& args) {
            std::vector<std::string> a;
            for (auto x : args) a.push_back(to_key(x, "argument"));
            std::vector<std::string_view> views(a.begin(), a.end());
            auto r = call(self, [&](kv::client& c) { return c.command(views); });
            return py::bytes(take(std::move(r)));
          },
          "Any command as an RPC; the raw RESP reply as bytes.")
      .def("stats",
           [](kv_client& self) {
             auto r =
                 call(self, [](kv::client& c) -> result<kv::client_stats> { return c.stats(); });
             const auto s = take(std::move(r));
             py::dict d;
             d["gets"] = s.gets;
             d["hits"] = s.hits;
             d["reads"] = s.reads;
             d["retries"] = s.retries;
             d["one_read"] = s.one_read;
             d["stale_cache"] = s.stale_cache;
             d["doorbells"] = s.doorbells;
             d["rounds"] = py::make_tuple(s.rounds[0], s.rounds[1], s.rounds[2], s.rounds[3]);
             d["hash_one_sided"] = s.hash_one_sided;
             d["hash_rpc_reads"] = s.hash_rpc_reads;
             d["header_reads"] = s.header_reads;
             d["acked_waits"] = s.acked_waits;
             d["lease_refusals"] = s.lease_refusals;
             return d;
           })
      .def("close", &close, "Disconnects; later calls raise InvalidState. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](kv_client& self, const py::args&) { close(self); });
  bind_cluster_client(m);
}

}  // namespace conveyor::python
