// Route packing, rotations, activation and the FP32 top-k combine of the fused CUDA MoE. All
// memory-bound; one warp per 128-element Hadamard chunk (4 values per lane: 2 in-register
// butterfly stages + 5 xor-shuffle stages, fp32).
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/had128.cuh"
#include "cuda/moe_kernels.hpp"
#include "cuda/pdl.cuh"
#include "exl3/trellis/dispatch.hpp"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxIntermediate = 8192;  // activation row staged in shared memory

__device__ __forceinline__ float h2f(const uint16_t* p, int64_t i) {
  return __half2float(reinterpret_cast<const __half*>(p)[i]);
}

// Block-wide max of a per-thread value (kThreads threads).
__device__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) r = fmaxf(r, red[w]);
  return r;
}

struct Route {
  int route, expert;
};

__device__ __forceinline__ Route route_of(int64_t slot, MoeSlots s, const int32_t* ids,
                                          int num_experts) {
  const int r = s.route_of_slot != nullptr ? s.route_of_slot[slot] : static_cast<int>(slot);
  if (r < 0) return {0, -1};  // a slot no valid route filled (prefill packing with skipped ids)
  const int e = ids[r];
  return {r, (e >= 0 && e < num_experts) ? e : -1};
}

// ---- route packing --------------------------------------------------------------------------

__global__ void count_kernel(const int32_t* ids, int64_t routes, int num_experts, int32_t* counts) {
  pdl_begin();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= routes) return;
  const int e = ids[r];
  if (e >= 0 && e < num_experts) atomicAdd(counts + e, 1);
}

// One block: exclusive scans of slots and groups per expert (each thread owns a contiguous run
// of experts), then the group table.
__global__ void scan_kernel(const int32_t* counts, int num_experts, int group_size, int32_t* fill,
                            int32_t* offsets, int32_t* group_expert, int32_t* group_begin,
                            int32_t* group_count, int32_t* num_groups) {
  pdl_begin();
  __shared__ int s_slots[1024], s_groups[1024];
  const int t = threadIdx.x, nt = blockDim.x;
  const int per = (num_experts + nt - 1) / nt;
  const int e0 = min(num_experts, t * per), e1 = min(num_experts, e0 + per);
  int slots = 0, groups = 0;
  for (int e = e0; e < e1; ++e) {
    slots += counts[e];
    groups += (counts[e] + group_size - 1) / group_size;
  }
  s_slots[t] = slots;
  s_groups[t] = groups;
  __syncthreads();
  for (int off = 1; off < nt; off <<= 1) {  // inclusive Hillis-Steele scan
    const int a = t >= off ? s_slots[t - off] : 0, b = t >= off ? s_groups[t - off] : 0;
    __syncthreads();
    s_slots[t] += a;
    s_groups[t] += b;
    __syncthreads();
  }
  int slot = s_slots[t] - slots, grp = s_groups[t] - groups;
  for (int e = e0; e < e1; ++e) {
    offsets[e] = slot;
    fill[e] = 0;
    const int c = counts[e];
    for (int i = 0; i < c; i += group_size) {
      group_expert[grp] = e;
      group_begin[grp] = slot + i;
      group_count[grp] = min(group_size, c - i);
      ++grp;
    }
    slot += c;
  }
  if (t == nt - 1) *num_groups = s_groups[t];
}

__global__ void scatter_kernel(const int32_t* ids, int64_t routes, int num_experts,
                               const int32_t* offsets, int32_t* fill, int32_t* slot_of_route,
                               int32_t* route_of_slot) {
  pdl_begin();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= routes) return;
  const int e = ids[r];
  if (e < 0 || e >= num_experts) {
    slot_of_route[r] = -1;
    return;
  }
  const int slot = offsets[e] + atomicAdd(fill + e, 1);
  slot_of_route[r] = slot;
  route_of_slot[slot] = static_cast<int32_t>(r);
}

// ---- input rotation -------------------------------------------------------------------------

// Grid (rows, 2): y = 0 gate, 1 up. Warp w owns 128-chunks w, w + 8, ... (at most
// kMaxChunksPerWarp): the whole row is read once, with all loads in flight together, kept in
// registers for the range guard's row maximum and then rotated from there.
constexpr int kMaxChunksPerWarp = 8;  // H <= 8 * 8 * 128 = 8192

__global__ void __launch_bounds__(kThreads)
    rotate_kernel(const void* __restrict__ x, DType in_type, int k, int64_t H, bool shared_h,
                  const int32_t* ids, int num_experts, MoeSlots slots, const uint16_t* gate_suh,
                  const uint16_t* up_suh, __half* xg, __half* xu, float* scale_g, float* scale_u) {
  pdl_begin();
  __shared__ float red[kWarps];
  const int64_t row = blockIdx.x;
  const bool up = blockIdx.y == 1;
  int64_t token = row, suh_row = 0;
  bool valid = true;
  if (!shared_h) {
    const Route rt = route_of(row, slots, ids, num_experts);
    token = rt.route / k;
    suh_row = rt.expert;
    valid = rt.expert >= 0;
  }
  __half* out = (up ? xu : xg) + row * H;
  float* scale = (up ? scale_u : scale_g) + row;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = static_cast<int>(H / 128);
  if (!valid) {  // a skipped route: finite zeros keep the GEMV's unused rows harmless
    for (int64_t i = threadIdx.x; i < H; i += kThreads) out[i] = __float2half(0.0f);
    if (threadIdx.x == 0) *scale = 1.0f;
    return;
  }
  const uint16_t* suh = (up ? up_suh : gate_suh) + suh_row * H;
  float v[kMaxChunksPerWarp][4];
  float mx = 0.0f;
#pragma unroll
  for (int c = 0; c < kMaxChunksPerWarp; ++c) {
    const int chunk = warp + kWarps * c;
    if (chunk < chunks) {
      const int64_t col = static_cast<int64_t>(chunk) * 128 + 4 * lane;
      float a[4], su[4];
      load_act4(x, in_type, token * H + col, a);
      load_half4(suh, col, su);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[c][i] = a[i] * su[i];
        mx = fmaxf(mx, fabsf(v[c][i]));
      }
    }
  }
  const float s = guard_divisor(block_max(mx, red) * kHadGain);
  if (threadIdx.x == 0) *scale = s;
  const float mul = exl3::trellis::kHadScale / s;
#pragma unroll
  for (int c = 0; c < kMaxChunksPerWarp; ++c) {
    const int chunk = warp + kWarps * c;
    if (chunk < chunks) {
      had128_lane4(v[c], lane);
      const __half2 lo = __floats2half2_rn(v[c][0] * mul, v[c][1] * mul);
      const __half2 hi = __floats2half2_rn(v[c][2] * mul, v[c][3] * mul);
      uint2 pk{*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi)};
      *reinterpret_cast<uint2*>(out + static_cast<int64_t>(chunk) * 128 + 4 * lane) = pk;
    }
  }
}

// ---- activation -----------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    activate_kernel(const float* __restrict__ partial, int splits, int64_t slots_cap, int k,
                    int64_t I, bool shared_h, const int32_t* ids, int num_experts, MoeSlots slots,
                    const float* scale_g, const float* scale_u, const uint16_t* intermediate,
                    MoeActivation fn, __half* act, float* act_scale) {
  pdl_begin();
  __shared__ float a_row[kMaxIntermediate];
  __shared__ float red[kWarps];
  const int64_t slot = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const Route rt = route_of(slot, slots, ids, num_experts);
  __half* out = act + slot * I;
  if (rt.expert < 0) {
    for (int64_t i = threadIdx.x; i < I; i += kThreads) out[i] = __float2half(0.0f);
    if (threadIdx.x == 0) act_scale[slot] = 1.0f;
    return;
  }
  const int64_t srow = shared_h ? rt.route / k : slot;  // rows of the input rotation
  const float sg = scale_g[srow] * exl3::trellis::kHadScale,
              su = scale_u[srow] * exl3::trellis::kHadScale;
  const uint16_t* tab =
      intermediate + static_cast<int64_t>(rt.expert) * 3 * I;  // gate svh | up svh | down suh
  const int64_t row_len = 2 * I;
  float mx = 0.0f;
  for (int64_t c0 = static_cast<int64_t>(warp) * 128; c0 < I; c0 += kWarps * 128) {
    float gv[4] = {0.f, 0.f, 0.f, 0.f}, uv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {  // fixed order: deterministic
      const float* p = partial + (s * slots_cap + slot) * row_len + c0 + 4 * lane;
      const float4 a = *reinterpret_cast<const float4*>(p),
                   b = *reinterpret_cast<const float4*>(p + I);
      gv[0] += a.x, gv[1] += a.y, gv[2] += a.z, gv[3] += a.w;
      uv[0] += b.x, uv[1] += b.y, uv[2] += b.z, uv[3] += b.w;
    }
    had128_lane4(gv, lane);
    had128_lane4(uv, lane);
    float av[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t col = c0 + 4 * lane + i;
      float gt = gv[i] * sg * h2f(tab, col), ut = uv[i] * su * h2f(tab, I + col);
      if (fn.gate_bias != nullptr) gt += fn.gate_bias[rt.expert * I + col];
      if (fn.up_bias != nullptr) ut += fn.up_bias[rt.expert * I + col];
      float a;
      if (col >= fn.valid) {
        a = 0.0f;
      } else if (fn.limit > 0.0f) {
        const float g = fminf(gt, fn.limit), u = fminf(fmaxf(ut, -fn.limit), fn.limit);
        a = g / (1.0f + __expf(-fn.alpha * g)) * (u + 1.0f);
      } else {
        a = gt / (1.0f + __expf(-gt)) * ut;
      }
      av[i] = a * h2f(tab, 2 * I + col);
    }
    had128_lane4(av, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      av[i] *= exl3::trellis::kHadScale;
      a_row[c0 + 4 * lane + i] = av[i];
      mx = fmaxf(mx, fabsf(av[i]));
    }
  }
  const float s = guard_divisor(block_max(mx, red));  // block_max syncs: a_row is complete
  if (threadIdx.x == 0) act_scale[slot] = s;
  const float inv = 1.0f / s;
  for (int64_t i = threadIdx.x; i < I; i += kThreads) out[i] = __float2half_rn(a_row[i] * inv);
}

// ---- combine --------------------------------------------------------------------------------

// Grid (m, H / 128): block (t, c) owns 128-column chunk c of token t; warp w sums the token's
// routes w, w + kWarps, ... (split-K partials, then per-expert output rotation and scales unless
// the experts share H), and the warps' sums add in warp order (deterministic, and the same for
// every batch size), so a decode step's one token still spreads over H / 128 blocks of 8 warps.
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const float* __restrict__ partial, int splits, int64_t slots_cap, int k,
                   int64_t H, bool shared_h, const int32_t* ids, const float* weights,
                   int num_experts, MoeSlots slots, const float* act_scale,
                   const uint16_t* down_svh, const float* down_bias, float* out) {
  pdl_begin();
  __shared__ float4 red[kWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.x;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * 128;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int j = warp; j < k; j += kWarps) {
    const int64_t r = t * k + j;
    const int e = ids[r];
    const int64_t slot = slots.slot_of_route != nullptr ? slots.slot_of_route[r] : r;
    if (e < 0 || e >= num_experts || slot < 0) continue;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      const float4 p =
          *reinterpret_cast<const float4*>(partial + (s * slots_cap + slot) * H + c0 + 4 * lane);
      v[0] += p.x, v[1] += p.y, v[2] += p.z, v[3] += p.w;
    }
    const float w = weights[r] * act_scale[slot];
    if (shared_h) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += w * v[i];
    } else {
      had128_lane4(v, lane);
      const uint16_t* sv = down_svh + static_cast<int64_t>(e) * H;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        acc[i] += w * (v[i] * exl3::trellis::kHadScale * h2f(sv, c0 + 4 * lane + i));
      if (down_bias != nullptr) {  // the expert's output bias, at the route's weight
        const float* b = down_bias + static_cast<int64_t>(e) * H + c0 + 4 * lane;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] += weights[r] * b[i];
      }
    }
  }
  red[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float4 p = red[w][lane];
    acc[0] += p.x, acc[1] += p.y, acc[2] += p.z, acc[3] += p.w;
  }
  if (shared_h) {
    had128_lane4(acc, lane);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[i] *= exl3::trellis::kHadScale * h2f(down_svh, c0 + 4 * lane + i);
  }
  *reinterpret_cast<float4*>(out + t * H + c0 + 4 * lane) =
      make_float4(acc[0], acc[1], acc[2], acc[3]);
}

unsigned blocks_for(int64_t n, int per) {
  return static_cast<unsigned>((n + per - 1) / per);
}

}  // namespace

cudaError_t moe_pack_routes(const int32_t* topk_ids, int64_t routes, int num_experts,
                            int group_size, int32_t* counts, int32_t* fill, int32_t* offsets,
                            int32_t* group_expert, int32_t* group_begin, int32_t* group_count,
                            int32_t* num_groups, int32_t* slot_of_route, int32_t* route_of_slot,
                            cudaStream_t stream) {
  if (routes <= 0 || num_experts <= 0 || group_size <= 0) return cudaErrorInvalidValue;
  launch_pdl(count_kernel, blocks_for(routes, 256), 256, 0, stream, topk_ids, routes, num_experts,
             counts);
  launch_pdl(scan_kernel, 1, 1024, 0, stream, counts, num_experts, group_size, fill, offsets,
             group_expert, group_begin, group_count, num_groups);
  launch_pdl(scatter_kernel, blocks_for(routes, 256), 256, 0, stream, topk_ids, routes, num_experts,
             offsets, fill, slot_of_route, route_of_slot);
  return cudaGetLastError();
}

cudaError_t moe_rotate_input(const void* x, DType in_type, int64_t m, int k, int64_t H,
                             bool shared_h, const int32_t* topk_ids, int num_experts,
                             MoeSlots slots, const uint16_t* gate_suh, const uint16_t* up_suh,
                             __half* xg, __half* xu, float* scale_g, float* scale_u,
                             cudaStream_t stream) {
  const int64_t rows = shared_h ? m : m * k;
  if (rows <= 0 || H % 128 != 0 || H > 128LL * kWarps * kMaxChunksPerWarp)
    return cudaErrorInvalidValue;
  launch_pdl(rotate_kernel, dim3(static_cast<unsigned>(rows), 2), kThreads, 0, stream, x, in_type,
             k, H, shared_h, topk_ids, num_experts, slots, gate_suh, up_suh, xg, xu, scale_g,
             scale_u);
  return cudaGetLastError();
}

cudaError_t moe_activate(const float* partial, int splits, int64_t slots_cap, int64_t routes, int k,
                         int64_t I, bool shared_h, const int32_t* topk_ids, int num_experts,
                         MoeSlots slots, const float* scale_g, const float* scale_u,
                         const uint16_t* intermediate, const MoeActivation& fn, __half* act,
                         float* act_scale, cudaStream_t stream) {
  if (routes <= 0 || I % 128 != 0 || I > kMaxIntermediate) return cudaErrorInvalidValue;
  launch_pdl(activate_kernel, static_cast<unsigned>(routes), kThreads, 0, stream, partial, splits,
             slots_cap, k, I, shared_h, topk_ids, num_experts, slots, scale_g, scale_u,
             intermediate, fn, act, act_scale);
  return cudaGetLastError();
}

cudaError_t moe_combine(const float* partial, int splits, int64_t slots_cap, int64_t m, int k,
                        int64_t H, bool shared_h, const int32_t* topk_ids,
                        const float* topk_weights, int num_experts, MoeSlots slots,
                        const float* act_scale, const uint16_t* down_svh, const float* down_bias,
                        float* out, cudaStream_t stream) {
  if (m <= 0 || H % 128 != 0 || (shared_h && down_bias != nullptr)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(m), static_cast<unsigned>(H / 128));
  launch_pdl(combine_kernel, grid, kThreads, 0, stream, partial, splits, slots_cap, k, H, shared_h,
             topk_ids, topk_weights, num_experts, slots, act_scale, down_svh, down_bias, out);
  return cudaGetLastError();
}

cudaError_t moe_gemv(trellis::Codebook cb, const MoeGemvArgs& a, int nt, int max_groups,
                     cudaStream_t stream) {
  if (max_groups <= 0 || a.col_blocks <= 0 || a.splits <= 0 || (nt != 1 && nt != 4))
    return cudaErrorInvalidValue;
  // One instance per codebook, each in its own generated translation unit (moe_gemv_cb.cu.in).
  return trellis::with_codebook(cb, [&](auto c) {
    return launch_moe_gemv_cb<decltype(c)::value>(a, nt, max_groups, stream);
  });
}

cudaError_t moe_gemm(trellis::Codebook cb, const MoeGemvArgs& a, int max_groups,
                     cudaStream_t stream) {
  if (max_groups <= 0 || a.col_blocks <= 0 || a.splits <= 0 || a.group_expert == nullptr)
    return cudaErrorInvalidValue;
  // One instance per codebook, each in its own generated translation unit (moe_gemm_cb.cu.in).
  return trellis::with_codebook(cb, [&](auto c) {
    return launch_moe_gemm_cb<decltype(c)::value>(a, max_groups, stream);
  });
}

}  // namespace exl3::cuda::detail
