// CUDA EXL3 linear layer: prepared once, then run with no allocation, no host sync and no
// data-dependent host control flow, so every run can be captured in a CUDA graph.
//
//   y = had128(had128(x * suh) @ W_hat) * svh + bias
//
// Paths, chosen by the row count m (Exl3LinearCuda::plan, exl3/cuda/plan.hpp):
//   kGemv   : m <= gemv_max_m. Same prologue and epilogue as kMma (the prologue inside the
//             kernel for small m: LinearPlan::staged_chunks) around a swap-AB kernel (the
//             weight tile is the mma A operand, up to 8 tokens the B operand) that multiplies
//             3INST/MCG weights as their unrounded two-half sum (<= 2^-11 relative per weight
//             from the fp16-rounded W_hat; MUL1 exact). Rows are batch-invariant bit for bit
//             for every m on this path.
//   kMma    : gemv_max_m < m <= mma_max_m. Prologue (suh, input rotation, per-row
//             power-of-two range guard -> fp16 x'), a tensor-core kernel that decodes each 16x16
//             trellis tile straight into mma.m16n8k16 B fragments once for up to 64 rows, split-K
//             partials in fp32, then an epilogue that sums the partials in a fixed order, rotates,
//             scales and adds bias. Row results are batch-invariant bit for bit within the path:
//             the split-K plan depends on (k, n) only, and every row's arithmetic is independent of
//             the others.
//   kCublas : m > mma_max_m. fp16/bf16 activations: the original-basis weight (both rotations and
//             scales folded in, in the activation dtype) is decoded into the caller's workspace
//             and cuBLAS GemmEx multiplies the raw activations and writes y (fp32 accumulation),
//             plus a bias pass when there is a bias. fp32 activations: the kMma prologue and
//             epilogue around W_hat and cuBLAS. Deterministic run to run, but not
//             batch-invariant (cuBLAS picks its algorithm by shape). cuBLAS runs on the
//             CudaContext's handle and workspace (32 MiB), shared by every linear of an engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/dtype.hpp"
#include "exl3/cuda/plan.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3 {
class Exl3LinearData;
}

namespace exl3::cuda {

class CudaContext;
namespace detail {
struct GemvMember;
}

class Exl3LinearCuda {
 public:
  // Uploads the tensors (one DeviceBuffer per tensor, synchronous). Throws exl3::Error on bad
  // options or CUDA failures, naming the layer; what was uploaded before a failure is freed.
  // The cuBLAS path runs on `ctx`'s handle and workspace: `ctx` must outlive the layer.
  Exl3LinearCuda(CudaContext& ctx, const Exl3LinearData& data, const LinearOptions& opts = {});
  // Raw form (host pointers; trellis int16 bits [in/16, out/16, 16K], suh/svh fp16 bits, bias
  // fp32 or null). `name` labels errors.
  Exl3LinearCuda(CudaContext& ctx, const char* name, const uint16_t* trellis, int64_t in_features,
                 int64_t out_features, int K, trellis::Codebook cb, const uint16_t* suh,
                 const uint16_t* svh, const float* bias, const LinearOptions& opts = {});
  Exl3LinearCuda(const Exl3LinearCuda&) = delete;
  Exl3LinearCuda& operator=(const Exl3LinearCuda&) = delete;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  int bits() const { return K_; }
  trellis::Codebook codebook() const { return cb_; }
  const LinearOptions& options() const { return opts_; }
  LinearShape shape() const { return {in_, out_}; }
  // The device traits read when the layer was built.
  const LinearTraits& traits() const { return traits_; }

  // What run() does at m rows: plan_linear(shape(), options(), traits(), m).
  LinearPlan plan(int64_t m) const;
  // The planner's answers, for reports and tests.
  int split_k() const;  // tensor-core path
  int gemv_split_k() const;
  int splits_for(int64_t m) const { return plan(m).split_k; }  // 1 on the cuBLAS path
  LinearPath path_for(int64_t m) const;
  // Workspace bytes needed by run() for any m <= max_m (256-byte aligned sub-buffers; cuBLAS's
  // own workspace is the context's).
  size_t workspace_bytes() const;
  // Workspace bytes for one path at one m (what the benchmark reports).
  size_t workspace_bytes(int64_t m) const { return plan(m).workspace.bytes; }

  // Runs `plan` (from plan(m) of this layer): x: [m, in] in `in_type`; y: [m, out] in
  // `out_type`; both device pointers; m in 1..max_m. Only launches: asynchronous on `stream`,
  // returns the first CUDA error (never throws, never syncs). 16-bit activations on the cuBLAS
  // path multiply the raw x by the folded weight; fp32 ones go through the rotations.
  cudaError_t run(const LinearPlan& plan, const void* x, DType in_type, void* y, DType out_type,
                  void* workspace, size_t workspace_size, cudaStream_t stream) const;
  // run(plan(m), ...).
  cudaError_t run(const void* x, DType in_type, void* y, DType out_type, int64_t m, void* workspace,
                  size_t workspace_size, cudaStream_t stream) const;

  // Linears that read the same x [m, in] (q/k/v; gate/up) in two launches (one input rotation,
  // one GEMV with the epilogue fused), or one when every member's plan fuses the rotation
  // (LinearPlan::staged_chunks), instead of two per linear: possible when m is on every
  // layer's GEMV path and they share in_features, K and codebook (at most 4 layers). Each
  // layer's rows are the bits its own run() gives. ys[i]: [m, out_i] in out_type; the workspace
  // holds group_workspace_bytes(layers, m). The same layer may not run on two streams at once
  // (its GEMV completion counters are per layer).
  static bool can_group(std::span<const Exl3LinearCuda* const> layers, int64_t m);
  static size_t group_workspace_bytes(std::span<const Exl3LinearCuda* const> layers, int64_t m);
  static cudaError_t run_group(std::span<const Exl3LinearCuda* const> layers, const void* x,
                               DType in_type, std::span<void* const> ys, DType out_type, int64_t m,
                               void* workspace, size_t workspace_size, cudaStream_t stream);

  // Decodes W_hat (fp16 bits, row-major [in, out]) into `out` (device).
  cudaError_t reconstruct(uint16_t* out, cudaStream_t stream) const;

 private:
  void init(const char* name, const uint16_t* trellis, const uint16_t* suh, const uint16_t* svh,
            const float* bias);
  cudaError_t run_folded(const void* x, DType in_type, void* y, DType out_type, int64_t m, void* w,
                         float* f32_out, cudaStream_t stream) const;
  // x_type / y_type are cudaDataType_t values (kept out of this header).
  cudaError_t cublas_gemm(const void* x, int x_type, const void* w, void* y, int y_type, int64_t m,
                          cudaStream_t stream) const;

  detail::GemvMember gemv_member(const LinearPlan& plan, void* workspace, void* y,
                                 int block_begin) const;

  int64_t in_ = 0, out_ = 0;
  int K_ = 0;
  trellis::Codebook cb_ = trellis::Codebook::k3Inst;
  LinearOptions opts_;
  LinearTraits traits_;
  CudaContext* ctx_ = nullptr;  // cuBLAS handle and workspace (not owned)
  DeviceBuffer trellis_;        // int16 [in/16, out/16, 16K]
  DeviceBuffer suh_;            // fp16 [in]
  DeviceBuffer svh_;            // fp16 [out]
  DeviceBuffer bias_;           // fp32 [out], or empty
  DeviceBuffer gemv_counters_;  // int32, zero between runs (see run_group)
};

// Convenience for tools and tests: copies fp32 x [m, in] to the device, runs the layer (fp32 in
// and out), copies y [m, out] back and synchronises. Throws exl3::Error naming the failing step.
std::vector<float> linear_forward_host(const Exl3LinearCuda& layer, const float* x, int64_t m);

// Name of device 0 ("NVIDIA H200"), or throws exl3::Error when there is none.
std::string device_name();

}  // namespace exl3::cuda
