// The verbs provider's memory regions: ibv_reg_mr with Conveyor's rights
// (remote_write/remote_atomic need local_write, as in verbs), and a clear
// error when the kernel refuses to pin the memory (RLIMIT_MEMLOCK).
#include "providers/verbs/verbs_objects.hpp"

#include <sys/resource.h>

#include <cerrno>
#include <mutex>

namespace conveyor::verbs {

namespace {

class verbs_mr final : public detail::mr_impl {
 public:
  verbs_mr(std::shared_ptr<verbs_pd> pd, ibv_mr* mr, access rights) : pd_(std::move(pd)), mr_(mr) {
    data_ = static_cast<std::byte*>(mr->addr);
    size_ = mr->length;
    lkey_ = mr->lkey;
    rkey_ = mr->rkey;
    rights_ = rights;
  }
  ~verbs_mr() override { deregister(); }
  void deregister() noexcept override {
    std::lock_guard lk(mu_);
    if (mr_ != nullptr) {
      rdma_core().ibv_dereg_mr(mr_);
      mr_ = nullptr;
    }
  }

 private:
  std::shared_ptr<verbs_pd> pd_;
  std::mutex mu_;
  ibv_mr* mr_;
};

}  // namespace

result<std::shared_ptr<detail::mr_impl>> verbs_pd::register_memory(std::span<std::byte> buf,
                                                                   access rights) {
  const std::string w = "register_memory on " + dev_->where();
  if (buf.empty() || buf.data() == nullptr)
    return make_error(errc::invalid_argument, w + ": empty buffer");
  if ((has(rights, access::remote_write) || has(rights, access::remote_atomic)) &&
      !has(rights, access::local_write))
    return make_error(errc::invalid_argument,
                      w + ": remote_write and remote_atomic require local_write (as in verbs)");
  // remote_atomic on a device without atomics grants nothing more (atomics are
  // refused at post time with errc::unsupported), as a verbs MR would.
  ibv_mr* mr = reg_mr(pd_, buf.data(), buf.size(), ibv_access(rights, dev_->attr().atomics));
  if (mr == nullptr) {
    int e = errno;
    if (e == ENOMEM || e == EPERM || e == EAGAIN) {
      rlimit rl{};
      getrlimit(RLIMIT_MEMLOCK, &rl);
      std::string lim =
          rl.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(rl.rlim_cur / 1024) + " KiB";
      return make_error(errc::resource_exhausted,
                        w + ": the kernel refused to pin " + std::to_string(buf.size()) +
                            " bytes (locked-memory limit RLIMIT_MEMLOCK is " + lim +
                            "; raise it with `ulimit -l unlimited` or limits.conf memlock)",
                        e);
    }
    return make_error(
        errc::io_error,
        w + ": ibv_reg_mr of " + std::to_string(buf.size()) + " bytes: " + err_text(e), e);
  }
  auto self = std::static_pointer_cast<verbs_pd>(shared_from_this());
  return std::make_shared<verbs_mr>(std::move(self), mr, rights);
}

}  // namespace conveyor::verbs
