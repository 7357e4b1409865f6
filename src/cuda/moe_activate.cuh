// The fused MoE's activation of one route slot, shared by the activation kernel (8 warps per
// slot) and the decode FC1 GEMV that runs it in its last block (4 warps): sum the slot's FC1
// split partials, rotate each 128-chunk, apply gate/up svh and the input divisors (and the
// biases), a = SiLU(gate) * up (or the clamped form), * down suh, rotate, and store fp16 under a
// power-of-two guard. Each chunk is one warp's and the guard is a maximum, so the bits do not
// depend on the warp count.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/had128.cuh"
#include "cuda/moe_args.hpp"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda::detail {

// Most intermediate channels a slot's activation stages (its row in shared memory).
constexpr int kMoeMaxIntermediate = 8192;

// Block-wide max of a per-thread value over W warps (red: W floats of shared memory).
template <int W>
__device__ __forceinline__ float block_max_of(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) r = fmaxf(r, red[w]);
  return r;
}

// Slot `slot` of route `route` on expert `expert` (>= 0) with a W-warp block; a_row: I floats of
// shared memory, red: W. Partials are read through L2: on the fused path other blocks wrote them.
template <int W>
__device__ void activate_slot(const float* partial, int splits, int64_t slots_cap, int k, int64_t I,
                              bool shared_h, int64_t slot, int route, int expert,
                              const float* scale_g, const float* scale_u,
                              const uint16_t* intermediate, const MoeActivation& fn, __half* act,
                              float* act_scale, float* a_row, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __half* out = act + slot * I;
  const int64_t srow = shared_h ? route / k : slot;  // rows of the input rotation
  const float sg = scale_g[srow] * exl3::trellis::kHadScale,
              su = scale_u[srow] * exl3::trellis::kHadScale;
  const auto* tab = reinterpret_cast<const __half*>(intermediate) +
                    static_cast<int64_t>(expert) * 3 * I;  // gate svh | up svh | down suh
  const int64_t row_len = 2 * I;
  float mx = 0.0f;
  for (int64_t c0 = static_cast<int64_t>(warp) * 128; c0 < I; c0 += W * 128) {
    float gv[4] = {0.f, 0.f, 0.f, 0.f}, uv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {  // fixed order: deterministic
      const float* p = partial + (s * slots_cap + slot) * row_len + c0 + 4 * lane;
      const float4 a = __ldcg(reinterpret_cast<const float4*>(p)),
                   b = __ldcg(reinterpret_cast<const float4*>(p + I));
      gv[0] += a.x, gv[1] += a.y, gv[2] += a.z, gv[3] += a.w;
      uv[0] += b.x, uv[1] += b.y, uv[2] += b.z, uv[3] += b.w;
    }
    had128_lane4(gv, lane);
    had128_lane4(uv, lane);
    float av[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t col = c0 + 4 * lane + i;
      float gt = gv[i] * sg * __half2float(tab[col]), ut = uv[i] * su * __half2float(tab[I + col]);
      if (fn.gate_bias != nullptr) gt += fn.gate_bias[expert * I + col];
      if (fn.up_bias != nullptr) ut += fn.up_bias[expert * I + col];
      float a;
      if (col >= fn.valid) {
        a = 0.0f;
      } else if (fn.limit > 0.0f) {
        const float g = fminf(gt, fn.limit), u = fminf(fmaxf(ut, -fn.limit), fn.limit);
        a = g / (1.0f + __expf(-fn.alpha * g)) * (u + 1.0f);
      } else {
        a = gt / (1.0f + __expf(-gt)) * ut;
      }
      av[i] = a * __half2float(tab[2 * I + col]);
    }
    had128_lane4(av, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      av[i] *= exl3::trellis::kHadScale;
      a_row[c0 + 4 * lane + i] = av[i];
      mx = fmaxf(mx, fabsf(av[i]));
    }
  }
  const float s = guard_divisor(block_max_of<W>(mx, red));  // it syncs: a_row is complete
  if (threadIdx.x == 0) act_scale[slot] = s;
  const float inv = 1.0f / s;
  for (int64_t i = threadIdx.x; i < I; i += W * 32) out[i] = __float2half_rn(a_row[i] * inv);
}

// An invalid route's slot: finite zeros (FC2's unused rows stay harmless) and divisor 1.
__device__ __forceinline__ void zero_slot(__half* act, float* act_scale, int64_t slot, int64_t I) {
  for (int64_t i = threadIdx.x; i < I; i += blockDim.x) act[slot * I + i] = __float2half(0.0f);
  if (threadIdx.x == 0) act_scale[slot] = 1.0f;
}

}  // namespace exl3::cuda::detail
