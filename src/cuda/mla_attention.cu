// Multi-head latent attention kernels (see include/exl3/cuda/mla.hpp): RoPE + latent norm + cache
// store, the query absorption and value expansion through kv_b_proj, and the attention over the
// latent cache.
#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/mla_rope.cuh"
#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"
#include "exl3/cuda/mla.hpp"

namespace exl3::cuda {
namespace {

using namespace detail;  // kNegBig, kv_slot, warp and block sums (cuda/paged_kv.cuh)

constexpr int kMaxLora = 512;
constexpr int kStoreThreads = 256;

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// One block per token: each warp ropes heads w, w + 8, ...; then the latent's RMSNorm and the
// roped key part go to the cache slot as fp16.
__global__ void __launch_bounds__(kStoreThreads)
    mla_rope_store_kernel(float* q, const float* kv_a, const float* kv_norm, float eps,
                          const float* rope_cs, bool interleave, TokenMeta meta, MlaShape s,
                          PagedKv kv) {
  pdl_begin();
  __shared__ float scratch[32];
  __shared__ float key_rope[2 * kMlaMaxRopeHalf];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t pos = meta.pos[t];
  const float* cs = rope_cs + static_cast<int64_t>(pos) * 2 * s.rope_half;
  const int qk = s.qk();
  for (int h = warp; h < s.heads; h += kStoreThreads / 32)
    rope_part(q + (t * s.heads + h) * qk + s.nope, cs, s.rope_half, interleave, lane);

  const float* x = kv_a + t * s.latent_width();
  float ss = 0.0f;
  for (int c = threadIdx.x; c < s.lora; c += blockDim.x) ss += x[c] * x[c];
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(s.lora) + eps);
  __half* slot = reinterpret_cast<__half*>(kv.k) +
                 kv_slot(kv, meta.seq_row[t], pos) * static_cast<int64_t>(s.latent_width());
  for (int c = threadIdx.x; c < s.lora; c += blockDim.x)
    slot[c] = __float2half_rn(x[c] * inv * kv_norm[c]);
  for (int r = threadIdx.x; r < 2 * s.rope_half; r += blockDim.x) key_rope[r] = x[s.lora + r];
  __syncthreads();
  if (warp == 0) rope_part(key_rope, cs, s.rope_half, interleave, lane);
  __syncthreads();
  for (int r = threadIdx.x; r < 2 * s.rope_half; r += blockDim.x)
    slot[s.lora + r] = __float2half_rn(key_rope[r]);
}

// q_lat[t, h, c] = sum_d q_nope[t, h, d] * kv_b[h * (nope + v) + d, c]: a thread per latent
// channel c (coalesced weight reads), kMlaTokensPerBlock tokens per weight read.
template <typename T>
__global__ void __launch_bounds__(128)
    mla_absorb_q_kernel(const float* q, const T* kv_b, int64_t n, MlaShape s, float* q_lat) {
  pdl_begin();
  constexpr int kT = kMlaTokensPerBlock;
  __shared__ float qs[kT][kMlaMaxNope];
  const int h = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * kT;
  const int qk = s.qk();
  for (int i = threadIdx.x; i < kT * s.nope; i += blockDim.x) {
    const int tt = i / s.nope, d = i % s.nope;
    qs[tt][d] = t0 + tt < n ? q[((t0 + tt) * s.heads + h) * qk + d] : 0.0f;
  }
  __syncthreads();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= s.lora) return;
  float acc[kT] = {};
  const T* w = kv_b + static_cast<int64_t>(h) * (s.nope + s.v_dim) * s.lora + c;
  for (int d = 0; d < s.nope; ++d) {
    const float wv = to_f32(w[static_cast<int64_t>(d) * s.lora]);
#pragma unroll
    for (int tt = 0; tt < kT; ++tt) acc[tt] += qs[tt][d] * wv;
  }
#pragma unroll
  for (int tt = 0; tt < kT; ++tt) {
    if (t0 + tt < n) q_lat[((t0 + tt) * s.heads + h) * s.lora + c] = acc[tt];
  }
}

// out[t, h * v + e] = sum_c kv_b[h * (nope + v) + nope + e, c] * o_lat[t, h, c]: a warp per
// output channel e, lanes over c, kMlaTokensPerBlock tokens per weight read.
template <typename T>
__global__ void __launch_bounds__(256)
    mla_expand_v_kernel(const float* o_lat, const T* kv_b, int64_t n, MlaShape s, float* out) {
  pdl_begin();
  constexpr int kT = kMlaTokensPerBlock;
  __shared__ float os[kT * kMaxLora];
  const int h = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * kT;
  for (int i = threadIdx.x; i < kT * s.lora; i += blockDim.x) {
    const int tt = i / s.lora, c = i % s.lora;
    os[i] = t0 + tt < n ? o_lat[((t0 + tt) * s.heads + h) * s.lora + c] : 0.0f;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int e = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (e >= s.v_dim) return;
  const T* w = kv_b + (static_cast<int64_t>(h) * (s.nope + s.v_dim) + s.nope + e) * s.lora;
  float acc[kT] = {};
  for (int c = lane; c < s.lora; c += 32) {
    const float wv = to_f32(w[c]);
#pragma unroll
    for (int tt = 0; tt < kT; ++tt) acc[tt] += wv * os[tt * s.lora + c];
  }
#pragma unroll
  for (int tt = 0; tt < kT; ++tt) {
    const float v = warp_sum(acc[tt]);
    if (lane == 0 && t0 + tt < n) out[(t0 + tt) * s.heads * s.v_dim + h * s.v_dim + e] = v;
  }
}

constexpr int kAttendKeys = 16;  // latent rows per shared-memory chunk
constexpr int kAttendThreads = 256;
static_assert(kAttendThreads / 32 == kMlaHeadsPerBlock, "one warp per head of the block");

// Half2 words per cached row in shared memory: odd, so the 16 rows a warp reads at one column
// fall in distinct banks.
__host__ __device__ inline int row_words(const MlaShape& s) {
  return (s.latent_width() / 2) | 1;
}

size_t attend_smem_bytes(const MlaShape& s) {
  constexpr int kG = kMlaHeadsPerBlock;
  return static_cast<size_t>(kG) * s.latent_width() * 4 +
         static_cast<size_t>(kAttendKeys) * row_words(s) * 4 +
         static_cast<size_t>(kG) * kAttendKeys * 4 + 2 * kG * 4;
}

// Blocks of the attention a launch wants at least (two per SM of an H200) before it splits.
constexpr int kAttendBlocksWanted = 264;
constexpr int kMaxSplits = 16;

// One block per (token, group of kMlaHeadsPerBlock heads, split): online softmax over chunks of
// kAttendKeys cached rows of the split's range of positions. Warp g scores head g (lane: key
// lane % 16, half the channels by lane / 16) and keeps its running max and sum; then every thread
// updates its latent channels' accumulators for all heads of the block. Unsplit, the normalised
// output goes to o_lat; split, the unnormalised accumulators and (max, sum) go to part / ml for
// mla_merge_kernel.
__global__ void __launch_bounds__(kAttendThreads)
    mla_attend_kernel(const float* q_lat, const float* q, const int32_t* selection,
                      int64_t sel_stride, const int32_t* count, TokenMeta meta, MlaShape s,
                      float scale, PagedKv kv, float* o_lat, float* part, float2* ml) {
  pdl_begin();
  constexpr int kG = kMlaHeadsPerBlock, kC = kAttendKeys;
  constexpr int kCols = kMaxLora / kAttendThreads;
  extern __shared__ float smem[];
  const int width = s.latent_width(), words = width / 2, stride = row_words(s);
  float* qs = smem;                                          // [kG][width]
  auto* rows = reinterpret_cast<__half2*>(qs + kG * width);  // [kC][stride]
  float* ps = reinterpret_cast<float*>(rows + kC * stride);  // [kG][kC]
  float* corr = ps + kG * kC;                                // [kG]
  float* lsum = corr + kG;                                   // [kG]
  const int64_t t = blockIdx.y;
  const int h0 = blockIdx.x * kG;
  const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int qk = s.qk();
  for (int i = threadIdx.x; i < kG * width; i += blockDim.x) {
    const int gg = i / width, c = i % width, h = h0 + gg;
    float v = 0.0f;
    if (h < s.heads) {
      v = c < s.lora ? q_lat[(t * s.heads + h) * s.lora + c]
                     : q[(t * s.heads + h) * qk + s.nope + (c - s.lora)];
    }
    qs[i] = v;
  }
  const int32_t seq = meta.seq_row[t];
  const int32_t total = selection != nullptr ? count[t] : meta.pos[t] + 1;
  const int splits = static_cast<int>(gridDim.z), split = static_cast<int>(blockIdx.z);
  const int32_t per = (total + splits - 1) / splits;
  const int32_t first = min(total, split * per), npos = min(total, first + per);
  const int32_t* sel = selection != nullptr ? selection + t * sel_stride : nullptr;
  float acc[kG][kCols] = {};
  float m_run = kNegBig, l_run = 0.0f;  // warp g's head
  const int key = lane & (kC - 1), half_of = lane / kC;
  for (int j0 = first; j0 < npos; j0 += kC) {
    __syncthreads();  // the previous chunk's rows and weights are consumed
    for (int i = threadIdx.x; i < kC * words; i += blockDim.x) {
      const int jj = i / words, w = i % words, j = j0 + jj;
      __half2 v = __float2half2_rn(0.0f);
      if (j < npos) {
        const int32_t p = sel != nullptr ? sel[j] : j;
        v = reinterpret_cast<const __half2*>(reinterpret_cast<const __half*>(kv.k) +
                                             kv_slot(kv, seq, p) * width)[w];
      }
      rows[jj * stride + w] = v;
    }
    __syncthreads();
    float dot = 0.0f;
    const float* qg = qs + g * width;
    for (int w = half_of; w < words; w += 2) {
      const float2 r = __half22float2(rows[key * stride + w]);
      dot += qg[2 * w] * r.x + qg[2 * w + 1] * r.y;
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, kC);
    const float sc = j0 + key < npos ? dot * scale : kNegBig;
    const float m_new = fmaxf(m_run, warp_max(sc));
    const float p = j0 + key < npos ? __expf(sc - m_new) : 0.0f;
    const float c = __expf(m_run - m_new);
    l_run = l_run * c + warp_sum(lane < kC ? p : 0.0f);
    m_run = m_new;
    if (lane < kC) ps[g * kC + key] = p;
    if (lane == 0) corr[g] = c;
    __syncthreads();
    const auto* rh = reinterpret_cast<const __half*>(rows);
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int col = threadIdx.x + k * kAttendThreads;
      if (col >= s.lora) break;
#pragma unroll
      for (int gg = 0; gg < kG; ++gg) acc[gg][k] *= corr[gg];
      for (int jj = 0; jj < kC; ++jj) {
        const float lat = __half2float(rh[jj * 2 * stride + col]);
#pragma unroll
        for (int gg = 0; gg < kG; ++gg) acc[gg][k] += ps[gg * kC + jj] * lat;
      }
    }
  }
  if (lane == 0) lsum[g] = l_run;
  if (splits > 1 && lane == 0 && h0 + g < s.heads)
    ml[(t * splits + split) * s.heads + h0 + g] = make_float2(m_run, l_run);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kCols; ++k) {
    const int col = threadIdx.x + k * kAttendThreads;
    if (col >= s.lora) break;
#pragma unroll
    for (int gg = 0; gg < kG; ++gg) {
      const int h = h0 + gg;
      if (h >= s.heads) continue;
      if (splits == 1) {
        o_lat[(t * s.heads + h) * s.lora + col] = acc[gg][k] / lsum[gg];
      } else {
        part[((t * splits + split) * s.heads + h) * s.lora + col] = acc[gg][k];
      }
    }
  }
}

// o_lat[t, h] = the splits' accumulators rescaled to their common max, over the rescaled sums,
// in split order. One block per (head, token).
__global__ void __launch_bounds__(256)
    mla_merge_kernel(const float* part, const float2* ml, int splits, MlaShape s, float* o_lat) {
  pdl_begin();
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  float m = kNegBig;
  for (int z = 0; z < splits; ++z) m = fmaxf(m, ml[(t * splits + z) * s.heads + h].x);
  float l = 0.0f;
  for (int z = 0; z < splits; ++z) {
    const float2 v = ml[(t * splits + z) * s.heads + h];
    l += __expf(v.x - m) * v.y;
  }
  for (int c = threadIdx.x; c < s.lora; c += blockDim.x) {
    float o = 0.0f;
    for (int z = 0; z < splits; ++z) {
      const float w = __expf(ml[(t * splits + z) * s.heads + h].x - m);
      o += w * part[((t * splits + z) * s.heads + h) * s.lora + c];
    }
    o_lat[(t * s.heads + h) * s.lora + c] = o / l;
  }
}

template <typename F>
cudaError_t with_weight_type(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kF16:
      return f(__half{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool mla_supports(const MlaShape& s) {
  return s.heads > 0 && s.lora > 0 && s.lora <= kMaxLora && s.lora % 2 == 0 && s.nope > 0 &&
         s.nope <= kMlaMaxNope && s.rope_half > 0 && s.rope_half <= kMlaMaxRopeHalf &&
         s.v_dim > 0 && attend_smem_bytes(s) <= 48 * 1024;
}

cudaError_t mla_rope_store(float* q, const float* kv_a, const float* kv_norm, float eps,
                           const float* rope_cs, bool interleave, TokenMeta meta, int64_t n,
                           const MlaShape& s, const PagedKv& kv, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!mla_supports(s)) return cudaErrorInvalidValue;
  launch_pdl(mla_rope_store_kernel, static_cast<unsigned>(n), kStoreThreads, 0, stream, q, kv_a,
             kv_norm, eps, rope_cs, interleave, meta, s, kv);
  return cudaGetLastError();
}

cudaError_t mla_absorb_q(const float* q, const void* kv_b, DType kv_b_type, int64_t n,
                         const MlaShape& s, float* q_lat, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!mla_supports(s)) return cudaErrorInvalidValue;
  const dim3 grid(blocks_for(s.lora, 128), static_cast<unsigned>(s.heads),
                  blocks_for(n, kMlaTokensPerBlock));
  return with_weight_type(kv_b_type, [&](auto tag) {
    using T = decltype(tag);
    launch_pdl(mla_absorb_q_kernel<T>, grid, 128, 0, stream, q, static_cast<const T*>(kv_b), n, s,
               q_lat);
    return cudaGetLastError();
  });
}

int mla_attend_splits(int64_t n, const MlaShape& s) {
  const int64_t blocks = static_cast<int64_t>(blocks_for(s.heads, kMlaHeadsPerBlock)) * n;
  if (blocks <= 0) return 1;
  return static_cast<int>(
      std::clamp<int64_t>((kAttendBlocksWanted + blocks - 1) / blocks, 1, kMaxSplits));
}

// Splits times tokens is at most wanted / groups + 1 + n (splits = ceil(wanted / (groups n))).
size_t mla_attend_workspace_bytes(int64_t n_max, const MlaShape& s) {
  const int64_t groups = blocks_for(s.heads, kMlaHeadsPerBlock);
  const int64_t rows = kAttendBlocksWanted / groups + 1 + n_max;  // (token, split) pairs
  return static_cast<size_t>(rows * s.heads) * (static_cast<size_t>(s.lora) * 4 + 8);
}

cudaError_t mla_attend(const float* q_lat, const float* q, const int32_t* selection,
                       int64_t sel_stride, const int32_t* count, TokenMeta meta, int64_t n,
                       const MlaShape& s, float scale, const PagedKv& kv, void* workspace,
                       size_t workspace_bytes, float* o_lat, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!mla_supports(s) || (selection != nullptr && count == nullptr)) return cudaErrorInvalidValue;
  int splits = mla_attend_splits(n, s);
  const size_t part_bytes = static_cast<size_t>(n * splits * s.heads) * s.lora * 4;
  const size_t ml_bytes = static_cast<size_t>(n * splits * s.heads) * 8;
  if (workspace == nullptr || part_bytes + ml_bytes > workspace_bytes) splits = 1;
  auto* part = static_cast<float*>(workspace);
  auto* ml = reinterpret_cast<float2*>(static_cast<char*>(workspace) + part_bytes);
  const dim3 grid(blocks_for(s.heads, kMlaHeadsPerBlock), static_cast<unsigned>(n),
                  static_cast<unsigned>(splits));
  launch_pdl(mla_attend_kernel, grid, kAttendThreads, attend_smem_bytes(s), stream, q_lat, q,
             selection, sel_stride, count, meta, s, scale, kv, o_lat, part, ml);
  if (splits == 1) return cudaGetLastError();
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  launch_pdl(mla_merge_kernel, dim3(static_cast<unsigned>(s.heads), static_cast<unsigned>(n)), 256,
             0, stream, part, ml, splits, s, o_lat);
  return cudaGetLastError();
}

cudaError_t mla_expand_v(const float* o_lat, const void* kv_b, DType kv_b_type, int64_t n,
                         const MlaShape& s, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!mla_supports(s)) return cudaErrorInvalidValue;
  const dim3 grid(blocks_for(s.v_dim, 8), static_cast<unsigned>(s.heads),
                  blocks_for(n, kMlaTokensPerBlock));
  return with_weight_type(kv_b_type, [&](auto tag) {
    using T = decltype(tag);
    launch_pdl(mla_expand_v_kernel<T>, grid, 256, 0, stream, o_lat, static_cast<const T*>(kv_b), n,
               s, out);
    return cudaGetLastError();
  });
}

}  // namespace exl3::cuda
