// dma_copy: a software NIC reading application memory that the application
// may be rewriting meanwhile, as a NIC's DMA does (an RDMA READ of a region
// being written is allowed; the reader gets whichever bytes). Under
// ThreadSanitizer these reads are declared ignored: the race is the RDMA
// model's, not a bug, and it is the same race the kernel's copy in sendmsg
// (invisible to ThreadSanitizer) has always had. Only for that case: a source
// the verbs rules forbid the application to touch (a SEND's or WRITE's buffer
// until its completion) is read normally, so that a violation is reported.
#pragma once

#include <cstddef>
#include <cstring>

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace conveyor::detail {

inline void dma_copy(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__SANITIZE_THREAD__)
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  std::memcpy(dst, src, n);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace conveyor::detail
