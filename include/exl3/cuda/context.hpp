// CudaContext: the CUDA state the linears of one engine (or one tool, benchmark or test) share: a
// stream, one cuBLAS handle and one cuBLAS workspace. The engine owns it and passes it by
// reference to every linear it loads; a linear keeps a pointer, so the context must outlive it.
// (Before: every linear that could reach cuBLAS created its own handle, about 200 on
// Qwen3-30B, each carving its own cuBLAS workspace out of the run workspace.)
//
// Graph capture: the handle is bound to stream() and the workspace set on it (cublasSetWorkspace)
// here, before any capture: cuBLAS may not allocate inside a capture. cublas() rebinds the
// handle only when a GEMM asks for another stream or another workspace size (cublasSetStream
// resets the workspace, so both are set together), as every linear did before each GEMM.
//
// Not thread-safe: one thread drives a context at a time (an engine's, or a TP rank's).
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"

struct cublasContext;  // cublasHandle_t is cublasContext*

namespace exl3::cuda {

// The current device's SM count (132, an H100/H200's, when it cannot be read).
int current_sm_count();

class CudaContext {
 public:
  // The workspace NVIDIA recommends for cuBLAS on Hopper, the largest any linear asks for.
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

  // On the current device: a non-blocking stream, a cuBLAS handle bound to it and
  // `cublas_workspace_bytes` of workspace set on it. Throws exl3::Error (nothing leaks).
  explicit CudaContext(size_t cublas_workspace_bytes = kCublasWorkspaceBytes);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  cudaStream_t stream() const { return stream_.get(); }
  size_t cublas_workspace_bytes() const { return workspace_.bytes(); }

  // The cuBLAS handle for GEMMs on `stream`, with the first `workspace_bytes` of the workspace
  // (at most cublas_workspace_bytes()). nullptr when cuBLAS refuses or more workspace is asked
  // for than there is: the caller returns an error (run() paths never throw).
  cublasContext* cublas(cudaStream_t stream, size_t workspace_bytes) const;

 private:
  struct StreamDestroy {
    void operator()(cudaStream_t s) const noexcept;
  };
  struct HandleDestroy {
    void operator()(cublasContext* h) const noexcept;
  };

  // Declaration order is destruction order reversed: the handle goes first, then the workspace
  // it points at, then the stream it is bound to.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy> stream_;
  DeviceBuffer workspace_;
  std::unique_ptr<cublasContext, HandleDestroy> handle_;
  mutable cudaStream_t bound_stream_ = nullptr;
  mutable size_t bound_bytes_ = 0;
};

}  // namespace exl3::cuda
