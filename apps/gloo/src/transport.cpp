// transport.cpp — conveyor-gloo: gloo::transport over Conveyor's public API.
//
// One RC queue pair per Gloo pair. Every message is a SEND into one of the
// peer's staging receives (credit flow control); payloads up to the staging
// size travel in it (one copy each side), larger ones are RDMA-written straight
// from the sender's buffer into the receiver's (both registered for that one
// operation only, so freed or remapped memory is never reached through a stale
// key). Data moves only once the receiver said it is ready (RTR), as in Gloo's
// TCP transport, so nothing is ever buffered unexpectedly. docs/GLOO.md.
#include "conveyor_gloo/transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/transport/address.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>
#include <conveyor/conveyor.hpp>

#include "auth.hpp"
#include "wire.hpp"

namespace conveyor_gloo {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t staging_size = 64 * 1024;                      // one receive / send slot
constexpr std::size_t eager_max = staging_size - wire::header_size;  // larger: RDMA WRITE
constexpr std::uint32_t recv_depth = 32;  // receives (= credits) per pair
// How long destroying a buffer waits for a peer to withdraw its RTRs or for a
// send from it to finish (Context::cancel); capped by the context's timeout.
constexpr std::chrono::milliseconds cancel_wait_max{1000};
constexpr std::uint32_t sq_depth = 512;
constexpr std::size_t write_chunk = 4u << 20;  // one WRITE's length at most
constexpr std::size_t max_peer_entries =
    1u << 16;  // RTRs / notifications / announcements a peer may park
// A pair's listener expects one peer: complete connection requests beyond
// this many wait for accept() are refused ("listener busy"; the real peer
// retries). Half-open ones are bounded by the device (max_pending_handshakes,
// handshake_timeout_ms).
constexpr int listen_backlog = 16;
constexpr std::uint32_t max_half_open = 64;
// Refused connections a pair's listener logs one line each for; later ones
// are counted and reported once the pair connects.
constexpr unsigned max_refusals_logged = 8;

enum class wr_kind : std::uint64_t { send = 1, recv = 2, write = 3 };
std::uint64_t make_wr(wr_kind k, std::uint64_t idx) {
  return (std::uint64_t(k) << 56) | idx;
}

std::string forced_from_env(const std::string& given) {
  if (!given.empty()) return given;
  const char* e = std::getenv("CONVEYOR_GLOO_DEVICE");
  return e ? std::string(e) : std::string();
}

void read_host_id(std::uint8_t out[24]) {
  std::memset(out, 0, 24);
  int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[64] = {};
    auto n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    for (ssize_t i = 0, j = 0; i < n && j < 16; ++i) {
      char c = buf[i];
      int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
      if (v < 0) continue;
      out[j / 2] = std::uint8_t(out[j / 2] | (v << ((j % 2) ? 0 : 4)));
      ++j;
      if (j == 32) break;
    }
  }
  struct stat st {};
  if (::stat("/proc/self/ns/net", &st) == 0) {
    std::uint64_t ino = st.st_ino;
    std::memcpy(out + 16, &ino, 8);
  }
}

bool is_loopback(const in_addr& a) {
  return (ntohl(a.s_addr) >> 24) == 127;
}

std::string ntop(const in_addr& a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, ip, sizeof ip);
  return ip;
}

// The IPv4 address of interface `name`, or of the first up, non-loopback
// interface when `name` is empty; nullopt if there is none.
std::optional<in_addr> interface_ipv4(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<in_addr> found;
  for (auto* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    auto a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if (name.empty()) {
      if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0 || is_loopback(a))
        continue;
    } else if (name != i->ifa_name) {
      continue;
    }
    found = a;
  }
  ::freeifaddrs(list);
  return found;
}

// The address this device's soft and verbs listeners bind and advertise, as
// Gloo's TCP transport and torch choose it: the interface(s) named (a comma-
// separated list, as GLOO_SOCKET_IFNAME takes: the first one with an IPv4
// address), else the host name given, else this host's name. A name (not a
// numeric address) that resolves to loopback, as a stock Debian host's own
// name does (127.0.1.1 in /etc/hosts), would be advertised to peers on other
// hosts, which cannot reach it: the first up, non-loopback interface's
// address is taken instead when there is one.
std::string choose_ipv4(const std::string& iface, const std::string& host) {
  if (!iface.empty()) {
    std::string tried;
    std::size_t pos = 0;
    while (pos <= iface.size()) {
      auto end = std::min(iface.find(',', pos), iface.size());
      std::string name = iface.substr(pos, end - pos);
      pos = end + 1;
      if (name.empty()) continue;
      if (auto a = interface_ipv4(name)) return ntop(*a);
      tried += (tried.empty() ? "" : ", ") + name;
    }
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: no IPv4 address on interface(s) '",
                                           tried.empty() ? iface : tried,
                                           "' (GLOO_SOCKET_IFNAME or attr.iface)");
  }
  std::string name = host;
  if (name.empty()) {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "127.0.0.1";
    name = buf;
  }
  in_addr literal{};
  if (::inet_pton(AF_INET, name.c_str(), &literal) == 1) return name;  // as given
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    GLOO_THROW_IO_EXCEPTION("conveyor-gloo: cannot resolve host '", name, "'");
  }
  auto a = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  if (is_loopback(a))
    if (auto other = interface_ipv4("")) return ntop(*other);
  return ntop(a);
}

// Whether "ip:port" names a loopback address.
bool loopback_target(const std::string& target) {
  in_addr a{};
  auto ip = target.substr(0, target.rfind(':'));
  return ::inet_pton(AF_INET, ip.c_str(), &a) == 1 && is_loopback(a);
}

// The uid a process runs as (the owner of /proc/<pid>), or nullopt when its
// pid is unknown or not visible from here (another pid namespace).
std::optional<uid_t> uid_of_pid(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) return std::nullopt;
  return st.st_uid;
}

// shm names its peers "pid <pid> qp <qpn>" (SO_PEERCRED's pid): 0 if not that.
pid_t shm_peer_pid(const std::string& peer) {
  unsigned long pid = 0, qpn = 0;
  if (std::sscanf(peer.c_str(), "pid %lu qp %lu", &pid, &qpn) != 2 || pid > 0x7fffffff) return 0;
  return pid_t(pid);
}

// ---------------------------------------------------------------------------
// Completion state of one unbound buffer, shared with the operations in flight
// so a completion arriving after the buffer is gone touches nothing freed.
struct buf_state {
  std::mutex m;
  std::condition_variable cv;
  int recv_completions = 0, recv_rank = -1;
  int send_completions = 0, send_rank = -1;
  bool abort_recv = false, abort_send = false;
  std::exception_ptr ex;
  std::string recv_from, send_to;  // for messages: the ranks of the last operation

  void recv_done(int rank) {
    std::lock_guard g(m);
    ++recv_completions;
    recv_rank = rank;
    cv.notify_all();
  }
  void send_done(int rank) {
    std::lock_guard g(m);
    ++send_completions;
    send_rank = rank;
    cv.notify_all();
  }
  void fail(const std::string& msg) {
    std::lock_guard g(m);
    if (!ex) ex = std::make_exception_ptr(::gloo::IoException(msg));
    cv.notify_all();
  }
};

const bool g_trace = std::getenv("CONVEYOR_GLOO_TRACE") != nullptr;
void trace(const char* dir, int self, int peer, const wire::header& h) {
  if (!g_trace) return;
  std::fprintf(stderr,
               "[cvgloo %d %s %d] type %d flags %d slot %llx token %llu nbytes %llu credits %u\n",
               self, dir, peer, int(h.type), int(h.flags), (unsigned long long)h.slot,
               (unsigned long long)h.token, (unsigned long long)h.nbytes, h.credits);
}

void drop(conveyor::memory_region& mr) {
  if (mr) mr.deregister();
}

struct send_op {
  std::shared_ptr<buf_state> st;
  const std::byte* ptr = nullptr;
  std::size_t nbytes = 0;
  std::uint64_t slot = 0;
  conveyor::memory_region mr;  // large sends: the source, for this operation only
};

struct recv_op {
  std::shared_ptr<buf_state> st;
  std::byte* ptr = nullptr;
  bool cancelled = false;  // the buffer is gone: arriving data is dropped, the RTR withdrawn
  std::size_t nbytes = 0;
  std::uint64_t slot = 0;
  conveyor::memory_region mr;  // large receives: the target, for this operation only
};

struct rtr_info {
  std::uint64_t token = 0, nbytes = 0, addr = 0;
  std::uint32_t rkey = 0;
};

struct bound_recv {
  std::uint64_t slot = 0;
  std::byte* ptr = nullptr;
  std::size_t size = 0;
  conveyor::memory_region mr;
  int completions = 0;
};

struct bound_send {
  int pending = 0;
};

// One message to post: optional RDMA WRITE(s) first, then the SEND with `h`.
struct out_item {
  wire::header h;
  const std::byte* payload = nullptr;
  std::size_t payload_len = 0;
  std::uint32_t write_lkey = 0;
  std::uint64_t write_src = 0;
  std::size_t write_len = 0;
  std::uint64_t write_dst = 0;
  std::uint32_t write_rkey = 0;
  std::shared_ptr<send_op> op;        // completes with this SEND
  std::shared_ptr<bound_send> bsend;  // likewise, for a bound buffer
};

struct staging_meta {
  std::shared_ptr<send_op> op;
  std::shared_ptr<bound_send> bsend;
};

class Device;
class Context;
class Pair;

class Address final : public ::gloo::transport::Address {
 public:
  explicit Address(wire::address a) : a_(std::move(a)) {}
  std::string str() const override {
    std::ostringstream o;
    o << "conveyor[rank " << a_.rank;
    if (!a_.shm.empty()) o << " shm " << a_.shm;
    if (!a_.soft.empty()) o << " soft " << a_.soft;
    if (!a_.verbs.empty()) o << " verbs " << a_.verbs;
    o << "]";
    return o.str();
  }
  std::vector<char> bytes() const override { return wire::encode(a_); }
  const wire::address& value() const { return a_; }

 private:
  wire::address a_;
};

// ---------------------------------------------------------------------------
class Device final : public ::gloo::transport::Device, public std::enable_shared_from_this<Device> {
 public:
  struct provider {
    std::string kind;  // soft, shm, verbs
    conveyor::device dev;
    conveyor::protection_domain pd;
  };

  explicit Device(const attr& a) : forced_(forced_from_env(a.device)) {
    read_host_id(host_id_);
    std::string base = forced_.substr(0, forced_.find(':'));
    if (!forced_.empty() && base != "soft" && base != "shm" && base != "verbs")
      GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: CONVEYOR_GLOO_DEVICE='", forced_,
                                             "': expected soft, shm or verbs[:name]");
    forced_base_ = base;
    if (base.empty() || base == "soft" || base == "verbs") {
      // torch passes the interface (GLOO_SOCKET_IFNAME, split at commas by
      // torch itself) or a host name; C++ programs that give neither get
      // GLOO_SOCKET_IFNAME's choice too.
      std::string iface = a.iface;
      const char* env = std::getenv("GLOO_SOCKET_IFNAME");
      if (iface.empty() && a.hostname.empty() && env != nullptr) iface = env;
      ip_ = choose_ipv4(iface, a.hostname);
    }
    conveyor::device_options opts;
    opts.handshake_timeout_ms = 30000;
    opts.max_pending_handshakes = max_half_open;
    // The pair's progress thread sleeps in cq.wait between bursts; a parked
    // engine thread would then resume only after its 1 ms grace period, which
    // put a millisecond on every small message.
    opts.engine_park = false;
    // cq.wait busy-polls this long before sleeping (CONVEYOR_GLOO_SPIN_US).
    if (const char* sp = std::getenv("CONVEYOR_GLOO_SPIN_US"))
      opts.spin_us = std::uint32_t(std::atoi(sp));
    // The pairs' progress threads drive the engine themselves (manual
    // progress): one thread hand-off less per message each side (4 KiB
    // all_reduce over soft, 2 ranks: 1.5 ms -> 0.27 ms on the 2-core build
    // machine). CONVEYOR_GLOO_PROGRESS=thread keeps the device's engine thread.
    const char* pm = std::getenv("CONVEYOR_GLOO_PROGRESS");
    opts.progress = pm && std::string(pm) == "thread" ? conveyor::progress_mode::thread
                                                      : conveyor::progress_mode::manual;
    // soft: MPA CRC32c on top of TCP's checksum, as Gloo's TCP transport has
    // none; CONVEYOR_GLOO_CRC=1 asks for it.
    const char* crc = std::getenv("CONVEYOR_GLOO_CRC");
    opts.request_crc = crc != nullptr && std::string(crc) == "1";
    auto open = [&](const std::string& kind, const std::string& name, bool required) {
      auto d = conveyor::device::open(name, opts);
      if (!d) {
        if (required)
          GLOO_THROW_IO_EXCEPTION("conveyor-gloo: opening ", name, ": ", d.error().to_string());
        return;
      }
      auto pd = d->alloc_pd();
      if (!pd) {
        if (required)
          GLOO_THROW_IO_EXCEPTION("conveyor-gloo: ", name, ": ", pd.error().to_string());
        return;
      }
      providers_.push_back({kind, std::move(*d), std::move(*pd)});
    };
    if (base.empty() || base == "soft") open("soft", "soft", true);
    if (base.empty() || base == "shm") open("shm", "shm", !base.empty());
    // "verbs" or "verbs:<device>", as device::open takes it (the first version
    // passed the bare device name, which no provider answers to).
    if (base == "verbs") open("verbs", forced_, true);
    std::ostringstream o;
    o << "conveyor-gloo(";
    for (std::size_t i = 0; i < providers_.size(); ++i) o << (i ? "," : "") << providers_[i].kind;
    o << (forced_.empty() ? "" : "; forced " + forced_) << ")";
    str_ = o.str();
  }

  std::string str() const override { return str_; }
  const std::string& getPCIBusID() const override { return pci_; }
  std::shared_ptr<::gloo::transport::Context> createContext(int rank, int size) override;

  provider* find(const std::string& kind) {
    for (auto& p : providers_)
      if (p.kind == kind) return &p;
    return nullptr;
  }
  const std::string& forced_base() const { return forced_base_; }
  const std::string& ip() const { return ip_; }
  const std::uint8_t* host_id() const { return host_id_; }

 private:
  std::string forced_, forced_base_, ip_, str_, pci_;
  std::uint8_t host_id_[24];
  std::vector<provider> providers_;
};

// ---------------------------------------------------------------------------
class Context final : public ::gloo::transport::Context,
                      public std::enable_shared_from_this<Context> {
 public:
  Context(std::shared_ptr<Device> dev, int rank, int size)
      : ::gloo::transport::Context(rank, size), device_(std::move(dev)) {
    if (pairs_.size() != std::size_t(size)) pairs_.resize(size);
  }
  ~Context() override;

  std::unique_ptr<::gloo::transport::Pair>& createPair(int rank) override;
  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                        size_t size) override;

  Pair& pair(int rank);

  // Operations of unbound buffers (all under mu_).
  void send(const std::shared_ptr<buf_state>& st, int dst, std::uint64_t slot, const std::byte* ptr,
            std::size_t n);
  void recv(const std::shared_ptr<buf_state>& st, std::vector<int> srcs, std::uint64_t slot,
            std::byte* ptr, std::size_t n);
  void cancel(const std::shared_ptr<buf_state>& st);

  // A NOTIFY from `rank` for `slot` (mu_ held).
  void on_notify(Pair& p, std::uint64_t slot);
  // Fails the recv-from-any operations that could be served by `rank` (mu_ held).
  void fail_any(int rank, const std::string& msg);

  std::shared_ptr<Device> device_;
  std::mutex mu_;  // all protocol state of every pair of this context
  std::condition_variable bound_cv_;
  std::uint64_t next_token_ = 1;

 private:
  struct any_recv {
    std::shared_ptr<buf_state> st;
    std::vector<int> ranks;
    std::uint64_t slot;
    std::byte* ptr;
    std::size_t n;
  };
  std::list<any_recv> pending_any_;
  // Notifications not yet matched, per slot in arrival order (recv-from-any
  // takes the oldest), and notifications already accounted for by a directed recv.
  std::map<std::uint64_t, std::deque<int>> available_;
  std::map<std::pair<std::uint64_t, int>, std::uint64_t> debt_;
  friend class Pair;
};

// ---------------------------------------------------------------------------
class Pair final : public ::gloo::transport::Pair {
 public:
  Pair(Context& ctx, int peer);
  ~Pair() override { shutdown(); }

  const ::gloo::transport::Address& address() const override { return *self_; }
  void connect(const std::vector<char>& bytes) override;
  void close() override { shutdown(); }
  void setSync(bool, bool) override {}
  std::unique_ptr<::gloo::transport::Buffer> createSendBuffer(int slot, void* ptr,
                                                              size_t size) override;
  std::unique_ptr<::gloo::transport::Buffer> createRecvBuffer(int slot, void* ptr,
                                                              size_t size) override;
  void send(::gloo::transport::UnboundBuffer*, uint64_t, size_t, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: use UnboundBuffer::send");
  }
  void recv(::gloo::transport::UnboundBuffer*, uint64_t, size_t, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: use UnboundBuffer::recv");
  }

  void shutdown();

  // All below: ctx_.mu_ held.
  void check_usable() const {
    if (failed_) throw ::gloo::IoException(error_);
    if (!connected_)
      GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: pair with rank ", peer_,
                                             " is not connected");
  }
  void start_send(const std::shared_ptr<send_op>& op);
  void start_recv(const std::shared_ptr<recv_op>& op);
  void enqueue(out_item it) {
    out_.push_back(std::move(it));
    pump();
  }
  void pump();
  void fail(const std::string& why);
  int peer() const { return peer_; }
  // Whether a large send from `st`'s memory is posted and not completed.
  bool sending_from(const std::shared_ptr<buf_state>& st) const {
    for (auto& m : staging_)
      if (m.op && m.op->st == st && m.op->mr) return true;
    return false;
  }
  // Revokes the source regions of `st`'s posted sends (the memory is about to
  // be freed: a WRITE still reading it fails locally instead).
  void drop_sends_from(const std::shared_ptr<buf_state>& st) {
    for (auto& m : staging_)
      if (m.op && m.op->st == st) drop(m.op->mr);
  }
  const std::string& peer_name() const { return peer_name_; }
  conveyor::protection_domain& pd() { return prov_->pd; }

  std::map<std::uint64_t, std::shared_ptr<bound_recv>> bound_recvs_;
  std::map<std::uint64_t, conveyor::remote_region> remote_bufs_;
  std::map<std::uint64_t, std::shared_ptr<recv_op>> recv_ops_;
  std::map<std::uint64_t, std::deque<std::shared_ptr<send_op>>> pending_sends_;
  std::map<std::uint64_t, std::deque<rtr_info>> remote_rtrs_;
  std::deque<out_item> out_;
  std::size_t parked_ = 0;  // entries the peer made us hold (RTRs, notifications)
  bool failed_ = false;
  bool unresponsive_ = false;  // a cancellation waited for this peer in vain: never wait again
  std::string error_;

 private:
  void make_qp();
  template <class Remaining>
  void accept_peer(const std::string& kind, const std::string& target,
                   clock_type::time_point deadline, Remaining remaining, std::string& last);
  template <class Remaining>
  void connect_peer(const wire::address& acceptor, const std::string& target,
                    clock_type::time_point deadline, Remaining remaining, std::string& last);
  void progress_loop();
  void handle(const conveyor::work_completion& wc);
  void handle_message(std::uint32_t idx, std::uint32_t len);
  void transmit(const std::shared_ptr<send_op>& op, const rtr_info& r, std::uint8_t flags);
  bool post_item(out_item& it);

  Context& ctx_;
  const int peer_;
  std::string peer_name_;
  std::unique_ptr<Address> self_;
  conveyor::listener soft_lis_, shm_lis_, verbs_lis_;
  Device::provider* prov_ = nullptr;
  conveyor::completion_queue cq_;
  conveyor::queue_pair qp_;
  conveyor::memory_region recv_mem_, send_mem_;
  std::vector<staging_meta> staging_;
  std::vector<std::uint32_t> free_staging_;
  std::uint32_t credits_ = 0, to_return_ = 0, sq_used_ = 0;
  std::uint32_t max_write_ = write_chunk;
  bool connected_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---------------------------------------------------------------------------
class UnboundBuffer final : public ::gloo::transport::UnboundBuffer {
 public:
  UnboundBuffer(std::shared_ptr<Context> ctx, void* ptr, size_t size)
      : ::gloo::transport::UnboundBuffer(ptr, size),
        ctx_(std::move(ctx)),
        st_(std::make_shared<buf_state>()) {}
  ~UnboundBuffer() override { ctx_->cancel(st_); }

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return wait(true, rank, timeout);
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return wait(false, rank, timeout);
  }
  void abortWaitRecv() override {
    std::lock_guard g(st_->m);
    st_->abort_recv = true;
    st_->cv.notify_all();
  }
  void abortWaitSend() override {
    std::lock_guard g(st_->m);
    st_->abort_send = true;
    st_->cv.notify_all();
  }
  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override {
    nbytes = checked(offset, nbytes);
    {
      std::lock_guard g(st_->m);
      st_->send_to = std::to_string(dst);
    }
    ctx_->send(st_, dst, slot, static_cast<const std::byte*>(ptr) + offset, nbytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override {
    recv(std::vector<int>{src}, slot, offset, nbytes);
  }
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override {
    nbytes = checked(offset, nbytes);
    GLOO_ENFORCE(!srcs.empty(), "conveyor-gloo: recv from no rank");
    {
      std::lock_guard g(st_->m);
      std::string s;
      for (int r : srcs) s += (s.empty() ? "" : ",") + std::to_string(r);
      st_->recv_from = s;
    }
    ctx_->recv(st_, std::move(srcs), slot, static_cast<std::byte*>(ptr) + offset, nbytes);
  }

 private:
  size_t checked(size_t offset, size_t nbytes) const {
    if (nbytes == kUnspecifiedByteCount) {
      GLOO_ENFORCE((offset) <= (size), "conveyor-gloo: out of range");
      nbytes = size - offset;
    }
    // As Gloo's TCP transport: an empty range may lie anywhere (it is never touched).
    if (nbytes > 0)
      GLOO_ENFORCE(offset <= size && nbytes <= size - offset, "conveyor-gloo: range [", offset,
                   ", +", nbytes, ") beyond a buffer of ", size);
    return nbytes;
  }

  bool wait(bool is_recv, int* rank, std::chrono::milliseconds timeout) {
    if (timeout == ::gloo::transport::kUnsetTimeout) timeout = ctx_->getTimeout();
    std::unique_lock l(st_->m);
    auto& count = is_recv ? st_->recv_completions : st_->send_completions;
    auto& abort = is_recv ? st_->abort_recv : st_->abort_send;
    auto ready = [&] { return count > 0 || abort || st_->ex; };
    if (!st_->cv.wait_for(l, timeout, ready)) {
      GLOO_THROW_IO_EXCEPTION("Timed out waiting ", timeout.count(), "ms for ",
                              is_recv ? "recv" : "send", " operation to complete (",
                              is_recv ? "from rank " : "to rank ",
                              is_recv ? st_->recv_from : st_->send_to, ")");
    }
    if (st_->ex) std::rethrow_exception(st_->ex);
    if (count == 0) {  // aborted
      abort = false;
      return false;
    }
    --count;
    if (rank) *rank = is_recv ? st_->recv_rank : st_->send_rank;
    return true;
  }

  std::shared_ptr<Context> ctx_;
  std::shared_ptr<buf_state> st_;
};

// Bound buffers (the older Gloo algorithms): a recv buffer is registered for its
// lifetime and announced to the peer; sends RDMA-WRITE into it and then tell it.
class SendBuffer final : public ::gloo::transport::Buffer {
 public:
  SendBuffer(Context& ctx, Pair& pair, int slot, void* ptr, size_t size)
      : Buffer(slot, ptr, size), ctx_(ctx), pair_(pair), st_(std::make_shared<bound_send>()) {
    // The older algorithms reuse a send buffer's memory right after send()
    // without waiting (ReduceScatterHalvingDoubling's distribution phase
    // memcpys into ptrs_[0] while its sends from there are in flight): they
    // rely on Gloo TCP writing to the socket at once. So send() copies the
    // range into this registered shadow, and the WRITE goes from there.
    if (size > 0) {
      auto mr = pair.pd().allocate_memory(size, conveyor::access::local_write);
      if (!mr) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: register: ", mr.error().to_string());
      mr_ = std::move(*mr);
    }
  }
  ~SendBuffer() override {
    std::unique_lock l(ctx_.mu_);
    ctx_.bound_cv_.wait_for(l, ctx_.getTimeout(),
                            [&] { return st_->pending == 0 || pair_.failed_; });
  }
  void send(size_t offset, size_t length, size_t roffset) override {
    GLOO_ENFORCE((offset) <= (size_), "conveyor-gloo: out of range");
    GLOO_ENFORCE((length) <= (size_ - offset), "conveyor-gloo: out of range");
    std::unique_lock l(ctx_.mu_);
    auto deadline = clock_type::now() + ctx_.getTimeout();
    // The shadow may be overwritten only once earlier sends from it are done.
    if (!ctx_.bound_cv_.wait_until(l, deadline, [&] { return st_->pending == 0 || pair_.failed_; }))
      GLOO_THROW_IO_EXCEPTION("Timed out waiting for an earlier send to rank ", pair_.peer());
    if (length > 0)
      std::memcpy(mr_.data() + offset, static_cast<const std::byte*>(ptr_) + offset, length);
    std::map<std::uint64_t, conveyor::remote_region>::iterator it;
    while (true) {
      pair_.check_usable();
      it = pair_.remote_bufs_.find(std::uint64_t(slot_));
      if (it != pair_.remote_bufs_.end()) break;
      if (ctx_.bound_cv_.wait_until(l, deadline) == std::cv_status::timeout)
        GLOO_THROW_IO_EXCEPTION("Timed out waiting for rank ", pair_.peer(),
                                " to create its receive buffer for slot ", slot_);
    }
    GLOO_ENFORCE((roffset + length) <= (it->second.length), "conveyor-gloo: write beyond rank ",
                 pair_.peer(), "'s buffer");
    out_item o;
    o.h.type = wire::msg_type::buf_done;
    o.h.slot = std::uint64_t(slot_);
    o.h.token = roffset;
    o.h.nbytes = length;
    if (length > 0) {
      o.write_lkey = mr_.lkey();
      o.write_src = mr_.addr() + offset;
      o.write_len = length;
      o.write_dst = it->second.addr + roffset;
      o.write_rkey = it->second.rkey;
    }
    o.bsend = st_;
    ++st_->pending;
    pair_.enqueue(std::move(o));
  }
  void waitRecv() override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: waitRecv on a send buffer");
  }
  void waitSend() override {
    std::unique_lock l(ctx_.mu_);
    if (!ctx_.bound_cv_.wait_for(l, ctx_.getTimeout(),
                                 [&] { return st_->pending == 0 || pair_.failed_; }))
      GLOO_THROW_IO_EXCEPTION("Timed out waiting ", ctx_.getTimeout().count(),
                              "ms for send operation to complete (to rank ", pair_.peer(), ")");
    if (st_->pending != 0) throw ::gloo::IoException(pair_.error_);
  }

 private:
  Context& ctx_;
  Pair& pair_;
  std::shared_ptr<bound_send> st_;
  conveyor::memory_region mr_;
};

class RecvBuffer final : public ::gloo::transport::Buffer {
 public:
  RecvBuffer(Context& ctx, Pair& pair, int slot, void* ptr, size_t size)
      : Buffer(slot, ptr, size), ctx_(ctx), pair_(pair), st_(std::make_shared<bound_recv>()) {
    st_->slot = std::uint64_t(slot);
    st_->ptr = static_cast<std::byte*>(ptr);
    st_->size = size;
    if (size > 0) {
      auto mr =
          pair.pd().register_memory(std::span(static_cast<std::byte*>(ptr), size),
                                    conveyor::access::local_write | conveyor::access::remote_write);
      if (!mr) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: register: ", mr.error().to_string());
      st_->mr = std::move(*mr);
    }
    std::lock_guard g(ctx_.mu_);
    pair_.check_usable();
    pair_.bound_recvs_[st_->slot] = st_;
    out_item o;
    o.h.type = wire::msg_type::buf_announce;
    o.h.slot = st_->slot;
    o.h.nbytes = size;
    if (size > 0) {
      o.h.addr = st_->mr.addr();
      o.h.rkey = st_->mr.rkey();
    }
    pair_.enqueue(std::move(o));
  }
  ~RecvBuffer() override {
    std::lock_guard g(ctx_.mu_);
    auto it = pair_.bound_recvs_.find(st_->slot);
    if (it != pair_.bound_recvs_.end() && it->second == st_) {
      pair_.bound_recvs_.erase(it);
      if (!pair_.failed_) {
        out_item o;
        o.h.type = wire::msg_type::buf_retract;
        o.h.slot = st_->slot;
        pair_.enqueue(std::move(o));
      }
    }
    drop(st_->mr);
  }
  void send(size_t, size_t, size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: send on a receive buffer");
  }
  void waitRecv() override {
    std::unique_lock l(ctx_.mu_);
    if (!ctx_.bound_cv_.wait_for(l, ctx_.getTimeout(),
                                 [&] { return st_->completions > 0 || pair_.failed_; }))
      GLOO_THROW_IO_EXCEPTION("Timed out waiting ", ctx_.getTimeout().count(),
                              "ms for recv operation to complete (from rank ", pair_.peer(), ")");
    if (st_->completions == 0) throw ::gloo::IoException(pair_.error_);
    --st_->completions;
  }
  void waitSend() override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: waitSend on a receive buffer");
  }

 private:
  Context& ctx_;
  Pair& pair_;
  std::shared_ptr<bound_recv> st_;
};

// ---------------------------------------------------------------------------
std::shared_ptr<::gloo::transport::Context> Device::createContext(int rank, int size) {
  return std::make_shared<Context>(shared_from_this(), rank, size);
}

Context::~Context() {
  for (auto& p : pairs_)
    if (p) static_cast<Pair*>(p.get())->shutdown();
  pairs_.clear();
}

std::unique_ptr<::gloo::transport::Pair>& Context::createPair(int r) {
  GLOO_ENFORCE(r >= 0 && r < size && r != rank, "conveyor-gloo: bad peer rank ", r);
  pairs_[r] = std::make_unique<Pair>(*this, r);
  return pairs_[r];
}

std::unique_ptr<::gloo::transport::UnboundBuffer> Context::createUnboundBuffer(void* ptr,
                                                                               size_t size) {
  return std::make_unique<UnboundBuffer>(shared_from_this(), ptr, size);
}

Pair& Context::pair(int r) {
  GLOO_ENFORCE(r >= 0 && r < size && r != rank, "conveyor-gloo: rank ", r, " out of range");
  auto& p = pairs_[r];
  GLOO_ENFORCE(p != nullptr, "conveyor-gloo: no pair for rank ", r);
  return static_cast<Pair&>(*p);
}

void Context::send(const std::shared_ptr<buf_state>& st, int dst, std::uint64_t slot,
                   const std::byte* ptr, std::size_t n) {
  auto op = std::make_shared<send_op>();
  op->st = st;
  op->ptr = ptr;
  op->nbytes = n;
  op->slot = slot;
  std::lock_guard g(mu_);
  auto& p = pair(dst);
  p.check_usable();
  p.start_send(op);
}

void Context::recv(const std::shared_ptr<buf_state>& st, std::vector<int> srcs, std::uint64_t slot,
                   std::byte* ptr, std::size_t n) {
  // A recv-from-any list may name this rank (torch's recv without a source
  // lists every rank): there is no pair to self, so it can never match.
  if (srcs.size() > 1) std::erase(srcs, rank);
  GLOO_ENFORCE(!srcs.empty(), "conveyor-gloo: recv from no other rank");
  std::lock_guard g(mu_);
  for (int r : srcs) pair(r).check_usable();
  int chosen = -1;
  if (srcs.size() == 1) {
    chosen = srcs[0];
    auto& q = available_[slot];
    auto it = std::find(q.begin(), q.end(), chosen);
    if (it != q.end()) {
      q.erase(it);
      --pair(chosen).parked_;
    } else {
      ++debt_[{slot, chosen}];
    }
    if (q.empty()) available_.erase(slot);
  } else {
    auto qi = available_.find(slot);
    if (qi != available_.end()) {
      for (auto it = qi->second.begin(); it != qi->second.end(); ++it) {
        if (std::find(srcs.begin(), srcs.end(), *it) != srcs.end()) {
          chosen = *it;
          qi->second.erase(it);
          --pair(chosen).parked_;
          break;
        }
      }
      if (qi->second.empty()) available_.erase(qi);
    }
    if (chosen < 0) {
      pending_any_.push_back({st, std::move(srcs), slot, ptr, n});
      return;
    }
  }
  auto op = std::make_shared<recv_op>();
  op->st = st;
  op->ptr = ptr;
  op->nbytes = n;
  op->slot = slot;
  pair(chosen).start_recv(op);
}

void Context::on_notify(Pair& p, std::uint64_t slot) {
  auto d = debt_.find({slot, p.peer()});
  if (d != debt_.end()) {
    if (--d->second == 0) debt_.erase(d);
    return;
  }
  for (auto it = pending_any_.begin(); it != pending_any_.end(); ++it) {
    if (it->slot != slot ||
        std::find(it->ranks.begin(), it->ranks.end(), p.peer()) == it->ranks.end())
      continue;
    auto op = std::make_shared<recv_op>();
    op->st = it->st;
    op->ptr = it->ptr;
    op->nbytes = it->n;
    op->slot = slot;
    pending_any_.erase(it);
    p.start_recv(op);
    return;
  }
  if (++p.parked_ > max_peer_entries) {
    p.fail("rank " + std::to_string(p.peer()) + " sent too many unmatched send notifications");
    return;
  }
  available_[slot].push_back(p.peer());
}

void Context::fail_any(int r, const std::string& msg) {
  for (auto it = pending_any_.begin(); it != pending_any_.end();) {
    if (std::find(it->ranks.begin(), it->ranks.end(), r) != it->ranks.end()) {
      it->st->fail(msg);
      it = pending_any_.erase(it);
    } else {
      ++it;
    }
  }
}

// A buffer being destroyed (the caller frees its memory next). A large
// receive's memory is registered for the peer to WRITE into: deregistering it
// while the peer writes would fail that WRITE with a remote access error and
// break a healthy pair, so that the peer's collective would name this rank
// instead of the one that really failed. The RTR is withdrawn instead: the
// peer answers with a cancel_ack if it had not used it, or its data is already
// on the way and ends with the usual `done`. Likewise a large send still being
// written from the buffer is let finish. Both are awaited for at most
// cancel_wait_max; a peer that answers nothing in that time is marked
// unresponsive and its regions are deregistered at once, then and from then on.
void Context::cancel(const std::shared_ptr<buf_state>& st) {
  std::unique_lock l(mu_);
  pending_any_.remove_if([&](const any_recv& a) { return a.st == st; });
  auto each_pair = [&](auto&& fn) {
    for (auto& up : pairs_)
      if (up) fn(*static_cast<Pair*>(up.get()));
  };
  each_pair([&](Pair& p) {
    for (auto& [slot, q] : p.pending_sends_)
      std::erase_if(q, [&](const std::shared_ptr<send_op>& o) { return o->st == st; });
    // Not posted yet: this buffer's sends, and the RTRs of its receives. A
    // send that had taken one of the peer's RTRs gives it back unused, so
    // the peer's withdrawal of it finds it and is answered.
    std::erase_if(p.out_, [&](const out_item& o) {
      if (o.op && o.op->st == st) {
        if (o.h.type == wire::msg_type::data || o.h.type == wire::msg_type::done) {
          p.remote_rtrs_[o.h.slot].push_front({o.h.token, o.h.nbytes, o.write_dst, o.write_rkey});
          ++p.parked_;
        }
        return true;
      }
      if (o.h.type != wire::msg_type::rtr) return false;
      auto it = p.recv_ops_.find(o.h.token);
      if (it == p.recv_ops_.end() || it->second->st != st) return false;
      p.recv_ops_.erase(it);
      return true;
    });
    std::vector<std::pair<std::uint64_t, std::uint64_t>> withdraw;  // token, slot
    for (auto& [tok, op] : p.recv_ops_) {
      if (op->st != st || op->cancelled) continue;
      op->cancelled = true;
      if (p.failed_ || p.unresponsive_)
        drop(op->mr);
      else
        withdraw.emplace_back(tok, op->slot);
    }
    for (auto [tok, slot] : withdraw) {
      out_item o;
      o.h.type = wire::msg_type::rtr_cancel;
      o.h.slot = slot;
      o.h.token = tok;
      p.enqueue(std::move(o));
    }
  });
  auto busy = [&](Pair& p) {
    if (p.failed_ || p.unresponsive_) return false;
    for (auto& [tok, op] : p.recv_ops_)
      if (op->st == st && op->mr) return true;
    return p.sending_from(st);
  };
  auto deadline =
      clock_type::now() + std::min<std::chrono::milliseconds>(getTimeout(), cancel_wait_max);
  each_pair([&](Pair& p) {
    if (!bound_cv_.wait_until(l, deadline, [&] { return !busy(p); })) p.unresponsive_ = true;
  });
  each_pair([&](Pair& p) {
    for (auto& [tok, op] : p.recv_ops_)
      if (op->st == st) drop(op->mr);  // kept, cancelled: a late done or ack is recognised
    p.drop_sends_from(st);
  });
}

// ---------------------------------------------------------------------------
Pair::Pair(Context& ctx, int peer) : ctx_(ctx), peer_(peer) {
  peer_name_ = "rank " + std::to_string(peer);
  auto& dev = *ctx.device_;
  wire::address a;
  a.rank = std::uint32_t(ctx.rank);
  std::memcpy(a.host_id, dev.host_id(), sizeof a.host_id);
  a.forced = dev.forced_base();
  if (ctx.rank < peer) {  // the lower rank accepts, the higher connects
    // The pair's secret and the acceptor's challenge: they reach the peer
    // through the rendezvous store only (never a name, never a log line).
    if (!auth::random_bytes(a.key, sizeof a.key) || !auth::random_bytes(a.nonce, sizeof a.nonce))
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: no random bytes for the pair's key");
    if (auto* p = dev.find("soft")) {
      auto l = conveyor::listener::bind(p->dev, dev.ip() + ":0", listen_backlog);
      if (!l) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: soft listen: ", l.error().to_string());
      a.soft = l->address();
      soft_lis_ = std::move(*l);
    }
    if (auto* p = dev.find("shm")) {
      // A random name unrelated to the key: abstract socket names are public
      // (/proc/net/unix). Another bind of the same name fails; try again.
      for (int attempt = 0; attempt < 4 && a.shm.empty(); ++attempt) {
        std::uint8_t r[8];
        if (!auth::random_bytes(r, sizeof r)) break;
        char name[32];
        std::snprintf(name, sizeof name, "@cvgloo-%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1],
                      r[2], r[3], r[4], r[5], r[6], r[7]);
        auto l = conveyor::listener::bind(p->dev, name, listen_backlog);
        if (l) {
          a.shm = name;
          shm_lis_ = std::move(*l);
        }
      }
    }
    if (auto* p = dev.find("verbs")) {
      auto l = conveyor::listener::bind(p->dev, dev.ip() + ":0", listen_backlog);
      if (!l) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: verbs listen: ", l.error().to_string());
      a.verbs = l->address();
      verbs_lis_ = std::move(*l);
    }
  }
  self_ = std::make_unique<Address>(std::move(a));
}

void Pair::make_qp() {
  qp_ = {};
  cq_ = {};
  auto cq = prov_->dev.create_cq({.depth = sq_depth + recv_depth + 64});
  if (!cq) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: create_cq: ", cq.error().to_string());
  cq_ = std::move(*cq);
  conveyor::qp_init_attr qa;
  qa.send_cq = &cq_;
  qa.recv_cq = &cq_;
  qa.cap.max_send_wr = sq_depth;
  qa.cap.max_recv_wr = recv_depth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = 0;  // never used: small payloads go through staging
  auto qp = prov_->pd.create_qp(qa);
  if (!qp) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: create_qp: ", qp.error().to_string());
  qp_ = std::move(*qp);
  for (std::uint32_t i = 0; i < recv_depth; ++i) {
    auto s =
        qp_.post_recv(recv_mem_.slice(i * staging_size, staging_size), make_wr(wr_kind::recv, i));
    if (s != conveyor::errc::ok)
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: post_recv: ", conveyor::to_string(s));
  }
}

void Pair::connect(const std::vector<char>& bytes) {
  auto pa = wire::decode_address(bytes);
  if (!pa || int(pa->rank) != peer_)
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: malformed address for rank ", peer_);
  auto& dev = *ctx_.device_;
  if (pa->forced != dev.forced_base())
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("conveyor-gloo: CONVEYOR_GLOO_DEVICE differs: rank ",
                                           ctx_.rank, " '", dev.forced_base(), "', rank ", peer_,
                                           " '", pa->forced, "'");
  std::string kind = dev.forced_base();
  bool same_host = std::memcmp(pa->host_id, dev.host_id(), sizeof pa->host_id) == 0;
  bool lower = ctx_.rank < peer_;
  const wire::address& acceptor = lower ? self_->value() : *pa;
  if (kind.empty()) kind = (same_host && !acceptor.shm.empty() && dev.find("shm")) ? "shm" : "soft";
  prov_ = dev.find(kind);
  if (!prov_) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: provider ", kind, " not available");
  const std::string& target = kind == "shm"    ? acceptor.shm
                              : kind == "soft" ? acceptor.soft
                                               : acceptor.verbs;
  if (target.empty())
    GLOO_THROW_IO_EXCEPTION("conveyor-gloo: rank ", lower ? ctx_.rank : peer_, " has no ", kind,
                            " listener");
  // A loopback address reaches this host, not the peer's: say so now rather
  // than time out (or reach whatever listens there).
  if (!same_host && kind != "shm" && loopback_target(target))
    GLOO_THROW_IO_EXCEPTION("conveyor-gloo: rank ", lower ? ctx_.rank : peer_,
                            " is on another host but listens on a loopback address (", target,
                            "): choose its network with GLOO_SOCKET_IFNAME (or the host name "
                            "it advertises)");

  auto rm = prov_->pd.allocate_memory(staging_size * recv_depth, conveyor::access::local_write);
  auto sm = prov_->pd.allocate_memory(staging_size * recv_depth, conveyor::access::local_write);
  if (!rm || !sm) GLOO_THROW_IO_EXCEPTION("conveyor-gloo: cannot allocate staging memory");
  recv_mem_ = std::move(*rm);
  send_mem_ = std::move(*sm);
  staging_.assign(recv_depth, {});
  free_staging_.clear();
  for (std::uint32_t i = recv_depth; i-- > 0;) free_staging_.push_back(i);
  if (prov_->dev.attr().max_msg_size > 0)
    max_write_ = std::min<std::uint32_t>(max_write_, prov_->dev.attr().max_msg_size);

  auto deadline = clock_type::now() + ctx_.getTimeout();
  auto remaining = [&] {
    return std::max(
        1ms, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()));
  };
  std::string last;
  if (lower)
    accept_peer(kind, target, deadline, remaining, last);
  else
    connect_peer(*pa, target, deadline, remaining, last);
  soft_lis_ = {};
  shm_lis_ = {};
  verbs_lis_ = {};
  peer_name_ = "rank " + std::to_string(peer_) + " (" + kind + " " + target + ")";
  {
    std::lock_guard g(ctx_.mu_);
    credits_ = recv_depth;
    connected_ = true;
  }
  thread_ = std::thread([this] { progress_loop(); });
}

// The lower rank's side of the handshake. Every connection request is checked
// before anything is set up for it: a hello from the peer rank whose MAC
// proves the pair's key over this side's nonce and the peer's (and, on shm,
// a process of this user). Anything else is refused and logged, and the
// listener goes on waiting for the real peer until the deadline.
template <class Remaining>
void Pair::accept_peer(const std::string& kind, const std::string& target,
                       clock_type::time_point deadline, Remaining remaining, std::string& last) {
  auto& lis = kind == "shm" ? shm_lis_ : kind == "soft" ? soft_lis_ : verbs_lis_;
  const wire::address& me = self_->value();
  unsigned refused = 0;
  bool need_qp = true;
  while (true) {
    if (clock_type::now() >= deadline)
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: waiting for rank ", peer_, " on ", target,
                              " timed out after ", ctx_.getTimeout().count(), "ms: ", last);
    if (need_qp) {
      make_qp();
      need_qp = false;
    }
    auto req = lis.accept(std::min<std::chrono::milliseconds>(remaining(), 1000ms));
    if (!req) {
      last = req.error().to_string();
      continue;
    }
    std::string peer = req->peer_address();
    auto pd = req->private_data();
    auto h = wire::decode_hello(pd.data(), pd.size());
    std::string why;
    if (!h) {
      why = "not a conveyor-gloo hello";
    } else if (h->from_rank != std::uint32_t(peer_) || h->to_rank != std::uint32_t(ctx_.rank)) {
      why = "claims rank " + std::to_string(h->from_rank) + " -> " + std::to_string(h->to_rank);
    } else if (!auth::verify(auth::compute(me.key, auth::role::hello, h->from_rank, h->to_rank,
                                           me.nonce, h->nonce),
                             h->mac)) {
      why = "claims rank " + std::to_string(peer_) + " without the pair's key";
    } else if (kind == "shm") {
      auto uid = uid_of_pid(shm_peer_pid(peer));
      if (uid && *uid != ::geteuid())
        why = "runs as uid " + std::to_string(*uid) + ", not " + std::to_string(::geteuid());
    }
    if (!why.empty()) {
      // The same reason for every refusal: the peer learns nothing about which check failed.
      (void)req->reject("conveyor-gloo: authentication failed");
      last = "refused " + peer + ": " + why;
      if (++refused <= max_refusals_logged)
        std::fprintf(stderr, "conveyor-gloo warn: rank %d refused a connection on %s from %s: %s\n",
                     ctx_.rank, target.c_str(), peer.c_str(), why.c_str());
      if (refused == max_refusals_logged)
        std::fprintf(stderr,
                     "conveyor-gloo warn: rank %d: further refusals on %s are counted, "
                     "not logged\n",
                     ctx_.rank, target.c_str());
      continue;
    }
    wire::hello_reply r;
    r.rank = std::uint32_t(ctx_.rank);
    auto m = auth::compute(me.key, auth::role::reply, h->from_rank, h->to_rank, me.nonce, h->nonce);
    std::memcpy(r.mac, m.data(), m.size());
    auto info = req->accept(qp_, wire::encode(r));
    if (!info) {
      last = info.error().to_string();
      need_qp = true;  // the QP may have gone to error
      continue;
    }
    break;
  }
  if (refused > max_refusals_logged)
    std::fprintf(stderr, "conveyor-gloo warn: rank %d refused %u connections on %s in all\n",
                 ctx_.rank, refused, target.c_str());
}

// The higher rank's side: a hello with a fresh nonce and its MAC; the reply
// must prove the key over both nonces too. Busy or not yet listening: try
// again until the deadline; refused for authentication: the ranks do not share
// the pair's key (mixed versions), which no retry mends.
template <class Remaining>
void Pair::connect_peer(const wire::address& acceptor, const std::string& target,
                        clock_type::time_point deadline, Remaining remaining, std::string& last) {
  while (true) {
    if (clock_type::now() >= deadline)
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: connecting to rank ", peer_, " (", target,
                              ") timed out after ", ctx_.getTimeout().count(), "ms: ", last);
    make_qp();
    wire::hello h;
    h.from_rank = std::uint32_t(ctx_.rank);
    h.to_rank = std::uint32_t(peer_);
    if (!auth::random_bytes(h.nonce, sizeof h.nonce))
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: no random bytes for the handshake's nonce");
    auto m = auth::compute(acceptor.key, auth::role::hello, h.from_rank, h.to_rank, acceptor.nonce,
                           h.nonce);
    std::memcpy(h.mac, m.data(), m.size());
    auto priv = wire::encode(h);
    auto info = conveyor::connect(qp_, target, {.private_data = priv, .timeout = remaining()});
    if (!info) {
      last = info.error().to_string();
      if (info.error().code == conveyor::errc::rejected &&
          last.find("conveyor-gloo: authentication failed") != std::string::npos)
        GLOO_THROW_IO_EXCEPTION("conveyor-gloo: rank ", peer_, " refused: ", last);
      std::this_thread::sleep_for(10ms);
      continue;
    }
    auto r = wire::decode_reply(info->private_data.data(), info->private_data.size());
    if (!r || r->rank != std::uint32_t(peer_) ||
        !auth::verify(auth::compute(acceptor.key, auth::role::reply, h.from_rank, h.to_rank,
                                    acceptor.nonce, h.nonce),
                      r->mac)) {
      qp_.disconnect();
      GLOO_THROW_IO_EXCEPTION("conveyor-gloo: ", target, " answered as rank ", peer_,
                              " without the pair's key");
    }
    break;
  }
}

void Pair::shutdown() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (qp_) qp_.disconnect();
  std::lock_guard g(ctx_.mu_);
  if (connected_ && !failed_) fail("connection to " + peer_name_ + " closed locally");
}

void Pair::progress_loop() {
  std::array<conveyor::work_completion, 32> wcs;
  while (!stop_) {
    auto n = cq_.wait(wcs, 50ms);
    if (!n) {
      if (n.error() == conveyor::errc::timed_out) continue;
      std::lock_guard g(ctx_.mu_);
      fail("completion queue of the pair with " + peer_name_ + ": " +
           std::string(conveyor::to_string(n.error())));
      return;
    }
    std::lock_guard g(ctx_.mu_);
    for (std::size_t i = 0; i < *n; ++i) handle(wcs[i]);
    pump();
  }
}

void Pair::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  error_ = "Connection closed by peer [" + peer_name_ + "]: " + why;
  for (auto& [tok, op] : recv_ops_) op->st->fail(error_);
  for (auto& [slot, q] : pending_sends_)
    for (auto& op : q) op->st->fail(error_);
  for (auto& it : out_)
    if (it.op) it.op->st->fail(error_);
  for (auto& s : staging_)
    if (s.op) s.op->st->fail(error_);
  recv_ops_.clear();
  pending_sends_.clear();
  remote_rtrs_.clear();
  out_.clear();
  ctx_.fail_any(peer_, error_);
  ctx_.bound_cv_.notify_all();
  if (qp_) (void)qp_.modify(conveyor::qp_state::error);
}

void Pair::start_send(const std::shared_ptr<send_op>& op) {
  auto it = remote_rtrs_.find(op->slot);
  if (it != remote_rtrs_.end() && !it->second.empty()) {
    rtr_info r = it->second.front();
    it->second.pop_front();
    --parked_;
    if (it->second.empty()) remote_rtrs_.erase(it);
    transmit(op, r, wire::flag_notify);
    return;
  }
  pending_sends_[op->slot].push_back(op);
  out_item o;
  o.h.type = wire::msg_type::notify;
  o.h.slot = op->slot;
  enqueue(std::move(o));
}

void Pair::start_recv(const std::shared_ptr<recv_op>& op) {
  std::uint64_t token = ctx_.next_token_++;
  out_item o;
  o.h.type = wire::msg_type::rtr;
  o.h.slot = op->slot;
  o.h.token = token;
  o.h.nbytes = op->nbytes;
  if (op->nbytes > eager_max) {
    auto mr =
        prov_->pd.register_memory(std::span(op->ptr, op->nbytes),
                                  conveyor::access::local_write | conveyor::access::remote_write);
    if (!mr) {
      op->st->fail("conveyor-gloo: register: " + mr.error().to_string());
      return;
    }
    op->mr = std::move(*mr);
    o.h.addr = op->mr.addr();
    o.h.rkey = op->mr.rkey();
  }
  recv_ops_[token] = op;
  enqueue(std::move(o));
}

void Pair::transmit(const std::shared_ptr<send_op>& op, const rtr_info& r, std::uint8_t flags) {
  if (r.nbytes != op->nbytes) {
    std::string msg = "message size mismatch on slot " + std::to_string(op->slot) + ": sending " +
                      std::to_string(op->nbytes) + " bytes to " + peer_name_ + ", which expects " +
                      std::to_string(r.nbytes);
    op->st->fail(msg);
    fail(msg);
    return;
  }
  out_item o;
  o.h.slot = op->slot;
  o.h.token = r.token;
  o.h.nbytes = op->nbytes;
  o.h.flags = flags;
  o.op = op;
  if (op->nbytes <= eager_max) {
    o.h.type = wire::msg_type::data;
    o.payload = op->ptr;
    o.payload_len = op->nbytes;
  } else {
    auto mr = prov_->pd.register_memory(std::span(const_cast<std::byte*>(op->ptr), op->nbytes),
                                        conveyor::access::local_write);
    if (!mr) {
      op->st->fail("conveyor-gloo: register: " + mr.error().to_string());
      return;
    }
    op->mr = std::move(*mr);
    o.h.type = wire::msg_type::done;
    o.write_lkey = op->mr.lkey();
    o.write_src = op->mr.addr();
    o.write_len = op->nbytes;
    o.write_dst = r.addr;
    o.write_rkey = r.rkey;
  }
  enqueue(std::move(o));
}

bool Pair::post_item(out_item& it) {
  std::uint32_t chunks =
      it.write_len == 0 ? 0 : std::uint32_t((it.write_len + max_write_ - 1) / max_write_);
  bool credit_only = it.h.type == wire::msg_type::credit;
  if (free_staging_.empty() || credits_ < (credit_only ? 1u : 2u) ||
      sq_used_ + chunks + 1 > sq_depth)
    return false;
  for (std::uint32_t c = 0; c < chunks; ++c) {
    std::size_t off = std::size_t(c) * max_write_;
    std::size_t len = std::min<std::size_t>(max_write_, it.write_len - off);
    conveyor::sge s{it.write_src + off, std::uint32_t(len), it.write_lkey};
    conveyor::send_wr w;
    w.wr_id = make_wr(wr_kind::write, 0);
    w.opcode = conveyor::wr_opcode::rdma_write;
    w.sg_list = std::span(&s, 1);
    w.remote_addr = it.write_dst + off;
    w.rkey = it.write_rkey;
    auto st = qp_.post_send(w);
    if (st != conveyor::errc::ok) {
      fail("post WRITE: " + std::string(conveyor::to_string(st)));
      return false;
    }
    ++sq_used_;
  }
  std::uint32_t idx = free_staging_.back();
  free_staging_.pop_back();
  std::byte* buf = send_mem_.data() + std::size_t(idx) * staging_size;
  it.h.credits = to_return_;
  to_return_ = 0;
  wire::encode(it.h, buf);
  trace("->", ctx_.rank, peer_, it.h);
  if (it.payload_len) std::memcpy(buf + wire::header_size, it.payload, it.payload_len);
  staging_[idx] = {std::move(it.op), std::move(it.bsend)};
  auto st = qp_.post_send_msg(
      send_mem_.slice(std::size_t(idx) * staging_size, wire::header_size + it.payload_len),
      make_wr(wr_kind::send, idx));
  if (st != conveyor::errc::ok) {
    fail("post SEND: " + std::string(conveyor::to_string(st)));
    return false;
  }
  ++sq_used_;
  --credits_;
  return true;
}

void Pair::pump() {
  if (failed_ || !connected_) return;
  while (!out_.empty()) {
    if (!post_item(out_.front())) return;
    out_.pop_front();
  }
  if (to_return_ >= recv_depth / 2) {
    out_item c;
    c.h.type = wire::msg_type::credit;
    (void)post_item(c);
  }
}

void Pair::handle(const conveyor::work_completion& wc) {
  if (failed_) return;
  auto kind = wr_kind(wc.wr_id >> 56);
  auto idx = std::uint32_t(wc.wr_id & 0xffffffu);
  if (wc.status != conveyor::wc_status::success) {
    fail(std::string(conveyor::to_string(wc.status)));
    return;
  }
  switch (kind) {
    case wr_kind::write:
      --sq_used_;
      return;
    case wr_kind::send: {
      --sq_used_;
      if (idx >= staging_.size()) return;
      auto meta = std::move(staging_[idx]);
      staging_[idx] = {};
      free_staging_.push_back(idx);
      if (meta.op) {
        bool large = bool(meta.op->mr);
        drop(meta.op->mr);
        meta.op->st->send_done(peer_);
        if (large) ctx_.bound_cv_.notify_all();  // a cancellation may wait for it
      }
      if (meta.bsend) {
        --meta.bsend->pending;
        ctx_.bound_cv_.notify_all();
      }
      return;
    }
    case wr_kind::recv:
      if (idx >= recv_depth || wc.opcode != conveyor::wc_opcode::recv) {
        fail("unexpected receive completion");
        return;
      }
      handle_message(idx, wc.byte_len);
      if (failed_) return;
      if (qp_.post_recv(recv_mem_.slice(std::size_t(idx) * staging_size, staging_size), wc.wr_id) !=
          conveyor::errc::ok) {
        fail("repost receive");
        return;
      }
      ++to_return_;
      return;
  }
  fail("unknown completion");
}

void Pair::handle_message(std::uint32_t idx, std::uint32_t len) {
  const std::byte* buf = recv_mem_.data() + std::size_t(idx) * staging_size;
  auto h = wire::decode(buf, std::min<std::size_t>(len, staging_size));
  auto bad = [&](const std::string& what) { fail("protocol error: " + what); };
  if (!h) return bad("malformed message");
  trace("<-", ctx_.rank, peer_, *h);
  if (h->credits > recv_depth || credits_ + h->credits > recv_depth)
    return bad("credits beyond the receive depth");
  credits_ += h->credits;
  if (h->type != wire::msg_type::data && len != wire::header_size) return bad("trailing bytes");
  switch (h->type) {
    case wire::msg_type::credit:
      return;
    case wire::msg_type::notify:
      ctx_.on_notify(*this, h->slot);
      return;
    case wire::msg_type::rtr: {
      if (h->nbytes > eager_max && h->rkey == 0) return bad("large RTR without a key");
      rtr_info r{h->token, h->nbytes, h->addr, h->rkey};
      auto it = pending_sends_.find(h->slot);
      if (it != pending_sends_.end() && !it->second.empty()) {
        auto op = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) pending_sends_.erase(it);
        transmit(op, r, 0);
        return;
      }
      if (++parked_ > max_peer_entries) return bad("too many unmatched RTRs");
      remote_rtrs_[h->slot].push_back(r);
      return;
    }
    case wire::msg_type::data:
    case wire::msg_type::done: {
      if (h->flags & wire::flag_notify) ctx_.on_notify(*this, h->slot);
      if (failed_) return;
      auto it = recv_ops_.find(h->token);
      if (it == recv_ops_.end()) return bad("data for an unknown receive");
      auto op = it->second;
      if (op->slot != h->slot || op->nbytes != h->nbytes) return bad("data does not match its RTR");
      bool eager = h->type == wire::msg_type::data;
      if (eager != (op->nbytes <= eager_max)) return bad("wrong data path");
      if (eager && len != wire::header_size + h->nbytes) return bad("payload length");
      recv_ops_.erase(it);
      if (op->cancelled) {
        ctx_.bound_cv_.notify_all();  // the cancellation waiting for it
        return;
      }
      if (eager && h->nbytes) std::memcpy(op->ptr, buf + wire::header_size, h->nbytes);
      drop(op->mr);
      op->st->recv_done(peer_);
      return;
    }
    case wire::msg_type::buf_announce: {
      if (h->nbytes > 0 && h->rkey == 0) return bad("announcement without a key");
      if (remote_bufs_.size() >= max_peer_entries && !remote_bufs_.contains(h->slot))
        return bad("too many announced buffers");
      remote_bufs_[h->slot] = {h->addr, h->nbytes, h->rkey};
      ctx_.bound_cv_.notify_all();
      return;
    }
    case wire::msg_type::buf_retract:
      remote_bufs_.erase(h->slot);
      return;
    case wire::msg_type::rtr_cancel: {
      // Not found: it was used, and its data or done is already on the way.
      auto it = remote_rtrs_.find(h->slot);
      if (it == remote_rtrs_.end()) return;
      auto& q = it->second;
      auto r =
          std::find_if(q.begin(), q.end(), [&](const rtr_info& x) { return x.token == h->token; });
      if (r == q.end()) return;
      q.erase(r);
      --parked_;
      if (q.empty()) remote_rtrs_.erase(it);
      out_item o;
      o.h.type = wire::msg_type::cancel_ack;
      o.h.slot = h->slot;
      o.h.token = h->token;
      enqueue(std::move(o));
      return;
    }
    case wire::msg_type::cancel_ack: {
      auto it = recv_ops_.find(h->token);
      if (it == recv_ops_.end() || !it->second->cancelled || it->second->slot != h->slot)
        return bad("acknowledgement of a receive that was not cancelled");
      recv_ops_.erase(it);
      ctx_.bound_cv_.notify_all();
      return;
    }
    case wire::msg_type::buf_done: {
      auto it = bound_recvs_.find(h->slot);
      if (it == bound_recvs_.end()) return;  // the buffer was destroyed meanwhile
      auto& b = *it->second;
      if (h->token > b.size || h->nbytes > b.size - h->token)
        return bad("bound write out of range");
      ++b.completions;
      ctx_.bound_cv_.notify_all();
      return;
    }
  }
}

std::unique_ptr<::gloo::transport::Buffer> Pair::createSendBuffer(int slot, void* ptr,
                                                                  size_t size) {
  GLOO_ENFORCE(prov_ != nullptr, "conveyor-gloo: pair not connected");
  return std::make_unique<SendBuffer>(ctx_, *this, slot, ptr, size);
}

std::unique_ptr<::gloo::transport::Buffer> Pair::createRecvBuffer(int slot, void* ptr,
                                                                  size_t size) {
  GLOO_ENFORCE(prov_ != nullptr, "conveyor-gloo: pair not connected");
  return std::make_unique<RecvBuffer>(ctx_, *this, slot, ptr, size);
}

}  // namespace

std::shared_ptr<::gloo::transport::Device> CreateDevice(const attr& a) {
  return std::make_shared<Device>(a);
}

}  // namespace conveyor_gloo
