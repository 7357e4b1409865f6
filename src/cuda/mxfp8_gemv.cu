// MXFP8 tensor-core GEMV for decode and small batches (m <= 64), the split-K reduction and the
// BF16 dequant pass, all on the tiled layout of mxfp8_tiles.hpp.
//
// Why tensor cores at m = 1: the fp32 route (decode to fp16, convert to fp32, FMA) costs ~5
// instructions per weight, and Hopper converts fp16 -> fp32 at a quarter of the FMA rate, so the
// first GEMV ran at 1.7 TB/s, compute bound. Here a lane's 16-byte load is already its A fragment
// (mxfp8_tiles.hpp): codes become bf16 (e4m3 * 2^-120, exact) with two shifts and masks per
// pair, mma.sync m16n8k16 multiplies 16 rows x 16 inputs by up to 8 activation rows, and the
// UE8M0 scale is applied per 32-input block to the fp32 fragment.
//
// Range: the activations enter the mma multiplied by 2^48 (exact in bf16 for |x| < 2^79), so the
// fp32 products inside the tensor core (e4m3 * 2^-120 * x * 2^48) stay normal for every code and
// |x| >= 2^-40 (tested at both ends); the block result is multiplied back by 2^72 and by the
// block scale in fp32: exact scalings, so the result equals the reference's arithmetic on
// w = e4m3 * 2^(s - 127) up to summation order. (Activations below 2^-40 lose their smallest
// products to underflow; no real activation is that small next to its neighbours.)
//
// Work split: a block of 8 warps owns RB 16-row tiles (1 or 2 by m, see launch_gemv); warp w
// takes each tile's 32-input blocks w, w + 8, ... of its K split, then the warps' fragments are
// summed in warp order through shared memory. A row's arithmetic depends on (k, n, splits) only:
// every m on this path gives the same bits for a given row.
#include <cuda_bf16.h>

#include "cuda/mxfp8_decode.cuh"
#include "cuda/mxfp8_kernels.hpp"
#include "cuda/mxfp8_tiles.hpp"

namespace exl3::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr uint32_t kBf16x2TwoPow48 = 0x57805780u;  // bf16 2^48 in both halves
constexpr float kTwoPow72 = 4722366482869645213696.0f;
constexpr float kTwoPow120 = 1.329227995784915872903807060280344576e36f;

__device__ __forceinline__ void store_out(void* y, DType t, int64_t idx, float v) {
  if (t == DType::kF32) {
    static_cast<float*>(y)[idx] = v;
  } else {
    static_cast<__nv_bfloat16*>(y)[idx] = __float2bfloat16_rn(v);
  }
}

// Streamed weights: read once, so keep them out of L1 (the activations live there).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_times_2p48(uint32_t v) {
  const uint32_t f = kBf16x2TwoPow48;
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&v),
                                   *reinterpret_cast<const __nv_bfloat162*>(&f));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// UE8M0 exponent -> 2^(e - 127) (e = 0 is the fp32 subnormal 2^-127; 255 never reaches a kernel).
__device__ __forceinline__ float ue8m0_exp2(uint32_t e) {
  return __uint_as_float(e == 0 ? 0x00400000u : e << 23);
}

// NT n8 tiles of activation rows (m <= 8 * NT); RB 16-row tiles per block share each activation
// fragment (the activations are re-read from L2 once per block, so at larger m more tiles per
// block cut that traffic); U blocks' loads in flight per lane and tile (at m <= 8, U = 8 measured
// slower than 4: fewer warps fit). RB and U change which block holds a tile and when loads
// issue, never a row's arithmetic or its order.
template <int NT, int RB, int U>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const uint4* __restrict__ values, const uint16_t* __restrict__ scales,
                const __nv_bfloat16* __restrict__ x, int m, int64_t k, int64_t n, int kb,
                int splits, float* __restrict__ partial, const float* __restrict__ bias, void* y,
                DType out_type) {
  __shared__ float red[kWarps][NT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int64_t tiles = (n + kMxfp8TileRows - 1) / kMxfp8TileRows;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * RB;
  const int split = blockIdx.y;
  const int b_begin = static_cast<int>(static_cast<int64_t>(kb) * split / splits);
  const int b_end = static_cast<int>(static_cast<int64_t>(kb) * (split + 1) / splits);

  float acc[RB][NT][4];
#pragma unroll
  for (int r = 0; r < RB; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][t][i] = 0.0f;

  // Small m: the activations' loads go out with the weights' (one memory round trip per step
  // instead of two); larger NT load them per use (registers).
  constexpr bool kPrefetchX = NT <= 2;
  const auto load_x = [&](int t, int b) {
    const int row = t * 8 + g;
    uint4 xv = make_uint4(0, 0, 0, 0);
    if (row < m) {
      xv = __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * k +
                                                static_cast<int64_t>(b) * 32 + q * 8));
    }
    return xv;
  };

  // Per-tile bases (the last block's tiles past the end read nothing; RB = 1 never has one).
  const uint4* vt[RB];
  const uint16_t* st[RB];
  bool live[RB];
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    live[r] = RB == 1 || tile0 + r < tiles;
    vt[r] = values + (tile0 + r) * kb * 32 + lane;
    st[r] = scales + (tile0 + r) * kb * 8 + g;
  }

  for (int b0 = b_begin + warp; b0 < b_end; b0 += kWarps * U) {
    uint4 v[U][RB];
    uint32_t sc[U][RB];
    uint4 xs[kPrefetchX ? U : 1][kPrefetchX ? NT : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * kWarps;
      if (b < b_end) {  // warp-uniform
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          if (live[r]) {
            v[u][r] = load_stream(vt[r] + static_cast<int64_t>(b) * 32);
            sc[u][r] = __ldg(st[r] + static_cast<int64_t>(b) * 8);
          } else {
            v[u][r] = make_uint4(0, 0, 0, 0);
            sc[u][r] = 0;
          }
        }
        if constexpr (kPrefetchX) {
#pragma unroll
          for (int t = 0; t < NT; ++t) xs[u][t] = load_x(t, b);
        }
      } else {
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          v[u][r] = make_uint4(0, 0, 0, 0);
          sc[u][r] = 0;
        }
        if constexpr (kPrefetchX) {
#pragma unroll
          for (int t = 0; t < NT; ++t) xs[u][t] = make_uint4(0, 0, 0, 0);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * kWarps;
      if (b >= b_end) break;  // warp-uniform
      // k16 steps 0 and 1 of each tile: {row g lo, row g+8 lo, row g hi, row g+8 hi}
      uint32_t a0[RB][4], a1[RB][4];
      float s_lo[RB], s_hi[RB];
#pragma unroll
      for (int r = 0; r < RB; ++r) {
        e4m3x4_to_bf16x2(v[u][r].x, a0[r][0], a0[r][2]);
        e4m3x4_to_bf16x2(v[u][r].z, a0[r][1], a0[r][3]);
        e4m3x4_to_bf16x2(v[u][r].y, a1[r][0], a1[r][2]);
        e4m3x4_to_bf16x2(v[u][r].w, a1[r][1], a1[r][3]);
        s_lo[r] = ue8m0_exp2(sc[u][r] & 0xFFu);
        s_hi[r] = ue8m0_exp2(sc[u][r] >> 8);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        uint4 xv;
        if constexpr (kPrefetchX) {
          xv = xs[u][t];
        } else {
          xv = load_x(t, b);
        }
        xv.x = bf16x2_times_2p48(xv.x);
        xv.y = bf16x2_times_2p48(xv.y);
        xv.z = bf16x2_times_2p48(xv.z);
        xv.w = bf16x2_times_2p48(xv.w);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_bf16(d, a0[r], xv.x, xv.y);
          mma_bf16(d, a1[r], xv.z, xv.w);
          acc[r][t][0] = fmaf(d[0] * kTwoPow72, s_lo[r], acc[r][t][0]);
          acc[r][t][1] = fmaf(d[1] * kTwoPow72, s_lo[r], acc[r][t][1]);
          acc[r][t][2] = fmaf(d[2] * kTwoPow72, s_hi[r], acc[r][t][2]);
          acc[r][t][3] = fmaf(d[3] * kTwoPow72, s_hi[r], acc[r][t][3]);
        }
      }
    }
  }

  // One tile at a time through shared memory. Fragment element (t, i) of lane (g, q): weight row
  // g (+8 for i >= 2), activation row 8t + 2q + (i & 1). Summed over the warps in order.
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    if (r > 0) __syncthreads();  // the previous tile's sums are read
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][t * 4 + i][lane] = acc[r][t][i];
    __syncthreads();
    const int64_t tile = tile0 + r;
    for (int e = threadIdx.x; e < NT * 4 * 32; e += kWarps * 32) {
      const int ti = e >> 5, ln = e & 31;
      float v = red[0][ti][ln];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) v += red[w][ti][ln];
      const int i = ti & 3;
      const int64_t row = tile * kMxfp8TileRows + (ln >> 2) + (i >= 2 ? 8 : 0);
      const int col = (ti >> 2) * 8 + 2 * (ln & 3) + (i & 1);
      if (row < n && col < m) {
        if (splits == 1) {
          store_out(y, out_type, static_cast<int64_t>(col) * n + row,
                    v + (bias != nullptr ? bias[row] : 0.0f));
        } else {
          partial[(static_cast<int64_t>(split) * m + col) * n + row] = v;
        }
      }
    }
  }
}

__global__ void reduce_kernel(const float* __restrict__ partial, int splits,
                              const float* __restrict__ bias, int64_t m, int64_t n, void* y,
                              DType out_type) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * n) return;
  float v = 0.0f;
  for (int s = 0; s < splits; ++s) v += partial[s * m * n + idx];
  if (bias != nullptr) v += bias[idx % n];
  store_out(y, out_type, idx, v);
}

// A thread block turns one row tile x kDqBlocks 32-input blocks into BF16 rows: the lane-loads
// are decoded into shared memory (rows g and g + 8, inputs 8q .. 8q+7 of each block), then whole
// row segments are written out, so the global stores are contiguous (storing straight from the
// tile layout wrote 64-byte pieces of 16 rows and ran at a third of the copy bandwidth). In fp32
// (denormals kept): (e4m3 * 2^-120) * 2^120 is exact, times the block scale 2^(s - 127) is the
// CPU's product, rounded to bf16 once.
constexpr int kDqBlocks = 16;
constexpr int kDqThreads = 256;
constexpr int kDqLoadsPerThread = kDqBlocks * 32 / kDqThreads;
constexpr int kDqPitch =
    kDqBlocks * 32 + 8;  // bf16 per staged row (+16 bytes against bank conflicts)

__global__ void __launch_bounds__(kDqThreads)
    dequant_kernel(const uint4* __restrict__ values, const uint16_t* __restrict__ scales, int64_t k,
                   int64_t n, int64_t kb, __nv_bfloat16* __restrict__ out) {
  __shared__ __align__(16) uint16_t staged[kMxfp8TileRows * kDqPitch];
  const int64_t tile = blockIdx.x, b0 = static_cast<int64_t>(blockIdx.y) * kDqBlocks;
  const int nb = static_cast<int>(kb - b0 < kDqBlocks ? kb - b0 : kDqBlocks);
  uint4 v[kDqLoadsPerThread];
  uint32_t sc[kDqLoadsPerThread];
#pragma unroll
  for (int j = 0; j < kDqLoadsPerThread; ++j) {
    const int i =
        threadIdx.x + j * kDqThreads;  // lane-load i: block i / 32 of this chunk, lane i % 32
    if (i < nb * 32) {
      const int64_t tb = tile * kb + b0 + (i >> 5);
      v[j] = load_stream(values + tb * 32 + (i & 31));
      sc[j] = __ldg(scales + tb * 8 + ((i & 31) >> 2));
    }
  }
#pragma unroll
  for (int j = 0; j < kDqLoadsPerThread; ++j) {
    const int i = threadIdx.x + j * kDqThreads;
    if (i >= nb * 32) break;
    const int bl = i >> 5, g = (i & 31) >> 2, q = i & 3;
    const uint32_t words[2][2] = {{v[j].x, v[j].y}, {v[j].z, v[j].w}};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float scale = ue8m0_exp2(half == 0 ? sc[j] & 0xFFu : sc[j] >> 8);
      uint32_t o[4];
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        uint32_t p[2];  // inputs 4w + {0, 1} and 4w + {2, 3}
        e4m3x4_to_bf16x2(words[half][w], p[0], p[1]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float lo = __uint_as_float(p[h] << 16) * kTwoPow120 * scale;
          const float hi = __uint_as_float(p[h] & 0xFFFF0000u) * kTwoPow120 * scale;
          const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
          o[2 * w + h] = *reinterpret_cast<const uint32_t*>(&r);
        }
      }
      *reinterpret_cast<uint4*>(staged + (g + 8 * half) * kDqPitch + bl * 32 + q * 8) =
          make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
  __syncthreads();
  const int chunks = nb * 4;  // 16-byte pieces per staged row
  for (int i = threadIdx.x; i < kMxfp8TileRows * chunks; i += kDqThreads) {
    const int r = i / chunks, c = i % chunks;
    const int64_t row = tile * kMxfp8TileRows + r;
    if (row < n) {
      *reinterpret_cast<uint4*>(out + row * k + b0 * 32 + c * 8) =
          *reinterpret_cast<const uint4*>(staged + r * kDqPitch + c * 8);
    }
  }
}

// Tiles per block and loads in flight by n8-tile count (m): one tile while the activations are
// a small share of the traffic, more as they grow.
template <int NT>
cudaError_t launch_gemv(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m,
                        int64_t k, int64_t n, int splits, float* partial, const float* bias,
                        void* y, DType out_type, cudaStream_t stream) {
  // Measured on the H200 (docs/performance.md, runs 5-8): 2 tiles per block took m = 16 from
  // 91-95 to 84-92 us on 8192x28672 and m = 64 from 302 to 266-288 us; at m = 17..32 (2 tiles,
  // 2 loads) it lost on 6 of 7 shapes.
  constexpr int RB = NT == 1 || NT == 4 ? 1 : 2;
  constexpr int U = NT == 8 ? 1 : 4;
  const int64_t tiles = (n + kMxfp8TileRows - 1) / kMxfp8TileRows;
  const dim3 grid(static_cast<unsigned>((tiles + RB - 1) / RB), static_cast<unsigned>(splits));
  gemv_kernel<NT, RB, U><<<grid, kWarps * 32, 0, stream>>>(
      reinterpret_cast<const uint4*>(values), reinterpret_cast<const uint16_t*>(scales),
      static_cast<const __nv_bfloat16*>(x), static_cast<int>(m), k, n, static_cast<int>(k / 32),
      splits, partial, bias, y, out_type);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mxfp8_gemv(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m,
                       int64_t k, int64_t n, int splits, float* partial, const float* bias, void* y,
                       DType out_type, cudaStream_t stream) {
  if (m <= 0 || m > kMxfp8GemvMaxM || k % 32 != 0 || splits < 1 || splits > k / 32 ||
      (out_type != DType::kF32 && out_type != DType::kBF16) || (splits > 1 && partial == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (m <= 8)
    return launch_gemv<1>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
  if (m <= 16)
    return launch_gemv<2>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
  if (m <= 32)
    return launch_gemv<4>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
  return launch_gemv<8>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
}

cudaError_t mxfp8_reduce(const float* partial, int splits, const float* bias, int64_t m, int64_t n,
                         void* y, DType out_type, cudaStream_t stream) {
  if (out_type != DType::kF32 && out_type != DType::kBF16) return cudaErrorInvalidValue;
  const int64_t total = m * n;
  reduce_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
      partial, splits, bias, m, n, y, out_type);
  return cudaGetLastError();
}

cudaError_t mxfp8_dequant_bf16(const uint8_t* values, const uint8_t* scales, int64_t k, int64_t n,
                               uint16_t* out, cudaStream_t stream) {
  if (k % 32 != 0) return cudaErrorInvalidValue;
  const int64_t kb = k / 32;
  const dim3 grid(static_cast<unsigned>((n + kMxfp8TileRows - 1) / kMxfp8TileRows),
                  static_cast<unsigned>((kb + kDqBlocks - 1) / kDqBlocks));
  dequant_kernel<<<grid, kDqThreads, 0, stream>>>(reinterpret_cast<const uint4*>(values),
                                                  reinterpret_cast<const uint16_t*>(scales), k, n,
                                                  kb, reinterpret_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
