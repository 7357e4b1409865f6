// DeviceBuffer (see exl3/cuda/device_buffer.hpp).
#include "exl3/cuda/device_buffer.hpp"

#include <fmt/format.h>

#include "exl3/cuda/check.hpp"

namespace exl3::cuda {

DeviceBuffer::DeviceBuffer(size_t bytes, std::string_view what, std::source_location where) {
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (detail::failed(e)) {
    detail::raise_status(detail::describe(e), "cudaMalloc", where.file_name(),
                         static_cast<int>(where.line()),
                         fmt::format("allocating {} ({} bytes)", what, bytes));
  }
  p_ = p;
  bytes_ = bytes;
}

DeviceBuffer::DeviceBuffer(const void* host, size_t bytes, std::string_view what,
                           std::source_location where)
    : DeviceBuffer(bytes, what, where) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice);
  if (detail::failed(e)) {
    // The delegating constructor has finished, so the destructor frees the allocation.
    detail::raise_status(detail::describe(e), "cudaMemcpy", where.file_name(),
                         static_cast<int>(where.line()),
                         fmt::format("uploading {} ({} bytes)", what, bytes));
  }
}

void DeviceBuffer::reset() noexcept {
  if (p_ != nullptr) (void)cudaFree(p_);
  p_ = nullptr;
  bytes_ = 0;
}

}  // namespace exl3::cuda
