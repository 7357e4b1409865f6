// Device-memory helpers of the CUDA runtime (internal): the device buffer
// (exl3::cuda::DeviceBuffer) and the dtype mapping between checkpoint tensors and the CUDA kernels.
#pragma once

#if defined(EXL3_HAVE_CUDA)

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/trellis/half.hpp"

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

// fp32 values that hold a checkpoint tensor's values exactly, back in its 16-bit dtype (BF16 /
// F16), so a kernel multiplies the stored weights; `type` gets the kernels' dtype. Any other
// stored dtype stays fp32: the result is empty and `type` is F32.
inline std::vector<uint16_t> to_stored_16bit(std::span<const float> w, exl3::DType stored,
                                             cuda::DType& type) {
  if (stored != exl3::DType::kBF16 && stored != exl3::DType::kF16) {
    type = cuda::DType::kF32;
    return {};
  }
  const bool bf16 = stored == exl3::DType::kBF16;
  std::vector<uint16_t> bits(w.size());
  for (size_t i = 0; i < w.size(); ++i)
    bits[i] = bf16 ? trellis::float_to_bf16(w[i]) : trellis::float_to_half(w[i]);
  type = bf16 ? cuda::DType::kBF16 : cuda::DType::kF16;
  return bits;
}

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
