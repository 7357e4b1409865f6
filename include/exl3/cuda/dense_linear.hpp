// Unquantized linear on the GPU through cuBLAS: y[m, out] (fp32) = x[m, in] (fp32) @ W^T + bias,
// W [out, in] kept in its checkpoint dtype (BF16 / FP16: x is converted to that dtype in the
// workspace and cuBLAS accumulates in fp32; F32: plain fp32 GEMM, no TF32) or widened to fp32
// at upload when `fp32_weights` (routers: their logits pick experts, so they get the CPU
// reference's precision). Same execution contract as Exl3LinearCuda: no allocation, no sync,
// capturable in a CUDA graph (cuBLAS runs on the CudaContext's handle, limited to the first
// 4 MiB of its workspace, the size these GEMMs have always been planned with).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/linear.hpp"

namespace exl3::cuda {

class DenseLinearCuda {
 public:
  // weight: host [out, in] in `wtype` (f16/bf16/f32); bias: host fp32 [out] or null. Throws
  // exl3::Error naming `name` on CUDA failures. `ctx` (cuBLAS) must outlive the layer.
  DenseLinearCuda(CudaContext& ctx, std::string name, const void* weight, DType wtype,
                  int64_t in_features, int64_t out_features, const float* bias, int64_t max_m,
                  bool fp32_weights = false);
  DenseLinearCuda(const DenseLinearCuda&) = delete;
  DenseLinearCuda& operator=(const DenseLinearCuda&) = delete;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  DType weight_type() const { return wtype_; }
  size_t device_bytes() const;
  size_t workspace_bytes() const;
  // The [out, in] weight on the device when it is fp32 and there is no bias (a router that a
  // fused kernel can read directly), else null.
  const float* fp32_matrix() const;

  cudaError_t run(const float* x, float* y, int64_t m, void* workspace, size_t workspace_size,
                  cudaStream_t stream) const;

 private:
  std::string name_;
  int64_t in_ = 0, out_ = 0, max_m_ = 0;
  DType wtype_ = DType::kBF16;
  DeviceBuffer w_;              // [out, in] in wtype_
  DeviceBuffer bias_;           // fp32 [out], or empty
  CudaContext* ctx_ = nullptr;  // cuBLAS handle and workspace (not owned)
};

}  // namespace exl3::cuda
