// Device-memory helpers of the CUDA runtime (internal): the device buffer
// (exl3::cuda::DeviceBuffer) and the dtype mapping between checkpoint tensors and the CUDA kernels.
#pragma once

#if defined(EXL3_HAVE_CUDA)

#include <string>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"

namespace exl3::runtime {

using cuda::DeviceBuffer;

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
