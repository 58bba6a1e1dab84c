// The coordination client (apps/kv/src/cluster/etcd.*) with no etcd and
// against a fake one: a loopback listener that answers each request with bytes
// a case chooses (not HTTP, not JSON, wrong types, too large, never), to show
// that every reply is checked and every wait is bounded.
#include "etcd_fixture.hpp"

namespace {

// ---------------------------------------------------------------- bounded failure

TEST(etcd_failure, no_etcd_is_an_error_within_the_timeout) {
  dead_port a, b;
  auto c = etcd_coord::open({.endpoints = {a.endpoint(), b.endpoint()},
                             .connect_timeout = 200ms,
                             .request_timeout = 300ms});
  ASSERT_TRUE(c.has_value());
  const auto start = steady::now();
  auto r = (*c)->get("k");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::connection_refused) << r.error().to_string();
  EXPECT_NE(r.error().context.find("all 2 etcd endpoints failed"), std::string::npos)
      << r.error().context;
  auto w = (*c)->watch_prefix("k", 0, 300ms);
  ASSERT_FALSE(w.has_value());
  EXPECT_LT(steady::now() - start, 2s);
}

// A loopback listener that answers every request with reply(request), or, if
// reply returns nullopt, reads and never answers. Connections are served one at a time.
class fake_server {
 public:
  using handler = std::function<std::optional<std::string>(const std::string& request)>;
  explicit fake_server(handler h) : handler_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "fake server: no listener";
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_server() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string endpoint() const { return loopback(port_); }
  int requests() const { return requests_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int conn = ::accept(fd_, nullptr, nullptr);
      if (conn < 0) continue;
      std::string req;
      char buf[4096];
      // Read the headers and the body (Content-Length), bounded in time.
      const auto until = steady::now() + 2s;
      while (!stop_ && steady::now() < until) {
        auto hdr_end = req.find("\r\n\r\n");
        if (hdr_end != std::string::npos) {
          auto cl = req.find("Content-Length: ");
          std::size_t want = cl == std::string::npos ? 0 : std::stoul(req.substr(cl + 16));
          if (req.size() >= hdr_end + 4 + want) break;
        }
        pollfd q{conn, POLLIN, 0};
        if (::poll(&q, 1, 20) <= 0) continue;
        auto n = ::read(conn, buf, sizeof buf);
        if (n <= 0) break;
        req.append(buf, static_cast<std::size_t>(n));
      }
      ++requests_;
      auto reply = handler_(req);
      if (reply) {
        for (std::size_t off = 0; off < reply->size();) {
          auto w = ::send(conn, reply->data() + off, reply->size() - off, MSG_NOSIGNAL);
          if (w <= 0) break;
          off += static_cast<std::size_t>(w);
        }
      } else {
        while (!stop_) {  // silent: hold the connection until the client gives up
          pollfd q{conn, POLLIN, 0};
          if (::poll(&q, 1, 20) > 0 && ::read(conn, buf, sizeof buf) <= 0) break;
        }
      }
      ::close(conn);
    }
  }

  handler handler_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

std::string http(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// Everything a fake server answering `reply` makes get() return.
conveyor::error get_error(const std::string& reply, std::size_t cap = std::size_t{1} << 20) {
  fake_server s([&](const std::string&) { return reply; });
  auto c = etcd_coord::open(
      {.endpoints = {s.endpoint()}, .request_timeout = 1s, .max_reply_bytes = cap});
  EXPECT_TRUE(c.has_value());
  auto r = (*c)->get("k");
  EXPECT_FALSE(r.has_value()) << reply.substr(0, 200);
  return r ? conveyor::error{} : r.error();
}

TEST(etcd_failure, a_silent_server_times_out_within_the_bound) {
  fake_server s([](const std::string&) { return std::nullopt; });
  auto c = etcd_coord::open({.endpoints = {s.endpoint()}, .request_timeout = 300ms});
  ASSERT_TRUE(c.has_value());
  auto start = steady::now();
  auto r = (*c)->get("k");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::timed_out) << r.error().to_string();
  EXPECT_LT(steady::now() - start, 1500ms);
  // A write that may have arrived is not sent again elsewhere.
  fake_server other([](const std::string&) { return http(200, R"({"header":{"revision":"9"}})"); });
  auto two =
      etcd_coord::open({.endpoints = {s.endpoint(), other.endpoint()}, .request_timeout = 300ms});
  auto p = (*two)->put("k", "v");
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().code, errc::timed_out);
  EXPECT_EQ(other.requests(), 0);
  // A read is.
  auto g = (*two)->get("k");
  EXPECT_TRUE(g.has_value()) << g.error().to_string();
  EXPECT_EQ(other.requests(), 1);
}

TEST(etcd_failure, replies_that_are_not_http_or_not_json_are_protocol_errors) {
  EXPECT_EQ(get_error("garbage\r\n\r\n").code, errc::protocol_error);
  EXPECT_EQ(get_error(std::string(5000, '\x80')).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, "not json")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, "")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, "[1,2]")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(200, std::string(100000, '[') + std::string(100000, ']'))).code,
            errc::protocol_error);
  EXPECT_EQ(get_error(http(500, "<html>oops</html>")).code, errc::protocol_error);
  EXPECT_EQ(get_error(http(302, "")).code, errc::protocol_error);
  auto e = get_error(http(200, "{\"header\":"));
  EXPECT_NE(e.context.find("etcd http://127.0.0.1:"), std::string::npos)
      << e.context;  // names the endpoint
}

TEST(etcd_failure, fields_of_the_wrong_type_are_protocol_errors) {
  for (
      const char* body : {
          R"({})",                                              // no header
          R"({"header":[]})",                                   // header not an object
          R"({"header":{"revision":true}})",                    // int64 as bool
          R"({"header":{"revision":"12x"}})",                   // int64 with junk
          R"({"header":{"revision":"99999999999999999999"}})",  // int64 overflow
          R"({"header":{"revision":1.5}})",                     // int64 as float
          R"({"header":{"revision":"1"},"kvs":"x"})",           // kvs not an array
          R"({"header":{"revision":"1"},"kvs":[7]})",           // kv not an object
          R"({"header":{"revision":"1"},"kvs":[{"key":"!!","mod_revision":"1"}]})",  // bad base64
          R"({"header":{"revision":"1"},"kvs":[{"key":"aw==","value":5,"mod_revision":"1"}]})",
          R"({"header":{"revision":"1"},"kvs":[{"key":"aw=="}]})",  // no mod_revision
          R"({"header":{"revision":"1"},"kvs":[{"value":"aw==","mod_revision":"1"}]})",  // no key
          R"({"header":{"revision":"1"},"kvs":[{"key":"aw==","mod_revision":"1"},{"key":"aw==","mod_revision":"1"}]})",
      }) {
    auto e = get_error(http(200, body));
    EXPECT_EQ(e.code, errc::protocol_error) << body << ": " << e.to_string();
  }
}

TEST(etcd_failure, etcds_own_errors_keep_their_meaning) {
  auto e = get_error(http(
      404,
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})"));
  EXPECT_EQ(e.code, errc::not_found);
  EXPECT_NE(e.context.find("requested lease not found"), std::string::npos) << e.context;
  EXPECT_EQ(
      get_error(http(400, R"({"error":"x","message":"etcdserver: key is not provided","code":3})"))
          .code,
      errc::invalid_argument);
  EXPECT_EQ(get_error(http(400, R"({"error":"x","message":7,"code":"3"})")).code,
            errc::protocol_error);
}

TEST(etcd_failure, an_oversized_reply_is_cut_off) {
  // Announced as too large, and too large with no length announced.
  auto e = get_error(
      http(200, "{\"header\":{\"revision\":\"1\"},\"x\":\"" + std::string(200000, 'a') + "\"}"),
      64 << 10);
  EXPECT_EQ(e.code, errc::protocol_error);
  std::string unannounced =
      "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + std::string(200000, ' ');
  e = get_error(unannounced, 64 << 10);
  EXPECT_EQ(e.code, errc::protocol_error);
  EXPECT_NE(e.context.find("larger than 65536"), std::string::npos) << e.context;
}

TEST(etcd_failure, replies_to_writes_and_leases_are_checked) {
  auto one = [](const std::string& body) {
    return std::make_unique<fake_server>([body](const std::string&) { return http(200, body); });
  };
  auto open = [](fake_server& s) {
    return etcd_coord::open({.endpoints = {s.endpoint()}, .request_timeout = 1s}).value();
  };
  {
    auto s = one(R"({"header":{"revision":"0"}})");  // a put without a revision
    EXPECT_EQ(code_of(open(*s)->put("k", "v")), errc::protocol_error);
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"succeeded":true})");  // no responses
    EXPECT_EQ(code_of(open(*s)->put_if("k", "v", 3)), errc::protocol_error);
  }
  {
    auto s = one(
        R"({"header":{"revision":"5"},"responses":[{"response_range":{"kvs":[{"key":"b3RoZXI=","mod_revision":"2"}]}}]})");
    EXPECT_EQ(code_of(open(*s)->put_if("k", "v", 3)), errc::protocol_error);  // another key
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"deleted":"7"})");
    EXPECT_EQ(code_of(open(*s)->del("k")), errc::protocol_error);
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"ID":"12"})");  // a grant without TTL
    EXPECT_EQ(code_of(open(*s)->grant_lease(3s)), errc::protocol_error);
  }
  {
    auto s = one(R"({"header":{"revision":"5"},"ID":"12","TTL":"3","error":"no"})");
    EXPECT_EQ(code_of(open(*s)->grant_lease(3s)), errc::protocol_error);
  }
  {
    auto s = one("{\"result\":{\"header\":{\"revision\":\"5\"},\"ID\":\"13\",\"TTL\":\"3\"}}\n");
    EXPECT_EQ(code_of(open(*s)->keep_alive(12)), errc::protocol_error);  // another lease
  }
  {
    auto s = one("{\"result\":{\"header\":{\"revision\":\"5\"},\"ID\":\"12\",\"TTL\":\"3\"}}\n");
    EXPECT_EQ(open(*s)->keep_alive(12).value(), 3s);
  }
  {
    auto s = one("");  // a stream that ends with nothing in it
    EXPECT_EQ(code_of(open(*s)->keep_alive(12)), errc::protocol_error);
  }
}

TEST(etcd_failure, watch_streams_are_checked_line_by_line) {
  auto one = [](const std::string& body) {
    return std::make_unique<fake_server>([body](const std::string&) { return http(200, body); });
  };
  auto watch = [](fake_server& s) {
    auto c = etcd_coord::open({.endpoints = {s.endpoint()}, .max_reply_bytes = 4096}).value();
    return c->watch_prefix("p/", 10, 1s);
  };
  const std::string created = "{\"result\":{\"header\":{\"revision\":\"12\"},\"created\":true}}\n";
  {
    auto s = one(created +
                 "{\"result\":{\"header\":{},\"canceled\":true,\"compact_revision\":\"11\"}}\n");
    auto w = watch(*s);
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    EXPECT_EQ(w->compact_revision, 11);
    EXPECT_TRUE(w->events.empty());
  }
  {
    auto s = one(created +
                 "{\"result\":{\"header\":{\"revision\":\"12\"},\"events\":[{\"type\":\"DELETE\","
                 "\"kv\":{\"key\":\"cC94\",\"mod_revision\":\"12\"}}]}}\n");
    auto w = watch(*s);
    ASSERT_TRUE(w.has_value()) << w.error().to_string();
    ASSERT_EQ(w->events.size(), 1u);
    EXPECT_EQ(w->events[0].type, watch_event::kind::del);
    EXPECT_EQ(w->events[0].kv.key, "p/x");
    EXPECT_EQ(w->next_revision, 13);
  }
  for (const std::string& bad : {
           created + "not json\n",
           created + "{\"result\":{\"events\":[{\"type\":\"EXPLODE\",\"kv\":{\"key\":\"cC94\","
                     "\"mod_revision\":\"12\"}}]}}\n",
           created + "{\"result\":{\"events\":[{\"kv\":{\"key\":\"cS94\",\"mod_revision\":\"12\"}}]"
                     "}}\n",  // q/x: outside
           created + "{\"result\":{\"events\":[{\"kv\":{\"key\":\"cC94\",\"mod_revision\":\"3\"}}]}"
                     "}\n",  // before 10
           created + "{\"result\":{\"events\":{}}}\n",
           created + std::string(10000, 'x'),  // a line longer than the bound
           std::string(
               "{\"result\":{\"header\":{\"revision\":\"12\"}}}\n"),  // ends before "created"
       }) {
    auto s = one(bad);
    auto w = watch(*s);
    ASSERT_FALSE(w.has_value()) << bad.substr(0, 160);
    EXPECT_EQ(w.error().code, errc::protocol_error) << w.error().to_string();
  }
  {
    auto s = one(created + "{\"error\":{\"grpc_code\":14,\"message\":\"no leader\"}}\n");
    auto w = watch(*s);
    ASSERT_FALSE(w.has_value());
    EXPECT_EQ(w.error().code, errc::rejected) << w.error().to_string();
  }
}

}  // namespace
