// Tensor-core EXL3 GEMM: x'[m, k] (fp16) @ W_hat[k, n] -> fp32 split-K partials.
//
// Shape assumptions: k % 128 == 0, n % 128 == 0, m >= 1.
// Grid: x = n / 128 column blocks, y = split-K slices, z = row groups of 16*MT rows.
// Block: 4 warps; warp w owns tile columns 8*blockIdx.x + 2w and +1 (32 output columns), and
// walks the split's k-tiles in ascending order.
//
// Decode: lane t of a warp holds sequence positions 8t..8t+7 of every tile, which are exactly its
// two mma.m16n8k16 B fragments (columns 0-7 and 8-15 of the tile) - the tensor-core permutation
// of the format exists for this. The lane's 8 states are 16-bit windows of the 7K+16 stream bits
// ending at bit 8(t+1)K, read from three 32-bit words, so each tile is decoded once per row
// group, in registers, with no shared memory.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

#include "cuda/kernels.hpp"
#include "cuda/mma.cuh"
#include "cuda/pdl.cuh"
#include "cuda/trellis_decode.cuh"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"
#include "exl3/trellis/dispatch.hpp"

namespace exl3::cuda::detail {

namespace tr = exl3::trellis;

constexpr int kMmaWarps = 4;
constexpr int kTilesPerWarp = 2;
// k-steps of trellis words and A fragments in flight per warp (fewer for the 64-row variant,
// whose ring would otherwise cost too many registers).
// The decode-sized variant is bound by global-load latency (Nsight: long-scoreboard stalls
// dominate), so it keeps 8 steps in flight and trades occupancy for them.
template <int MT>
constexpr int kPrefetchFor = MT >= 4 ? 2 : (MT == 2 ? 4 : 8);

template <int K, tr::Codebook CB, int MT>
__global__ void __launch_bounds__(32 * kMmaWarps, MT == 1 ? 4 : 1)
    mma_gemm_kernel(const uint32_t* __restrict__ trellis, const __half* __restrict__ xr, int m,
                    int k, int n, int splits, float* __restrict__ partial) {
  pdl_begin();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int tiles_n = n >> 4, tiles_k = k >> 4;
  const int j0 = blockIdx.x * (kMmaWarps * kTilesPerWarp) + warp * kTilesPerWarp;
  const int split = blockIdx.y;
  const int row0 = blockIdx.z * 16 * MT;
  const int kt_begin = static_cast<int>(static_cast<int64_t>(tiles_k) * split / splits);
  const int kt_end = static_cast<int>(static_cast<int64_t>(tiles_k) * (split + 1) / splits);

  // Word offsets (within a tile) and bit offset of this lane's window span, same for every tile.
  constexpr int kWords = 8 * K;
  const LaneSpan<K> span(lane);
  const int off = span.off;

  const int64_t tile_stride = static_cast<int64_t>(tiles_n) * kWords;  // words per tile row
  // Lane pointers to its three words in tile (kt_begin, j0); each k-step adds tile_stride.
  const uint32_t* col_base = trellis + static_cast<int64_t>(j0) * kWords;
  const uint32_t* lp0 = col_base + span.w0;
  const uint32_t* lp1 = col_base + span.w1;
  const uint32_t* lp2 = col_base + span.w2;

  float acc[MT][kTilesPerWarp][2][4];
#pragma unroll
  for (int a = 0; a < MT; ++a)
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[a][t][h][i] = 0.0f;

  // Ring of kPrefetch k-steps in flight: each holds the lane's trellis words for its tiles and
  // its A fragments, so neither global load is on the critical path of the step that uses it.
  struct Stage {
    uint32_t w[kTilesPerWarp][3];
    uint32_t a[MT][4];
  };
  constexpr int kPrefetch = kPrefetchFor<MT>;
  Stage ring[kPrefetch];
  const uint32_t* xr32 = reinterpret_cast<const uint32_t*>(xr);
  auto load = [&](int kt, Stage& st) {
    const int64_t row = kt * tile_stride;
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
      st.w[t][0] = __ldg(lp0 + row + t * kWords);
      st.w[t][1] = __ldg(lp1 + row + t * kWords);
      // K = 4 spans exactly 2 words (lane-invariant bit offset 20), so its third load is skipped.
      st.w[t][2] = K != 4 ? __ldg(lp2 + row + t * kWords) : 0u;
    }
    // A fragments: rows row0 + 16a + g (+8), columns 16*kt + 2c (+8). Rows >= m are zero.
    const int col32 = 8 * kt + c;  // fp16 column pair index
#pragma unroll
    for (int a = 0; a < MT; ++a) {
      const int r_lo = row0 + 16 * a + g, r_hi = r_lo + 8;
      const uint32_t* lo = xr32 + static_cast<int64_t>(r_lo) * (k >> 1) + col32;
      const uint32_t* hi = xr32 + static_cast<int64_t>(r_hi) * (k >> 1) + col32;
      st.a[a][0] = r_lo < m ? __ldg(lo) : 0u;
      st.a[a][1] = r_hi < m ? __ldg(hi) : 0u;
      st.a[a][2] = r_lo < m ? __ldg(lo + 4) : 0u;
      st.a[a][3] = r_hi < m ? __ldg(hi + 4) : 0u;
    }
  };
#pragma unroll
  for (int d = 0; d < kPrefetch; ++d)
    if (kt_begin + d < kt_end) load(kt_begin + d, ring[d]);

  for (int kt = kt_begin; kt < kt_end; kt += kPrefetch) {
#pragma unroll
    for (int d = 0; d < kPrefetch; ++d) {
      const int step = kt + d;
      if (step < kt_end) {
        // Decode and multiply straight from the ring slot, then refill it: no register copies.
        Stage& cur = ring[d];
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) {
          uint32_t b[4];
          decode_lane<K, CB>(cur.w[t][0], cur.w[t][1], cur.w[t][2], off, b);
#pragma unroll
          for (int a = 0; a < MT; ++a) {
            mma16816(acc[a][t][0], cur.a[a], b[0], b[1]);
            mma16816(acc[a][t][1], cur.a[a], b[2], b[3]);
          }
        }
        if (step + kPrefetch < kt_end) load(step + kPrefetch, cur);
      }
    }
  }

  // C fragment: c0,c1 at (row g, cols 2c, 2c+1), c2,c3 at (row g+8, same cols).
  float* out = partial + static_cast<int64_t>(split) * m * n;
#pragma unroll
  for (int a = 0; a < MT; ++a) {
    const int r_lo = row0 + 16 * a + g, r_hi = r_lo + 8;
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 16 * (j0 + t) + 8 * h + 2 * c;
        if (r_lo < m) {
          *reinterpret_cast<float2*>(out + static_cast<int64_t>(r_lo) * n + col) =
              make_float2(acc[a][t][h][0], acc[a][t][h][1]);
        }
        if (r_hi < m) {
          *reinterpret_cast<float2*>(out + static_cast<int64_t>(r_hi) * n + col) =
              make_float2(acc[a][t][h][2], acc[a][t][h][3]);
        }
      }
    }
  }
}

template <int K, tr::Codebook CB>
cudaError_t launch_mma_cb(const uint16_t* trellis, const __half* xr, int64_t m, int64_t k,
                          int64_t n, int splits, float* partial, cudaStream_t stream) {
  // Row groups: one 16-row tile per group for decode batches, up to 4 (64 rows) beyond that.
  const auto* t32 = reinterpret_cast<const uint32_t*>(trellis);
  const dim3 block(32 * kMmaWarps);
  const unsigned gx = static_cast<unsigned>(n / (16 * kMmaWarps * kTilesPerWarp));
  const int mi = static_cast<int>(m), ki = static_cast<int>(k), ni = static_cast<int>(n);
  if (m <= 16) {
    launch_pdl(mma_gemm_kernel<K, CB, 1>, dim3(gx, splits, 1), block, 0, stream, t32, xr, mi, ki,
               ni, splits, partial);
  } else if (m <= 32) {
    launch_pdl(mma_gemm_kernel<K, CB, 2>, dim3(gx, splits, 1), block, 0, stream, t32, xr, mi, ki,
               ni, splits, partial);
  } else {
    const unsigned gz = static_cast<unsigned>((m + 63) / 64);
    launch_pdl(mma_gemm_kernel<K, CB, 4>, dim3(gx, splits, gz), block, 0, stream, t32, xr, mi, ki,
               ni, splits, partial);
  }
  return cudaGetLastError();
}

template <int K>
cudaError_t mma_gemm_k(const uint16_t* trellis, tr::Codebook cb, const __half* xr, int64_t m,
                       int64_t k, int64_t n, int splits, float* partial, cudaStream_t stream) {
  return tr::with_codebook(cb, [&](auto c) {
    return launch_mma_cb<K, decltype(c)::value>(trellis, xr, m, k, n, splits, partial, stream);
  });
}

// Resident blocks per SM of the decode-sized (16-row) variant, for the split-K planner.
template <int K>
int mma_blocks_per_sm_k(tr::Codebook cb) {
  int blocks = 0;
  const cudaError_t e = tr::with_codebook(cb, [&](auto c) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, mma_gemm_kernel<K, decltype(c)::value, 1>, 32 * kMmaWarps, 0);
  });
  return e == cudaSuccess && blocks > 0 ? blocks : 1;
}

}  // namespace exl3::cuda::detail
