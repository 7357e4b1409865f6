// One linear layer on the GPU behind one interface (internal to the CUDA runtime): EXL3 through
// Exl3LinearCuda, unquantized through cuBLAS (DenseLinearCuda), MXFP8 (stored in the checkpoint
// or converted at load by the overlay) through Mxfp8LinearCuda, from a checkpoint or from one
// tensor-parallel rank's slice (tp_linear.hpp).
//
// An EXL3 linear's stored dims may be padded past the model's (and a rank's k/v slice may cover
// whole 128-channel blocks around its heads): the input is zero-padded and the output cut
// through the engine's pad buffers, so callers always see [m, in()] -> [m, out()].
#pragma once

#if defined(EXL3_HAVE_CUDA)

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/context.hpp"
#include "exl3/cuda/dense_linear.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/cuda/mxfp8.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/dtype.hpp"
#include "exl3/model/tp_plan.hpp"
#include "exl3/runtime/overlay.hpp"
#include "exl3/runtime/tp_linear.hpp"

namespace exl3::runtime {

class GpuLinear {
 public:
  struct Pads {
    float* in = nullptr;   // [cap, max stored in]
    float* out = nullptr;  // [cap, max stored out]
  };

  // `<prefix>` of the checkpoint (EXL3, stored MXFP8 `.weight` + `.weight_scale`, or `.weight`)
  // [+ `.bias`] as config.json's in -> out. fp32_weights keeps an unquantized weight in fp32
  // (routers). cap: the most rows run() gets. Non-EXL3 linears go through the CPU engine's
  // Linear::load with `overlay` and `report`, so both engines check, convert (same MXFP8 codec)
  // and report exactly alike; an MXFP8 result is uploaded as Mxfp8LinearCuda. Every factory
  // takes the engine's CudaContext (the cuBLAS handle and workspace), which must outlive the
  // linear. `mxfp8` tunes an MXFP8 result and `exl3` an EXL3 one (their max_m is replaced by
  // cap).
  static GpuLinear load(cuda::CudaContext& ctx, const Checkpoint& ckpt, const std::string& prefix,
                        int64_t in, int64_t out, int64_t cap, bool fp32_weights = false,
                        const OverlayDecision& overlay = {}, OverlayReport* report = nullptr,
                        const cuda::Mxfp8Options& mxfp8 = {}, const cuda::LinearOptions& exl3 = {});
  // An unquantized [out, in] matrix tensor (also the tied embedding as the head); `rows`, when
  // not empty, keeps only those output rows (a rank's vocabulary).
  static GpuLinear dense(cuda::CudaContext& ctx, const TensorStore& store,
                         const std::string& tensor, const std::vector<float>& bias, int64_t cap,
                         bool fp32_weights, Extent rows = {});
  // One rank's slice (not empty: the CUDA TP engine refuses plans that leave a rank without
  // heads or channels). out_offset: the first output column this rank keeps of the slice (k/v
  // slices that cover whole blocks around the rank's heads); out(): `out` columns from there.
  // An unquantized slice (fp32 on the host) goes up in `stored`, the checkpoint tensor's dtype,
  // so a rank computes with the same weights as the unsliced engine.
  static GpuLinear from_rank(cuda::CudaContext& ctx, const RankLinear& r, const std::string& name,
                             int64_t out_offset, int64_t out, int64_t cap,
                             exl3::DType stored = exl3::DType::kF32,
                             const cuda::LinearOptions& exl3 = {});

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  int64_t stored_in() const { return stored_in_; }
  int64_t stored_out() const { return stored_out_; }
  bool is_mxfp8() const { return mx_ != nullptr; }
  // The device [out, in] fp32 matrix of an unpadded, bias-free dense linear (routers, for the
  // fused decode routing), else null.
  const float* fp32_matrix() const;
  // Weight (+ bias) bytes on the device.
  size_t device_bytes() const { return bytes_; }
  size_t workspace_bytes() const;

  // y[m, out] = x[m, in] (both fp32, packed rows).
  void run(const float* x, float* y, int64_t m, void* ws, size_t ws_size, const Pads& pads,
           cudaStream_t stream) const;
  // ys[i] = x @ linears[i]: one fused EXL3 group launch pair when every linear is an unpadded
  // EXL3 linear, m is on their GEMV paths and the workspace holds the group
  // (Exl3LinearCuda::run_group), else run() each in turn.
  static void run_group(std::span<const GpuLinear* const> linears, const float* x,
                        std::span<float* const> ys, int64_t m, void* ws, size_t ws_size,
                        const Pads& pads, cudaStream_t stream);
  // Workspace bytes of run_group on these linears at its largest grouped m (0 when they never
  // group).
  static size_t group_workspace_bytes(std::span<const GpuLinear* const> linears);

 private:
  // The fused group form of these linears at m, or empty.
  static std::vector<const cuda::Exl3LinearCuda*> groupable(
      std::span<const GpuLinear* const> linears, int64_t m);
  // The EXL3 linear `v` (stored dims) on the device, as name_.
  void upload_exl3(cuda::CudaContext& ctx, const cpu::LinearView& v, int64_t cap,
                   cuda::LinearOptions lo);

  std::string name_;
  int64_t in_ = 0, out_ = 0, stored_in_ = 0, stored_out_ = 0, out_offset_ = 0;
  size_t bytes_ = 0;
  std::unique_ptr<cuda::Exl3LinearCuda> exl3_;
  std::unique_ptr<cuda::DenseLinearCuda> dense_;
  // MXFP8: the kernels take BF16 activations, so run() first rounds x into the front of the
  // workspace (mx_x_bytes_, sized for cap rows), as DenseLinearCuda does for BF16 weights.
  std::unique_ptr<cuda::Mxfp8LinearCuda> mx_;
  size_t mx_x_bytes_ = 0;
};

}  // namespace exl3::runtime

#endif  // EXL3_HAVE_CUDA
