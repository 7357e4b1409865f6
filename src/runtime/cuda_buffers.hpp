// Device-memory helpers of the CUDA runtime (internal): an owning device
// buffer, uploads, and the dtype mapping between checkpoint tensors and the CUDA kernels.
#pragma once

#if defined(EXL3_HAVE_CUDA)

#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3::runtime {

// One device allocation, freed with the owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const std::string& what) : bytes_(bytes) {
    if (bytes > 0) EXL3_CUDA_CHECK(cudaMalloc(&p_, bytes), "allocating " + what);
  }
  DeviceBuffer(const void* host, size_t bytes, const std::string& what)
      : DeviceBuffer(bytes, what) {
    if (bytes > 0)
      EXL3_CUDA_CHECK(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice), "uploading " + what);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

inline DeviceBuffer upload_floats(const std::vector<float>& v, const std::string& what) {
  return DeviceBuffer(v.data(), v.size() * sizeof(float), what);
}

inline cuda::DType cuda_dtype(exl3::DType t, const std::string& what) {
  switch (t) {
    case exl3::DType::kF32:
      return cuda::DType::kF32;
    case exl3::DType::kF16:
      return cuda::DType::kF16;
    case exl3::DType::kBF16:
      return cuda::DType::kBF16;
    default:
      fail("CUDA engine: {} is {}; expected F32, F16 or BF16", what, dtype_name(t));
  }
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
