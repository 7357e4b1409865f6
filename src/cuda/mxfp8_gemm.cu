// MXFP8 tensor-core GEMM for mid-size batches: in-register dequant to BF16 + mma.sync m16n8k16.
//
// Shape assumptions: k % 32 == 0; x rows 16-byte aligned; any m, n (edges are guarded).
// Tiles: 64 activation rows x 64 output features per block of 4 warps (2 x 2, 32 x 32 each), one
// 32-wide scale block of K per step. Per step every thread loads two 16-byte pieces of x and
// one 16-byte piece of codes plus its scale into registers (prefetched one step ahead), then
// writes BF16 x and the dequantized BF16 weight (exact: e4m3 * 2^(e-127) has 4 significant bits)
// into padded shared memory (row stride 80 bytes: fragment reads hit 32 distinct banks).
// Split-K runs whole K blocks per grid.z slice into fp32 partials (planned from k and n only);
// each output row's arithmetic is independent of the other rows, so results are batch-invariant
// within this path.
#include <cuda_bf16.h>

#include "cuda/mxfp8_decode.cuh"
#include "cuda/mxfp8_kernels.hpp"

namespace exl3::cuda::detail {
namespace {

constexpr int kTileM = 64, kTileN = kMxfp8MmaTileN, kTileK = 32;
constexpr int kStride = kTileK + 8;  // bf16 elements per shared row (80 bytes)
constexpr int kThreads = 128;

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

struct Prefetch {
  uint4 x[2];
  uint4 w;
  uint8_t scale;
};

__device__ __forceinline__ void load_step(Prefetch& p, const uint8_t* __restrict__ values,
                                          const uint8_t* __restrict__ scales, const __nv_bfloat16* __restrict__ x,
                                          int64_t m, int64_t k, int64_t n, int64_t m0, int64_t n0, int64_t kblock) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = t + i * kThreads;  // 64 rows x 4 pieces of 8 bf16
    const int64_t row = m0 + idx / 4;
    p.x[i] = row < m ? __ldg(reinterpret_cast<const uint4*>(x + row * k + kblock * kTileK + (idx % 4) * 8))
                     : make_uint4(0, 0, 0, 0);
  }
  const int64_t wrow = n0 + t / 2;  // 64 rows x 2 pieces of 16 codes
  if (wrow < n) {
    p.w = __ldg(reinterpret_cast<const uint4*>(values + wrow * k + kblock * kTileK + (t % 2) * 16));
    p.scale = __ldg(scales + wrow * (k / 32) + kblock);
  } else {
    p.w = make_uint4(0, 0, 0, 0);
    p.scale = 0;
  }
}

__device__ __forceinline__ void store_step(const Prefetch& p, __nv_bfloat16 (*as)[kStride],
                                           __nv_bfloat16 (*bs)[kStride]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = t + i * kThreads;
    *reinterpret_cast<uint4*>(&as[idx / 4][(idx % 4) * 8]) = p.x[i];
  }
  float w[16];
  decode4(p.w.x, w);
  decode4(p.w.y, w + 4);
  decode4(p.w.z, w + 8);
  decode4(p.w.w, w + 12);
  const float s = mxfp8::ue8m0_to_float_x256(p.scale);
  __align__(16) __nv_bfloat162 o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = __floats2bfloat162_rn(w[2 * j] * s, w[2 * j + 1] * s);
  uint4* dst = reinterpret_cast<uint4*>(&bs[t / 2][(t % 2) * 16]);
  dst[0] = *reinterpret_cast<const uint4*>(&o[0]);
  dst[1] = *reinterpret_cast<const uint4*>(&o[4]);
}

__global__ void __launch_bounds__(kThreads) mma_kernel(const uint8_t* __restrict__ values,
                                                       const uint8_t* __restrict__ scales,
                                                       const __nv_bfloat16* __restrict__ x, int64_t m, int64_t k,
                                                       int64_t n, int splits, float* __restrict__ partial,
                                                       const float* __restrict__ bias, void* y, DType out_type) {
  __shared__ __align__(16) __nv_bfloat16 as[kTileM][kStride];
  __shared__ __align__(16) __nv_bfloat16 bs[kTileN][kStride];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int g = lane >> 2, tg = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN, m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t blocks = k / kTileK;
  const int split = blockIdx.z;
  const int64_t kb_begin = blocks * split / splits, kb_end = blocks * (split + 1) / splits;

  float acc[2][4][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

  Prefetch p;
  if (kb_begin < kb_end) load_step(p, values, scales, x, m, k, n, m0, n0, kb_begin);
  for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
    store_step(p, as, bs);
    __syncthreads();
    if (kb + 1 < kb_end) load_step(p, values, scales, x, m, k, n, m0, n0, kb + 1);
#pragma unroll
    for (int ks = 0; ks < kTileK; ks += 16) {
      uint32_t af[2][4], bf[4][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = wm * 32 + mt * 16 + g;
        af[mt][0] = *reinterpret_cast<const uint32_t*>(&as[r][ks + tg * 2]);
        af[mt][1] = *reinterpret_cast<const uint32_t*>(&as[r + 8][ks + tg * 2]);
        af[mt][2] = *reinterpret_cast<const uint32_t*>(&as[r][ks + tg * 2 + 8]);
        af[mt][3] = *reinterpret_cast<const uint32_t*>(&as[r + 8][ks + tg * 2 + 8]);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = wn * 32 + nt * 8 + g;
        bf[nt][0] = *reinterpret_cast<const uint32_t*>(&bs[c][ks + tg * 2]);
        bf[nt][1] = *reinterpret_cast<const uint32_t*>(&bs[c][ks + tg * 2 + 8]);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_bf16(acc[mt][nt], af[mt], bf[nt]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + wm * 32 + mt * 16 + g + h * 8;
        if (row >= m) continue;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int64_t col = n0 + wn * 32 + nt * 8 + tg * 2 + j;
          if (col >= n) continue;
          const float v = acc[mt][nt][h * 2 + j];
          if (splits > 1) {
            partial[(split * m + row) * n + col] = v;
          } else {
            const float o = v + (bias != nullptr ? bias[col] : 0.0f);
            if (out_type == DType::kF32) {
              static_cast<float*>(y)[row * n + col] = o;
            } else {
              static_cast<__nv_bfloat16*>(y)[row * n + col] = __float2bfloat16_rn(o);
            }
          }
        }
      }
    }
  }
}

}  // namespace

cudaError_t mxfp8_mma(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m, int64_t k, int64_t n,
                      int splits, float* partial, const float* bias, void* y, DType out_type, cudaStream_t stream) {
  if (m <= 0 || k % kTileK != 0 || splits < 1 || (out_type != DType::kF32 && out_type != DType::kBF16)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((n + kTileN - 1) / kTileN), static_cast<unsigned>((m + kTileM - 1) / kTileM),
                  static_cast<unsigned>(splits));
  mma_kernel<<<grid, kThreads, 0, stream>>>(values, scales, static_cast<const __nv_bfloat16*>(x), m, k, n, splits,
                                            partial, bias, y, out_type);
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
