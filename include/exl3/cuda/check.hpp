// The one check for CUDA runtime, cuBLAS and NCCL status codes:
//
//   EXL3_CUDA_CHECK(cudaStreamSynchronize(stream));
//   EXL3_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, stream), fmt::format("{} (pad)", name));
//
// evaluates the call once and, when it failed, throws exl3::Error with the optional context
// (anything convertible to std::string_view; evaluated only on failure), the library's name and
// text for the status, the failing expression and the file and line:
//
//   model.layers.0.self_attn.q_proj (pad): invalid argument (cudaErrorInvalidValue) in
//   `cudaMemcpyAsync(dst, src, n, kind, stream)` at runtime/gpu_linear.cpp:190
//
// The status type picks the overload: cudaError_t and cublasStatus_t here; ncclResult_t where
// src/runtime/nccl_check.hpp is included (only the runtime links NCCL). Kernel launchers keep
// returning cudaError_t (they never throw, so they can run inside graph capture); their callers
// check with this macro. Safe to include from nvcc-compiled files (no fmt, no exl3::Error here).
#pragma once

#include <string>
#include <string_view>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace exl3::cuda::detail {

inline bool failed(cudaError_t s) {
  return s != cudaSuccess;
}
inline bool failed(cublasStatus_t s) {
  return s != CUBLAS_STATUS_SUCCESS;
}

// "out of memory (cudaErrorMemoryAllocation)", "the library was not initialized
// (CUBLAS_STATUS_NOT_INITIALIZED)".
std::string describe(cudaError_t s);
std::string describe(cublasStatus_t s);

// Throws exl3::Error: "<context>: <status> in `<expr>` at <file>:<line>" (file: its last two path
// components).
[[noreturn]] void raise_status(const std::string& status, const char* expr, const char* file,
                               int line, std::string_view context = {});

}  // namespace exl3::cuda::detail

// EXL3_CUDA_CHECK(expr) or EXL3_CUDA_CHECK(expr, context): see above.
#define EXL3_CUDA_CHECK(expr, ...)                                                              \
  do {                                                                                          \
    const auto exl3_check_status_ = (expr);                                                     \
    if (::exl3::cuda::detail::failed(exl3_check_status_)) {                                     \
      ::exl3::cuda::detail::raise_status(::exl3::cuda::detail::describe(exl3_check_status_),    \
                                         #expr, __FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                                           \
  } while (false)
