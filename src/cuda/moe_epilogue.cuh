// The MoE activation and combine as block-level device functions, written once for their own
// kernels (moe_kernels.cu, the prefill plan) and for the decode GEMV's last-block epilogues
// (moe_gemv.cuh). One warp per 128-element Hadamard chunk (4 values per lane); partials are read
// through L2 (__ldcg) because in the epilogue other blocks of the same grid wrote them.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/had128.cuh"
#include "cuda/moe_args.hpp"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda::detail {

constexpr float kMoeHadGain = 11.3137085f;  // |had128(v)| <= sqrt(128) max|v|
constexpr float kMoeHalfSafe = 32768.0f;    // keep fp16 values below 2^15

__device__ __forceinline__ float moe_h2f(const uint16_t* p, int64_t i) {
  return __half2float(reinterpret_cast<const __half*>(p)[i]);
}

// Block-wide max of a per-thread value; every thread of the block calls it. red: Warps floats.
template <int Warps>
__device__ float moe_block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = 0.0f;
#pragma unroll
  for (int w = 0; w < Warps; ++w) r = fmaxf(r, red[w]);
  return r;
}

// Power-of-two divisor that keeps bound / divisor below kMoeHalfSafe (1 for non-finite bounds,
// so NaN/inf propagate instead of being scaled away).
__device__ __forceinline__ float moe_guard_scale(float bound) {
  return bound > kMoeHalfSafe && bound < INFINITY ? exp2f(ceilf(log2f(bound / kMoeHalfSafe)))
                                                  : 1.0f;
}

struct MoeRoute {
  int route, expert;
};

__device__ __forceinline__ MoeRoute moe_route_of(int64_t slot, MoeSlots s, const int32_t* ids,
                                                 int num_experts) {
  const int r = s.route_of_slot != nullptr ? s.route_of_slot[slot] : static_cast<int>(slot);
  if (r < 0) return {0, -1};  // a slot no valid route filled (prefill packing with skipped ids)
  const int e = ids[r];
  return {r, (e >= 0 && e < num_experts) ? e : -1};
}

// One slot's activation: sum the FC1 split partials, rotate gate and up per chunk, apply their
// svh and input scales, a = SiLU(gate) * up * down_suh, rotate, then store fp16 under a per-slot
// power-of-two guard. Two passes over the chunks (the row maximum, then the stores) instead of
// staging the row in shared memory, so the GEMV epilogue that calls this keeps its occupancy.
template <int Warps>
__device__ void moe_activate_slot(const MoeActivateArgs& a, int64_t slot, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t I = a.I;
  const MoeRoute rt = moe_route_of(slot, a.slots, a.ids, a.num_experts);
  __half* out = a.act + slot * I;
  if (rt.expert < 0) {  // finite zeros keep FC2's unused rows harmless
    for (int64_t i = threadIdx.x; i < I; i += 32 * Warps) out[i] = __float2half(0.0f);
    if (threadIdx.x == 0) a.act_scale[slot] = 1.0f;
    return;
  }
  const int64_t srow = a.shared_h ? rt.route / a.k : slot;  // rows of the input rotation
  const float sg = a.scale_g[srow] * exl3::trellis::kHadScale,
              su = a.scale_u[srow] * exl3::trellis::kHadScale;
  const uint16_t* tab = a.intermediate + static_cast<int64_t>(rt.expert) * 3 * I;
  float mx = 0.0f, inv = 1.0f;
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      const float s = moe_guard_scale(moe_block_max<Warps>(mx, red));
      if (threadIdx.x == 0) a.act_scale[slot] = s;
      inv = 1.0f / s;
    }
    for (int64_t c0 = static_cast<int64_t>(warp) * 128; c0 < I; c0 += Warps * 128) {
      float gv[4] = {0.f, 0.f, 0.f, 0.f}, uv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
      for (int s = 0; s < a.splits; ++s) {  // fixed order: deterministic
        const float* p = a.partial + (s * a.slots_cap + slot) * 2 * I + c0 + 4 * lane;
        const float4 g = __ldcg(reinterpret_cast<const float4*>(p)),
                     u = __ldcg(reinterpret_cast<const float4*>(p + I));
        gv[0] += g.x, gv[1] += g.y, gv[2] += g.z, gv[3] += g.w;
        uv[0] += u.x, uv[1] += u.y, uv[2] += u.z, uv[3] += u.w;
      }
      had128_lane4(gv, lane);
      had128_lane4(uv, lane);
      float av[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t col = c0 + 4 * lane + i;
        const float gt = gv[i] * sg * moe_h2f(tab, col), ut = uv[i] * su * moe_h2f(tab, I + col);
        av[i] = gt / (1.0f + __expf(-gt)) * ut * moe_h2f(tab, 2 * I + col);
      }
      had128_lane4(av, lane);
      if (pass == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) mx = fmaxf(mx, fabsf(av[i] * exl3::trellis::kHadScale));
      } else {
        const float mul = exl3::trellis::kHadScale;
        const __half2 lo = __floats2half2_rn(av[0] * mul * inv, av[1] * mul * inv);
        const __half2 hi = __floats2half2_rn(av[2] * mul * inv, av[3] * mul * inv);
        *reinterpret_cast<uint2*>(out + c0 + 4 * lane) =
            uint2{*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi)};
      }
    }
  }
}

// Token t's 128-column chunk of the output: out[t] = sum_j w[t, j] * (H128(sum of FC2 splits of
// its slot) * act_scale) * down_svh[e] in FP32. Warp w sums routes w, w + Warps, ...; the warps'
// sums add in warp order, so the result is deterministic and the same for every batch size.
// shared_h: the rotation and svh are linear and shared, so they run once after the sum.
// red: Warps x 32 float4.
template <int Warps>
__device__ void moe_combine_chunk(const MoeCombineArgs& a, int64_t t, int64_t chunk,
                                  float4 (*red)[32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t H = a.H, c0 = chunk * 128;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int j = warp; j < a.k; j += Warps) {
    const int64_t r = t * a.k + j;
    const int e = a.ids[r];
    const int64_t slot = a.slots.slot_of_route != nullptr ? a.slots.slot_of_route[r] : r;
    if (e < 0 || e >= a.num_experts || slot < 0) continue;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int s = 0; s < a.splits; ++s) {
      const float4 p = __ldcg(reinterpret_cast<const float4*>(
          a.partial + (s * a.slots_cap + slot) * H + c0 + 4 * lane));
      v[0] += p.x, v[1] += p.y, v[2] += p.z, v[3] += p.w;
    }
    const float w = a.weights[r] * a.act_scale[slot];
    if (a.shared_h) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += w * v[i];
    } else {
      had128_lane4(v, lane);
      const uint16_t* sv = a.down_svh + static_cast<int64_t>(e) * H;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        acc[i] += w * (v[i] * exl3::trellis::kHadScale * moe_h2f(sv, c0 + 4 * lane + i));
    }
  }
  red[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int w = 0; w < Warps; ++w) {
    const float4 p = red[w][lane];
    acc[0] += p.x, acc[1] += p.y, acc[2] += p.z, acc[3] += p.w;
  }
  if (a.shared_h) {
    had128_lane4(acc, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[i] *= exl3::trellis::kHadScale * moe_h2f(a.down_svh, c0 + 4 * lane + i);
  }
  *reinterpret_cast<float4*>(a.out + t * H + c0 + 4 * lane) =
      make_float4(acc[0], acc[1], acc[2], acc[3]);
}

}  // namespace exl3::cuda::detail
