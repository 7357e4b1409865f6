// CUDA MXFP8 linear (E4M3 weights, UE8M0 scale per 32 inputs, BF16 activations): prepared once,
// run with no allocation, no host sync and no data-dependent host control flow, so every run
// can be captured in a CUDA graph. The CPU reference is mxfp8::Weight::matmul_t.
//
//   y[m, out] = x[m, in] @ dq(W)^T (+ bias), fp32 accumulation
//
// Split-K on the GEMV and GEMM paths depends on (in, out) and the SM count only.
// Paths, by m (Mxfp8LinearCuda::path_for):
//   kGemv   : m <= gemv_max_m. Bandwidth bound: each warp streams 16-byte rows of E4M3 codes and
//             their scales, decodes in registers (E4M3 -> fp16 bits by one shift, the 2^8 folded
//             into the block scale), multiplies fp32 activations and accumulates in fp32; split-K
//             partials are reduced in a fixed order. Split-K depends on (in, out) and the device
//             only, and each row's arithmetic is independent of the others: rows are
//             batch-invariant bit for bit for every m on this path.
//   kMma    : gemv_max_m < m <= mma_max_m. In-register dequant to BF16 (exact for every code
//             whose block scale is >= 2^-117) into shared memory, then mma.sync m16n8k16 BF16
//             with fp32 accumulators, 64x64 tiles, one 32-wide K block per step, split-K over whole
//             blocks with the same fixed-order reduction. Batch-invariant within the path.
//   kCublas : m > mma_max_m. The weight is dequantized to BF16 into the caller's workspace and
//             cuBLAS multiplies (fp32 accumulation): at large m the GEMM is compute bound and
//             the dequant pass (3 bytes/weight of traffic) costs a few percent. Deterministic,
//             not batch-invariant (cuBLAS picks its algorithm by shape).
// Why not FP8 tensor cores with per-block scaling on sm_90: Hopper's FP8 wgmma has no per-32
// block scale, so each 32-wide K step would need its own accumulator rescale (4 K-steps of 32
// per wgmma K=128 tile are impossible; K=32 wgmma tiles halve tensor throughput) and the BF16
// activations would have to be quantized to E4M3, changing the numerics against the BF16
// reference. Dequant-to-BF16 keeps the result equal to the CPU reference up to summation order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/linear.hpp"

namespace exl3::mxfp8 {
class Weight;
}

namespace exl3::cuda {

enum class Mxfp8Path : uint8_t { kGemv, kMma, kCublas };
const char* mxfp8_path_name(Mxfp8Path p);  // "gemv" | "mma" | "cublas"

struct Mxfp8Options {
  int64_t max_m = 4096;     // largest batch the workspace is sized for
  int64_t gemv_max_m = 16;  // m up to this uses the GEMV (0 = never)
  int64_t mma_max_m = 512;  // m above this uses dequant + cuBLAS
  int split_k = 0;          // GEMV split-K; 0 = planned from (in, out) and the SM count
};

class Mxfp8LinearCuda {
 public:
  // Uploads the planes (and bias, fp32, may be empty). Throws exl3::Error naming the layer on
  // bad shapes (in % 32, empty), bad options or CUDA failures.
  Mxfp8LinearCuda(const mxfp8::Weight& w, const std::vector<float>& bias = {}, const Mxfp8Options& opts = {});
  // Raw form: host planes values [out, in], scales [out, in / 32].
  Mxfp8LinearCuda(const char* name, const uint8_t* values, const uint8_t* scales, int64_t in_features,
                  int64_t out_features, const float* bias, const Mxfp8Options& opts = {});
  ~Mxfp8LinearCuda();
  Mxfp8LinearCuda(const Mxfp8LinearCuda&) = delete;
  Mxfp8LinearCuda& operator=(const Mxfp8LinearCuda&) = delete;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  int gemv_split_k() const { return split_k_; }
  // Split-K slices run() uses at this m (1 on the cuBLAS path).
  int splits_for(int64_t m) const;
  const Mxfp8Options& options() const { return opts_; }
  Mxfp8Path path_for(int64_t m) const;
  // Device bytes of the weight (both planes).
  size_t weight_bytes() const { return static_cast<size_t>(in_ * out_ + in_ / 32 * out_); }

  // Workspace bytes run() needs for any m <= max_m, and for one m.
  size_t workspace_bytes() const;
  size_t workspace_bytes(int64_t m) const;

  // x: [m, in] BF16; y: [m, out] BF16 or F32; device pointers, m in 1..max_m. Asynchronous on
  // `stream`; returns the first CUDA error (never throws, never syncs).
  cudaError_t run(const void* x, void* y, DType out_type, int64_t m, void* workspace,
                  size_t workspace_size, cudaStream_t stream) const;

  // Dequantizes the weight to BF16 [out, in] into `out` (device).
  cudaError_t dequantize_bf16(uint16_t* out, cudaStream_t stream) const;

 private:
  void init(const char* name, const uint8_t* values, const uint8_t* scales, const float* bias);

  std::string name_;
  int64_t in_ = 0, out_ = 0;
  Mxfp8Options opts_;
  int split_k_ = 1;      // GEMV
  int mma_split_k_ = 1;  // tensor-core GEMM
  uint8_t* d_values_ = nullptr;
  uint8_t* d_scales_ = nullptr;
  float* d_bias_ = nullptr;
  void* cublas_ = nullptr;  // cublasHandle_t, created only when the cuBLAS path is reachable
};

// For tools and tests: copies x (fp32 [m, in], rounded to BF16) to the device, runs the layer
// with fp32 output, copies y back and synchronises. Throws exl3::Error naming the step.
std::vector<float> mxfp8_forward_host(const Mxfp8LinearCuda& layer, const float* x, int64_t m);

}  // namespace exl3::cuda
