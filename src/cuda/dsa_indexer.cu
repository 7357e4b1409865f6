// DSA lightning-indexer kernels (see include/exl3/cuda/mla.hpp): the indexer's RoPE, key norm and
// key cache, then per token the scores of every earlier position (spread over blocks of
// positions) and an exact top-k (radix select on the scores' bits, ties to the lower position, the
// kept positions in ascending order).
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "cuda/mla_rope.cuh"
#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"
#include "exl3/cuda/mla.hpp"

namespace exl3::cuda {
namespace {

using namespace detail;  // kv_slot, warp and block sums, rope_part

constexpr int kStoreThreads = 256;
constexpr int kSelectThreads = 512;
constexpr int kMaxHeadDim = 256;

// One block per token: warps rope the query heads; the block LayerNorms the key (fp32
// statistics), warp 0 ropes it, and it goes to the token's cache slot.
__global__ void __launch_bounds__(kStoreThreads)
    dsa_index_store_kernel(float* iq, const float* ik, const float* ln_w, const float* ln_b,
                           const float* rope_cs, bool interleave, TokenMeta meta, DsaShape s,
                           float* keys, PagedKv kv) {
  pdl_begin();
  __shared__ float scratch[32];
  __shared__ float k[kMaxHeadDim];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t pos = meta.pos[t];
  const float* cs = rope_cs + static_cast<int64_t>(pos) * 2 * s.rope_half;
  for (int h = warp; h < s.heads; h += kStoreThreads / 32)
    rope_part(iq + (t * s.heads + h) * s.head_dim, cs, s.rope_half, interleave, lane);
  const float* x = ik + t * s.head_dim;
  float sum = 0.0f;
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x) sum += x[d];
  const float mean = block_sum(sum, scratch) / static_cast<float>(s.head_dim);
  float var = 0.0f;
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x) var += (x[d] - mean) * (x[d] - mean);
  const float inv = rsqrtf(block_sum(var, scratch) / static_cast<float>(s.head_dim) + 1e-6f);
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x)
    k[d] = (x[d] - mean) * inv * ln_w[d] + ln_b[d];
  __syncthreads();
  if (warp == 0) rope_part(k, cs, s.rope_half, interleave, lane);
  __syncthreads();
  float* slot = keys + kv_slot(kv, meta.seq_row[t], pos) * static_cast<int64_t>(s.head_dim);
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x) slot[d] = k[d];
}

// A float's bits mapped so that unsigned order is the floats' order.
__device__ __forceinline__ uint32_t ordered_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

constexpr int kScoreThreads = 256;

// Blocks of kScoreThreads positions for each token (grid: position blocks x tokens, so a long
// context spreads over the GPU; blocks past the token's position exit): a thread per position,
// the token's query and head weights in shared memory.
__global__ void __launch_bounds__(kScoreThreads)
    dsa_index_score_kernel(const float* iq, const float* weights, const float* keys, TokenMeta meta,
                           DsaShape s, PagedKv kv, float* scratch, int64_t scratch_stride) {
  pdl_begin();
  extern __shared__ float qw[];  // [heads * head_dim] query, then [heads] weights
  const int64_t t = blockIdx.y;
  const int32_t npos = meta.pos[t] + 1;
  const int32_t j0 = static_cast<int32_t>(blockIdx.x) * kScoreThreads;
  if (npos <= s.topk || j0 >= npos) return;  // everything is kept, or nothing to score here
  const int qn = s.heads * s.head_dim;
  for (int i = threadIdx.x; i < qn; i += blockDim.x) qw[i] = iq[t * qn + i];
  for (int h = threadIdx.x; h < s.heads; h += blockDim.x) qw[qn + h] = weights[t * s.heads + h];
  __syncthreads();
  const int32_t j = j0 + static_cast<int32_t>(threadIdx.x);
  if (j >= npos) return;
  const float kscale = rsqrtf(static_cast<float>(s.head_dim));
  const float wscale = rsqrtf(static_cast<float>(s.heads));
  const float* kj = keys + kv_slot(kv, meta.seq_row[t], j) * static_cast<int64_t>(s.head_dim);
  float score = 0.0f;
  for (int h = 0; h < s.heads; ++h) {
    const float* qh = qw + h * s.head_dim;
    float dot = 0.0f;
    for (int d = 0; d < s.head_dim; ++d) dot += qh[d] * kj[d];
    score += qw[qn + h] * wscale * fmaxf(dot * kscale, 0.0f);
  }
  scratch[t * scratch_stride + j] = score;
}

// One block per token over its scores: the k-th largest key by four 8-bit radix passes, then the
// kept positions in order with block scans.
__global__ void __launch_bounds__(kSelectThreads)
    dsa_index_select_kernel(TokenMeta meta, DsaShape s, const float* scratch,
                            int64_t scratch_stride, int32_t* selection, int32_t* count) {
  pdl_begin();
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int hist[256];
  __shared__ uint32_t prefix_s;
  __shared__ int need_s, out_s, eq_seen_s;
  const int64_t t = blockIdx.x;
  const int32_t npos = meta.pos[t] + 1;
  int32_t* out = selection + t * s.topk;
  if (npos <= s.topk) {
    for (int j = threadIdx.x; j < npos; j += blockDim.x) out[j] = j;
    if (threadIdx.x == 0) count[t] = npos;
    return;
  }
  const float* sc = scratch + t * scratch_stride;
  // The k-th largest ordered key, 8 bits at a time from the top; need_s ends as how many keys
  // equal to it are kept (every larger one is).
  uint32_t prefix = 0, mask = 0;
  if (threadIdx.x == 0) need_s = s.topk;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < npos; j += blockDim.x) {
      const uint32_t u = ordered_bits(sc[j]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, digit = 255;
      for (; digit > 0; --digit) {
        if (above + hist[digit] >= need_s) break;
        above += hist[digit];
      }
      need_s -= above;
      prefix_s = prefix | (static_cast<uint32_t>(digit) << shift);
    }
    __syncthreads();
    prefix = prefix_s;
    mask |= 255u << shift;
  }
  const int need = need_s;
  if (threadIdx.x == 0) out_s = eq_seen_s = 0;
  __syncthreads();
  for (int base = 0; base < npos; base += blockDim.x) {
    const int j = base + static_cast<int>(threadIdx.x);
    const uint32_t u = j < npos ? ordered_bits(sc[j]) : 0u;
    const int eq = j < npos && u == prefix, gt = j < npos && u > prefix;
    int eq_rank = 0, eq_total = 0;
    Scan(scan).ExclusiveSum(eq, eq_rank, eq_total);
    __syncthreads();
    const int take = gt || (eq && eq_seen_s + eq_rank < need);
    int at = 0, taken = 0;
    Scan(scan).ExclusiveSum(take, at, taken);
    if (take) out[out_s + at] = j;
    __syncthreads();
    if (threadIdx.x == 0) {
      out_s += taken;
      eq_seen_s += eq_total;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) count[t] = s.topk;
}

}  // namespace

bool dsa_supports(const DsaShape& s) {
  return s.heads > 0 && s.head_dim > 0 && s.head_dim <= kMaxHeadDim && s.rope_half > 0 &&
         2 * s.rope_half <= s.head_dim && s.rope_half <= kMlaMaxRopeHalf && s.topk > 0 &&
         static_cast<size_t>(s.heads) * (s.head_dim + 1) * 4 <= 40 * 1024;  // + the static shared
}

cudaError_t dsa_index_store(float* iq, const float* ik, const float* ln_w, const float* ln_b,
                            const float* rope_cs, bool interleave, TokenMeta meta, int64_t n,
                            const DsaShape& s, float* keys, const PagedKv& kv,
                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!dsa_supports(s)) return cudaErrorInvalidValue;
  launch_pdl(dsa_index_store_kernel, static_cast<unsigned>(n), kStoreThreads, 0, stream, iq, ik,
             ln_w, ln_b, rope_cs, interleave, meta, s, keys, kv);
  return cudaGetLastError();
}

cudaError_t dsa_index_select(const float* iq, const float* weights, const float* keys,
                             TokenMeta meta, int64_t n, const DsaShape& s, const PagedKv& kv,
                             float* scratch, int32_t* selection, int32_t* count,
                             cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!dsa_supports(s)) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(s.heads) * (s.head_dim + 1) * 4;
  const int64_t stride = static_cast<int64_t>(kv.max_pages) * kv.page_size;
  const dim3 grid(blocks_for(stride, kScoreThreads), static_cast<unsigned>(n));
  launch_pdl(dsa_index_score_kernel, grid, kScoreThreads, smem, stream, iq, weights, keys, meta, s,
             kv, scratch, stride);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  launch_pdl(dsa_index_select_kernel, static_cast<unsigned>(n), kSelectThreads, 0, stream, meta, s,
             scratch, stride, selection, count);
  return cudaGetLastError();
}

}  // namespace exl3::cuda
