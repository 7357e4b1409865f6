// MoE routers on the GPU: top-k selection from logits (route_topk, any m) and the decode form
// that computes the logits too (route_decode), so a decode step's routing is one launch. The
// selection is written once (route_row) and matches exl3::moe's CPU routers.
#include <cfloat>
#include <cstdint>

#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"
#include "exl3/cuda/model_ops.hpp"

namespace exl3::cuda {
namespace {

using namespace detail;  // warp_max, warp_sum, blocks_for (cuda/paged_kv.cuh)

// Warp argmax over the lanes' candidates (value, id): larger value wins, ties to the lower id.
__device__ __forceinline__ void warp_argmax(float& v, int& id) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oid = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oid < id)) {
      v = ov;
      id = oid;
    }
  }
}

// The best entry of score[0..n) not yet taken (taken[] marks), by the same order; one warp.
__device__ int warp_pick(const float* score, const bool* taken, int n) {
  float best = -FLT_MAX;
  int id = INT32_MAX;
  bool found = false;
  for (int i = threadIdx.x & 31; i < n; i += 32) {
    if (taken[i]) continue;
    if (!found || score[i] > best || (score[i] == best && i < id)) {
      best = score[i];
      id = i;
      found = true;
    }
  }
  if (!found) best = -INFINITY;
  warp_argmax(best, id);
  return id;
}

constexpr int kRouterWarps = 4;
constexpr int kMaxExperts = 1024;

// One warp's scratch for one token's selection.
struct TopkScratch {
  float* score;   // [E]
  float* raw;     // [E]
  bool* taken;    // [E]
  float* gscore;  // [32]
  bool* gtaken;   // [32]
};

// One warp selects token t's experts from its logits row. The selection reproduces router.cpp:
// softmax probabilities ranked (ties to the lower id); for sigmoid-grouped the group score is the
// sum of the group's best two corrected scores, the topk_group best groups stay eligible, the
// rest are masked to -inf. The row is read through L2 (__ldcg): in route_decode other blocks of
// the same grid wrote it. A logit bias is added as each logit is read.
__device__ void route_row(const float* row, int64_t t, const RouterParams& p, TopkScratch s,
                          int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  const int e = p.num_experts;
  float* score = s.score;
  float* raw = s.raw;
  bool* taken = s.taken;
  const auto logit = [&](int i) {
    return p.logit_bias != nullptr ? __ldcg(row + i) + p.logit_bias[i] : __ldcg(row + i);
  };
  if (!p.sigmoid_grouped) {
    float mx = -INFINITY;
    for (int i = lane; i < e; i += 32) mx = fmaxf(mx, logit(i));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = lane; i < e; i += 32) {
      raw[i] = expf(logit(i) - mx);
      sum += raw[i];
    }
    sum = warp_sum(sum);
    for (int i = lane; i < e; i += 32) {
      score[i] = raw[i] / sum;
      raw[i] = score[i];
      taken[i] = false;
    }
  } else {
    for (int i = lane; i < e; i += 32) {
      raw[i] = 1.0f / (1.0f + expf(-logit(i)));
      score[i] = raw[i] + (p.correction_bias ? p.correction_bias[i] : 0.0f);
      taken[i] = false;
    }
    __syncwarp();
    const int gsize = e / p.n_group;
    if (lane < p.n_group) {  // each lane scans its own group for the best two
      float b1 = -INFINITY, b2 = -INFINITY;
      const float* gs = score + lane * gsize;
      for (int i = 0; i < gsize; ++i) {
        const float v = gs[i];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      s.gscore[lane] = gsize >= 2 ? b1 + b2 : b1;
      s.gtaken[lane] = false;
    }
    __syncwarp();
    for (int r = 0; r < p.topk_group; ++r) {
      const int g = warp_pick(s.gscore, s.gtaken, p.n_group);
      if (lane == 0) s.gtaken[g] = true;
      __syncwarp();
    }
    for (int i = lane; i < e; i += 32) {
      if (!s.gtaken[i / gsize]) score[i] = -INFINITY;
    }
  }
  __syncwarp();
  float chosen = 0.0f;
  int my_id = 0;
  for (int j = 0; j < p.top_k; ++j) {
    const int id = warp_pick(score, taken, e);
    if (lane == 0) taken[id] = true;
    __syncwarp();
    chosen += raw[id];
    if (lane == j) my_id = id;
  }
  if (lane < p.top_k) {
    float w = raw[my_id];
    if (p.sigmoid_grouped) {
      if (p.renormalize) w /= chosen + 1e-20f;
      w *= p.routed_scaling_factor;
    } else if (p.renormalize) {
      w /= chosen;
    }
    ids[t * p.top_k + lane] = my_id;
    weights[t * p.top_k + lane] = w;
  }
}

// One warp per token (4 tokens per block), scratch in static shared memory.
__global__ void route_topk_kernel(const float* logits, int64_t m, RouterParams p, int32_t* ids,
                                  float* weights) {
  pdl_begin();
  __shared__ float score_s[kRouterWarps][kMaxExperts];
  __shared__ float raw_s[kRouterWarps][kMaxExperts];
  __shared__ bool taken_s[kRouterWarps][kMaxExperts];
  __shared__ float gscore_s[kRouterWarps][32];
  __shared__ bool gtaken_s[kRouterWarps][32];
  const int warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kRouterWarps) + warp;
  if (t >= m) return;
  route_row(logits + t * p.num_experts, t, p,
            {score_s[warp], raw_s[warp], taken_s[warp], gscore_s[warp], gtaken_s[warp]}, ids,
            weights);
}

// Bytes of one warp's TopkScratch for E experts, 16-byte aligned.
__host__ __device__ constexpr size_t topk_scratch_bytes(int e) {
  return ((2 * static_cast<size_t>(e) + 32) * 4 + static_cast<size_t>(e) + 32 + 15) / 16 * 16;
}

constexpr int kDecodeTokensPerPass = 8;
// route_decode's block: 8 warps, so the last block selects 8 tokens at a time (a batch-8 decode
// step in one round), the selection scratch of up to 8 warps staying under 48 KiB of shared memory.
constexpr int kDecodeWarps = 8;

// Warps of the last block that select (each needs its TopkScratch in dynamic shared memory).
__host__ __device__ constexpr int decode_select_warps(int e) {
  return e <= 512 ? kDecodeWarps : 4;
}

// Decode routing in one launch. Block b owns expert b: its threads stride over the weight row
// in float4s (all of a thread's loads for 8 tokens in flight together), each thread sums its
// products in H order, the warps add their lanes by a fixed xor tree and thread j adds the eight
// warps in order, so a token's logit does not depend on m. The last block to finish (a
// self-resetting counter) selects every token's experts, a warp per token, with its scratch in
// dynamic shared memory (only the selection needs it).
__global__ void __launch_bounds__(32 * kDecodeWarps)
    route_decode_kernel(const float* __restrict__ x, const float* __restrict__ w, int64_t m,
                        int64_t hidden, RouterParams p, float* logits, int32_t* counter,
                        int32_t* ids, float* weights) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char scratch[];
  __shared__ int s_last;
  __shared__ float part[kDecodeWarps][kDecodeTokensPerPass];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int e = static_cast<int>(blockIdx.x);
  const int64_t h4 = hidden / 4;
  const float4* wr = reinterpret_cast<const float4*>(w + e * hidden);
  for (int64_t t0 = 0; t0 < m; t0 += kDecodeTokensPerPass) {
    float acc[kDecodeTokensPerPass];
#pragma unroll
    for (int j = 0; j < kDecodeTokensPerPass; ++j) acc[j] = 0.0f;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < h4; i += 32 * kDecodeWarps) {
      const float4 wv = __ldg(wr + i);
#pragma unroll
      for (int j = 0; j < kDecodeTokensPerPass; ++j) {
        if (t0 + j < m) {
          const float4 xv = __ldg(reinterpret_cast<const float4*>(x + (t0 + j) * hidden) + i);
          acc[j] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kDecodeTokensPerPass; ++j) {
      const float v = warp_sum(acc[j]);
      if (lane == 0) part[warp][j] = v;
    }
    __syncthreads();
    if (threadIdx.x < kDecodeTokensPerPass && t0 + threadIdx.x < m) {
      float v = 0.0f;
#pragma unroll
      for (int k = 0; k < kDecodeWarps; ++k) v += part[k][threadIdx.x];
      logits[(t0 + threadIdx.x) * p.num_experts + e] = v;
    }
    __syncthreads();  // part is reused by the next pass
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    s_last = atomicAdd(counter, 1) == static_cast<int>(gridDim.x) - 1;
    if (s_last) *counter = 0;  // every block is in: ready for the next launch
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int ne = p.num_experts;
  unsigned char* mine = scratch + warp * topk_scratch_bytes(ne);
  auto* fl = reinterpret_cast<float*>(mine);
  const TopkScratch s{fl, fl + ne, reinterpret_cast<bool*>(fl + 2 * ne + 32), fl + 2 * ne,
                      reinterpret_cast<bool*>(fl + 2 * ne + 32) + ne};
  const int selectors = decode_select_warps(ne);
  if (warp >= selectors) return;
  for (int64_t t = warp; t < m; t += selectors) {
    route_row(logits + t * ne, t, p, s, ids, weights);
  }
}

bool router_params_valid(const RouterParams& p) {
  return p.num_experts > 0 && p.num_experts <= kMaxExperts && p.top_k > 0 && p.top_k <= 32 &&
         p.top_k <= p.num_experts && p.n_group > 0 && p.n_group <= 32 &&
         p.num_experts % p.n_group == 0 && p.topk_group > 0 && p.topk_group <= p.n_group;
}

}  // namespace

cudaError_t route_topk(const float* logits, int64_t m, const RouterParams& p, int32_t* ids,
                       float* weights, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (!router_params_valid(p)) return cudaErrorInvalidValue;
  launch_pdl(route_topk_kernel, blocks_for(m, kRouterWarps), 32 * kRouterWarps, 0, stream, logits,
             m, p, ids, weights);
  return cudaGetLastError();
}

cudaError_t route_decode(const float* x, const float* w, int64_t m, int64_t hidden,
                         const RouterParams& p, float* logits, int32_t* counter, int32_t* ids,
                         float* weights, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (!router_params_valid(p) || m > kRouteDecodeMaxTokens || hidden <= 0 || hidden % 4 != 0 ||
      counter == nullptr) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = decode_select_warps(p.num_experts) * topk_scratch_bytes(p.num_experts);
  launch_pdl(route_decode_kernel, static_cast<unsigned>(p.num_experts), 32 * kDecodeWarps, smem,
             stream, x, w, m, hidden, p, logits, counter, ids, weights);
  return cudaGetLastError();
}

}  // namespace exl3::cuda
