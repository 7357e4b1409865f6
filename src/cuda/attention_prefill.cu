// Prefill attention over the paged KV cache (see include/exl3/cuda/model_ops.hpp): a tile of up to
// 32 consecutive tokens of one sequence attends causally to its sequence's keys, the earlier
// context included (chunked prefill), with GQA, sliding windows and gpt-oss sinks.
//
// fp16 cache: tensor cores (mma.sync m16n8k16), FlashAttention-2 style. A block takes one tile and
// up to kHeads query heads of one kv head; each warp owns 16 query rows of one head. K and V are
// staged per chunk of keys in shared memory by cp.async, double-buffered, and every warp of the
// block reuses them. The cache holds fp16 K and V exactly, but q (fp32) and the softmax weights p
// (fp32) are not fp16 values: each is split into hi = fp16(x) and lo = fp16(x - hi), and both
// halves are multiplied (q K^T = q_hi K^T + q_lo K^T, p V likewise), so the result keeps about 22
// bits of q and p and matches the fp32 kernels to ~1e-6 rather than fp16's 1e-3. Scores are in log2
// units (q is pre-scaled by scale * log2 e) so each weight is one exp2.
//
// Quantized caches (fp8 / q8 / q4): a CUDA-core kernel that decodes codes to fp32 as it stages.
#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/attention_mma.cuh"
#include "cuda/mma.cuh"
#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"
#include "exl3/cpu/kv_codec.hpp"
#include "exl3/cuda/model_ops.hpp"
#include "exl3/trellis/half.hpp"

namespace exl3::cuda {
namespace {

using namespace detail;  // kNegBig, kv_slot, softmax_output, mma / ldmatrix / cp.async, the
                         // online-softmax step

// ---- fp16 cache: tensor cores --------------------------------------------------------------

// Keys per staged chunk and query heads per block: the chunk's S fragments and the head's O
// fragments live in registers (BC / 2 + HD / 2 floats per lane), so head dim 256 takes smaller
// chunks and fewer warps.
template <int HD>
struct PrefillConfig {
  static constexpr int kChunk = HD >= 256 ? 16 : 64;
  static constexpr int kHeads = HD >= 256 ? 2 : 4;
  static constexpr int kWarps = 2 * kHeads;
  static constexpr int kLd = HD + 8;  // halves per staged row: 16 bytes of padding keep the eight
                                      // rows of each ldmatrix on distinct banks
  static constexpr int kKvStage = 2 * kChunk * kLd;  // K then V of one chunk (halves)
  static constexpr int kQWarp = 2 * 16 * kLd;        // q_hi then q_lo of a warp's 16 rows
  static constexpr size_t kBytes = (2 * kKvStage + kWarps * kQWarp) * sizeof(__half);
};

template <int HD>
__global__ void __launch_bounds__(32 * PrefillConfig<HD>::kWarps, 1)
    attention_prefill_mma_kernel(const float* __restrict__ q, const int32_t* tile_first,
                                 const int32_t* tile_len, TokenMeta meta, AttnShape s,
                                 float scale_log2, PagedKv kv, float* __restrict__ out) {
  pdl_begin();
  using C = PrefillConfig<HD>;
  constexpr int BC = C::kChunk, LD = C::kLd;
  extern __shared__ __align__(16) __half prefill_smem[];
  __half* const stages = prefill_smem;  // [2][K, V][BC][LD]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int group = s.num_heads / s.num_kv_heads;
  const int head_blocks = (group + C::kHeads - 1) / C::kHeads;
  const int kvh = blockIdx.y / head_blocks;
  const int gi = (blockIdx.y % head_blocks) * C::kHeads + warp / 2;  // head within the group
  const int h = kvh * group + gi;
  const int half = warp & 1;  // rows 16 half .. 16 half + 15 of the tile
  // Blocks start roughly in index order, and a sequence's later tiles walk more keys: taking the
  // tiles last to first starts the longest blocks first, so the short ones fill the last wave.
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int first = tile_first[tile], len = tile_len[tile];
  const int32_t pos0 = meta.pos[first];
  const int32_t last_pos = pos0 + len - 1;
  const int32_t row = meta.seq_row[first];
  const bool active = gi < group && 16 * half < len;
  // The lowest key any query of the tile sees.
  const int32_t tile_lo = s.window > 0 ? max(0, pos0 - s.window + 1) : 0;
  const int64_t kv_stride = static_cast<int64_t>(s.num_kv_heads) * HD;

  // Stage chunk `c0` into buffer `b`: 16-byte pieces, keys past the tile's last position zeroed
  // (V must be finite there: masked weights are 0, and 0 * NaN would not be).
  auto stage = [&](int32_t c0, int b) {
    __half* sk = stages + b * C::kKvStage;
    __half* sv = sk + BC * LD;
    for (int i = threadIdx.x; i < BC * (HD / 8); i += 32 * C::kWarps) {
      const int j = i / (HD / 8), x = 8 * (i % (HD / 8));
      const int32_t key = c0 + j;
      const bool in = key <= last_pos;
      const int64_t off =
          in ? kv_slot(kv, row, key) * kv_stride + static_cast<int64_t>(kvh) * HD + x : 0;
      cp_async16_or_zero(sk + j * LD + x, kv.k + off, in);
      cp_async16_or_zero(sv + j * LD + x, kv.v + off, in);
    }
    cp_async_commit();
  };
  stage(tile_lo, 0);

  // This warp's q rows, pre-scaled and split into fp16 hi / lo (rows past the tile are zero).
  __half* const sq = stages + 2 * C::kKvStage + warp * C::kQWarp;
  if (active) {
    for (int i = lane; i < 16 * (HD / 2); i += 32) {
      const int r = i / (HD / 2), x = 2 * (i % (HD / 2));
      float2 v = make_float2(0.0f, 0.0f);
      if (16 * half + r < len) {
        v = *reinterpret_cast<const float2*>(
            q + (static_cast<int64_t>(first + 16 * half + r) * s.num_heads + h) * HD + x);
      }
      uint32_t hi, lo;
      split_pair(v.x * scale_log2, v.y * scale_log2, hi, lo);
      *reinterpret_cast<uint32_t*>(sq + r * LD + x) = hi;
      *reinterpret_cast<uint32_t*>(sq + 16 * LD + r * LD + x) = lo;
    }
  }
  __syncwarp();

  // Rows g and g + 8 of the warp: their positions and window starts.
  const int32_t pa = pos0 + 16 * half + g, pb = pa + 8;
  const int32_t loa = s.window > 0 ? pa - s.window + 1 : 0;
  const int32_t lob = s.window > 0 ? pb - s.window + 1 : 0;
  const int32_t warp_last = pos0 + 16 * half + 15;  // the warp's highest row position

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float ma = kNegBig, mb = kNegBig, la = 0.0f, lb = 0.0f;

  int b = 0;
  for (int32_t c0 = tile_lo; c0 <= last_pos; c0 += BC, b ^= 1) {
    if (c0 + BC <= last_pos) {
      stage(c0 + BC, b ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __half* sk = stages + b * C::kKvStage;
    const __half* sv = sk + BC * LD;
    if (active && c0 <= warp_last) {
      // S = q K^T over the chunk: BC / 8 n-tiles of 8 keys.
      float sc[BC / 8][4];
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int k0 = 0; k0 < HD; k0 += 16) {
        uint32_t qh[4], ql[4];
        const __half* qrow = sq + (lane & 15) * LD + k0 + 8 * (lane >> 4);
        ldmatrix_x4(qh, qrow);
        ldmatrix_x4(ql, qrow + 16 * LD);
#pragma unroll
        for (int n0 = 0; n0 < BC; n0 += 16) {
          uint32_t kb[4];  // b0, b1 of keys n0 .. n0 + 7, then of n0 + 8 .. n0 + 15
          ldmatrix_x4(kb,
                      sk + (n0 + (lane & 7) + 8 * (lane >> 4)) * LD + k0 + 8 * ((lane >> 3) & 1));
          mma16816(sc[n0 / 8], qh, kb[0], kb[1]);
          mma16816(sc[n0 / 8], ql, kb[0], kb[1]);
          mma16816(sc[n0 / 8 + 1], qh, kb[2], kb[3]);
          mma16816(sc[n0 / 8 + 1], ql, kb[2], kb[3]);
        }
      }
      // Mask (causal, window), the online-softmax step, then O += p V.
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int32_t key = c0 + 8 * n + 2 * c + e;
          if (key > pa || key < loa) sc[n][e] = kNegBig;
          if (key > pb || key < lob) sc[n][2 + e] = kNegBig;
        }
      }
      online_softmax_step<HD, BC / 8>(sc, o, ma, mb, la, lb);
      accumulate_pv<HD, BC / 8, LD>(sc, o, sv, lane);
    }
    __syncthreads();  // every warp is done with buffer b before it is staged again
  }
  if (!active) return;
#pragma unroll
  for (int sh = 1; sh <= 2; sh <<= 1) {
    la += __shfl_xor_sync(0xffffffffu, la, sh);
    lb += __shfl_xor_sync(0xffffffffu, lb, sh);
  }
  // A sink joins the max and the denominator and weighs no value (softmax_output's rule, here in
  // log2 units).
  float fa = 1.0f / la, fb = 1.0f / lb;
  if (s.sinks != nullptr) {
    const float sink = s.sinks[h] * 1.4426950408889634f;
    const float ua = fmaxf(ma, sink), ub = fmaxf(mb, sink);
    const float ea = exp2f(ma - ua), eb = exp2f(mb - ub);
    fa = ea / (la * ea + exp2f(sink - ua));
    fb = eb / (lb * eb + exp2f(sink - ub));
  }
  const int ra = 16 * half + g, rb = ra + 8;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    const int x = 8 * n + 2 * c;
    if (ra < len) {
      *reinterpret_cast<float2*>(out + (static_cast<int64_t>(first + ra) * s.num_heads + h) * HD +
                                 x) = make_float2(o[n][0] * fa, o[n][1] * fa);
    }
    if (rb < len) {
      *reinterpret_cast<float2*>(out + (static_cast<int64_t>(first + rb) * s.num_heads + h) * HD +
                                 x) = make_float2(o[n][2] * fb, o[n][3] * fb);
    }
  }
}

template <int HD>
cudaError_t launch_mma(const float* q, const int32_t* tile_first, const int32_t* tile_len,
                       int64_t count, TokenMeta meta, const AttnShape& s, float scale,
                       const PagedKv& kv, float* out, cudaStream_t stream) {
  using C = PrefillConfig<HD>;
  const cudaError_t e = cudaFuncSetAttribute(attention_prefill_mma_kernel<HD>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(C::kBytes));
  if (e != cudaSuccess) return e;
  const int group = s.num_heads / s.num_kv_heads;
  const int head_blocks = (group + C::kHeads - 1) / C::kHeads;
  launch_pdl(
      attention_prefill_mma_kernel<HD>,
      dim3(static_cast<unsigned>(count), static_cast<unsigned>(s.num_kv_heads * head_blocks)),
      32 * C::kWarps, C::kBytes, stream, q, tile_first, tile_len, meta, s,
      scale * 1.4426950408889634f, kv, out);
  return cudaGetLastError();
}

// ---- quantized caches: CUDA cores ------------------------------------------------------------

// Channels c and c + 1 (c even) of a quantized head, decoded to fp32.
template <int HD>
__device__ __forceinline__ float2 quantized_pair(cpu::KvFormat f, const uint8_t* codes,
                                                 const uint16_t* scales, int64_t head, int c) {
  const float sc = trellis::half_to_float(scales[head * (HD / cpu::kKvGroup) + c / cpu::kKvGroup]);
  if (f == cpu::KvFormat::kQ4) {
    const uint8_t b = codes[head * (HD / 2) + c / 2];
    return make_float2(cpu::kv_decode(f, b) * sc, cpu::kv_decode(f, b >> 4) * sc);
  }
  const uint8_t* p = codes + head * HD + c;
  return make_float2(cpu::kv_decode(f, p[0]) * sc, cpu::kv_decode(f, p[1]) * sc);
}

// Quantized caches: one block per (tile of <= 32 consecutive tokens of one sequence, query head);
// 128 threads = 32 queries x 4 parts, part p owning channels p, p + 4, ... (so the four parts of a
// query read four neighbouring banks and different queries broadcast). Keys come in chunks of 32
// staged in shared memory as fp32; scores are reduced over the 4 parts with two shuffles, and
// each chunk updates a running softmax (causal: key > pos is skipped, and with a sliding window
// key <= pos - window too).
template <int HD>
__global__ void attention_prefill_quantized_kernel(const float* q, const int32_t* tile_first,
                                                   const int32_t* tile_len, TokenMeta meta,
                                                   AttnShape s, float scale, PagedKv kv,
                                                   float* out) {
  pdl_begin();
  constexpr int kParts = 4, kDpt = HD / kParts, kChunk = 32;
  extern __shared__ float smem[];
  float* sk = smem;                // [kChunk][HD]
  float* sv = smem + kChunk * HD;  // [kChunk][HD]
  const int h = blockIdx.y;
  const int kvh = h / (s.num_heads / s.num_kv_heads);
  const int first = tile_first[blockIdx.x], len = tile_len[blockIdx.x];
  const int qi = threadIdx.x / kParts, part = threadIdx.x % kParts;
  const bool active = qi < len;
  const int64_t t = first + (active ? qi : 0);
  const int32_t my_pos = meta.pos[t];
  const int32_t last_pos = meta.pos[first + len - 1];
  // Keys before my_lo are outside this query's sliding window; the tile starts at the lowest
  // key any of its queries sees.
  const int32_t my_lo = s.window > 0 ? max(0, my_pos - s.window + 1) : 0;
  const int32_t tile_lo = s.window > 0 ? max(0, meta.pos[first] - s.window + 1) : 0;
  const int32_t row = meta.seq_row[first];
  float qr[kDpt], o[kDpt];
#pragma unroll
  for (int i = 0; i < kDpt; ++i) {
    qr[i] = q[(t * s.num_heads + h) * HD + part + kParts * i] * scale;
    o[i] = 0.0f;
  }
  float m = kNegBig, l = 0.0f;
  for (int c0 = tile_lo; c0 <= last_pos; c0 += kChunk) {
    __syncthreads();
    for (int i = threadIdx.x; i < kChunk * HD / 2; i += blockDim.x) {
      const int j = i / (HD / 2), c = 2 * (i % (HD / 2));
      const int key = c0 + j;
      float2 kf = make_float2(0.0f, 0.0f), vf = kf;
      if (key <= last_pos) {
        const int64_t head = kv_slot(kv, row, key) * s.num_kv_heads + kvh;
        kf = quantized_pair<HD>(kv.format, kv.kq, kv.ks, head, c);
        vf = quantized_pair<HD>(kv.format, kv.vq, kv.vs, head, c);
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
      sc[j] = c0 + j <= my_pos && c0 + j >= my_lo ? d : kNegBig;
      cmax = fmaxf(cmax, sc[j]);
    }
    const float mn = fmaxf(m, cmax);
    const float corr = expf(m - mn);
    l *= corr;
#pragma unroll
    for (int i = 0; i < kDpt; ++i) o[i] *= corr;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const float p = c0 + j <= my_pos && c0 + j >= my_lo ? expf(sc[j] - mn) : 0.0f;
      l += p;
#pragma unroll
      for (int i = 0; i < kDpt; ++i) o[i] += p * sv[j * HD + part + kParts * i];
    }
    m = mn;
  }
  if (active) {
#pragma unroll
    for (int i = 0; i < kDpt; ++i)
      out[(t * s.num_heads + h) * HD + part + kParts * i] = softmax_output(m, l, o[i], s.sinks, h);
  }
}

template <int HD>
cudaError_t launch_quantized(const float* q, const int32_t* tile_first, const int32_t* tile_len,
                             int64_t count, TokenMeta meta, const AttnShape& s, float scale,
                             const PagedKv& kv, float* out, cudaStream_t stream) {
  const size_t smem = 2u * 32u * HD * sizeof(float);
  if (smem > 48u * 1024u) {
    const cudaError_t e =
        cudaFuncSetAttribute(attention_prefill_quantized_kernel<HD>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  launch_pdl(attention_prefill_quantized_kernel<HD>,
             dim3(static_cast<unsigned>(count), static_cast<unsigned>(s.num_heads)), 128, smem,
             stream, q, tile_first, tile_len, meta, s, scale, kv, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attention_prefill(const float* q, const int32_t* tile_first, const int32_t* tile_len,
                              int64_t count, TokenMeta meta, const AttnShape& shape, float scale,
                              const PagedKv& kv, float* out, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (shape.num_kv_heads <= 0 || shape.num_heads % shape.num_kv_heads != 0)
    return cudaErrorInvalidValue;
  if (shape.window < 0) return cudaErrorInvalidValue;
  return detail::with_head_dim(shape.head_dim, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    if (kv.format == cpu::KvFormat::kNative) {
      return launch_mma<HD>(q, tile_first, tile_len, count, meta, shape, scale, kv, out, stream);
    }
    return launch_quantized<HD>(q, tile_first, tile_len, count, meta, shape, scale, kv, out,
                                stream);
  });
}

}  // namespace exl3::cuda
