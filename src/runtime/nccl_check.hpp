// EXL3_CUDA_CHECK for NCCL results (exl3/cuda/check.hpp): the overloads that let the one check
// macro take an ncclResult_t. Internal to the runtime, the only layer that links NCCL.
#pragma once

#if defined(EXL3_HAVE_NCCL)

#include <string>

#include <nccl.h>

#include "exl3/cuda/check.hpp"

namespace exl3::cuda::detail {

inline bool failed(ncclResult_t r) {
  return r != ncclSuccess;
}
// "NCCL: unhandled cuda error (run with NCCL_DEBUG=INFO for details)".
inline std::string describe(ncclResult_t r) {
  return std::string("NCCL: ") + ncclGetErrorString(r);
}

}  // namespace exl3::cuda::detail

#endif  // EXL3_HAVE_NCCL
