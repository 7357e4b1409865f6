// Split-KV decode attention (flash-decoding) over the paged KV cache; see
// include/exl3/cuda/model_ops.hpp for the contract. The fp16 cache runs on tensor cores
// (attention_decode_mma.cu); this file's CUDA-core kernel serves the quantized caches (fp8, q8,
// q4), whose codes it decodes to fp16 rows as it stages them.
//
// Grid (listed token, head group, split). A head group is G query heads of one kv head, so the
// K/V rows a block reads serve G heads. A split is a range of the token's keys: the keys 0..pos
// (pos - window + 1..pos in a sliding-window layer) are cut into `splits` ranges of equal length (a
// multiple of 32, at least kMinChunk), so short contexts run in one block and long ones spread over
// up to kDecodeMaxSplits blocks. Inside a block, warp w walks the 32-key tiles w, w + 4, ... of its
// range: the tile's K and V codes are decoded into shared memory, lane j scores key j against the G
// heads from there, the tile updates a running max / sum per head, and the lanes, each owning HD/32
// output channels, accumulate p * V. The warps' states merge in shared memory; with one active
// split that is the output, otherwise the block stores its state and the last of the token's blocks
// to finish (an atomic counter, reset by that block) merges the splits in split order, so the
// result is deterministic. Sinks (gpt-oss) join the final state only, once per head, after every
// split is merged.
#include <algorithm>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/attention_kernels.hpp"
#include "cuda/attention_merge.cuh"
#include "cuda/paged_kv.cuh"
#include "cuda/pdl.cuh"
#include "exl3/cuda/model_ops.hpp"

namespace exl3::cuda {
namespace {

using namespace detail;  // kNegBig, kv_slot, warp_max, warp_sum, softmax_output (paged_kv.cuh)

constexpr int kWarps = 4;
constexpr int kTile = 32;      // keys per warp step (one per lane)
constexpr int kMinChunk = 64;  // keys per split at least
constexpr size_t kAlign = 256;

size_t align_up(size_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

// Query heads per block: 4 when the heads per kv head allow it (the K/V tile serves 4 heads and
// batch-1 steps still get num_heads / 4 blocks), else 2 or 1.
int group_size(const AttnShape& s) {
  const int qpk = s.num_heads / s.num_kv_heads;
  return qpk % 4 == 0 ? 4 : qpk % 2 == 0 ? 2 : 1;
}

// Shared memory of one block, in bytes: q [G][HD] fp32, p [warps][G][32] fp32, then either the
// warps' K/V tiles or (after the key loop) their softmax states [warps][G] x 2 + [warps][G][HD].
template <int HD, int G>
struct Smem {
  // K rows padded by 16 bytes: lane j reads row j in 16-byte pieces, and 8 consecutive lanes
  // then hit 8 different 16-byte bank groups. V is read row by row across lanes (no padding).
  static constexpr int kKRow = HD * 2 + 16;
  static constexpr int kVRow = HD * 2;
  static constexpr int kWarpTiles = kTile * (kKRow + kVRow);
  static constexpr int kQ = G * HD * 4;
  static constexpr int kP = kWarps * G * kTile * 4;
  static constexpr int kMerge = kWarps * G * (HD + 2) * 4;
  static constexpr int kRegion = kWarps * kWarpTiles > kMerge ? kWarps* kWarpTiles : kMerge;
  static constexpr int kBytes = kQ + kP + kRegion;
  static_assert(split_merge_floats(G, kDecodeMaxSplits) * 4 <= kRegion,
                "the split merge's weights fit in the dead tiles");
};

// Two codes as an fp16 pair, exactly (every E4M3, int8 and q4 value is an fp16 value): fp8 by
// the hardware's E4M3x2 conversion; q8 / q4 by placing the biased code in the mantissa of 1024
// (fp16 bits 0x6400 | u is 1024 + u for u < 1024) and subtracting the bias with it. The same
// values as cpu::kv_decode, without its per-byte branches.
__device__ __forceinline__ __half2 code_pair(cpu::KvFormat f, uint32_t lo, uint32_t hi) {
  if (f == cpu::KvFormat::kFp8) {
    const __half2_raw r =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(lo | (hi << 8)), __NV_E4M3);
    return __half2(r);
  }
  const bool q8 = f == cpu::KvFormat::kQ8;
  const uint32_t bias = q8 ? 0x80u : 0x8u;  // int8 c -> c + 128; q4 nibbles are c + 8 already
  const uint32_t ulo = q8 ? (lo ^ 0x80u) : lo, uhi = q8 ? (hi ^ 0x80u) : hi;
  const uint32_t bits = 0x64006400u | ulo | (uhi << 16);
  const __half off = __ushort_as_half(static_cast<unsigned short>(0x6400u | bias));
  return __hsub2(*reinterpret_cast<const __half2*>(&bits), __half2(off, off));
}

// 16 code bytes (16 channels of fp8 / q8, 32 of q4: never more than one scale group) decoded into
// fp16 channels at dst (16-byte aligned). code * scale is exact in fp32 (at most 8 significant
// bits times fp16's 11), so the one rounding of __hmul2 gives the bits cpu::kv_decode(c) * s
// rounded to fp16 gives.
__device__ __forceinline__ void decode_piece(cpu::KvFormat f, uint4 raw, __half scale,
                                             unsigned char* dst) {
  const auto* b = reinterpret_cast<const uint8_t*>(&raw);
  const __half2 s2(scale, scale);
  __half2 h[16];
  if (f == cpu::KvFormat::kQ4) {
#pragma unroll
    for (int i = 0; i < 16; ++i) h[i] = __hmul2(code_pair(f, b[i] & 0xFu, b[i] >> 4), s2);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(h)[i];
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = __hmul2(code_pair(f, b[2 * i], b[2 * i + 1]), s2);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(h)[i];
  }
}

// A warp's tile of a quantized cache: the K and V codes of its keys (lane j's slot is my_slot)
// for kv head kvh, decoded to fp16 rows in the same shared-memory layout the fp16 path copies
// into, so the scoring below is one code for every format. Loads go out kBatch pieces per lane at
// a time before any of them is decoded (more would cost registers at head_dim 256).
template <int HD, int KRow, int VRow>
__device__ __forceinline__ void load_quantized_tile(const PagedKv& kv, int64_t my_slot, int n_here,
                                                    int kvh, int num_kv_heads, unsigned char* kt,
                                                    unsigned char* vt, int lane) {
  constexpr int kBatch = 4;
  const cpu::KvFormat f = kv.format;
  const int row_bytes = static_cast<int>(cpu::kv_code_bytes(f, HD));
  const int pieces = row_bytes / 16;                 // per key: 1 (q4, HD 32) .. 16 (q8, HD 256)
  const int per_piece = 128 / cpu::kv_code_bits(f);  // channels per piece
  for (int it0 = 0; it0 < pieces; it0 += kBatch) {
    uint4 kc[kBatch], vc[kBatch];
    __half ksc[kBatch], vsc[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (it0 + b) * 32 + lane, r = i / pieces, c = i % pieces;
      const int64_t slot = __shfl_sync(0xffffffffu, my_slot, r & 31);
      if (it0 + b < pieces && r < n_here) {
        const int64_t head = slot * num_kv_heads + kvh;
        const int64_t scale = head * (HD / cpu::kKvGroup) + c * per_piece / cpu::kKvGroup;
        kc[b] = *reinterpret_cast<const uint4*>(kv.kq + head * row_bytes + 16 * c);
        vc[b] = *reinterpret_cast<const uint4*>(kv.vq + head * row_bytes + 16 * c);
        ksc[b] = __ushort_as_half(kv.ks[scale]);
        vsc[b] = __ushort_as_half(kv.vs[scale]);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (it0 + b) * 32 + lane, r = i / pieces, c = i % pieces;
      if (it0 + b < pieces && r < n_here) {
        decode_piece(f, kc[b], ksc[b], kt + r * KRow + 2 * c * per_piece);
        decode_piece(f, vc[b], vsc[b], vt + r * VRow + 2 * c * per_piece);
      }
    }
  }
}

// The cache holds codes (kv.format says which), decoded by load_quantized_tile.
template <int HD, int G>
__global__ void __launch_bounds__(32 * kWarps)
    attention_decode_kernel(const float* __restrict__ q, const int32_t* __restrict__ tokens,
                            TokenMeta meta, AttnShape s, float scale, PagedKv kv, int splits,
                            int32_t* counters, float* partial, float* __restrict__ out) {
  pdl_begin();
  using L = Smem<HD, G>;
  constexpr int kDpl = HD / 32;  // output channels per lane
  constexpr int kVec = HD / 8;   // 16-byte pieces per K/V row
  extern __shared__ __align__(16) unsigned char smem[];
  float* sq = reinterpret_cast<float*>(smem);
  float* sp = reinterpret_cast<float*>(smem + L::kQ);
  unsigned char* region = smem + L::kQ + L::kP;
  __shared__ int s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ti = blockIdx.x, grp = blockIdx.y, split = blockIdx.z;
  const int groups = s.num_heads / G;
  const int h0 = grp * G;
  const int kvh = h0 / (s.num_heads / s.num_kv_heads);
  const int64_t t = tokens[ti];
  const int32_t pos = meta.pos[t], row = meta.seq_row[t];
  // Keys lo .. pos: every earlier position, or the last `window` of them.
  const int lo = s.window > 0 ? max(0, pos + 1 - s.window) : 0;
  const int keys = pos + 1 - lo;
  const int chunk = max(kMinChunk, ((keys + splits - 1) / splits + kTile - 1) / kTile * kTile);
  const int active = (keys + chunk - 1) / chunk;
  if (split >= active) return;  // this token's context needs fewer splits
  const int k0 = lo + split * chunk, k1 = min(pos + 1, k0 + chunk);

  for (int i = threadIdx.x; i < G * HD; i += blockDim.x)
    sq[i] = q[(t * s.num_heads + h0) * HD + i] * scale;
  __syncthreads();

  unsigned char* kt = region + warp * L::kWarpTiles;
  unsigned char* vt = kt + kTile * L::kKRow;
  float* wp = sp + warp * G * kTile;
  float m[G], l[G], o[G][kDpl];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = kNegBig;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < kDpl; ++d) o[g][d] = 0.0f;
  }
  for (int c0 = k0 + warp * kTile; c0 < k1; c0 += kWarps * kTile) {
    const int n_here = min(kTile, k1 - c0);
    const bool valid = lane < n_here;
    const int64_t my_slot = valid ? kv_slot(kv, row, c0 + lane) : 0;
    load_quantized_tile<HD, L::kKRow, L::kVRow>(kv, my_slot, n_here, kvh, s.num_kv_heads, kt, vt,
                                                lane);
    __syncwarp();

    float sc[G];
#pragma unroll
    for (int g = 0; g < G; ++g) sc[g] = 0.0f;
    if (valid) {
      const unsigned char* kr = kt + lane * L::kKRow;
#pragma unroll
      for (int c = 0; c < kVec; ++c) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kr + 16 * c);
        const __half2* h2 = reinterpret_cast<const __half2*>(&raw);
        float kf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __half22float2(h2[i]);
          kf[2 * i] = f.x;
          kf[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float4 qa = *reinterpret_cast<const float4*>(sq + g * HD + 8 * c);
          const float4 qb = *reinterpret_cast<const float4*>(sq + g * HD + 8 * c + 4);
          sc[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                   qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float mn = fmaxf(m[g], warp_max(valid ? sc[g] : kNegBig));
      const float corr = expf(m[g] - mn);
      const float p = valid ? expf(sc[g] - mn) : 0.0f;
      l[g] = l[g] * corr + warp_sum(p);
      m[g] = mn;
#pragma unroll
      for (int d = 0; d < kDpl; ++d) o[g][d] *= corr;
      wp[g * kTile + lane] = p;
    }
    __syncwarp();
    for (int j = 0; j < n_here; ++j) {
      float vv[kDpl];
      const __half* vr = reinterpret_cast<const __half*>(vt + j * L::kVRow) + lane * kDpl;
      if constexpr (kDpl == 1) {  // head_dim 32: one channel per lane
        vv[0] = __half2float(vr[0]);
      } else {
#pragma unroll
        for (int d = 0; d < kDpl; d += 2) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(vr + d));
          vv[d] = f.x;
          vv[d + 1] = f.y;
        }
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pj = wp[g * kTile + j];
#pragma unroll
        for (int d = 0; d < kDpl; ++d) o[g][d] += pj * vv[d];
      }
    }
    __syncwarp();  // the next tile's copies overwrite this one
  }

  // Merge the warps (the tiles are dead: their region now holds the states).
  __syncthreads();
  float* wm = reinterpret_cast<float*>(region);
  float* wl = wm + kWarps * G;
  float* wo = wl + kWarps * G;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      wm[warp * G + g] = m[g];
      wl[warp * G + g] = l[g];
    }
#pragma unroll
    for (int d = 0; d < kDpl; ++d) wo[(warp * G + g) * HD + lane * kDpl + d] = o[g][d];
  }
  __syncthreads();
  const int64_t pair = static_cast<int64_t>(ti) * groups + grp;
  const int64_t split_floats = static_cast<int64_t>(G) * (HD + 2);
  float* const out_rows = out + (t * s.num_heads + h0) * HD;
  store_block_state<HD, kWarps, false>(wm, wl, wo, G, G, active == 1, out_rows,
                                       partial + (pair * splits + split) * split_floats, s.sinks,
                                       h0);
  if (active == 1) return;

  // The last block of this (token, head group) merges every split's state.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(counters + pair, 1) == active - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  merge_split_states<HD, false>(partial + pair * splits * split_floats, split_floats, G, active, wm,
                                out_rows, s.sinks, h0);
  if (threadIdx.x == 0) counters[pair] = 0;  // ready for the next launch
}

template <int HD, int G>
cudaError_t launch(const float* q, const int32_t* tokens, int64_t count, TokenMeta meta,
                   const AttnShape& s, float scale, const PagedKv& kv, int splits,
                   int32_t* counters, float* partial, float* out, cudaStream_t stream) {
  constexpr int bytes = Smem<HD, G>::kBytes;
  const auto kernel = attention_decode_kernel<HD, G>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(count), static_cast<unsigned>(s.num_heads / G),
                  static_cast<unsigned>(splits));
  launch_pdl(kernel, grid, 32 * kWarps, bytes, stream, q, tokens, meta, s, scale, kv, splits,
             counters, partial, out);
  return cudaGetLastError();
}

template <int HD>
cudaError_t launch_hd(const float* q, const int32_t* tokens, int64_t count, TokenMeta meta,
                      const AttnShape& s, float scale, const PagedKv& kv, int splits,
                      int32_t* counters, float* partial, float* out, cudaStream_t stream) {
  switch (group_size(s)) {
    case 4:
      return launch<HD, 4>(q, tokens, count, meta, s, scale, kv, splits, counters, partial, out,
                           stream);
    case 2:
      return launch<HD, 2>(q, tokens, count, meta, s, scale, kv, splits, counters, partial, out,
                           stream);
    default:
      return launch<HD, 1>(q, tokens, count, meta, s, scale, kv, splits, counters, partial, out,
                           stream);
  }
}

// The completion counters come first and cover kAttentionSplitMaxTokens tokens whatever the
// launch's count, so a smaller launch's states never overwrite a counter a larger one relies on
// being zero; they serve either kernel's blocks per token.
size_t counter_bytes(const AttnShape& s) {
  const int64_t per_token =
      std::max<int64_t>(s.num_heads / group_size(s), decode_mma_row_blocks(s));
  return align_up(static_cast<size_t>(kAttentionSplitMaxTokens * per_token) * 4);
}

// Softmax-state rows per token and split, for either cache format: the CUDA-core kernel stores one
// per query head, the tensor-core kernel a padded set per row block, which is never fewer (so a
// workspace sized without knowing the cache's format serves both).
int64_t state_rows(const AttnShape& s) {
  return std::max<int64_t>(s.num_heads, decode_mma_state_rows(s));
}

bool valid_shape(const AttnShape& s) {
  return s.num_kv_heads > 0 && s.num_heads > 0 && s.num_heads % s.num_kv_heads == 0 &&
         s.window >= 0 && attention_supports_head_dim(s.head_dim);
}

}  // namespace

int attention_decode_splits(const PagedKv& kv) {
  const int64_t max_keys = static_cast<int64_t>(kv.max_pages) * kv.page_size;
  return static_cast<int>(
      std::clamp<int64_t>((max_keys + kMinChunk - 1) / kMinChunk, 1, kDecodeMaxSplits));
}

size_t attention_decode_workspace_bytes(int64_t count, const AttnShape& shape, const PagedKv& kv) {
  if (!valid_shape(shape) || count <= 0 || count > kAttentionSplitMaxTokens) return 0;
  const int splits = attention_decode_splits(kv);
  if (splits == 1) return 0;
  return counter_bytes(shape) +
         static_cast<size_t>(count * state_rows(shape) * splits * (shape.head_dim + 2)) * 4;
}

cudaError_t attention_decode(const float* q, const int32_t* tokens, int64_t count, TokenMeta meta,
                             const AttnShape& shape, float scale, const PagedKv& kv,
                             void* workspace, size_t workspace_bytes, float* out,
                             cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (!valid_shape(shape) || count > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const size_t need = attention_decode_workspace_bytes(count, shape, kv);
  int splits = 1;
  int32_t* counters = nullptr;
  float* partial = nullptr;
  if (need > 0 && workspace != nullptr && workspace_bytes >= need) {
    splits = attention_decode_splits(kv);
    counters = static_cast<int32_t*>(workspace);
    partial = reinterpret_cast<float*>(static_cast<char*>(workspace) + counter_bytes(shape));
  }
  if (!cpu::kv_quantized(kv.format)) {
    return detail::attention_decode_mma(q, tokens, count, meta, shape, scale, kv, splits, counters,
                                        partial, out, stream);
  }
  return with_head_dim(shape.head_dim, [&](auto hd) {
    return launch_hd<decltype(hd)::value>(q, tokens, count, meta, shape, scale, kv, splits,
                                          counters, partial, out, stream);
  });
}

}  // namespace exl3::cuda
