// CudaContext (see exl3/cuda/context.hpp).
#include "exl3/cuda/context.hpp"

#include <cublas_v2.h>

#include "exl3/cuda/check.hpp"

namespace exl3::cuda {

void CudaContext::StreamDestroy::operator()(cudaStream_t s) const noexcept {
  (void)cudaStreamDestroy(s);
}

void CudaContext::HandleDestroy::operator()(cublasContext* h) const noexcept {
  (void)cublasDestroy(h);
}

CudaContext::CudaContext(size_t cublas_workspace_bytes) {
  cudaStream_t s = nullptr;
  EXL3_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                  "CUDA context: creating the stream");
  stream_.reset(s);
  workspace_ = DeviceBuffer(cublas_workspace_bytes, "the cuBLAS workspace");
  cublasHandle_t h = nullptr;
  EXL3_CUDA_CHECK(cublasCreate(&h), "CUDA context: creating the cuBLAS handle");
  handle_.reset(h);
  EXL3_CUDA_CHECK(cublasSetStream(h, s), "CUDA context: binding cuBLAS to the stream");
  EXL3_CUDA_CHECK(cublasSetWorkspace(h, workspace_.get(), workspace_.bytes()),
                  "CUDA context: setting the cuBLAS workspace");
  bound_stream_ = s;
  bound_bytes_ = workspace_.bytes();
}

CudaContext::~CudaContext() = default;

cublasContext* CudaContext::cublas(cudaStream_t stream, size_t workspace_bytes) const {
  if (workspace_bytes > workspace_.bytes()) return nullptr;
  if (stream != bound_stream_ || workspace_bytes != bound_bytes_) {
    // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
    if (cublasSetStream(handle_.get(), stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(handle_.get(), workspace_.get(), workspace_bytes) !=
            CUBLAS_STATUS_SUCCESS) {
      bound_stream_ = nullptr;
      bound_bytes_ = 0;
      return nullptr;
    }
    bound_stream_ = stream;
    bound_bytes_ = workspace_bytes;
  }
  return handle_.get();
}

int current_sm_count() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

}  // namespace exl3::cuda
