// Split-KV decode attention on tensor cores, for the fp16 paged cache (attention_decode's fp16
// path; include/exl3/cuda/model_ops.hpp has the contract, attention_decode.cu the CUDA-core kernel
// that serves the quantized caches).
//
// Grid (listed token, row block, split). A row block is up to 16 query heads of one kv head: the
// M rows of mma.m16n8k16, so each K/V row a block stages serves every query head of its kv head
// (GQA): with up to 16 query heads per kv head, a token reads each key once. A split is a range of
// the token's keys (a multiple of kChunk keys), staged kChunk keys at a time by cp.async into
// double-buffered shared memory; warp w takes keys 16 w .. 16 w + 15 of each chunk: S = q K^T on
// two 8-key n-tiles, a running max and sum per row, then O += p V over its 16 keys. As in the
// prefill kernel, q and the softmax weights are each split into fp16 hi + lo and both halves
// multiplied, which keeps fp32-level accuracy, and scores are in log2 units (q pre-scaled by scale
// * log2 e). The warps' states merge in shared memory; with one active split that is the output,
// otherwise each block stores its state and the last of the (token, row block)'s blocks to finish
// (an atomic counter, reset by that block) merges the splits in split order, so the result is
// deterministic and, the split plan depending only on the cache's capacity, the same bits at every
// batch size.
#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/attention_kernels.hpp"
#include "cuda/attention_merge.cuh"
#include "cuda/attention_mma.cuh"
#include "cuda/mma.cuh"
#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"

namespace exl3::cuda::detail {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

template <int HD>
struct DecodeMmaConfig {
  static constexpr int kWarps = 4;
  static constexpr int kRows = 16;            // query heads per block (mma M)
  static constexpr int kChunk = 16 * kWarps;  // keys per stage: 16 per warp
  static constexpr int kLd = HD + 8;          // halves per staged row: 16 bytes of padding keep
                                              // the eight rows of an ldmatrix on distinct banks
  static constexpr int kStage = 2 * kChunk * kLd;  // K then V of one chunk (halves)
  static constexpr int kQ = 2 * kRows * kLd;       // q hi then q lo (halves)
  static constexpr size_t kBytes = (2 * kStage + kQ) * sizeof(__half);
  // After the key loop the stages hold the warps' states: m and l [warps][rows], O
  // [warps][rows][HD] (fp32).
  static_assert(static_cast<size_t>(kWarps) * kRows * (HD + 2) * 4 <= 2 * kStage * sizeof(__half),
                "the warps' states fit in the dead stages");
  static_assert(split_merge_floats(kRows, kDecodeMaxSplits) * 4 <= 2 * kStage * sizeof(__half),
                "the split merge's weights fit in the dead stages");
};

template <int HD>
__global__ void __launch_bounds__(32 * DecodeMmaConfig<HD>::kWarps)
    attention_decode_mma_kernel(const float* __restrict__ q, const int32_t* __restrict__ tokens,
                                TokenMeta meta, AttnShape s, float scale_log2, PagedKv kv,
                                int splits, int32_t* counters, float* partial,
                                float* __restrict__ out) {
  pdl_begin();
  using C = DecodeMmaConfig<HD>;
  constexpr int BC = C::kChunk, LD = C::kLd, R = C::kRows, W = C::kWarps;
  extern __shared__ __align__(16) __half decode_smem[];
  __half* const stages = decode_smem;              // [2][K, V][BC][LD]
  __half* const sq = decode_smem + 2 * C::kStage;  // [hi, lo][R][LD]
  __shared__ int s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int ti = blockIdx.x, rb = blockIdx.y, split = blockIdx.z;
  const int group = s.num_heads / s.num_kv_heads;
  const int row_blocks = (group + R - 1) / R;
  const int kvh = rb / row_blocks;
  const int r0 = (rb % row_blocks) * R;  // the block's first head within its kv head's group
  const int rows = min(R, group - r0);
  const int h0 = kvh * group + r0;
  const int64_t t = tokens[ti];
  const int32_t pos = meta.pos[t], seq = meta.seq_row[t];
  const int lo = s.window > 0 ? max(0, pos + 1 - s.window) : 0;
  const int chunk = decode_mma_split_keys(pos + 1 - lo, splits);
  const int active = (pos + 1 - lo + chunk - 1) / chunk;
  if (split >= active) return;  // this token's context needs fewer splits
  const int k0 = lo + split * chunk, k1 = min(pos + 1, k0 + chunk);
  const int64_t kv_stride = static_cast<int64_t>(s.num_kv_heads) * HD;

  // Stage keys c0 .. c0 + BC - 1 into buffer b; keys past the range are zero (V must be finite
  // there: their weights are 0, and 0 * NaN would not be).
  auto stage = [&](int c0, int b) {
    __half* sk = stages + b * C::kStage;
    __half* sv = sk + BC * LD;
    for (int i = threadIdx.x; i < BC * (HD / 8); i += 32 * W) {
      const int j = i / (HD / 8), x = 8 * (i % (HD / 8));
      const bool in = c0 + j < k1;
      const int64_t off =
          in ? kv_slot(kv, seq, c0 + j) * kv_stride + static_cast<int64_t>(kvh) * HD + x : 0;
      cp_async16_or_zero(sk + j * LD + x, kv.k + off, in);
      cp_async16_or_zero(sv + j * LD + x, kv.v + off, in);
    }
    cp_async_commit();
  };
  stage(k0, 0);

  // The block's q rows, pre-scaled and split into fp16 hi / lo (rows past its heads are zero).
  for (int i = threadIdx.x; i < R * (HD / 2); i += 32 * W) {
    const int r = i / (HD / 2), x = 2 * (i % (HD / 2));
    float2 v = make_float2(0.0f, 0.0f);
    if (r < rows) {
      v = *reinterpret_cast<const float2*>(q + (t * s.num_heads + h0 + r) * HD + x);
    }
    uint32_t hi, lo_bits;
    split_pair(v.x * scale_log2, v.y * scale_log2, hi, lo_bits);
    *reinterpret_cast<uint32_t*>(sq + r * LD + x) = hi;
    *reinterpret_cast<uint32_t*>(sq + (R + r) * LD + x) = lo_bits;
  }

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float ma = kNegBig, mb = kNegBig, la = 0.0f, lb = 0.0f;  // rows g and g + 8

  int b = 0;
  for (int c0 = k0; c0 < k1; c0 += BC, b ^= 1) {
    if (c0 + BC < k1) {
      stage(c0 + BC, b ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();                // the chunk (and, the first time, q) is in shared memory
    const int kw = c0 + 16 * warp;  // the warp's first key
    if (kw < k1) {
      const __half* sk = stages + b * C::kStage + 16 * warp * LD;
      const __half* sv = stages + b * C::kStage + (BC + 16 * warp) * LD;
      // S = q K^T over the warp's 16 keys: n-tiles of keys kw .. kw + 7 and kw + 8 .. kw + 15.
      float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int x0 = 0; x0 < HD; x0 += 16) {
        uint32_t qh[4], ql[4], kb[4];
        const __half* qrow = sq + (lane & 15) * LD + x0 + 8 * (lane >> 4);
        ldmatrix_x4(qh, qrow);
        ldmatrix_x4(ql, qrow + R * LD);
        ldmatrix_x4(kb, sk + ((lane & 7) + 8 * (lane >> 4)) * LD + x0 + 8 * ((lane >> 3) & 1));
        mma16816(sc[0], qh, kb[0], kb[1]);
        mma16816(sc[0], ql, kb[0], kb[1]);
        mma16816(sc[1], qh, kb[2], kb[3]);
        mma16816(sc[1], ql, kb[2], kb[3]);
      }
      // Keys past the range are masked; the online-softmax step, then O += p V over the keys.
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (kw + 8 * n + 2 * c + e >= k1) sc[n][e] = sc[n][2 + e] = kNegBig;
        }
      }
      online_softmax_step<HD, 2>(sc, o, ma, mb, la, lb);
      accumulate_pv<HD, 2, LD>(sc, o, sv, lane);
    }
    __syncthreads();  // every warp is done with buffer b before it is staged again
  }
#pragma unroll
  for (int sh = 1; sh <= 2; sh <<= 1) {
    la += __shfl_xor_sync(0xffffffffu, la, sh);
    lb += __shfl_xor_sync(0xffffffffu, lb, sh);
  }

  // Merge the warps (every copy has landed and every warp left the loop: the stages are dead).
  float* wm = reinterpret_cast<float*>(stages);  // [W][R]
  float* wl = wm + W * R;                        // [W][R]
  float* wo = wl + W * R;                        // [W][R][HD]
  if (c == 0) {
    wm[warp * R + g] = ma;
    wm[warp * R + g + 8] = mb;
    wl[warp * R + g] = la;
    wl[warp * R + g + 8] = lb;
  }
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    const int x = 8 * n + 2 * c;
    *reinterpret_cast<float2*>(wo + (warp * R + g) * HD + x) = make_float2(o[n][0], o[n][1]);
    *reinterpret_cast<float2*>(wo + (warp * R + g + 8) * HD + x) = make_float2(o[n][2], o[n][3]);
  }
  __syncthreads();
  const int64_t pair = static_cast<int64_t>(ti) * gridDim.y + rb;
  const int stride_rows = min(R, group);
  const int64_t split_floats = static_cast<int64_t>(stride_rows) * (HD + 2);
  float* const out_rows = out + (t * s.num_heads + h0) * HD;
  store_block_state<HD, W, true>(wm, wl, wo, R, rows, active == 1, out_rows,
                                 partial + (pair * splits + split) * split_floats, s.sinks, h0);
  if (active == 1) return;

  // The last block of this (token, row block) merges every split's state, in split order.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(counters + pair, 1) == active - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  merge_split_states<HD, true>(partial + pair * splits * split_floats, split_floats, rows, active,
                               wm, out_rows, s.sinks, h0);
  if (threadIdx.x == 0) counters[pair] = 0;  // ready for the next launch
}

template <int HD>
cudaError_t launch_hd(const float* q, const int32_t* tokens, int64_t count, TokenMeta meta,
                      const AttnShape& s, float scale, const PagedKv& kv, int splits,
                      int32_t* counters, float* partial, float* out, cudaStream_t stream) {
  constexpr size_t bytes = DecodeMmaConfig<HD>::kBytes;
  const auto kernel = attention_decode_mma_kernel<HD>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(decode_mma_row_blocks(s)),
                  static_cast<unsigned>(splits));
  launch_pdl(kernel, grid, 32 * DecodeMmaConfig<HD>::kWarps, bytes, stream, q, tokens, meta, s,
             scale * kLog2e, kv, splits, counters, partial, out);
  return cudaGetLastError();
}

}  // namespace

int decode_mma_row_blocks(const AttnShape& s) {
  const int group = s.num_heads / s.num_kv_heads;
  return s.num_kv_heads * ((group + 15) / 16);
}

int64_t decode_mma_state_rows(const AttnShape& s) {
  const int group = s.num_heads / s.num_kv_heads;
  return static_cast<int64_t>(decode_mma_row_blocks(s)) * (group < 16 ? group : 16);
}

cudaError_t attention_decode_mma(const float* q, const int32_t* tokens, int64_t count,
                                 TokenMeta meta, const AttnShape& s, float scale, const PagedKv& kv,
                                 int splits, int32_t* counters, float* partial, float* out,
                                 cudaStream_t stream) {
  return with_head_dim(s.head_dim, [&](auto hd) {
    return launch_hd<decltype(hd)::value>(q, tokens, count, meta, s, scale, kv, splits, counters,
                                          partial, out, stream);
  });
}

}  // namespace exl3::cuda::detail
