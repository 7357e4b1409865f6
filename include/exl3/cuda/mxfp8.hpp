// CUDA MXFP8 linear (E4M3 weights, UE8M0 scale per 32 inputs, BF16 activations): prepared once,
// run with no allocation, no host sync and no data-dependent host control flow, so every run
// can be captured in a CUDA graph. The CPU reference is mxfp8::Weight::matmul_t.
//
//   y[m, out] = x[m, in] @ dq(W)^T (+ bias), fp32 accumulation
//
// Paths, by m (Mxfp8LinearCuda::plan, exl3/cuda/plan.hpp):
//   kGemv   : m <= gemv_max_m (default 32, at most 64). Bandwidth bound at decode: the weight is
//   uploaded in
//             a tiled layout (src/cuda/mxfp8_tiles.hpp) whose 16-byte lane loads are mma.sync
//             A fragments; E4M3 codes become bf16 with shifts and masks (exact), mma.sync
//             m16n8k16 multiplies 16 rows x 16 inputs by up to 8 activation rows per tile, and
//             the UE8M0 scale is applied to each 32-input block's fp32 result. Split-K over
//             whole blocks, planned from (in, out) and the SM count only, reduced in a fixed
//             order: rows are batch-invariant bit for bit for every m on this path.
//   kCublas : m > gemv_max_m. The weight is dequantized to BF16 into the caller's workspace and
//             cuBLAS multiplies (fp32 accumulation): at large m the GEMM is compute bound and
//             the dequant pass (3 bytes/weight of traffic) costs a few percent. Deterministic,
//             not batch-invariant (cuBLAS picks its algorithm by shape). cuBLAS runs on the
//             CudaContext's handle and workspace.
// Why not FP8 tensor cores with per-block scaling on sm_90: Hopper's FP8 wgmma has no per-32
// block scale, so each 32-wide K step would need its own accumulator rescale, and the BF16
// activations would have to be quantized to E4M3, changing the numerics against the BF16
// reference. BF16 mma on exactly decoded codes keeps the result equal to the CPU reference up
// to summation order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/cuda/plan.hpp"

namespace exl3::mxfp8 {
class Weight;
}

namespace exl3::cuda {

class Mxfp8LinearCuda {
 public:
  // Uploads the planes (and bias, fp32, may be empty). Throws exl3::Error naming the layer on
  // bad shapes (in % 32, empty), bad options or CUDA failures. `ctx` (cuBLAS) must outlive the
  // layer.
  Mxfp8LinearCuda(CudaContext& ctx, const mxfp8::Weight& w, const std::vector<float>& bias = {},
                  const Mxfp8Options& opts = {});
  // Raw form: host planes values [out, in], scales [out, in / 32]; NaN codes (E4M3 S.1111.111,
  // UE8M0 255) are refused naming the layer, as mxfp8::Weight does for checkpoints.
  Mxfp8LinearCuda(CudaContext& ctx, const char* name, const uint8_t* values, const uint8_t* scales,
                  int64_t in_features, int64_t out_features, const float* bias,
                  const Mxfp8Options& opts = {});
  Mxfp8LinearCuda(const Mxfp8LinearCuda&) = delete;
  Mxfp8LinearCuda& operator=(const Mxfp8LinearCuda&) = delete;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  const Mxfp8Options& options() const { return opts_; }
  Mxfp8Shape shape() const { return {in_, out_, !bias_.empty()}; }
  const Mxfp8Traits& traits() const { return traits_; }

  // What run() does at m rows: plan_mxfp8(shape(), options(), traits(), m).
  Mxfp8Plan plan(int64_t m) const;
  // The planner's answers, for reports and tests.
  int gemv_split_k() const;
  int splits_for(int64_t m) const { return plan(m).split_k; }  // 1 on the cuBLAS path
  Mxfp8Path path_for(int64_t m) const;
  // Device bytes of the weight (both planes; rows padded to a multiple of 16).
  size_t weight_bytes() const { return static_cast<size_t>((in_ + in_ / 32) * padded_rows()); }

  // Workspace bytes run() needs for any m <= max_m, and for one m.
  size_t workspace_bytes() const;
  size_t workspace_bytes(int64_t m) const { return plan(m).workspace.bytes; }

  // Runs `plan` (from plan(m) of this layer): x: [m, in] BF16; y: [m, out] BF16 or F32; device
  // pointers, m in 1..max_m. Only launches: asynchronous on `stream`, returns the first CUDA
  // error (never throws, never syncs).
  cudaError_t run(const Mxfp8Plan& plan, const void* x, void* y, DType out_type, void* workspace,
                  size_t workspace_size, cudaStream_t stream) const;
  // run(plan(m), ...).
  cudaError_t run(const void* x, void* y, DType out_type, int64_t m, void* workspace,
                  size_t workspace_size, cudaStream_t stream) const;

  // Dequantizes the weight to BF16 [out, in] into `out` (device).
  cudaError_t dequantize_bf16(uint16_t* out, cudaStream_t stream) const;

 private:
  // check_codes: refuse NaN codes and out-of-range scales (raw planes; an mxfp8::Weight is
  // checked).
  void init(const char* name, const uint8_t* values, const uint8_t* scales, const float* bias,
            bool check_codes);
  int64_t padded_rows() const { return (out_ + 15) / 16 * 16; }

  std::string name_;
  int64_t in_ = 0, out_ = 0;
  Mxfp8Options opts_;
  Mxfp8Traits traits_;
  CudaContext* ctx_ = nullptr;  // cuBLAS handle and workspace (not owned)
  DeviceBuffer values_;         // tiled (src/cuda/mxfp8_tiles.hpp)
  DeviceBuffer scales_;
  DeviceBuffer bias_;  // fp32 [out], or empty
};

// For tools and tests: copies x (fp32 [m, in], rounded to BF16) to the device, runs the layer
// with fp32 output, copies y back and synchronises. Throws exl3::Error naming the step.
std::vector<float> mxfp8_forward_host(const Mxfp8LinearCuda& layer, const float* x, int64_t m);

}  // namespace exl3::cuda
