// pd_impl::allocate_memory's default: anonymous pages registered through the
// provider's own register_memory, owned by the region that registers them.
#include "core/impl.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace conveyor::detail {

namespace {

// The provider's registration plus the pages under it: the registration goes
// first (its destructor revokes the keys), then the pages.
class owned_mr final : public mr_impl {
 public:
  owned_mr(std::shared_ptr<mr_impl> inner, void* pages, std::size_t map_len)
      : inner_(std::move(inner)), pages_(pages), map_len_(map_len) {
    data_ = inner_->data();
    size_ = inner_->size();
    lkey_ = inner_->lkey();
    rkey_ = inner_->rkey();
    rights_ = inner_->rights();
  }
  ~owned_mr() override {
    inner_.reset();
    ::munmap(pages_, map_len_);
  }
  void deregister() noexcept override { inner_->deregister(); }

 private:
  std::shared_ptr<mr_impl> inner_;
  void* pages_;
  std::size_t map_len_;
};

}  // namespace

result<std::shared_ptr<mr_impl>> pd_impl::allocate_memory(std::size_t len, access rights) {
  if (len == 0) return make_error(errc::invalid_argument, "allocate_memory: zero length");
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (len > (std::size_t(1) << 46))
    return make_error(errc::invalid_argument,
                      "allocate_memory: " + std::to_string(len) + " bytes is too large");
  const std::size_t map_len = (len + page - 1) / page * page;
  // Populated now, as a NIC registration pins every page: no first-touch
  // faults later on the data path.
  void* p = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    return make_error(errc::resource_exhausted, "allocate_memory: mmap of " +
                                                    std::to_string(map_len) +
                                                    " bytes failed: " + std::strerror(errno));
  auto mr = register_memory(std::span<std::byte>(static_cast<std::byte*>(p), len), rights);
  if (!mr) {
    ::munmap(p, map_len);
    return std::unexpected(mr.error());
  }
  return std::shared_ptr<mr_impl>(std::make_shared<owned_mr>(std::move(*mr), p, map_len));
}

}  // namespace conveyor::detail
