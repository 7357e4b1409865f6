// cuBLAS-backed unquantized linear (see include/exl3/cuda/dense_linear.hpp).
#include "exl3/cuda/dense_linear.hpp"

#include <cstring>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "exl3/cuda/check.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/cuda/plan.hpp"
#include "exl3/error.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::cuda {
namespace {

// The part of the context's cuBLAS workspace these GEMMs get: the 4 MiB they were always planned
// with (cuBLAS may pick another algorithm, so other bits, with more).
constexpr size_t kCublasWorkspace = 4u << 20;
cudaDataType_t cuda_type(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : (t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF);
}

}  // namespace

DenseLinearCuda::DenseLinearCuda(CudaContext& ctx, std::string name, const void* weight,
                                 DType wtype, int64_t in_features, int64_t out_features,
                                 const float* bias, int64_t max_m, bool fp32_weights)
    : name_(std::move(name)),
      in_(in_features),
      out_(out_features),
      max_m_(max_m),
      wtype_(wtype),
      ctx_(&ctx) {
  if (in_ <= 0 || out_ <= 0 || max_m_ <= 0) {
    fail("CUDA dense linear '{}': bad shape {} -> {} or max_m {}", name_, in_, out_, max_m_);
  }
  const size_t n = static_cast<size_t>(in_ * out_);
  std::vector<float> widened;
  const void* src = weight;
  if (fp32_weights && wtype_ != DType::kF32) {
    widened.resize(n);
    const auto* w16 = static_cast<const uint16_t*>(weight);
    for (size_t i = 0; i < n; ++i) {
      widened[i] =
          wtype_ == DType::kF16 ? trellis::half_to_float(w16[i]) : trellis::bf16_to_float(w16[i]);
    }
    src = widened.data();
    wtype_ = DType::kF32;
  }
  const size_t bytes = n * dtype_size(wtype_);
  w_ = DeviceBuffer(src, bytes, fmt::format("the weights of CUDA dense linear '{}'", name_));
  if (bias != nullptr) {
    bias_ = DeviceBuffer(bias, static_cast<size_t>(out_) * 4,
                         fmt::format("the bias of CUDA dense linear '{}'", name_));
  }
}

const float* DenseLinearCuda::fp32_matrix() const {
  return wtype_ == DType::kF32 && bias_.bytes() == 0 ? w_.as<float>() : nullptr;
}

size_t DenseLinearCuda::device_bytes() const {
  return static_cast<size_t>(in_ * out_) * dtype_size(wtype_) + bias_.bytes();
}

size_t DenseLinearCuda::workspace_bytes() const {
  const size_t x16 =
      wtype_ == DType::kF32 ? 0 : carve_align_up(static_cast<size_t>(max_m_ * in_) * 2);
  return x16;
}

cudaError_t DenseLinearCuda::run(const float* x, float* y, int64_t m, void* workspace,
                                 size_t workspace_size, cudaStream_t stream) const {
  if (m <= 0 || m > max_m_ || workspace_size < workspace_bytes()) return cudaErrorInvalidValue;
  auto* base = static_cast<char*>(workspace);
  const void* xin = x;
  if (wtype_ != DType::kF32) {
    const cudaError_t e = convert_rows(x, in_, base, wtype_, in_, m, in_, stream);
    if (e != cudaSuccess) return e;
    xin = base;
  }
  cublasHandle_t h = ctx_->cublas(stream, kCublasWorkspace);
  if (h == nullptr) return cudaErrorUnknown;
  // Row-major y[m, out] = x[m, in] W^T is column-major Y^T[out, m] = (W as [in, out])^T X^T.
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = cuda_type(wtype_);
  if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_), static_cast<int>(m),
                   static_cast<int>(in_), &alpha, w_.get(), t, static_cast<int>(in_), xin, t,
                   static_cast<int>(in_), &beta, y, CUDA_R_32F, static_cast<int>(out_),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
    return cudaErrorUnknown;
  }
  if (!bias_.empty()) return add_bias(y, bias_.as<float>(), m, out_, stream);
  return cudaGetLastError();
}

}  // namespace exl3::cuda
