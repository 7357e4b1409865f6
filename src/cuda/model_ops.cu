// Device kernels of the CUDA model runtime (see include/exl3/cuda/model_ops.hpp). Written for
// clarity first: the model's time goes to the EXL3 linears and the MoE layer; these kernels are
// elementwise, per-row or attention, each with its shape assumptions stated above it.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/cuda/model_ops.hpp"

namespace exl3::cuda {
namespace {

constexpr float kNegBig = -1e30f;  // "no score yet": finite, so exp(kNegBig - m) is 0, never NaN

__device__ __forceinline__ float load_as_f32(const void* p, DType t, int64_t i) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  if (t == DType::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
__device__ float block_sum(float v, float* scratch /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(t);
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// ---- embeddings, norms, elementwise ---------------------------------------------------------

__global__ void embed_rows_kernel(const void* table, DType t, int64_t hidden, const int32_t* ids, float* out) {
  const int64_t row = blockIdx.x;
  const int64_t src = static_cast<int64_t>(ids[row]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[row * hidden + i] = load_as_f32(table, t, src + i);
}

// One block per output row; the mean of squares in fp32 (the CPU reference sums in fp64; the
// difference is far below the tests' tolerances).
__global__ void add_rms_norm_kernel(float* x, const float* add, const float* w, const int32_t* row_index, int64_t n,
                                    float eps, float* y) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t src = row_index ? row_index[r] : r;
  float* xr = x + src * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = xr[i];
    if (add) {
      v += add[src * n + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  const float total = block_sum(ss, scratch);
  const float inv = rsqrtf(total / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[r * n + i] = xr[i] * inv * w[i];
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float a = g[i];
  g[i] = a / (1.0f + expf(-a)) * u[i];
}

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t m, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < m * n) y[i] += bias[i % n];
}

__global__ void convert_rows_kernel(const float* src, int64_t ld_src, void* dst, DType t, int64_t ld_dst, int64_t n) {
  const int64_t r = blockIdx.y;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = src[r * ld_src + i];
    if (t == DType::kF32) {
      static_cast<float*>(dst)[r * ld_dst + i] = v;
    } else if (t == DType::kF16) {
      static_cast<__half*>(dst)[r * ld_dst + i] = __float2half_rn(v);
    } else {
      static_cast<__nv_bfloat16*>(dst)[r * ld_dst + i] = __float2bfloat16_rn(v);
    }
  }
}

// ---- q/k norm, RoPE, KV store ----------------------------------------------------------------

__device__ __forceinline__ int64_t kv_slot(const PagedKv& kv, int32_t row, int32_t pos) {
  const int32_t page = kv.page_tables[static_cast<int64_t>(row) * kv.max_pages + pos / kv.page_size];
  return static_cast<int64_t>(page) * kv.page_size + pos % kv.page_size;
}

// One block per token, one warp per head at a time. Each warp stages its head in shared memory
// (RoPE pairs channel i with i + half, which other lanes hold).
template <int HD>
__global__ void qk_norm_rope_store_kernel(float* q, const float* k, const float* v, const float* q_norm,
                                          const float* k_norm, float eps, const float* rope_cs, TokenMeta meta,
                                          AttnShape s, PagedKv kv) {
  constexpr int kWarps = 4;
  __shared__ float stage[kWarps][HD];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t pos = meta.pos[t];
  const int64_t slot = kv_slot(kv, meta.seq_row[t], pos);
  const float* cs = rope_cs + static_cast<int64_t>(pos) * 2 * s.rotary_half;
  const int total = s.num_heads + 2 * s.num_kv_heads;
  for (int h = warp; h < total; h += kWarps) {
    const bool is_q = h < s.num_heads, is_k = !is_q && h < s.num_heads + s.num_kv_heads;
    const int kvh = is_q ? 0 : (is_k ? h - s.num_heads : h - s.num_heads - s.num_kv_heads);
    const float* src = is_q ? q + (t * s.num_heads + h) * HD : (is_k ? k : v) + (t * s.num_kv_heads + kvh) * HD;
    float* sh = stage[warp];
    float ss = 0.0f;
    for (int i = lane; i < HD; i += 32) {
      sh[i] = src[i];
      ss += sh[i] * sh[i];
    }
    const float* nw = is_q ? q_norm : (is_k ? k_norm : nullptr);
    if (nw != nullptr) {
      const float inv = rsqrtf(warp_sum(ss) / HD + eps);
      for (int i = lane; i < HD; i += 32) sh[i] = sh[i] * inv * nw[i];
    }
    __syncwarp();
    float out[HD / 32];
#pragma unroll
    for (int j = 0; j < HD / 32; ++j) {
      const int i = lane + 32 * j;
      float val = sh[i];
      if (!is_q && !is_k) {
        // v: stored as is
      } else if (i < s.rotary_half) {
        val = sh[i] * cs[i] - sh[i + s.rotary_half] * cs[s.rotary_half + i];
      } else if (i < 2 * s.rotary_half) {
        const int p = i - s.rotary_half;
        val = sh[i] * cs[p] + sh[p] * cs[s.rotary_half + p];
      }
      out[j] = val;
    }
    __syncwarp();
    if (is_q) {
      float* dst = q + (t * s.num_heads + h) * HD;
#pragma unroll
      for (int j = 0; j < HD / 32; ++j) dst[lane + 32 * j] = out[j];
    } else {
      uint16_t* dst = (is_k ? kv.k : kv.v) + (slot * s.num_kv_heads + kvh) * HD;
#pragma unroll
      for (int j = 0; j < HD / 32; ++j) dst[lane + 32 * j] = __half_as_ushort(__float2half_rn(out[j]));
    }
  }
}

// ---- attention -------------------------------------------------------------------------------

// Decode: one block per (listed token, kv head, head group of G query heads). Warp w walks key
// chunks w, w + 4, ... of 32 keys: lane j scores key chunk*32 + j against the G heads (the K
// row read once for all of them), the chunk updates a running max / sum per head, then the
// lanes, each owning HD/32 output channels, accumulate p * V over the chunk's keys. The four
// warps' partial softmax states merge in shared memory at the end.
template <int HD, int G>
__global__ void attention_decode_kernel(const float* q, const int32_t* tokens, TokenMeta meta, AttnShape s,
                                        float scale, PagedKv kv, float* out) {
  constexpr int kWarps = 4, kDpl = HD / 32;
  __shared__ float sq[G][HD];
  __shared__ float sm[kWarps][G], sl[kWarps][G];
  __shared__ float so[kWarps][G][HD];
  const int64_t t = tokens[blockIdx.x];
  const int kvh = blockIdx.y;
  const int q_per_kv = s.num_heads / s.num_kv_heads;
  const int h0 = kvh * q_per_kv + blockIdx.z * G;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    sq[i / HD][i % HD] = q[(t * s.num_heads + h0 + i / HD) * HD + i % HD] * scale;
  }
  __syncthreads();
  const int32_t pos = meta.pos[t], row = meta.seq_row[t];
  const int64_t kv_stride = static_cast<int64_t>(s.num_kv_heads) * HD;
  float m[G], l[G], o[G][kDpl];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = kNegBig;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDpl; ++d) o[g][d] = 0.0f;
  }
  const int keys = pos + 1;
  for (int c0 = warp * 32; c0 < keys; c0 += kWarps * 32) {
    const int key = c0 + lane;
    const bool valid = key < keys;
    int64_t slot = 0;
    float sc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) sc[g] = 0.0f;
    if (valid) {
      slot = kv_slot(kv, row, key);
      const __half2* kr = reinterpret_cast<const __half2*>(kv.k + slot * kv_stride + static_cast<int64_t>(kvh) * HD);
#pragma unroll 4
      for (int i = 0; i < HD / 2; ++i) {
        const float2 kf = __half22float2(kr[i]);
#pragma unroll
        for (int g = 0; g < G; ++g) sc[g] += sq[g][2 * i] * kf.x + sq[g][2 * i + 1] * kf.y;
      }
    }
    float p[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float cmax = warp_max(valid ? sc[g] : kNegBig);
      const float mn = fmaxf(m[g], cmax);
      const float corr = expf(m[g] - mn);
      p[g] = valid ? expf(sc[g] - mn) : 0.0f;
      l[g] = l[g] * corr + warp_sum(p[g]);
      m[g] = mn;
#pragma unroll
      for (int d = 0; d < kDpl; ++d) o[g][d] *= corr;
    }
    const int n_here = min(32, keys - c0);
    for (int j = 0; j < n_here; ++j) {
      const int64_t sj = __shfl_sync(0xffffffffu, slot, j);
      const __half* vr = reinterpret_cast<const __half*>(kv.v) + sj * kv_stride + static_cast<int64_t>(kvh) * HD;
      float vv[kDpl];
#pragma unroll
      for (int d = 0; d < kDpl; ++d) vv[d] = __half2float(vr[lane * kDpl + d]);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pj = __shfl_sync(0xffffffffu, p[g], j);
#pragma unroll
        for (int d = 0; d < kDpl; ++d) o[g][d] += pj * vv[d];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      sm[warp][g] = m[g];
      sl[warp][g] = l[g];
    }
#pragma unroll
    for (int d = 0; d < kDpl; ++d) so[warp][g][lane * kDpl + d] = o[g][d];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    float mx = kNegBig;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w][g]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = expf(sm[w][g] - mx);
      num += so[w][g][d] * f;
      den += sl[w][g] * f;
    }
    out[(t * s.num_heads + h0 + g) * HD + d] = num / den;
  }
}

// Prefill: one block per (tile of <= 32 consecutive tokens of one sequence, query head); 128
// threads = 32 queries x 4 parts, part p owning channels p, p + 4, ... (so the four parts of a
// query read four neighbouring banks and different queries broadcast). Keys come in chunks of 32
// staged in shared memory as fp32; scores are reduced over the 4 parts with two shuffles, and
// each chunk updates a running softmax (causal: key > pos is skipped).
template <int HD>
__global__ void attention_prefill_kernel(const float* q, const int32_t* tile_first, const int32_t* tile_len,
                                         TokenMeta meta, AttnShape s, float scale, PagedKv kv, float* out) {
  constexpr int kParts = 4, kDpt = HD / kParts, kChunk = 32;
  extern __shared__ float smem[];
  float* sk = smem;                 // [kChunk][HD]
  float* sv = smem + kChunk * HD;   // [kChunk][HD]
  const int h = blockIdx.y;
  const int kvh = h / (s.num_heads / s.num_kv_heads);
  const int first = tile_first[blockIdx.x], len = tile_len[blockIdx.x];
  const int qi = threadIdx.x / kParts, part = threadIdx.x % kParts;
  const bool active = qi < len;
  const int64_t t = first + (active ? qi : 0);
  const int32_t my_pos = meta.pos[t];
  const int32_t last_pos = meta.pos[first + len - 1];
  const int32_t row = meta.seq_row[first];
  const int64_t kv_stride = static_cast<int64_t>(s.num_kv_heads) * HD;
  float qr[kDpt], o[kDpt];
#pragma unroll
  for (int i = 0; i < kDpt; ++i) {
    qr[i] = q[(t * s.num_heads + h) * HD + part + kParts * i] * scale;
    o[i] = 0.0f;
  }
  float m = kNegBig, l = 0.0f;
  for (int c0 = 0; c0 <= last_pos; c0 += kChunk) {
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * HD / 2; i += blockDim.x) {
      const int j = i / (HD / 2), c = 2 * (i % (HD / 2));
      const int key = c0 + j;
      float2 kf = make_float2(0.0f, 0.0f), vf = kf;
      if (key <= last_pos) {
        const int64_t off = kv_slot(kv, row, key) * kv_stride + static_cast<int64_t>(kvh) * HD + c;
        kf = __half22float2(*reinterpret_cast<const __half2*>(kv.k + off));
        vf = __half22float2(*reinterpret_cast<const __half2*>(kv.v + off));
      }
      sk[j * HD + c] = kf.x;
      sk[j * HD + c + 1] = kf.y;
      sv[j * HD + c] = vf.x;
      sv[j * HD + c + 1] = vf.y;
    }
    __syncthreads();
    float sc[kChunk];
    float cmax = kNegBig;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < kDpt; ++i) d += qr[i] * sk[j * HD + part + kParts * i];
      d += __shfl_xor_sync(0xffffffffu, d, 1);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      sc[j] = c0 + j <= my_pos ? d : kNegBig;
      cmax = fmaxf(cmax, sc[j]);
    }
    const float mn = fmaxf(m, cmax);
    const float corr = expf(m - mn);
    l *= corr;
#pragma unroll
    for (int i = 0; i < kDpt; ++i) o[i] *= corr;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const float p = c0 + j <= my_pos ? expf(sc[j] - mn) : 0.0f;
      l += p;
#pragma unroll
      for (int i = 0; i < kDpt; ++i) o[i] += p * sv[j * HD + part + kParts * i];
    }
    m = mn;
  }
  if (active) {
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < kDpt; ++i) out[(t * s.num_heads + h) * HD + part + kParts * i] = o[i] * inv;
  }
}

// ---- MoE routers -----------------------------------------------------------------------------

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

// One warp per token (4 tokens per block). Shared memory per warp: score[E], taken[E] and
// group arrays. The selection reproduces router.cpp: softmax probabilities ranked (ties to the
// lower id); for sigmoid-grouped the group score is the sum of the group's best two corrected
// scores, the topk_group best groups stay eligible, the rest are masked to -inf.
constexpr int kRouterWarps = 4;
constexpr int kMaxExperts = 1024;

__global__ void route_topk_kernel(const float* logits, int64_t m, RouterParams p, int32_t* ids, float* weights) {
  __shared__ float score_s[kRouterWarps][kMaxExperts];
  __shared__ float s_raw[kRouterWarps][kMaxExperts];
  __shared__ bool taken_s[kRouterWarps][kMaxExperts];
  __shared__ float gscore_s[kRouterWarps][32];
  __shared__ bool gtaken_s[kRouterWarps][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kRouterWarps) + warp;
  if (t >= m) return;
  const int e = p.num_experts;
  const float* row = logits + t * e;
  float* score = score_s[warp];
  float* raw = s_raw[warp];
  bool* taken = taken_s[warp];
  if (!p.sigmoid_grouped) {
    float mx = -INFINITY;
    for (int i = lane; i < e; i += 32) mx = fmaxf(mx, row[i]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int i = lane; i < e; i += 32) {
      raw[i] = expf(row[i] - mx);
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
      raw[i] = 1.0f / (1.0f + expf(-row[i]));
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
      gscore_s[warp][lane] = gsize >= 2 ? b1 + b2 : b1;
      gtaken_s[warp][lane] = false;
    }
    __syncwarp();
    for (int r = 0; r < p.topk_group; ++r) {
      const int g = warp_pick(gscore_s[warp], gtaken_s[warp], p.n_group);
      if (lane == 0) gtaken_s[warp][g] = true;
      __syncwarp();
    }
    for (int i = lane; i < e; i += 32) {
      if (!gtaken_s[warp][i / gsize]) score[i] = -INFINITY;
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

template <int HD>
cudaError_t launch_decode(const float* q, const int32_t* tokens, int64_t count, TokenMeta meta, const AttnShape& s,
                          float scale, const PagedKv& kv, float* out, cudaStream_t stream) {
  const int qpk = s.num_heads / s.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(s.num_kv_heads), 1);
  if (qpk % 8 == 0) {
    attention_decode_kernel<HD, 8><<<dim3(grid.x, grid.y, qpk / 8), 128, 0, stream>>>(q, tokens, meta, s, scale, kv,
                                                                                    out);
  } else if (qpk % 4 == 0) {
    attention_decode_kernel<HD, 4><<<dim3(grid.x, grid.y, qpk / 4), 128, 0, stream>>>(q, tokens, meta, s, scale, kv,
                                                                                    out);
  } else if (qpk % 2 == 0) {
    attention_decode_kernel<HD, 2><<<dim3(grid.x, grid.y, qpk / 2), 128, 0, stream>>>(q, tokens, meta, s, scale, kv,
                                                                                    out);
  } else {
    attention_decode_kernel<HD, 1><<<dim3(grid.x, grid.y, qpk), 128, 0, stream>>>(q, tokens, meta, s, scale, kv, out);
  }
  return cudaGetLastError();
}

template <int HD>
cudaError_t launch_prefill(const float* q, const int32_t* tile_first, const int32_t* tile_len, int64_t count,
                           TokenMeta meta, const AttnShape& s, float scale, const PagedKv& kv, float* out,
                           cudaStream_t stream) {
  const size_t smem = 2u * 32u * HD * sizeof(float);
  if (smem > 48u * 1024u) {
    const cudaError_t e =
        cudaFuncSetAttribute(attention_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  attention_prefill_kernel<HD><<<dim3(static_cast<unsigned>(count), static_cast<unsigned>(s.num_heads)), 128, smem,
                                 stream>>>(q, tile_first, tile_len, meta, s, scale, kv, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t embed_rows(const void* table, DType table_type, int64_t hidden, const int32_t* ids, int64_t n, float* out,
                       cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  embed_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(table, table_type, hidden, ids, out);
  return cudaGetLastError();
}

cudaError_t add_rms_norm(float* x, const float* add, const float* w, const int32_t* row_index, int64_t rows, int64_t n,
                         float eps, float* y, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  add_rms_norm_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, add, w, row_index, n, eps, y);
  return cudaGetLastError();
}

cudaError_t qk_norm_rope_store(float* q, const float* k, const float* v, const float* q_norm, const float* k_norm,
                               float eps, const float* rope_cs, TokenMeta meta, int64_t n, const AttnShape& shape,
                               const PagedKv& kv, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (shape.head_dim == 64) {
    qk_norm_rope_store_kernel<64><<<static_cast<unsigned>(n), 128, 0, stream>>>(q, k, v, q_norm, k_norm, eps, rope_cs,
                                                                                meta, shape, kv);
  } else if (shape.head_dim == 128) {
    qk_norm_rope_store_kernel<128><<<static_cast<unsigned>(n), 128, 0, stream>>>(q, k, v, q_norm, k_norm, eps,
                                                                                 rope_cs, meta, shape, kv);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

bool attention_supports_head_dim(int head_dim) {
  return head_dim == 64 || head_dim == 128;
}

cudaError_t attention_decode(const float* q, const int32_t* tokens, int64_t count, TokenMeta meta,
                             const AttnShape& shape, float scale, const PagedKv& kv, float* out, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) return cudaErrorInvalidValue;
  if (shape.head_dim == 64) return launch_decode<64>(q, tokens, count, meta, shape, scale, kv, out, stream);
  if (shape.head_dim == 128) return launch_decode<128>(q, tokens, count, meta, shape, scale, kv, out, stream);
  return cudaErrorInvalidValue;
}

cudaError_t attention_prefill(const float* q, const int32_t* tile_first, const int32_t* tile_len, int64_t count,
                              TokenMeta meta, const AttnShape& shape, float scale, const PagedKv& kv, float* out,
                              cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0) return cudaErrorInvalidValue;
  if (shape.head_dim == 64) {
    return launch_prefill<64>(q, tile_first, tile_len, count, meta, shape, scale, kv, out, stream);
  }
  if (shape.head_dim == 128) {
    return launch_prefill<128>(q, tile_first, tile_len, count, meta, shape, scale, kv, out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t silu_mul(float* g, const float* u, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  silu_mul_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(g, u, n);
  return cudaGetLastError();
}

cudaError_t add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  add_inplace_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t add_bias(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream) {
  if (m * n <= 0) return cudaSuccess;
  add_bias_kernel<<<blocks_for(m * n, 256), 256, 0, stream>>>(y, bias, m, n);
  return cudaGetLastError();
}

cudaError_t convert_rows(const float* src, int64_t ld_src, void* dst, DType dst_type, int64_t ld_dst, int64_t m,
                         int64_t n, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 64)), static_cast<unsigned>(m));
  convert_rows_kernel<<<grid, 256, 0, stream>>>(src, ld_src, dst, dst_type, ld_dst, n);
  return cudaGetLastError();
}

cudaError_t route_topk(const float* logits, int64_t m, const RouterParams& p, int32_t* ids, float* weights,
                       cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (p.num_experts <= 0 || p.num_experts > kMaxExperts || p.top_k <= 0 || p.top_k > 32 || p.top_k > p.num_experts ||
      p.n_group <= 0 || p.n_group > 32 || p.num_experts % p.n_group != 0 || p.topk_group <= 0 ||
      p.topk_group > p.n_group) {
    return cudaErrorInvalidValue;
  }
  route_topk_kernel<<<blocks_for(m, kRouterWarps), 32 * kRouterWarps, 0, stream>>>(logits, m, p, ids, weights);
  return cudaGetLastError();
}

}  // namespace exl3::cuda
