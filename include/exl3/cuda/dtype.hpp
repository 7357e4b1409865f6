// Activation and weight element types of the CUDA kernels. Its own header so kernel translation
// units (nvcc) that take a DType do not see the host classes of linear.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace exl3::cuda {

enum class DType : uint8_t { kF16, kBF16, kF32 };

// Bytes of one element of `t`.
size_t dtype_size(DType t);

}  // namespace exl3::cuda
