// The tensor-core form of MLA's attention over the latent cache (mla_attend_tc.cu), launched by
// mla_attend (mla_attention.cu) for every shape it supports; the CUDA-core kernel there covers
// the rest and is the simpler statement of the same computation.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/cuda/mla.hpp"

namespace exl3::cuda::detail {

// Heads one block scores together (the M of the 16x16x16 fp16 MMA tiles; missing heads are
// zero rows).
constexpr int kMlaTcHeads = 16;

// kv_lora_rank a multiple of 64 (four warps split the latent output in 16-channel tiles).
bool mla_tc_supports(const MlaShape& s);
size_t mla_tc_smem_bytes(const MlaShape& s);
// Lets the kernel take mla_tc_smem_bytes(s) of shared memory (over the default 48 KiB); called
// at load, never while a graph is being captured.
cudaError_t mla_tc_prepare(const MlaShape& s);

// grid (head groups of kMlaTcHeads, n tokens, splits); arguments as mla_attend_kernel's.
cudaError_t launch_mla_attend_tc(dim3 grid, const float* q_lat, const float* q,
                                 const int32_t* selection, int64_t sel_stride, const int32_t* count,
                                 TokenMeta meta, const MlaShape& s, float scale, const PagedKv& kv,
                                 float* o_lat, float* part, float2* ml, cudaStream_t stream);

}  // namespace exl3::cuda::detail
