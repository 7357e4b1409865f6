// Exl3LinearCuda: upload once and read the device traits, then run the plan of each m
// (exl3/cuda/plan.hpp) with only kernel launches (graph-capturable).
#include "exl3/cuda/linear.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <cublas_v2.h>

#include "cuda/kernels.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/reconstruct.hpp"
#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/dispatch.hpp"

namespace exl3::cuda {

size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

int detail::mma_blocks_per_sm(int K, trellis::Codebook cb) {
  return trellis::with_bits(K, 1,
                            [&](auto k) { return mma_blocks_per_sm_k<decltype(k)::value>(cb); });
}

int detail::gemv_blocks_per_sm(int K, trellis::Codebook cb) {
  return trellis::with_bits(K, 1,
                            [&](auto k) { return gemv_blocks_per_sm_k<decltype(k)::value>(cb); });
}

cudaError_t detail::gemv(int K, trellis::Codebook cb, const GemvGroupArgs& args,
                         cudaStream_t stream) {
  return exl3::trellis::with_bits(K, cudaErrorInvalidValue, [&](auto bits) {
    return gemv_k<decltype(bits)::value>(cb, args, stream);
  });
}

cudaError_t detail::mma_gemm(const uint16_t* trellis, int K, trellis::Codebook cb, const __half* xr,
                             int64_t m, int64_t k, int64_t n, int splits, float* partial,
                             cudaStream_t stream) {
  return exl3::trellis::with_bits(K, cudaErrorInvalidValue, [&](auto bits) {
    return mma_gemm_k<decltype(bits)::value>(trellis, cb, xr, m, k, n, splits, partial, stream);
  });
}

Exl3LinearCuda::Exl3LinearCuda(CudaContext& ctx, const Exl3LinearData& data,
                               const LinearOptions& opts)
    : in_(data.info().in_features),
      out_(data.info().out_features),
      K_(data.info().bits),
      cb_(data.info().codebook),
      opts_(opts),
      ctx_(&ctx) {
  init(data.info().prefix.c_str(), data.trellis().data(), data.suh().data(), data.svh().data(),
       data.bias().empty() ? nullptr : data.bias().data());
}

Exl3LinearCuda::Exl3LinearCuda(CudaContext& ctx, const char* name, const uint16_t* trellis,
                               int64_t in_features, int64_t out_features, int K,
                               trellis::Codebook cb, const uint16_t* suh, const uint16_t* svh,
                               const float* bias, const LinearOptions& opts)
    : in_(in_features), out_(out_features), K_(K), cb_(cb), opts_(opts), ctx_(&ctx) {
  init(name, trellis, suh, svh, bias);
}

void Exl3LinearCuda::init(const char* name, const uint16_t* trellis, const uint16_t* suh,
                          const uint16_t* svh, const float* bias) {
  if (!trellis::valid_bits(K_)) fail("CUDA linear '{}': bits {} outside 1..8", name, K_);
  if (in_ <= 0 || out_ <= 0 || in_ % 128 != 0 || out_ % 128 != 0) {
    fail("CUDA linear '{}': {}x{} must be positive multiples of 128", name, in_, out_);
  }
  if (in_ > (1 << 30) || out_ > (1 << 30))
    fail("CUDA linear '{}': {}x{} is too large", name, in_, out_);
  if (opts_.max_m < 1 || opts_.mma_max_m < 0 || opts_.gemv_max_m < 0) {
    fail(
        "CUDA linear '{}': max_m {} must be positive and gemv_max_m {} / mma_max_m {} non-negative",
        name, opts_.max_m, opts_.gemv_max_m, opts_.mma_max_m);
  }
  if (opts_.gemv_max_splits < 1 || opts_.gemv_min_split_tiles < 1) {
    fail("CUDA linear '{}': gemv_max_splits {} and gemv_min_split_tiles {} must be positive", name,
         opts_.gemv_max_splits, opts_.gemv_min_split_tiles);
  }
  traits_.sms = current_sm_count();
  if (opts_.split_k == 0) {  // the occupancies only feed the split-K rule
    traits_.mma_blocks_per_sm = detail::mma_blocks_per_sm(K_, cb_);
    traits_.gemv_blocks_per_sm = detail::gemv_blocks_per_sm(K_, cb_);
  }
  if (split_k() > in_ / 16)
    fail("CUDA linear '{}': split_k {} exceeds the {} k-tiles", name, split_k(), in_ / 16);

  const size_t tbytes = static_cast<size_t>(in_ / 16 * (out_ / 16) * 16 * K_) * 2;
  const auto of = [&](const char* tensor) {
    return fmt::format("the {} of CUDA linear '{}'", tensor, name);
  };
  trellis_ = DeviceBuffer(trellis, tbytes, of("trellis"));
  suh_ = DeviceBuffer(suh, static_cast<size_t>(in_) * 2, of("suh"));
  svh_ = DeviceBuffer(svh, static_cast<size_t>(out_) * 2, of("svh"));
  if (bias != nullptr) bias_ = DeviceBuffer(bias, static_cast<size_t>(out_) * 4, of("bias"));
  // The GEMV's completion counters: one per 128 output columns and token group of the largest
  // GEMV-path m (zero between runs; the kernel resets what it uses).
  const int64_t token_groups =
      std::max<int64_t>(1, (std::min(opts_.gemv_max_m, opts_.max_m) + 31) / 32);
  const auto counter_bytes = static_cast<size_t>(token_groups * (out_ / 128)) * 4;
  gemv_counters_ = DeviceBuffer(counter_bytes, of("GEMV counters"));
  EXL3_CUDA_CHECK(cudaMemset(gemv_counters_.get(), 0, counter_bytes), of("GEMV counters"));
  if (opts_.max_m > opts_.mma_max_m) {
    EXL3_CUDA_CHECK(detail::reconstruct_folded_prepare(K_, cb_),
                    fmt::format("CUDA linear '{}': preparing the folded reconstruct kernel", name));
  }
}

LinearPlan Exl3LinearCuda::plan(int64_t m) const {
  return plan_linear(shape(), opts_, traits_, m);
}

int Exl3LinearCuda::split_k() const {
  return linear_splits(shape(), opts_, traits_, LinearPath::kMma);
}

int Exl3LinearCuda::gemv_split_k() const {
  return linear_splits(shape(), opts_, traits_, LinearPath::kGemv);
}

LinearPath Exl3LinearCuda::path_for(int64_t m) const {
  return linear_path(opts_, m);
}

size_t Exl3LinearCuda::workspace_bytes() const {
  return linear_workspace_bytes(shape(), opts_, traits_);
}

cudaError_t Exl3LinearCuda::reconstruct(uint16_t* out, cudaStream_t stream) const {
  return reconstruct_w_hat(trellis_.as<uint16_t>(), in_, out_, K_, cb_, out, stream);
}

cudaError_t Exl3LinearCuda::run(const void* x, DType in_type, void* y, DType out_type, int64_t m,
                                void* workspace, size_t workspace_size, cudaStream_t stream) const {
  return run(plan(m), x, in_type, y, out_type, workspace, workspace_size, stream);
}

cudaError_t Exl3LinearCuda::run(const LinearPlan& plan, const void* x, DType in_type, void* y,
                                DType out_type, void* workspace, size_t workspace_size,
                                cudaStream_t stream) const {
  const int64_t m = plan.m;
  if (m < 1 || m > opts_.max_m || x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (workspace == nullptr || workspace_size < plan.workspace.bytes) return cudaErrorInvalidValue;
  auto* xr = plan.workspace.xr.in<__half>(workspace);
  auto* row_scale = plan.workspace.row_scale.in<float>(workspace);
  auto* partial = plan.workspace.partial.in<float>(workspace);
  auto* w_hat = plan.workspace.w_hat.in<uint16_t>(workspace);

  if (plan.path == LinearPath::kCublas && in_type != DType::kF32)
    return run_folded(x, in_type, y, out_type, m, w_hat, partial, stream);

  const bool gemv = plan.path == LinearPath::kGemv;
  detail::GemvGroupArgs args;
  if (gemv) {
    args.member[0] = gemv_member(plan, workspace, y, 0);
    args.count = 1;
    args.m = static_cast<int>(m);
    args.k = static_cast<int>(in_);
    args.out_type = out_type;
  }
  if (gemv && plan.staged_chunks > 0) {  // the rotation inside the GEMV: one launch
    args.x = x;
    args.in_type = in_type;
    args.staged_chunks = plan.staged_chunks;
    return detail::gemv(K_, cb_, args, stream);
  }
  cudaError_t e =
      detail::rotate_input(x, in_type, suh_.as<uint16_t>(), m, in_, xr, row_scale, stream);
  if (e != cudaSuccess) return e;
  if (gemv) return detail::gemv(K_, cb_, args, stream);
  if (plan.path == LinearPath::kMma) {
    e = detail::mma_gemm(trellis_.as<uint16_t>(), K_, cb_, xr, m, in_, out_, plan.split_k, partial,
                         stream);
  } else {
    // fp32 activations: rotate them to fp16 (with the range guard) and multiply W_hat.
    e = reconstruct_w_hat(trellis_.as<uint16_t>(), in_, out_, K_, cb_, w_hat, stream);
    if (e != cudaSuccess) return e;
    e = cublas_gemm(xr, CUDA_R_16F, w_hat, partial, CUDA_R_32F, m, stream);
  }
  if (e != cudaSuccess) return e;
  return detail::rotate_output(partial, plan.split_k, row_scale, svh_.as<uint16_t>(),
                               bias_.as<float>(), m, out_, y, out_type, stream);
}

detail::GemvMember Exl3LinearCuda::gemv_member(const LinearPlan& plan, void* workspace, void* y,
                                               int block_begin) const {
  detail::GemvMember g;
  g.trellis = trellis_.as<uint32_t>();
  g.xr = plan.workspace.xr.in<__half>(workspace);
  g.suh = suh_.as<uint16_t>();
  g.row_scale = plan.workspace.row_scale.in<float>(workspace);
  g.partial = plan.workspace.partial.in<float>(workspace);
  g.svh = svh_.as<uint16_t>();
  g.bias = bias_.as<float>();
  g.y = y;
  g.counters = gemv_counters_.as<int32_t>();
  g.n = static_cast<int>(out_);
  g.splits = plan.split_k;
  g.block_begin = block_begin;
  return g;
}

bool Exl3LinearCuda::can_group(std::span<const Exl3LinearCuda* const> layers, int64_t m) {
  if (layers.empty() || layers.size() > static_cast<size_t>(detail::kGemvGroupMax)) return false;
  const Exl3LinearCuda& a = *layers[0];
  for (const Exl3LinearCuda* l : layers) {
    if (l->in_ != a.in_ || l->K_ != a.K_ || l->cb_ != a.cb_ || m < 1 || m > l->opts_.max_m ||
        l->path_for(m) != LinearPath::kGemv) {
      return false;
    }
  }
  return true;
}

namespace {
size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}
}  // namespace

size_t Exl3LinearCuda::group_workspace_bytes(std::span<const Exl3LinearCuda* const> layers,
                                             int64_t m) {
  size_t bytes = 0;
  for (const Exl3LinearCuda* l : layers) bytes += align256(l->plan(m).workspace.bytes);
  return bytes;
}

cudaError_t Exl3LinearCuda::run_group(std::span<const Exl3LinearCuda* const> layers, const void* x,
                                      DType in_type, std::span<void* const> ys, DType out_type,
                                      int64_t m, void* workspace, size_t workspace_size,
                                      cudaStream_t stream) {
  if (!can_group(layers, m) || ys.size() != layers.size() || x == nullptr || workspace == nullptr ||
      workspace_size < group_workspace_bytes(layers, m)) {
    return cudaErrorInvalidValue;
  }
  detail::RotateGroup rot;
  detail::GemvGroupArgs args;
  auto* base = static_cast<char*>(workspace);
  int blocks = 0;
  // Staged (no rotation launch) when every member's plan is; the widest slice sizes the rows.
  int staged_chunks = 0;
  bool staged = true;
  for (const Exl3LinearCuda* l : layers) {
    const int c = l->plan(m).staged_chunks;
    staged = staged && c > 0;
    staged_chunks = std::max(staged_chunks, c);
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const Exl3LinearCuda& l = *layers[i];
    if (ys[i] == nullptr) return cudaErrorInvalidValue;
    const LinearPlan plan = l.plan(m);
    args.member[i] = l.gemv_member(plan, base, ys[i], blocks);
    rot.suh[i] = l.suh_.as<uint16_t>();
    rot.xr[i] = plan.workspace.xr.in<__half>(base);
    rot.row_scale[i] = plan.workspace.row_scale.in<float>(base);
    blocks += static_cast<int>(l.out_ / 128);
    base += align256(plan.workspace.bytes);
  }
  rot.count = args.count = static_cast<int>(layers.size());
  args.m = static_cast<int>(m);
  args.k = static_cast<int>(layers[0]->in_);
  args.out_type = out_type;
  if (staged) {
    args.x = x;
    args.in_type = in_type;
    args.staged_chunks = staged_chunks;
  } else {
    const cudaError_t e = detail::rotate_input_group(x, in_type, rot, m, layers[0]->in_, stream);
    if (e != cudaSuccess) return e;
  }
  return detail::gemv(layers[0]->K_, layers[0]->cb_, args, stream);
}

// Large m with fp16/bf16 activations: fold both rotations and scales into the decoded weight (in
// the activation dtype) and let cuBLAS multiply the raw activations and write y directly.
cudaError_t Exl3LinearCuda::run_folded(const void* x, DType in_type, void* y, DType out_type,
                                       int64_t m, void* w, float* f32_out,
                                       cudaStream_t stream) const {
  const bool bf16 = in_type == DType::kBF16;
  cudaError_t e =
      detail::reconstruct_folded(trellis_.as<uint16_t>(), K_, cb_, in_, out_, suh_.as<uint16_t>(),
                                 svh_.as<uint16_t>(), bf16, w, stream);
  if (e != cudaSuccess) return e;
  // cuBLAS writes fp32 or the inputs' own 16-bit type; the other 16-bit type goes through fp32.
  const bool direct = out_type == DType::kF32 || out_type == in_type;
  const cudaDataType_t out_dt = out_type == DType::kF16    ? CUDA_R_16F
                                : out_type == DType::kBF16 ? CUDA_R_16BF
                                                           : CUDA_R_32F;
  e = cublas_gemm(x, bf16 ? CUDA_R_16BF : CUDA_R_16F, w, direct ? y : f32_out,
                  direct ? out_dt : CUDA_R_32F, m, stream);
  if (e != cudaSuccess) return e;
  if (!direct)
    return detail::finish_output(f32_out, bias_.as<float>(), m, out_, y, out_type, stream);
  return bias_.empty()
             ? cudaSuccess
             : detail::finish_output(nullptr, bias_.as<float>(), m, out_, y, out_type, stream);
}

// Row-major Y[m, n] = X[m, k] W[k, n] is column-major Y^T = W^T X^T (fp32 accumulation).
cudaError_t Exl3LinearCuda::cublas_gemm(const void* x, int x_type, const void* w, void* y,
                                        int y_type, int64_t m, cudaStream_t stream) const {
  // The context's handle on `stream` with its whole workspace (cuBLAS's recommended 32 MiB on
  // Hopper, the size this path has always used).
  cublasHandle_t h = ctx_->cublas(stream, CudaContext::kCublasWorkspaceBytes);
  if (h == nullptr) return cudaErrorUnknown;
  const auto xt = static_cast<cudaDataType_t>(x_type);
  const float alpha = 1.0f, beta = 0.0f;
  if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(out_), static_cast<int>(m),
                   static_cast<int>(in_), &alpha, w, xt, static_cast<int>(out_), x, xt,
                   static_cast<int>(in_), &beta, y, static_cast<cudaDataType_t>(y_type),
                   static_cast<int>(out_), CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
    return cudaErrorUnknown;
  }
  return cudaGetLastError();
}

}  // namespace exl3::cuda
