// Mxfp8LinearCuda: permute the planes into the GEMV's tiled layout and upload once, read the
// device traits, then run the plan of each m (exl3/cuda/plan.hpp) with only kernel launches
// (graph-capturable). See exl3/cuda/mxfp8.hpp.
#include "exl3/cuda/mxfp8.hpp"

#include <algorithm>

#include <cublas_v2.h>

#include "cuda/mxfp8_kernels.hpp"
#include "cuda/mxfp8_tiles.hpp"
#include "exl3/cuda/check.hpp"
#include "exl3/cuda/context.hpp"
#include "exl3/cuda/reconstruct.hpp"
#include "exl3/error.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::cuda {
namespace {

static_assert(detail::kMxfp8TileRows == kMxfp8PlanTileRows,
              "the split-K rule counts the GEMV's weight tiles");

// The checkpoint planes in the tiled layout. offset(row, col) = tile base + a row part + a column
// part (mxfp8_tiles.hpp), so both parts are tabulated once from the layout function itself.
void tile_planes(const uint8_t* values, const uint8_t* scales, int64_t k, int64_t n,
                 std::vector<uint8_t>& tv, std::vector<uint8_t>& ts) {
  const int64_t kb = k / 32, rows = (n + 15) / 16 * 16;
  tv.assign(static_cast<size_t>(rows * k), 0);
  ts.assign(static_cast<size_t>(rows * kb), 0);
  int64_t col_part[32], row_part[16];
  for (int c = 0; c < 32; ++c) col_part[c] = detail::mxfp8_tile_value_offset(0, c, kb);
  for (int r = 0; r < 16; ++r) row_part[r] = detail::mxfp8_tile_value_offset(r, 0, kb);
  for (int64_t row = 0; row < n; ++row) {
    const uint8_t* src = values + row * k;
    for (int64_t b = 0; b < kb; ++b) {
      uint8_t* dst =
          tv.data() + ((row / 16) * kb + b) * detail::kMxfp8TileBytes + row_part[row % 16];
      for (int c = 0; c < 32; ++c) dst[col_part[c]] = src[b * 32 + c];
      ts[static_cast<size_t>(detail::mxfp8_tile_scale_offset(row, b, kb))] = scales[row * kb + b];
    }
  }
}

}  // namespace

Mxfp8LinearCuda::Mxfp8LinearCuda(CudaContext& ctx, const mxfp8::Weight& w,
                                 const std::vector<float>& bias, const Mxfp8Options& opts)
    : name_(w.name()), in_(w.cols()), out_(w.rows()), opts_(opts), ctx_(&ctx) {
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != out_) {
    fail("CUDA MXFP8 linear '{}': bias has {} values for {} outputs", name_, bias.size(), out_);
  }
  // An mxfp8::Weight's codes were checked when it was loaded, converted or built from planes.
  init(w.name().c_str(), w.values(), w.scales(), bias.empty() ? nullptr : bias.data(),
       /*check_codes=*/false);
}

Mxfp8LinearCuda::Mxfp8LinearCuda(CudaContext& ctx, const char* name, const uint8_t* values,
                                 const uint8_t* scales, int64_t in_features, int64_t out_features,
                                 const float* bias, const Mxfp8Options& opts)
    : name_(name), in_(in_features), out_(out_features), opts_(opts), ctx_(&ctx) {
  init(name, values, scales, bias, /*check_codes=*/true);
}

void Mxfp8LinearCuda::init(const char* name, const uint8_t* values, const uint8_t* scales,
                           const float* bias, bool check_codes) {
  if (in_ <= 0 || out_ <= 0 || in_ % 32 != 0) {
    fail(
        "CUDA MXFP8 linear '{}': {} -> {}: the input width must be a positive multiple of 32 and "
        "the output "
        "positive",
        name, in_, out_);
  }
  if (in_ > (1 << 30) || out_ > (1 << 30))
    fail("CUDA MXFP8 linear '{}': {}x{} is too large", name, in_, out_);
  if (opts_.max_m < 1 || opts_.gemv_max_m < 0 || opts_.gemv_max_m > detail::kMxfp8GemvMaxM) {
    fail("CUDA MXFP8 linear '{}': max_m {} must be positive and gemv_max_m {} in 0..{}", name,
         opts_.max_m, opts_.gemv_max_m, detail::kMxfp8GemvMaxM);
  }
  traits_.sms = current_sm_count();
  if (gemv_split_k() > in_ / 32)
    fail("CUDA MXFP8 linear '{}': split_k {} exceeds the {} 32-wide blocks", name, gemv_split_k(),
         in_ / 32);
  if (check_codes)
    mxfp8::check_planes(fmt::format("CUDA MXFP8 linear '{}'", name), values, scales, out_, in_);
  std::vector<uint8_t> tv, ts;
  tile_planes(values, scales, in_, out_, tv, ts);
  const auto of = [&](const char* what) {
    return fmt::format("the {} of CUDA MXFP8 linear '{}'", what, name);
  };
  values_ = DeviceBuffer::upload(tv, of("values"));
  scales_ = DeviceBuffer::upload(ts, of("scales"));
  if (bias != nullptr) bias_ = DeviceBuffer(bias, static_cast<size_t>(out_) * 4, of("bias"));
}

Mxfp8Plan Mxfp8LinearCuda::plan(int64_t m) const {
  return plan_mxfp8(shape(), opts_, traits_, m);
}

int Mxfp8LinearCuda::gemv_split_k() const {
  return mxfp8_splits(shape(), opts_, traits_, Mxfp8Path::kGemv);
}

Mxfp8Path Mxfp8LinearCuda::path_for(int64_t m) const {
  return mxfp8_path(opts_, m);
}

size_t Mxfp8LinearCuda::workspace_bytes() const {
  return mxfp8_workspace_bytes(shape(), opts_, traits_);
}

cudaError_t Mxfp8LinearCuda::dequantize_bf16(uint16_t* out, cudaStream_t stream) const {
  return detail::mxfp8_dequant_bf16(values_.as<uint8_t>(), scales_.as<uint8_t>(), in_, out_, out,
                                    stream);
}

cudaError_t Mxfp8LinearCuda::run(const void* x, void* y, DType out_type, int64_t m, void* workspace,
                                 size_t workspace_size, cudaStream_t stream) const {
  return run(plan(m), x, y, out_type, workspace, workspace_size, stream);
}

cudaError_t Mxfp8LinearCuda::run(const Mxfp8Plan& plan, const void* x, void* y, DType out_type,
                                 void* workspace, size_t workspace_size,
                                 cudaStream_t stream) const {
  const int64_t m = plan.m;
  if (m < 1 || m > opts_.max_m || x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (out_type != DType::kF32 && out_type != DType::kBF16) return cudaErrorInvalidValue;
  const int splits = plan.split_k;
  if (plan.workspace.bytes > 0 && (workspace == nullptr || workspace_size < plan.workspace.bytes))
    return cudaErrorInvalidValue;
  auto* partial = plan.workspace.partial.in<float>(workspace);
  auto* w_bf16 = plan.workspace.w_bf16.in<uint16_t>(workspace);
  cudaError_t e = cudaSuccess;
  if (plan.path == Mxfp8Path::kGemv) {
    e = detail::mxfp8_gemv(values_.as<uint8_t>(), scales_.as<uint8_t>(), x, m, in_, out_, splits,
                           partial, bias_.as<float>(), y, out_type, stream);
    if (e != cudaSuccess || splits == 1) return e;
    return detail::mxfp8_reduce(partial, splits, bias_.as<float>(), m, out_, y, out_type, stream);
  }
  e = detail::mxfp8_dequant_bf16(values_.as<uint8_t>(), scales_.as<uint8_t>(), in_, out_, w_bf16,
                                 stream);
  if (e != cudaSuccess) return e;
  // Row-major y[m, n] = x[m, k] W[n, k]^T is column-major y^T = W^T(k x n, transposed) x^T.
  cublasHandle_t h = ctx_->cublas(stream, CudaContext::kCublasWorkspaceBytes);
  if (h == nullptr) return cudaErrorUnknown;
  const bool via_partial = !bias_.empty();  // bias added in fp32 before the output rounding
  void* dst = via_partial ? static_cast<void*>(partial) : y;
  const cudaDataType_t dt = via_partial || out_type == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const float alpha = 1.0f, beta = 0.0f;
  const auto n = static_cast<int>(out_), mm = static_cast<int>(m), k = static_cast<int>(in_);
  if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, mm, k, &alpha, w_bf16, CUDA_R_16BF, k, x,
                   CUDA_R_16BF, k, &beta, dst, dt, n, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
    return cudaErrorUnknown;
  }
  if (!via_partial) return cudaGetLastError();
  return detail::mxfp8_reduce(partial, 1, bias_.as<float>(), m, out_, y, out_type, stream);
}

std::vector<float> mxfp8_forward_host(const Mxfp8LinearCuda& layer, const float* x, int64_t m) {
  if (m < 1 || m > layer.options().max_m) {
    fail("CUDA MXFP8 linear: {} rows outside 1..{} (raise Mxfp8Options::max_m)", m,
         layer.options().max_m);
  }
  const size_t xin = static_cast<size_t>(m * layer.in_features()),
               yout = static_cast<size_t>(m * layer.out_features());
  std::vector<uint16_t> xb(xin);
  for (size_t i = 0; i < xin; ++i) xb[i] = trellis::float_to_bf16(x[i]);
  const size_t ws_bytes = layer.workspace_bytes(m);  // may be 0 (then nullptr is accepted)
  const auto dx = DeviceBuffer::upload(xb, "the MXFP8 host wrapper's input");
  const DeviceBuffer dy(yout * 4, "the MXFP8 host wrapper's output");
  const DeviceBuffer ws(ws_bytes, "the MXFP8 host wrapper's workspace");
  EXL3_CUDA_CHECK(layer.run(dx.get(), dy.get(), DType::kF32, m, ws.get(), ws_bytes, nullptr),
                  "CUDA MXFP8 linear (host wrapper): running");
  EXL3_CUDA_CHECK(cudaDeviceSynchronize(), "CUDA MXFP8 linear (host wrapper): running");
  std::vector<float> y(yout);
  EXL3_CUDA_CHECK(cudaMemcpy(y.data(), dy.get(), yout * 4, cudaMemcpyDeviceToHost),
                  "CUDA MXFP8 linear (host wrapper): copying output");
  return y;
}

}  // namespace exl3::cuda
