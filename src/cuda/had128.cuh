// Hadamard-128 and vector load/store helpers shared by the rotation kernels (linear, MoE and the
// standalone hadamard128_rows). One warp holds one 128-chunk, 4 consecutive elements per lane:
// the two lowest index bits are butterflied in registers, the five lane bits by xor-shuffles, all
// in fp32 (Sylvester order, unnormalised: callers multiply by 1/sqrt(128)).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/cuda/dtype.hpp"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda::detail {

// The two stages over a lane's 4 register elements (index bits held in registers).
__device__ __forceinline__ void had_register_stages(float (&v)[4]) {
  const float a = v[0] + v[1], b = v[0] - v[1], c = v[2] + v[3], d = v[2] - v[3];
  v[0] = a + c;
  v[1] = b + d;
  v[2] = a - c;
  v[3] = b - d;
}

// The five stages over the lane index, by xor-shuffles.
__device__ __forceinline__ void had_lane_stages(float (&v)[4], int lane) {
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float o = __shfl_xor_sync(0xFFFFFFFFu, v[i], m);
      v[i] = upper ? (o - v[i]) : (v[i] + o);
    }
  }
}

// Lane holds elements 4 lane .. 4 lane + 3 of the chunk.
__device__ __forceinline__ void had128_lane4(float (&v)[4], int lane) {
  had_register_stages(v);
  had_lane_stages(v, lane);
}

// Four consecutive activations at idx (idx % 4 == 0) as fp32, one vector load.
__device__ __forceinline__ void load_act4(const void* x, DType t, int64_t idx, float (&v)[4]) {
  switch (t) {
    case DType::kF16: {
      const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const __half*>(x) + idx);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
      v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
      break;
    }
    case DType::kBF16: {
      const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(x) + idx);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
      v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
      break;
    }
    default: {
      const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + idx);
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    }
  }
}

__device__ __forceinline__ void load_half4(const uint16_t* p, int64_t idx, float (&v)[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p + idx);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}

// Stores four consecutive fp32 values at idx (idx % 4 == 0) in `t`, one vector store.
__device__ __forceinline__ void store_act4(void* y, DType t, int64_t idx, const float (&v)[4]) {
  switch (t) {
    case DType::kF16: {
      const __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
      *reinterpret_cast<uint2*>(static_cast<__half*>(y) + idx) =
          uint2{*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b)};
      break;
    }
    case DType::kBF16: {
      const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]),
                           b = __floats2bfloat162_rn(v[2], v[3]);
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(y) + idx) =
          uint2{*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b)};
      break;
    }
    default:
      *reinterpret_cast<float4*>(static_cast<float*>(y) + idx) =
          make_float4(v[0], v[1], v[2], v[3]);
  }
}

// The input rotation's range guard: |had128(v)| <= sqrt(128) max|v|, and the rotated fp16 x'
// must stay below 2^15, so a row whose bound = max|x * suh| * kHadGain passes kHalfSafe is divided
// by the smallest power of two that brings it back (exact, undone in the epilogue). Non-finite
// bounds keep 1, so NaN/inf propagate instead of being scaled away.
constexpr float kHadGain = 11.3137085f;
constexpr float kHalfSafe = 32768.0f;
__device__ __forceinline__ float guard_divisor(float bound) {
  return bound > kHalfSafe && bound < INFINITY ? exp2f(ceilf(log2f(bound / kHalfSafe))) : 1.0f;
}

// max |x[idx .. idx + 3] * suh[col .. col + 3]| folded into mx: the guard's row maximum.
__device__ __forceinline__ float guard_max4(const void* x, DType t, int64_t idx,
                                            const uint16_t* suh, int64_t col, float mx) {
  float a[4], s4[4];
  load_act4(x, t, idx, a);
  load_half4(suh, col, s4);
#pragma unroll
  for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fabsf(a[j] * s4[j]));
  return mx;
}

// One warp's 128-chunk of the rotated input: lane's 4 fp16 values of had128(x * suh) * mul
// (mul = kHadScale / divisor), x at row offset idx (chunk start + 4 lane), suh at col.
__device__ __forceinline__ uint2 rotate_chunk_lane4(const void* x, DType t, int64_t idx,
                                                    const uint16_t* suh, int64_t col, float mul,
                                                    int lane) {
  float v[4], s4[4];
  load_act4(x, t, idx, v);
  load_half4(suh, col, s4);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] *= s4[i];
  had128_lane4(v, lane);
  const __half2 lo = __floats2half2_rn(v[0] * mul, v[1] * mul);
  const __half2 hi = __floats2half2_rn(v[2] * mul, v[3] * mul);
  return uint2{*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi)};
}

// Split-K partial sums are added as kSplitSums interleaved running sums (sum j takes splits j,
// j + kSplitSums, ... in order), then sum 0 + sum 1 + sum 2 + sum 3 in that order. One warp can
// keep the four sums in registers (four independent load chains instead of one), or four warps
// can each build one and meet in shared memory: the bits are the same either way, so a kernel
// may pick by batch size and rows stay batch-invariant.
constexpr int kSplitSums = 4;

// Running sum j (j < kSplitSums) of one lane's four columns: partial[s, row, col .. col + 3] for
// s = j, j + kSplitSums, ... < splits. Partials are read through L2 (__ldcg): another block may
// have written them.
__device__ __forceinline__ float4 split_sum(const float* partial, int splits, int j, int64_t mn,
                                            int64_t idx) {
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = j; s < splits; s += kSplitSums) {
    const float4 p = __ldcg(reinterpret_cast<const float4*>(partial + s * mn + idx));
    a.x += p.x;
    a.y += p.y;
    a.z += p.z;
    a.w += p.w;
  }
  return a;
}

// The four running sums added in order.
__device__ __forceinline__ void add_split_sums(const float4 (&p)[kSplitSums], float (&v)[4]) {
  v[0] = p[0].x, v[1] = p[0].y, v[2] = p[0].z, v[3] = p[0].w;
#pragma unroll
  for (int j = 1; j < kSplitSums; ++j)
    v[0] += p[j].x, v[1] += p[j].y, v[2] += p[j].z, v[3] += p[j].w;
}

// y[row, col0 .. col0 + 127] (out_type) = had128(v) * (kHadScale * row_scale) * svh + bias, where
// lane holds v for columns col0 + 4 * lane .. + 3.
__device__ __forceinline__ void finish_summed_chunk(float (&v)[4], int64_t n, int64_t row,
                                                    int64_t col0, float row_scale,
                                                    const uint16_t* svh, const float* bias, void* y,
                                                    DType out_type, int lane) {
  const int64_t col = col0 + 4 * lane, idx = row * n + col;
  had128_lane4(v, lane);
  const float mul = exl3::trellis::kHadScale * row_scale;
  float sv[4], o[4];
  load_half4(svh, col, sv);
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = v[i] * mul * sv[i] + (bias ? bias[col + i] : 0.0f);
  store_act4(y, out_type, idx, o);
}

// The EXL3 linear's epilogue for one warp: y[row, col0 .. col0 + 127] (out_type) =
// had128(sum over s of partial[s, row, ...], added as above) * (kHadScale * row_scale) * svh +
// bias.
__device__ __forceinline__ void finish_output_chunk(const float* partial, int splits, int64_t m,
                                                    int64_t n, int64_t row, int64_t col0,
                                                    float row_scale, const uint16_t* svh,
                                                    const float* bias, void* y, DType out_type,
                                                    int lane) {
  const int64_t idx = row * n + col0 + 4 * lane;
  float4 p[kSplitSums];
#pragma unroll
  for (int j = 0; j < kSplitSums; ++j) p[j] = split_sum(partial, splits, j, m * n, idx);
  float v[4];
  add_split_sums(p, v);
  finish_summed_chunk(v, n, row, col0, row_scale, svh, bias, y, out_type, lane);
}

}  // namespace exl3::cuda::detail
